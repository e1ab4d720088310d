//! Issue 2: the inflight limit through the real proxy, a real upstream and a real client.
//! Every end of a request must give its inflight unit back: the exact gauge returns to 0
//! and the full `max` can be held again.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{client, eventually, get_as, Tollgate, Upstream, SERVER};
use reqwest::StatusCode;

fn config(upstreams: &[std::net::SocketAddr], max: u64, extra_origin: &str) -> String {
    let ups: Vec<String> = upstreams.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        r#"
{SERVER}  threads: 2
  trusted_proxies: ["127.0.0.1/32"]
  customer_header: x-customer-id
origins:
  app:
    hosts: ["app.test"]
    upstreams: [{ups}]
    customer: default
    {extra_origin}
    limits:
      conc:
        kind: inflight
        max: {max}
"#,
        ups = ups.join(", ")
    )
}

/// Starts `n` held requests with `customer` and waits until the upstream holds them.
async fn hold(
    t: &Tollgate,
    up: &[&Upstream],
    n: usize,
    customer: &str,
) -> Vec<tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>> {
    let before: usize = up.iter().map(|u| u.held()).sum();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let req = client()
            .get(t.url("/hold"))
            .header("host", "app.test")
            .header("x-customer-id", customer);
        tasks.push(tokio::spawn(req.send()));
    }
    eventually("upstream holds the requests", 500, || async {
        up.iter().map(|u| u.held()).sum::<usize>() == before + n
    })
    .await;
    tasks
}

async fn gauge(t: &Tollgate) -> f64 {
    t.metric("tollgate_inflight_requests{origin=\"app\"}").await
}

async fn assert_drained(t: &Tollgate) {
    eventually("inflight gauge back at 0", 500, || async {
        gauge(t).await == 0.0
    })
    .await;
    assert_eq!(gauge(t).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admits_under_max_and_answers_200() {
    let up = Upstream::start("127.0.0.1", "up1").await;
    let t = Tollgate::start(&config(&[up.addr], 2, "")).await;
    let resp = get_as(&t, "/", "acme").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-upstream"], "up1");
    assert_eq!(resp.headers()["x-seen-forwarded-for"], "127.0.0.1");
    assert_eq!(resp.text().await.unwrap(), "hello from up1\n");
    assert_eq!(up.requests(), 1);
    assert_drained(&t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_above_max_with_503_problem_and_recovers() {
    let up = Upstream::start("127.0.0.1", "up1").await;
    let t = Tollgate::start(&config(&[up.addr], 2, "")).await;
    let held = hold(&t, &[&up], 2, "acme").await;
    assert_eq!(gauge(&t).await, 2.0);

    let resp = get_as(&t, "/", "acme").await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let h = resp.headers().clone();
    assert_eq!(h["retry-after"], "1");
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(h["ratelimit-policy"], "\"conc\";q=2");
    assert_eq!(h["ratelimit"], "\"conc\";r=0;t=1");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
    );
    assert_eq!(body["status"], 503);
    assert_eq!(body["violated-policies"][0], "conc");
    assert_eq!(
        up.requests(),
        2,
        "the rejected request never reached the upstream"
    );

    // Another customer has its own count.
    let other = get_as(&t, "/", "globex").await;
    assert_eq!(other.status(), StatusCode::OK);

    up.release();
    for task in held {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_drained(&t).await;
    // Recovered: the full max can be held again.
    let held = hold(&t, &[&up], 2, "acme").await;
    up.release();
    for task in held {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let m = t.metrics_text().await;
    assert_eq!(
        common::sample(&m, "tollgate_limit_decisions_total{decision=\"rejected\",kind=\"inflight\",limit=\"conc\",origin=\"app\"}"),
        1.0
    );
    t.wait_metric("tollgate_requests_total{code=\"503\",origin=\"app\"}", 1.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_server_ip_has_its_own_count() {
    let a = Upstream::start("127.0.0.1", "a").await;
    let b = Upstream::start("127.0.0.2", "b").await;
    let t = Tollgate::start(&config(&[a.addr, b.addr], 1, "")).await;
    // Round robin sends the two held requests to different servers: with max 1 per
    // (customer, server_ip, host) both are admitted.
    let held = hold(&t, &[&a, &b], 2, "acme").await;
    assert_eq!((a.held(), b.held()), (1, 1));
    // A third lands on a server that already holds one.
    assert_eq!(
        get_as(&t, "/", "acme").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    a.release();
    b.release();
    for task in held {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_drained(&t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_returns_to_zero_after_upstream_5xx_and_connect_failure() {
    let up = Upstream::start("127.0.0.1", "up1").await;
    let t = Tollgate::start(&config(&[up.addr], 1, "")).await;
    let resp = get_as(&t, "/status/500", "acme").await;
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_drained(&t).await;
    drop(t);

    // An upstream port nobody listens on: connect fails, 502.
    let dead = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let t = Tollgate::start(&config(&[dead], 1, "")).await;
    for _ in 0..3 {
        let resp = get_as(&t, "/", "acme").await;
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    }
    assert_drained(&t).await;
    let m = t.metrics_text().await;
    assert_eq!(
        common::sample(&m, "tollgate_limit_decisions_total{decision=\"allowed\",kind=\"inflight\",limit=\"conc\",origin=\"app\"}"),
        3.0,
        "each failed attempt was admitted, so each must have been given back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_returns_to_zero_after_client_abort() {
    let up = Upstream::start("127.0.0.1", "up1").await;
    let t = Tollgate::start(&config(&[up.addr], 1, "")).await;
    let held = hold(&t, &[&up], 1, "acme").await;
    assert_eq!(gauge(&t).await, 1.0);
    // The client gives up: drop its connection while the upstream still holds.
    for task in held {
        task.abort();
    }
    assert_drained(&t).await;
    up.release();
    // The unit came back: max 1 can be held again.
    let held = hold(&t, &[&up], 1, "acme").await;
    up.release();
    for task in held {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_returns_to_zero_after_upstream_timeout() {
    let up = Upstream::start("127.0.0.1", "up1").await;
    let t = Tollgate::start(&config(&[up.addr], 1, "read_timeout: 300ms")).await;
    let resp = get_as(&t, "/hold", "acme").await;
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_drained(&t).await;
    up.release();
    // The unit came back: with max 1, the next request is admitted.
    assert_eq!(get_as(&t, "/", "acme").await.status(), StatusCode::OK);
    assert_drained(&t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_host_is_404_problem() {
    let up = Upstream::start("127.0.0.1", "up1").await;
    let t = Tollgate::start(&config(&[up.addr], 1, "")).await;
    let resp = client()
        .get(t.url("/"))
        .header("host", "nope.test")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["status"], 404);
    assert_eq!(up.requests(), 0);
    t.wait_metric(
        "tollgate_requests_total{code=\"404\",origin=\"_unmatched\"}",
        1.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_without_a_customer_is_its_own_customer() {
    // No `customer`, no trusted customer header: the default inflight key
    // [customer, server_ip, host] still applies, with the origin's name as the customer.
    let up = Upstream::start("127.0.0.1", "up").await;
    let text = format!(
        r#"
{SERVER}defaults:
  limits:
    origin_inflight: {{ kind: inflight, max: 1 }}
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{}"]
"#,
        up.addr
    );
    let t = Tollgate::start(&text).await;
    let held = hold(&t, &[&up], 1, "ignored").await;
    let resp = get_as(&t, "/", "someone-else").await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    up.release();
    for task in held {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}
