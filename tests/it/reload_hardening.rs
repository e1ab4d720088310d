//! Reloads that must not hurt: a config file written in place in two parts (the first part
//! valid on its own) must never be applied half-written, under traffic; a deliberate
//! removal still applies by SIGHUP or by a rename-save.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{client, eventually, Tollgate, Upstream, SERVER};

/// Origin `a` with two token buckets, then origin `b`. Cut after `first`, the text is a
/// valid config that drops the limit `second` and the origin `b`.
fn part1(up: std::net::SocketAddr) -> String {
    format!(
        r#"{SERVER}origins:
  a:
    hosts: ["a.test"]
    upstreams: ["{up}"]
    limits:
      first:
        kind: token_bucket
        key: [header:x-first]
        capacity: 2
        refill: {{ amount: 1, every: 1h }}
"#
    )
}

fn part2(up: std::net::SocketAddr, extra: &str) -> String {
    format!(
        r#"      second:
        kind: token_bucket
        key: [header:x-second]
        capacity: 2
        refill: {{ amount: 1, every: 1h }}
  b:
    hosts: ["b.test"]
    upstreams: ["{up}"]
{extra}"#
    )
}

/// Origin `c`, added by the completed file.
fn origin_c(up: std::net::SocketAddr) -> String {
    format!("  c:\n    hosts: [\"c.test\"]\n    upstreams: [\"{up}\"]\n")
}

fn fill(t: &Tollgate, text: &str) -> String {
    text.replace("{listen}", &t.listen.to_string())
        .replace("{metrics}", &t.metrics.to_string())
}

async fn status(t: &Tollgate, host: &str, header: Option<&str>) -> u16 {
    let mut req = client().get(t.url("/")).header("host", host);
    if let Some(h) = header {
        req = req.header(h, "k");
    }
    req.send().await.expect("request").status().as_u16()
}

async fn reloads(t: &Tollgate, result: &str) -> f64 {
    t.metric(&format!(
        "tollgate_config_reloads_total{{result=\"{result}\"}}"
    ))
    .await
}

/// Waits until the reloader watches the file: an edit made before would go unseen.
async fn reloader_ready(t: &Tollgate) {
    eventually("the reloader is ready", 1_000, || async {
        t.log_text().contains("config reloader ready")
    })
    .await;
}

async fn attempts(t: &Tollgate) -> f64 {
    reloads(t, "success").await + reloads(t, "failure").await
}

