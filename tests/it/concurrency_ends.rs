//! A `kind: concurrency` limit with a `global` count and a group, through the real proxy:
//! every end of a request gives its copy back to the key, the global count and the group
//! exactly once (upstream 5xx, connect failure, client abort, upstream read timeout), so
//! `tollgate_concurrency_in_use` returns to 0 and, with every max at 1, the next request
//! is admitted (a copy kept by mistake would turn it into a 503).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{eventually, get_as, hold_as, Tollgate, Upstream, SERVER};
use reqwest::StatusCode;

/// One origin whose concurrency limit allows one copy per customer, one in all, and one
/// to the group `big` (acme is a member).
fn config(up: std::net::SocketAddr, extra_origin: &str) -> String {
    format!(
        r#"
{SERVER}  trusted_proxies: ["127.0.0.1/32"]
  customer_header: x-customer-id
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
    {extra_origin}
    limits:
      uploads:
        kind: concurrency
        key: [customer]
        max: 1
        global: 1
        groups:
          - {{ name: big, members: {{ customer: [acme] }}, max: 1 }}
"#
    )
}

fn in_use(group: &str) -> String {
    format!("tollgate_concurrency_in_use{{group=\"{group}\",limit=\"uploads\",origin=\"app\"}}")
}

/// Both gauges (every copy, and the group's) are back at 0.
async fn assert_drained(t: &Tollgate) {
    eventually("concurrency gauges back at 0", 500, || async {
        t.metric(&in_use("_all")).await == 0.0 && t.metric(&in_use("big")).await == 0.0
    })
    .await;
}

/// A held request from acme, once the upstream holds it and both gauges count it.
async fn hold(
    t: &Tollgate,
    up: &Upstream,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let task = hold_as(t, up, "acme").await;
    assert_eq!(t.metric(&in_use("_all")).await, 1.0);
    assert_eq!(t.metric(&in_use("big")).await, 1.0);
    task
}

fn allowed() -> &'static str {
    "tollgate_limit_decisions_total{decision=\"allowed\",kind=\"concurrency\",limit=\"uploads\",origin=\"app\"}"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_come_back_after_an_upstream_5xx() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, "")).await;
    for _ in 0..3 {
        let resp = get_as(&t, "/status/500", "acme").await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_drained(&t).await;
    }
    // The next request is admitted: with every max at 1, no copy was kept.
    assert_eq!(get_as(&t, "/", "acme").await.status(), StatusCode::OK);
    assert_drained(&t).await;
    t.wait_metric(allowed(), 4.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_come_back_after_a_connect_failure() {
    // An upstream port nobody listens on: connect fails, 502.
    let dead = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let t = Tollgate::start(&config(dead, "connect_timeout: 300ms")).await;
    // Each attempt is admitted (a kept copy would make the next one a 503) and fails.
    for _ in 0..3 {
        assert_eq!(
            get_as(&t, "/", "acme").await.status(),
            StatusCode::BAD_GATEWAY
        );
        assert_drained(&t).await;
    }
    t.wait_metric(allowed(), 3.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_come_back_after_a_client_abort() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, "")).await;
    let held = hold(&t, &up).await;
    // While it is held, acme and everyone else are refused (key, group, global).
    for who in ["acme", "globex"] {
        assert_eq!(
            get_as(&t, "/", who).await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    // The client gives up while the upstream still holds the request.
    held.abort();
    assert_drained(&t).await;
    up.release();
    // The copy came back: acme can hold one again.
    let held = hold(&t, &up).await;
    up.release();
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_drained(&t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_come_back_after_an_upstream_read_timeout() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, "read_timeout: 300ms")).await;
    let resp = get_as(&t, "/hold", "acme").await;
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_drained(&t).await;
    up.release();
    // The copy came back: with every max at 1, the next request is admitted.
    assert_eq!(get_as(&t, "/", "acme").await.status(), StatusCode::OK);
    assert_drained(&t).await;
    t.wait_metric(allowed(), 2.0).await;
}
