//! Tiered, concurrency and sliding-log limits shared by real tollgate processes through a
//! real `redis-server` (free loopback port), with a real upstream and real HTTP clients.
//!
//! - Two instances share a concurrency limit (key max, global, a bulkhead group) exactly,
//!   a sliding-log cap exactly, and burst tiers.
//! - An instance killed with SIGKILL while holding concurrency copies: its share is gone
//!   after one lease.
//! - Redis frozen (SIGSTOP) while traffic runs through all three kinds: no 5xx, every
//!   answer within the budget plus slack, the fallback decides, Redis decides again once
//!   thawed.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::fleet;
use crate::common::redis as harness;

use std::time::{Duration, Instant};

use common::{eventually, Tollgate, Upstream};
use fleet::{
    assert_no_5xx_within, burst, config, fleet, hold, hold_admitted, no_fallback, status, wait_up,
    Traffic, FALLBACK, ROOMY, SHARED, UP,
};
use harness::RedisServer;

/// A concurrency limit: 3 per customer, 5 in all, and `bigco` in a group of 2.
fn concurrency(store_line: &str) -> String {
    format!(
        "      slots:
        kind: concurrency
        key: [customer]
        max: 3
        global: 5
        groups:
          - {{ name: big, members: {{ customer: [bigco] }}, max: 2 }}
{store_line}"
    )
}