/// Background traffic to `b.test` and `a.test`, counting responses by status.
struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    statuses: Arc<Mutex<HashMap<u16, usize>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    fn start(t: &Tollgate) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let statuses = Arc::new(Mutex::new(HashMap::new()));
        let mut workers = Vec::new();
        for host in ["b.test", "a.test"] {
            let (stop, sent, statuses) = (stop.clone(), sent.clone(), statuses.clone());
            let url = t.url("/");
            workers.push(tokio::spawn(async move {
                let c = client();
                // Bounded: at most 20 000 requests per worker, to loopback.
                for _ in 0..20_000 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let code = match c.get(&url).header("host", host).send().await {
                        Ok(r) => r.status().as_u16(),
                        Err(_) => 0,
                    };
                    sent.fetch_add(1, Ordering::SeqCst);
                    *statuses.lock().unwrap().entry(code).or_default() += 1;
                }
            }));
        }
        Traffic {
            stop,
            sent,
            statuses,
            workers,
        }
    }

    /// Waits until `n` more requests were answered: the partial file is given traffic to
    /// hurt, counted in requests rather than in time.
    async fn wait_for(&self, n: usize) {
        let target = self.sent.load(Ordering::SeqCst) + n;
        eventually("traffic flowed", 1_500, || async {
            self.sent.load(Ordering::SeqCst) >= target
        })
        .await;
    }

    async fn finish(self) -> (usize, HashMap<u16, usize>) {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers {
            w.await.unwrap();
        }
        let sent = self.sent.load(Ordering::SeqCst);
        let statuses = self.statuses.lock().unwrap().clone();
        (sent, statuses)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_in_place_write_is_never_applied_half_written() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let full = format!("{}{}", part1(up.addr), part2(up.addr, ""));
    let t = Tollgate::start(&full).await;
    reloader_ready(&t).await;

    // Empty `second`'s bucket for key k: its state must survive the torn write.
    assert_eq!(status(&t, "a.test", Some("x-second")).await, 200);
    assert_eq!(status(&t, "a.test", Some("x-second")).await, 200);
    assert_eq!(status(&t, "a.test", Some("x-second")).await, 429);

    let traffic = Traffic::start(&t);
    traffic.wait_for(200).await;

    // The torn write: truncate and write the first part in place (same inode), flushed,
    // and left there until tollgate has looked at it.
    let before = attempts(&t).await;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&t.config_path)
        .unwrap();
    file.write_all(fill(&t, &part1(up.addr)).as_bytes())
        .unwrap();
    file.sync_all().unwrap();
    drop(file);
    eventually("the partial file was considered", 1_000, || async {
        attempts(&t).await > before
    })
    .await;
    traffic.wait_for(500).await;

    // The second part completes the file, which also adds origin `c`.
    let successes = reloads(&t, "success").await;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&t.config_path)
        .unwrap();
    file.write_all(fill(&t, &part2(up.addr, &origin_c(up.addr))).as_bytes())
        .unwrap();
    file.sync_all().unwrap();
    drop(file);
    eventually("the completed file applied", 1_000, || async {
        reloads(&t, "success").await > successes
    })
    .await;
    assert_eq!(status(&t, "c.test", None).await, 200, "origin c is live");
    traffic.wait_for(200).await;

    let (sent, statuses) = traffic.finish().await;
    let not_found = statuses.get(&404).copied().unwrap_or(0);
    let second = status(&t, "a.test", Some("x-second")).await;
    eprintln!(
        "torn write: {sent} requests, {not_found} got 404, statuses {statuses:?}; `second` after: {second}"
    );
    assert_eq!(
        not_found, 0,
        "requests got 404 during the torn write: {statuses:?}"
    );
    assert_eq!(statuses.get(&200).copied(), Some(sent), "{statuses:?}");
    assert_eq!(
        second, 429,
        "`second` kept its state (its bucket is still empty)"
    );
    let log = t.log_text();
    assert!(
        log.contains("looks like a partly written file"),
        "the refusal is explained:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliberate_removal_applies_by_sighup_and_a_huge_table_never_reaches_the_reloader() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let full = format!("{}{}", part1(up.addr), part2(up.addr, ""));
    let t = Tollgate::start(&full).await;
    reloader_ready(&t).await;
    assert_eq!(status(&t, "b.test", None).await, 200);

    // Removing origin `b` in place: held, and the log says how to apply it.
    let failures = reloads(&t, "failure").await;
    t.write_config(&part1(up.addr));
    eventually("the removal was held", 1_000, || async {
        reloads(&t, "failure").await > failures
    })
    .await;
    assert_eq!(status(&t, "b.test", None).await, 200, "b still serves");
    let log = t.log_text();
    assert!(
        log.contains("removes limit `second` of origin `a`, origin `b`")
            && log.contains("send SIGHUP to apply it as it is"),
        "{log}"
    );

    // SIGHUP applies it deliberately.
    let successes = reloads(&t, "success").await;
    t.signal(libc::SIGHUP);
    eventually("SIGHUP applied the removal", 1_000, || async {
        reloads(&t, "success").await > successes
    })
    .await;
    assert_eq!(status(&t, "b.test", None).await, 404);

    // A table of 2^64 - 1 keys used to panic the reloader thread ("capacity overflow"),
    // after which every later edit and SIGHUP was ignored. It is now an invalid config:
    // a counted failure, and the next edit still applies.
    let failures = reloads(&t, "failure").await;
    t.write_config(&format!(
        "{}        max_keys: 18446744073709551615\n",
        part1(up.addr)
    ));
    eventually("the huge table was refused", 1_000, || async {
        reloads(&t, "failure").await > failures
    })
    .await;
    assert!(
        t.log_text()
            .contains("max_keys: too large: must be at most 16777216, found 18446744073709551615"),
        "{}",
        t.log_text()
    );
    let successes = reloads(&t, "success").await;
    t.write_config(&full);
    eventually("the next edit applied", 1_000, || async {
        reloads(&t, "success").await > successes
    })
    .await;
    assert_eq!(status(&t, "b.test", None).await, 200);
}
