//! Issue 4: hot reload under traffic. No request fails during reloads; unchanged limits
//! keep their state, changed ones start fresh, an invalid file changes nothing.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::{client, eventually, Tollgate, Upstream, SERVER};

fn config(up: std::net::SocketAddr, b_capacity: u64, extra: &str) -> String {
    format!(
        r#"
{SERVER}origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
    limits:
      a:
        kind: token_bucket
        key: [header:x-a]
        capacity: 2
        refill: {{ amount: 1, every: 1h }}
      b:
        kind: token_bucket
        key: [header:x-b]
        capacity: {b_capacity}
        refill: {{ amount: 1, every: 1h }}
{extra}
"#
    )
}

async fn status(t: &Tollgate, header: &str) -> u16 {
    client()
        .get(t.url("/"))
        .header("host", "app.test")
        .header(header, "k")
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

async fn reloads(t: &Tollgate, result: &str) -> f64 {
    t.metric(&format!(
        "tollgate_config_reloads_total{{result=\"{result}\"}}"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_traffic_keeps_unchanged_state_and_refuses_bad_files() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, 2, "")).await;

    // Empty both buckets.
    for h in ["x-a", "x-b"] {
        assert_eq!(status(&t, h).await, 200);
        assert_eq!(status(&t, h).await, 200);
        assert_eq!(status(&t, h).await, 429);
    }

    // Background traffic on a key no limit uses: every response must be a 200.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let (stop, sent, failures) = (stop.clone(), sent.clone(), failures.clone());
        let url = t.url("/");
        workers.push(tokio::spawn(async move {
            let c = client();
            // Bounded: at most 5000 requests per worker.
            for _ in 0..5000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let ok = matches!(
                    c.get(&url).header("host", "app.test").send().await,
                    Ok(r) if r.status() == 200
                );
                sent.fetch_add(1, Ordering::SeqCst);
                if !ok {
                    failures.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }

    // 1. Valid change by SIGHUP: `b` changes capacity, `a` is untouched.
    let before = reloads(&t, "success").await;
    t.write_config(&config(up.addr, 3, ""));
    t.signal(libc::SIGHUP);
    eventually("reload succeeded", 500, || async {
        reloads(&t, "success").await > before
    })
    .await;
    assert_eq!(
        status(&t, "x-a").await,
        429,
        "unchanged bucket is still empty"
    );
    assert_eq!(status(&t, "x-b").await, 200, "changed bucket starts full");

    // 2. Invalid file, picked up by the file watcher: refused, nothing changes.
    let failed = reloads(&t, "failure").await;
    let successes = reloads(&t, "success").await;
    t.write_config(&config(
        up.addr,
        3,
        "      c: { kind: token_bucket, capasity: 1 }",
    ));
    eventually("reload refused", 500, || async {
        reloads(&t, "failure").await > failed
    })
    .await;
    assert_eq!(reloads(&t, "success").await, successes);
    assert!(
        t.log_text().contains("did you mean `capacity`"),
        "{}",
        t.log_text()
    );
    assert_eq!(status(&t, "x-a").await, 429);
    // b kept its post-reload state: capacity 3, one used, two left.
    assert_eq!(status(&t, "x-b").await, 200);
    assert_eq!(status(&t, "x-b").await, 200);
    assert_eq!(status(&t, "x-b").await, 429);

    // 3. An editor-style save (write a new file, rename over the old) is seen too.
    let tmp = t.dir.path().join("tollgate.yaml.tmp");
    std::fs::write(
        &tmp,
        config(up.addr, 3, "")
            .replace("{listen}", &t.listen.to_string())
            .replace("{metrics}", &t.metrics.to_string())
            .replace("capacity: 2", "capacity: 5"),
    )
    .unwrap();
    let successes = reloads(&t, "success").await;
    std::fs::rename(&tmp, &t.config_path).unwrap();
    eventually("rename picked up", 500, || async {
        reloads(&t, "success").await > successes
    })
    .await;
    assert_eq!(
        status(&t, "x-a").await,
        200,
        "a changed (capacity 5): fresh and full"
    );

    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    assert!(sent.load(Ordering::SeqCst) > 0);
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "a request failed during reload"
    );
    assert!(
        t.metric("tollgate_config_last_reload_success_timestamp_seconds")
            .await
            > 1.7e9
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_changes_are_logged_as_needing_an_upgrade() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, 2, "")).await;
    let before = reloads(&t, "success").await;
    t.write_config(
        &config(up.addr, 2, "").replace("grace_period: 0s", "grace_period: 0s\n  threads: 3"),
    );
    t.signal(libc::SIGHUP);
    eventually("reload", 500, || async {
        reloads(&t, "success").await > before
    })
    .await;
    // The metric can move before the log line reaches the test through the stderr pipe.
    eventually("the restart-only change is logged", 500, || async {
        t.log_text()
            .contains("server.threads changed but cannot be applied live")
    })
    .await;
    assert_eq!(status(&t, "x-a").await, 200);
}
