//! Issue 4: graceful shutdown (SIGTERM) finishes in-flight requests within
//! `server.grace_period`, and the zero-downtime upgrade (`--upgrade` + SIGQUIT) hands the
//! listeners to a new process without refusing connections.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::{client, eventually, spawn, Tollgate, Upstream};

fn config(up: std::net::SocketAddr) -> String {
    format!(
        r#"
server:
  listen: ["{{listen}}"]
  metrics: "{{metrics}}"
  grace_period: 2s
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
"#
    )
}

async fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    for _ in 0..1500 {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("process did not exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_held_request_finish() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let mut t = Tollgate::start(&config(up.addr)).await;
    let held = tokio::spawn(
        client()
            .get(t.url("/hold"))
            .header("host", "app.test")
            .send(),
    );
    eventually("held", 500, || async { up.held() == 1 }).await;
    t.signal(libc::SIGTERM);
    // Let the process see the signal, then let the request complete inside the grace period.
    eventually("shutdown started", 500, || async {
        t.log_text().contains("Graceful shutdown")
    })
    .await;
    up.release();
    let resp = held.await.unwrap().expect("held request completed");
    assert_eq!(resp.status(), 200);
    let status = wait_exit(&mut t.child).await;
    assert!(status.success(), "exit {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_hands_listeners_to_the_new_process() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let mut old = Tollgate::start(&config(up.addr)).await;
    let sock = old.dir.path().join("upgrade.sock");
    let get = |url: String| async move {
        client()
            .get(url)
            .header("host", "app.test")
            .send()
            .await
            .map(|r| r.status().as_u16())
    };
    assert_eq!(get(old.url("/")).await.unwrap(), 200);

    // The new process waits on the upgrade socket for the old one's listeners.
    let mut new = spawn(&old.config_path, &sock, true);
    eventually("new process listens on the upgrade socket", 500, || async {
        sock.exists()
    })
    .await;
    old.signal(libc::SIGQUIT);
    let status = wait_exit(&mut old.child).await;
    assert!(status.success(), "old exit {status}");
    // The old process is gone; the same address is served by the new one.
    let mut ok = false;
    for _ in 0..1_500 {
        if let Ok(200) = get(old.url("/")).await {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = new.kill();
    let _ = new.wait();
    assert!(ok, "the new process never answered on the old address");
}
