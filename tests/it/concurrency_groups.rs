//! Charon's groups with absolute expectations through the real proxy: a probation group
//! whose members are a segment of customer IDs (`of: customer`, a roaring file built by
//! `tollgate segment build`) shares one copy, and a blacklist group of `max: 0` refuses its
//! members always, without inviting a retry. A rebuilt segment file moves the membership.
//! The blacklist is also refused without a retry invitation when the limit is shared
//! through a real `redis-server` (free loopback port).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::fleet;
use crate::common::redis as harness;

use common::{build_segment, eventually, get_as, hold_as, Tollgate, Upstream, SERVER};
use reqwest::StatusCode;

type Held = tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>;

/// Lets every held request answer, each with 200.
async fn finish(up: &Upstream, held: Vec<Held>) {
    up.release();
    for h in held {
        assert_eq!(h.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

fn in_use(group: &str) -> String {
    format!("tollgate_concurrency_in_use{{group=\"{group}\",limit=\"uploads\",origin=\"app\"}}")
}

/// A 503 that invites a retry in one second.
fn assert_busy(resp: &reqwest::Response, who: &str) {
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{who}");
    assert_eq!(resp.headers()["retry-after"], "1", "{who}");
}

/// A 503 that invites no retry: the customer is blocked.
fn assert_blocked(resp: &reqwest::Response) {
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        resp.headers().get("retry-after").is_none(),
        "a block invites no retry: {:?}",
        resp.headers()
    );
    assert_eq!(resp.headers()["ratelimit"], "\"uploads\";r=0;t=0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probation_shares_one_copy_a_blacklist_is_always_refused_and_a_rebuilt_segment_moves_members(
) {
    let up = Upstream::start("127.0.0.1", "up").await;
    let seg_dir = tempfile::tempdir().unwrap();
    let segment = seg_dir.path().join("probation.roaring");
    build_segment(seg_dir.path(), &[7, 42], &segment);
    let config = format!(
        r#"
{SERVER}  trusted_proxies: ["127.0.0.1/32"]
  customer_header: x-customer-id
segments:
  probation: {{ file: "{}", of: customer }}
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{}"]
    limits:
      uploads:
        kind: concurrency
        key: [customer]
        max: 5
        global: 3
        groups:
          - {{ name: probation, members: {{ segment: probation }}, max: 1 }}
          - {{ name: blacklist, members: {{ customer: ["13", "666"] }}, max: 0 }}
"#,
        segment.display(),
        up.addr
    );
    let t = Tollgate::start(&config).await;

    // A blacklisted customer is refused with nothing held, without a retry invitation.
    assert_blocked(&get_as(&t, "/", "13").await);

    // Probation member 7 holds the group's one copy: its second concurrent request, and
    // member 42's, are refused; a non-member passes with copies of its own.
    let mut held = vec![hold_as(&t, &up, "7").await];
    assert_eq!(t.metric(&in_use("probation")).await, 1.0);
    assert_busy(&get_as(&t, "/", "7").await, "7, second");
    assert_busy(&get_as(&t, "/", "42").await, "42, same group");
    held.push(hold_as(&t, &up, "8").await);
    assert_eq!(t.metric(&in_use("_all")).await, 2.0);
    assert_eq!(t.metric(&in_use("probation")).await, 1.0);

    // The global count is full now: a non-member is told to retry, a blacklisted customer
    // still is not (it never could pass), whichever limit was found full first.
    held.push(hold_as(&t, &up, "9").await);
    assert_busy(&get_as(&t, "/", "10").await, "10, global full");
    assert_blocked(&get_as(&t, "/", "666").await);
    assert_eq!(t.metric(&in_use("blacklist")).await, 0.0);
    finish(&up, held).await;
    t.wait_metric(&in_use("_all"), 0.0).await;
    assert_eq!(t.metric(&in_use("probation")).await, 0.0);
    // With everything free, the blacklist is still refused.
    assert_blocked(&get_as(&t, "/", "13").await);

    // The rebuilt file is picked up live: 7 leaves probation, 8 joins it.
    build_segment(seg_dir.path(), &[8, 42], &segment);
    let reloads = "tollgate_config_reloads_total{result=\"success\"}";
    eventually("the rebuilt segment is loaded", 500, || async {
        t.metric(reloads).await >= 1.0
    })
    .await;
    let mut held = vec![hold_as(&t, &up, "8").await];
    assert_eq!(t.metric(&in_use("probation")).await, 1.0);
    assert_busy(&get_as(&t, "/", "8").await, "8, now on probation");
    held.push(hold_as(&t, &up, "7").await);
    held.push(hold_as(&t, &up, "7").await);
    assert_eq!(t.metric(&in_use("probation")).await, 1.0, "7 is out");
    assert_eq!(t.metric(&in_use("_all")).await, 3.0);
    finish(&up, held).await;
    t.wait_metric(&in_use("_all"), 0.0).await;
    let rejected = "tollgate_limit_decisions_total{decision=\"rejected\",kind=\"concurrency\",limit=\"uploads\",origin=\"app\"}";
    t.wait_metric(rejected, 7.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_blacklist_never_invites_a_retry_even_when_the_global_count_is_full() {
    let redis = harness::RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      uploads:
        kind: concurrency
        key: [customer]
        max: 5
        global: 2
        groups:
          - { name: blacklist, members: { customer: [\"13\"] }, max: 0 }
        store: shared
";
    let text = fleet::config(up.addr, &redis.url(), fleet::ROOMY, limits);
    let t = Tollgate::start(&text).await;
    fleet::wait_up(&t).await;
    assert_blocked(&get_as(&t, "/", "13").await);
    // The global count full (Redis checks it before the groups): still no retry for 13.
    let held = vec![hold_as(&t, &up, "8").await, hold_as(&t, &up, "8").await];
    assert_busy(&get_as(&t, "/", "9").await, "9, global full");
    assert_blocked(&get_as(&t, "/", "13").await);
    finish(&up, held).await;
    assert_eq!(get_as(&t, "/", "9").await.status(), StatusCode::OK);
    assert_blocked(&get_as(&t, "/", "13").await);
    fleet::no_fallback(std::slice::from_ref(&t)).await;
}
