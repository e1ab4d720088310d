//! The limiter API served by the real binary beside the proxy: `redis-cli` talks to
//! `server.limiter_api` and gets `RL.REDUCE`'s answers, and SIGTERM closes it with the rest.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::{free_port, Tollgate, Upstream, SERVER};

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (Debian's redis-tools; make test installs it)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_reduces_a_bucket_through_the_real_binary() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let api = free_port();
    let config = format!(
        "{SERVER}  limiter_api: \"127.0.0.1:{api}\"\napi:\n  max_keys: 1000\norigins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"{}\"]\n",
        up.addr
    );
    let mut t = Tollgate::start(&config).await;
    common::eventually("the limiter API answers", 250, || async {
        std::net::TcpStream::connect(("127.0.0.1", api)).is_ok()
    })
    .await;
    let replies: Vec<String> = (0..3)
        .map(|_| redis_cli(api, &["RL.REDUCE", "TwoPerMin", "2", "60"]))
        .collect();
    assert_eq!(replies, ["2", "1", "0"]);
    assert_eq!(redis_cli(api, &["PING"]), "PONG");
    let metrics = t.metrics_text().await;
    assert!(
        metrics.contains("tollgate_api_commands_total{command=\"rl.reduce\",result=\"ok\"} 2"),
        "{metrics}"
    );
    // The proxy beside it is unaffected.
    let resp = common::client()
        .get(t.url("/"))
        .header("host", "app.test")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    t.signal(libc::SIGTERM);
    let status = tokio::task::block_in_place(|| t.child.wait()).unwrap();
    assert!(status.success() || status.code().is_some(), "{status:?}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", api)).is_err());
}