async fn held(up: &Upstream, n: usize) {
    eventually(&format!("{n} requests held upstream"), 500, || async {
        up.held() == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_a_concurrency_limit_with_a_group_exactly() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let all = fleet(
        2,
        &config(up.addr, &redis.url(), ROOMY, &concurrency(SHARED)),
    )
    .await;
    // acme holds 3 through both instances: its max, whichever instance it asks.
    let mut holds = vec![
        hold(&all[0], "acme"),
        hold(&all[1], "acme"),
        hold(&all[0], "acme"),
    ];
    held(&up, 3).await;
    for t in &all {
        assert_eq!(status(t, "acme").await, 503, "acme's 4th");
    }
    // bigco's group holds 2 across the fleet.
    holds.push(hold(&all[1], "bigco"));
    holds.push(hold(&all[0], "bigco"));
    held(&up, 5).await;
    assert_eq!(status(&all[1], "bigco").await, 503, "the bulkhead");
    // 5 in all: the global limit turns away everyone else.
    assert_eq!(status(&all[0], "other").await, 503, "the global limit");
    // The gauges count each instance's copies: they sum to the fleet's.
    let mut sum = 0.0;
    for t in &all {
        sum += t
            .metric("tollgate_concurrency_in_use{group=\"_all\",limit=\"slots\",origin=\"app\"}")
            .await;
    }
    assert_eq!(sum, 5.0);
    up.release();
    for h in holds {
        assert_eq!(h.await.unwrap(), Some(200));
    }
    // Every copy given back, on both instances and in Redis.
    for t in &all {
        assert_eq!(status(t, "bigco").await, 200);
        assert_eq!(status(t, "other").await, 200);
    }
    no_fallback(&all).await;
    eventually("Redis holds no copies", 200, || async {
        let keys = match redis.cmd(&["KEYS", "tollgate:app:slots:*"]) {
            redis::Value::Array(k) => k.len(),
            other => panic!("{other:?}"),
        };
        keys == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_a_sliding_log_cap_exactly() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = format!(
        "      caps:
        kind: sliding_log
        key: [customer]
        windows: [{{ max: 7, per: 1d }}, {{ max: 20, per: 7d }}]
{SHARED}"
    );
    let all = fleet(2, &config(up.addr, &redis.url(), ROOMY, &limits)).await;
    let statuses = burst(&all, "acme", 10).await;
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(ok, 7, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429));
    // Rejected by either instance, with the day's Retry-After; other customers pass.
    for t in &all {
        let r = fleet::get(t, "/", "acme").await;
        assert_eq!(r.status(), 429);
        let retry: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((86_390..=86_400).contains(&retry), "retry-after {retry}");
        assert_eq!(status(t, "other").await, 200);
    }
    no_fallback(&all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_burst_tiers() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = format!(
        "      tiers:
        kind: tiered
        key: [customer]
        headers: always
        tiers:
          - {{ limit: 4, window: 1m, active: 1h, cooldown: 0s }}
          - {{ limit: 2, window: 1m, active: 10m, cooldown: 1h }}
{SHARED}"
    );
    let all = fleet(2, &config(up.addr, &redis.url(), ROOMY, &limits)).await;
    let mut policies = Vec::new();
    for i in 0..8 {
        let r = fleet::get(&all[i % 2], "/", "acme").await;
        let policy = r.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .to_string();
        policies.push((r.status().as_u16(), policy));
    }
    let want: Vec<(u16, &str)> = [(200, "q=4"); 4]
        .into_iter()
        .chain([(200, "q=2"), (200, "q=2"), (429, "q=2"), (429, "q=2")])
        .collect();
    for ((got, policy), (status, q)) in policies.iter().zip(&want) {
        assert_eq!(got, status, "{policies:?}");
        assert!(policy.contains(q), "{policies:?}");
    }
    // Each instance counts the entries it caused: summed, tier 1 once, tier 2 once.
    let mut entries = [0.0, 0.0];
    for t in &all {
        for (tier, e) in entries.iter_mut().enumerate() {
            *e += t
                .metric(&format!(
                    "tollgate_tier_entries_total{{limit=\"tiers\",origin=\"app\",tier=\"{}\"}}",
                    tier + 1
                ))
                .await;
        }
    }
    assert_eq!(entries, [1.0, 1.0]);
    no_fallback(&all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_killed_holding_concurrency_copies_loses_them_after_one_lease() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let store = "timeout: 1s\n    breaker: { failures: 1000, probe_every: 50ms }\n    lease: 2s";
    let mut all = fleet(
        2,
        &config(up.addr, &redis.url(), store, &concurrency(SHARED)),
    )
    .await;
    // Instance 0 holds 2 of acme's copies and 1 of bigco's; instance 1 holds 2 more: the
    // global limit of 5 is reached.
    let mut dying = vec![
        hold(&all[0], "acme"),
        hold(&all[0], "acme"),
        hold(&all[0], "bigco"),
    ];
    held(&up, 3).await;
    let living = vec![hold(&all[1], "acme"), hold(&all[1], "umbrella")];
    held(&up, 5).await;
    assert_eq!(status(&all[1], "other").await, 503, "the global limit");
    // SIGKILL instance 0: no release is ever sent for its 3 copies.
    all[0].signal(libc::SIGKILL);
    let _ = all[0].child.wait();
    let killed = Instant::now();
    assert_eq!(status(&all[1], "other").await, 503, "share gone at once");
    eventually("the dead instance's copies expire", 400, || async {
        status(&all[1], "bigco").await == 200
    })
    .await;
    let after = killed.elapsed();
    // Renewed every lease / 3: the last renewal was at most 2/3 s before the kill.
    assert!(after >= Duration::from_millis(1000), "gone after {after:?}");
    // Instance 1 holds 2: exactly 3 more fit in all, then the global limit again. The
    // probe's own copy goes back to Redis in the background after its response, so a
    // request sent at once may still find it there: each is retried until held.
    let mut extra = Vec::new();
    for (n, who) in [(3, "acme"), (4, "acme"), (5, "x")] {
        extra.push(hold_admitted(&all[1], &up, who, n).await);
    }
    assert_eq!(status(&all[1], "y").await, 503, "full again at 5");
    up.release();
    for h in living.into_iter().chain(extra) {
        assert_eq!(h.await.unwrap(), Some(200));
    }
    let ends: Vec<Option<u16>> = futures(dying.drain(..)).await;
    assert!(ends.iter().all(Option::is_none), "{ends:?}");
    let _ = all.remove(0);
}

async fn futures(
    handles: impl Iterator<Item = tokio::task::JoinHandle<Option<u16>>>,
) -> Vec<Option<u16>> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_frozen_fails_open_within_the_budget_for_every_kind() {
    const BUDGET: Duration = Duration::from_millis(25);
    // As in fleet_faults: a loaded machine's scheduling; it catches a hang.
    const SLACK: Duration = Duration::from_secs(3);
    let store = "timeout: 25ms\n    breaker: { failures: 3, probe_every: 100ms }\n    fallback: allow\n    deny_cache: 0";
    let limits = format!(
        "      caps:
        kind: sliding_log
        key: [customer]
        windows: [{{ max: 100000, per: 1d }}]
        max_keys: 100
        store: shared
        overrides:
          - match: {{ customer: capped }}
            windows: [{{ max: 1, per: 1d }}]
      tiers:
        kind: tiered
        key: [customer]
        tiers:
          - {{ limit: 100000, window: 1m, active: 1h, cooldown: 0s }}
        max_keys: 100
        store: shared
{}",
        concurrency(SHARED)
            .replace("max: 3\n", "max: 100\n")
            .replace("global: 5", "global: 1000")
    );
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, &redis.url(), store, &limits)).await;
    wait_up(&t).await;
    // `capped` is at its cap, decided by Redis.
    assert_eq!(status(&t, "capped").await, 200);
    assert_eq!(status(&t, "capped").await, 429);
    let load = Traffic::start(&[t.url("/")], "load", 2, Duration::from_secs(60));
    load.more(20).await;
    redis.freeze();
    t.wait_metric(UP, 0.0).await;
    let before = t.metric(FALLBACK).await;
    load.more(20).await;
    // Three shared limits per request, each decided by its fallback.
    assert!(t.metric(FALLBACK).await >= before + 30.0);
    assert_eq!(status(&t, "capped").await, 200, "fail open");
    redis.thaw();
    let back = Instant::now();
    while status(&t, "capped").await != 429 {
        assert!(
            back.elapsed() < Duration::from_millis(1500),
            "not enforced again:\n{}",
            t.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    load.more(20).await;
    let seen = load.stop().await;
    assert_no_5xx_within(&seen, BUDGET, SLACK, "frozen");
    assert!(seen.iter().all(|s| s.status == 200), "only 200s for `load`");
}
