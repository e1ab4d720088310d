//! Charon's limits through the real proxy: burst tiers with the headers of the current
//! tier, exact concurrency with a group (bulkhead), the kill switch, and the unmatched
//! origin that records unconfigured traffic.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{client, eventually, get_as, Tollgate, Upstream, SERVER};
use reqwest::StatusCode;

fn config(up: std::net::SocketAddr, server: &str, limits: &str) -> String {
    format!(
        r#"
{SERVER}  trusted_proxies: ["127.0.0.1/32"]
  customer_header: x-customer-id
{server}origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
    limits:
{limits}
"#
    )
}

fn decisions(limit: &str, kind: &str, decision: &str) -> String {
    format!(
        "tollgate_limit_decisions_total{{decision=\"{decision}\",kind=\"{kind}\",limit=\"{limit}\",origin=\"app\"}}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tier_bursts_into_the_next_and_the_headers_follow_the_tier() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      search:
        kind: tiered
        key: [customer]
        headers: always
        tiers:
          - { limit: 2, window: 1m, active: 10m, cooldown: 0s }
          - { limit: 1, window: 1m, active: 5m, cooldown: 1h }
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    let first = get_as(&t, "/", "acme").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["ratelimit-policy"], "\"search\";q=2;w=60");
    assert_eq!(get_as(&t, "/", "acme").await.status(), StatusCode::OK);
    // Tier 1's window is full: the third bursts into tier 2, whose limit is 1.
    let burst = get_as(&t, "/", "acme").await;
    assert_eq!(burst.status(), StatusCode::OK);
    assert_eq!(burst.headers()["ratelimit-policy"], "\"search\";q=1;w=60");
    // Tier 2 is full and there is no tier 3: rejected, described by tier 2.
    let rejected = get_as(&t, "/", "acme").await;
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        rejected.headers()["ratelimit-policy"],
        "\"search\";q=1;w=60"
    );
    let retry: u64 = rejected.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    // Another customer starts in tier 1.
    assert_eq!(get_as(&t, "/", "other").await.status(), StatusCode::OK);
    let entries = |tier: u32| {
        format!("tollgate_tier_entries_total{{limit=\"search\",origin=\"app\",tier=\"{tier}\"}}")
    };
    t.wait_metric(&entries(2), 1.0).await;
    assert_eq!(t.metric(&entries(1)).await, 2.0, "two keys entered tier 1");
    assert_eq!(up.requests(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_caps_its_members_together_and_holds_are_exact() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      uploads:
        kind: concurrency
        key: [customer]
        max: 2
        groups:
          - { name: big, members: { customer: [bigco, hugeco] }, max: 1 }
"#;
    let t = Tollgate::start(&config(up.addr, "", limits)).await;
    let hold = |customer: &'static str| {
        let req = client()
            .get(t.url("/hold"))
            .header("host", "app.test")
            .header("x-customer-id", customer);
        tokio::spawn(req.send())
    };
    let big = hold("bigco");
    eventually("bigco's request is held", 500, || async { up.held() == 1 }).await;
    // The group's one copy is taken: hugeco, another member, gets 503.
    let refused = get_as(&t, "/", "hugeco").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    // A customer outside the group has its own two copies.
    let small = [hold("small"), hold("small")];
    eventually("small's two requests are held", 500, || async {
        up.held() == 3
    })
    .await;
    assert_eq!(
        get_as(&t, "/", "small").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let gauge = |group: &str| {
        format!("tollgate_concurrency_in_use{{group=\"{group}\",limit=\"uploads\",origin=\"app\"}}")
    };
    assert_eq!(t.metric(&gauge("big")).await, 1.0);
    assert_eq!(t.metric(&gauge("_all")).await, 3.0);
    up.release();
    assert_eq!(big.await.unwrap().unwrap().status(), StatusCode::OK);
    for h in small {
        assert_eq!(h.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    // Every copy came back exactly once.
    t.wait_metric(&gauge("_all"), 0.0).await;
    assert_eq!(t.metric(&gauge("big")).await, 0.0);
    assert_eq!(get_as(&t, "/", "hugeco").await.status(), StatusCode::OK);
    t.wait_metric(&decisions("uploads", "concurrency", "rejected"), 2.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_above_global_is_lowered_to_it_everywhere() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = r#"
      uploads:
        kind: concurrency
        key: [customer]
        max: 5
        global: 2
        groups:
          - { name: big, members: { customer: [bigco] }, max: 9 }
          - { name: small, members: { customer: [tinyco] }, max: 1 }
"#;
    let text = config(up.addr, "", limits);
    let t = Tollgate::start(&text).await;
    // `check` warns at each lowered field and prints the lowered values.
    let check = |effective: bool| {
        let mut cmd = std::process::Command::new(common::binary());
        cmd.arg("check");
        if effective {
            cmd.arg("--print-effective");
        }
        let out = cmd.arg("--config").arg(&t.config_path).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (out, err) = check(false);
    let all = format!("{out}{err}");
    for warning in [
        "origins.app.limits.uploads.max: warning: max 5 is above global 2: lowered to 2, as all keys together hold at most 2 copies",
        "origins.app.limits.uploads.groups[0].max: warning: group `big` max 9 is above global 2: lowered to 2, as all keys together hold at most 2 copies",
    ] {
        assert!(all.contains(warning), "{all}");
    }
    assert!(!all.contains("groups[1].max: warning"), "{all}");
    let (effective, _) = check(true);
    assert!(!effective.contains("max: 9"), "{effective}");
    assert!(!effective.contains("max: 5"), "{effective}");
    assert!(effective.contains("max: 2"), "{effective}");
    // The gauges an alert compares in_use with show the lowered maxes.
    let max = |group: &str| {
        format!("tollgate_concurrency_max{{group=\"{group}\",limit=\"uploads\",origin=\"app\"}}")
    };
    assert_eq!(t.metric(&max("big")).await, 2.0);
    assert_eq!(t.metric(&max("small")).await, 1.0);
    assert_eq!(t.metric(&max("_all")).await, 2.0);
    // And the runtime holds bigco to them: its third request is refused by the global count.
    let hold = || {
        let req = client()
            .get(t.url("/hold"))
            .header("host", "app.test")
            .header("x-customer-id", "bigco");
        tokio::spawn(req.send())
    };
    let held = [hold(), hold()];
    eventually("bigco's two requests are held", 500, || async {
        up.held() == 2
    })
    .await;
    let in_use = "tollgate_concurrency_in_use{group=\"big\",limit=\"uploads\",origin=\"app\"}";
    assert_eq!(t.metric(in_use).await, 2.0);
    assert_eq!(
        get_as(&t, "/", "bigco").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    up.release();
    for h in held {
        assert_eq!(h.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    t.wait_metric(in_use, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_turns_rejections_into_grants_counted_as_shadow() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      per_client: { kind: rate, max: 1, per: 1h }\n";
    let t = Tollgate::start(&config(up.addr, "  kill_switch: true\n", limits)).await;
    for _ in 0..3 {
        assert_eq!(get_as(&t, "/", "acme").await.status(), StatusCode::OK);
    }
    t.wait_metric(&decisions("per_client", "rate", "shadow_rejected"), 2.0)
        .await;
    assert_eq!(t.metric("tollgate_kill_switch").await, 1.0);
    assert_eq!(
        t.metric(&decisions("per_client", "rate", "rejected")).await,
        0.0
    );
    // Off again by a reload: the limit bites.
    t.write_config(&config(up.addr, "", limits));
    eventually("the reload switched it off", 250, || async {
        t.metric("tollgate_kill_switch").await == 0.0
    })
    .await;
    assert_eq!(
        get_as(&t, "/", "acme").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfigured_hosts_can_go_to_the_unmatched_origin() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let text = format!(
        r#"
{SERVER}defaults:
  unmatched:
    upstreams: ["{}"]
    limits:
      record: {{ kind: rate, max: 1, per: 1h, mode: shadow }}
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{}"]
"#,
        up.addr, up.addr
    );
    let t = Tollgate::start(&text).await;
    for _ in 0..3 {
        let resp = client()
            .get(t.url("/"))
            .header("host", "somewhere-else.test")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let shadow = "tollgate_limit_decisions_total{decision=\"shadow_rejected\",kind=\"rate\",limit=\"record\",origin=\"_unmatched\"}";
    t.wait_metric(shadow, 2.0).await;
    t.wait_metric(
        "tollgate_requests_total{code=\"200\",origin=\"_unmatched\"}",
        3.0,
    )
    .await;
    assert_eq!(up.requests(), 3);
}
