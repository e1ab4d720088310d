//! Issue 3 through the real proxy: 429s with every header, recovery after refill, shadow
//! mode, overrides, the no-burn rule, cost headers and X-Forwarded-For spoofing.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{client, Tollgate, Upstream, SERVER};
use reqwest::StatusCode;

fn config(up: std::net::SocketAddr, trusted: &str, limits: &str) -> String {
    format!(
        r#"
{SERVER}  trusted_proxies: [{trusted}]
  customer_header: x-customer-id
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
    customer: default
    limits:
{limits}
"#
    )
}

async fn send(t: &Tollgate, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client().get(t.url("/")).header("host", "app.test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("request through tollgate")
}

async fn statuses(t: &Tollgate, n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(send(t, headers).await.status().as_u16());
    }
    out
}

fn decisions(limit: &str, kind: &str, decision: &str) -> String {
    format!(
        "tollgate_limit_decisions_total{{decision=\"{decision}\",kind=\"{kind}\",limit=\"{limit}\",origin=\"app\"}}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_429_carries_every_header_and_recovers_after_retry_after() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      tokens:
        kind: token_bucket
        key: [client_ip]
        capacity: 2
        refill: { amount: 1, every: 2s }
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    assert_eq!(statuses(&t, 2, &[]).await, vec![200, 200]);
    let resp = send(&t, &[]).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = resp.headers().clone();
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "retry-after {retry}");
    assert_eq!(h["ratelimit-policy"], "\"tokens\";q=2;w=4");
    assert_eq!(
        h["ratelimit"].to_str().unwrap(),
        format!("\"tokens\";r=0;t={retry}")
    );
    assert_eq!(h["content-type"], "application/problem+json");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"][0], "tokens");
    assert_eq!(up.requests(), 2);

    // Waiting as long as Retry-After says is enough.
    tokio::time::sleep(std::time::Duration::from_secs(retry)).await;
    assert_eq!(send(&t, &[]).await.status(), StatusCode::OK);
    assert_eq!(
        t.metric(&decisions("tokens", "token_bucket", "rejected"))
            .await,
        1.0
    );
    assert_eq!(
        t.metric(&decisions("tokens", "token_bucket", "allowed"))
            .await,
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_rejects_over_max_and_headers_always_reports_admissions() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      per_client:
        kind: rate
        key: [client_ip]
        max: 3
        per: 1m
        headers: always
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    let first = send(&t, &[]).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        first.headers()["ratelimit-policy"],
        "\"per_client\";q=3;w=60"
    );
    assert!(first.headers()["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"per_client\";r=2;t="));
    assert_eq!(statuses(&t, 3, &[]).await, vec![200, 200, 429]);
    let resp = send(&t, &[]).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=120).contains(&retry), "retry-after {retry}");
    assert_eq!(
        t.metric(&decisions("per_client", "rate", "rejected")).await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_lets_everything_through_and_counts() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      probe:
        kind: token_bucket
        capacity: 1
        refill: { amount: 1, every: 1h }
        mode: shadow
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    assert_eq!(statuses(&t, 4, &[]).await, vec![200; 4]);
    assert_eq!(
        t.metric(&decisions("probe", "token_bucket", "allowed"))
            .await,
        1.0
    );
    assert_eq!(
        t.metric(&decisions("probe", "token_bucket", "shadow_rejected"))
            .await,
        3.0
    );
    assert!(t.log_text().contains("shadow: limit `probe`"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_give_matching_customers_their_own_bucket() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      tokens:
        kind: token_bucket
        key: [customer]
        capacity: 1
        refill: { amount: 1, every: 1h }
        overrides:
          - match: { customer: bigco }
            capacity: 3
          - match: { customer: blocked }
            capacity: 0
"#;
    let t = Tollgate::start(&config(up.addr, "\"127.0.0.1/32\"", limits)).await;
    let small = [("x-customer-id", "small")];
    let big = [("x-customer-id", "bigco")];
    let blocked = [("x-customer-id", "blocked")];
    assert_eq!(statuses(&t, 2, &small).await, vec![200, 429]);
    assert_eq!(statuses(&t, 4, &big).await, vec![200, 200, 200, 429]);
    // A deliberate block does not invite retries: no Retry-After.
    let resp = send(&t, &blocked).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().get("retry-after").is_none(), "{resp:?}");
    assert_eq!(resp.headers()["ratelimit"], "\"tokens\";r=0;t=0");
    // Requests without the header fall back to the origin's customer, its own bucket.
    assert_eq!(statuses(&t, 2, &[]).await, vec![200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_rejections_writes_a_few_log_lines() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      per_client:
        kind: rate
        max: 1
        per: 1h
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    let start = std::time::Instant::now();
    let got = statuses(&t, 41, &[]).await;
    assert_eq!(got.iter().filter(|&&c| c == 429).count(), 40);
    t.wait_metric(&decisions("per_client", "rate", "rejected"), 40.0)
        .await;
    // The allowance is per second of the clock: the run touches at most ⌈elapsed⌉ + 1 of
    // them, however slowly a busy machine ran it.
    let seconds = start.elapsed().as_secs_f64().ceil() as u64 + 1;
    let lines = t
        .log_text()
        .lines()
        .filter(|l| l.contains("rejected 429: origin `app` limit `per_client`"))
        .count() as u64;
    // At most five lines a second (each second spanned may start a new allowance).
    assert!(
        (1..=5 * seconds).contains(&lines) && lines < 40,
        "{lines} lines in {seconds}s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_header_is_believed_only_from_a_trusted_proxy() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      per_customer:
        kind: token_bucket
        key: [customer]
        capacity: 2
        refill: { amount: 1, every: 1h }
        overrides:
          - match: { customer: vip }
            capacity: 100
          - match: { customer: blocked }
            capacity: 0
"#;
    // The test client (127.0.0.1) is not a trusted proxy: a header it invents changes
    // nothing. It cannot escape its bucket, claim an override, or be mistaken for another.
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    let spoofs = ["vip", "a", "b", "c", "blocked"];
    let got: Vec<u16> = {
        let mut got = Vec::new();
        for s in spoofs {
            got.extend(statuses(&t, 1, &[("x-customer-id", s)]).await);
        }
        got
    };
    assert_eq!(
        got,
        vec![200, 200, 429, 429, 429],
        "all one customer: the origin's"
    );
    drop(t);
    // From a trusted proxy the header is the customer.
    let t = Tollgate::start(&config(up.addr, "\"127.0.0.1/32\"", limits)).await;
    assert_eq!(
        statuses(&t, 3, &[("x-customer-id", "vip")]).await,
        vec![200; 3]
    );
    assert_eq!(
        statuses(&t, 1, &[("x-customer-id", "blocked")]).await,
        vec![429]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_rejection_does_not_burn_earlier_tokens() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      outer:
        kind: token_bucket
        key: [client_ip]
        capacity: 5
        refill: { amount: 1, every: 1h }
      inner:
        kind: token_bucket
        key: [header:x-api-key]
        capacity: 1
        refill: { amount: 1, every: 1h }
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    let keyed = [("x-api-key", "k1")];
    // 1 admitted by both, then `inner` rejects 3: `outer` must still hold 4 tokens.
    assert_eq!(statuses(&t, 4, &keyed).await, vec![200, 429, 429, 429]);
    // Without the header `inner` is skipped: exactly 4 more pass `outer`.
    assert_eq!(statuses(&t, 5, &[]).await, vec![200, 200, 200, 200, 429]);
    // The fifth was rejected by `outer` before `inner` ran: 4 skips.
    assert_eq!(
        t.metric(&decisions("inner", "token_bucket", "skipped"))
            .await,
        4.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inflight_rejection_refunds_request_time_tokens() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      tokens:
        kind: token_bucket
        key: [client_ip]
        capacity: 3
        refill: { amount: 1, every: 1h }
      conc:
        kind: inflight
        max: 1
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    let held = tokio::spawn(
        client()
            .get(t.url("/hold"))
            .header("host", "app.test")
            .send(),
    );
    common::eventually("request held", 500, || async { up.held() == 1 }).await;
    // Two 503s while one is held: their tokens must come back.
    assert_eq!(statuses(&t, 2, &[]).await, vec![503, 503]);
    up.release();
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
    // 3 tokens, 1 used by the held request: 2 left.
    assert_eq!(statuses(&t, 3, &[]).await, vec![200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_header_is_clamped_and_garbage_is_400() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      tokens:
        kind: token_bucket
        capacity: 10
        refill: { amount: 1, every: 1h }
        cost: header:x-cost
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    assert_eq!(statuses(&t, 1, &[("x-cost", "7")]).await, vec![200]);
    assert_eq!(statuses(&t, 1, &[("x-cost", "4")]).await, vec![429]);
    // Not a positive integer: 400, and nothing is charged ("0" too: it is not a cost).
    for garbage in ["lots", "0", "-1", "1.5", ""] {
        let bad = send(&t, &[("x-cost", garbage)]).await;
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST, "x-cost {garbage:?}");
    }
    // Any positive integer clamps to capacity, 2^64 as well as 2^64 - 1: 429, not 400.
    for huge in ["18446744073709551615", "18446744073709551616"] {
        assert_eq!(statuses(&t, 1, &[("x-cost", huge)]).await, vec![429]);
    }
    // 3 tokens remain, so three cost-1 requests pass.
    assert_eq!(
        statuses(&t, 4, &[("x-cost", "1")]).await,
        vec![200, 200, 200, 429]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_forwarded_for_from_an_untrusted_peer_changes_nothing() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      per_client:
        kind: rate
        key: [client_ip]
        max: 1
        per: 1h
"#;
    // The test client (127.0.0.1) is not trusted: its X-Forwarded-For is ignored.
    let t = Tollgate::start(&config(up.addr, "\"10.0.0.0/8\"", limits)).await;
    assert_eq!(
        statuses(&t, 1, &[("x-forwarded-for", "1.1.1.1")]).await,
        vec![200]
    );
    assert_eq!(
        statuses(&t, 1, &[("x-forwarded-for", "2.2.2.2")]).await,
        vec![429]
    );
    drop(t);

    // Trusted: each forwarded client has its own window; a spoofed left-most hop does not
    // help, because the right-most untrusted hop is the client.
    let t = Tollgate::start(&config(up.addr, "\"127.0.0.1/32\"", limits)).await;
    assert_eq!(
        statuses(&t, 1, &[("x-forwarded-for", "1.1.1.1")]).await,
        vec![200]
    );
    assert_eq!(
        statuses(&t, 1, &[("x-forwarded-for", "2.2.2.2")]).await,
        vec![200]
    );
    assert_eq!(
        statuses(&t, 1, &[("x-forwarded-for", "9.9.9.9, 2.2.2.2")]).await,
        vec![429]
    );
    assert_eq!(
        statuses(&t, 1, &[("x-forwarded-for", "not an ip")]).await,
        vec![400]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_bucket_table_evicts_and_says_so() {
    let up = Upstream::start("127.0.0.1", "up").await;
    // max_keys 8: one set of 8 slots. Ten keys that each spend a token need ten slots.
    let limits = r#"
      tokens:
        kind: token_bucket
        key: [header:x-k]
        capacity: 2
        refill: { amount: 1, every: 1h }
        max_keys: 8
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    for i in 0..10 {
        let k = format!("k{i}");
        assert_eq!(statuses(&t, 1, &[("x-k", k.as_str())]).await, vec![200]);
    }
    assert_eq!(
        t.metric(
            "tollgate_limit_evictions_total{kind=\"token_bucket\",limit=\"tokens\",origin=\"app\"}"
        )
        .await,
        2.0
    );
    // Still exact for a key that kept its slot: k9 has one token left.
    assert_eq!(statuses(&t, 2, &[("x-k", "k9")]).await, vec![200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_can_set_its_own_cost() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      tokens:
        kind: token_bucket
        key: [customer]
        capacity: 4
        refill: { amount: 1, every: 1h }
        overrides:
          - match: { customer: heavy }
            cost: 2
"#;
    let t = Tollgate::start(&config(up.addr, "\"127.0.0.1/32\"", limits)).await;
    let heavy = [("x-customer-id", "heavy")];
    assert_eq!(statuses(&t, 3, &heavy).await, vec![200, 200, 429]);
    assert_eq!(statuses(&t, 5, &[]).await, vec![200, 200, 200, 200, 429]);
}
