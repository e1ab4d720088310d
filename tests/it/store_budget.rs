//! The store's budget (`timeout`) bounds a request phase, not each limit: a request whose
//! phase has several limits in a frozen Redis waits one budget for all of them, the
//! limits after the first missed answer being decided by their fallback at once. Through
//! the real binary and a real `redis-server` frozen with SIGSTOP.
//!
//! Not a performance measurement: the bounds are deadlines (a request that waited one
//! budget per limit waits 6 budgets in the first phase alone), with a generous slack for
//! a debug build on a busy machine.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::fleet;
use crate::common::redis as harness;

use std::time::{Duration, Instant};

use common::Upstream;
use fleet::{config, requests, status, wait_up};
use harness::RedisServer;

/// The store's budget: long enough that eight of them (2.4 s, what waiting per limit
/// costs) cannot hide in the slack.
const BUDGET: Duration = Duration::from_millis(300);
/// What a request may take beyond its budgets: proxying, a debug build, timers firing
/// late on a busy machine, the suite's other tests.
const SLACK: Duration = Duration::from_millis(900);

/// The budget above, a breaker that never opens (every call must meet the frozen Redis),
/// the local fallback, no deny cache.
const STORE: &str =
    "timeout: 300ms\n    breaker: { failures: 1000, probe_every: 50ms }\n    deny_cache: 0";

/// Six shared limits decided when the request arrives (token buckets and rates), and two
/// decided once the upstream is picked (inflight).
fn limits() -> String {
    let mut text = String::new();
    for i in 0..3 {
        text.push_str(&format!(
            "      bucket{i}: {{ kind: token_bucket, key: [customer], capacity: 100, refill: {{ amount: 1, every: 1s }}, store: shared }}\n"
        ));
        text.push_str(&format!(
            "      rate{i}: {{ kind: rate, key: [customer], max: 100, per: 1m, store: shared }}\n"
        ));
    }
    for i in 0..2 {
        text.push_str(&format!(
            "      inflight{i}: {{ kind: inflight, key: [customer], max: 100, store: shared }}\n"
        ));
    }
    text
}

const LATENCY_SUM: &str = "tollgate_store_latency_seconds_sum{store=\"shared\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_store_costs_one_budget_per_request_phase() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = common::Tollgate::start(&config(up.addr, &redis.url(), STORE, &limits())).await;
    wait_up(&t).await;
    // Every limit decides in Redis while it answers.
    assert_eq!(status(&t, "alice").await, 200);
    let ok = t.metric(&requests("ok")).await;
    assert!(ok >= 8.0, "eight store calls, got {ok}");

    redis.freeze();
    let waited_before = t.metric(LATENCY_SUM).await;
    let timeouts_before = t.metric(&requests("timeout")).await;
    let started = Instant::now();
    assert_eq!(status(&t, "alice").await, 200, "{}", t.log_text());
    let took = started.elapsed();
    let waited = Duration::from_secs_f64(t.metric(LATENCY_SUM).await - waited_before);
    let timeouts = t.metric(&requests("timeout")).await - timeouts_before;
    redis.thaw();
    eprintln!("8 shared limits in 2 phases, Redis frozen: request {took:?}, store calls waited {waited:?}, {timeouts} timeouts");

    // Two phases: two budgets at most, whatever the number of limits in them. A phase's
    // calls wait together (one pipeline, one round trip per phase): each waits at most
    // its phase's one budget, so their waits add up to one budget per call, not more.
    assert!(
        waited < 8 * BUDGET + SLACK,
        "the store calls waited {waited:?} in all: one budget per phase is {BUDGET:?}"
    );
    assert!(
        took < 2 * BUDGET + SLACK,
        "the request took {took:?}: one budget per phase is {BUDGET:?}"
    );
    // Each limit still counted its missed answer.
    assert_eq!(timeouts, 8.0);
}
