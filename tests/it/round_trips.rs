//! One round trip per request phase: the shared limits a request meets in one phase on
//! one store are decided in one round trip to Redis (their script calls leave in one
//! pipeline), however many there are, with the all-or-nothing meaning of one call after
//! another: what one admitted is given back when another rejects.
//!
//! Round trips are counted by a TCP relay between tollgate and a real `redis-server`
//! (`common::relay`).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::fleet::{config, requests, status, wait_up};
use crate::common::redis::RedisServer;
use crate::common::relay::Relay;
use crate::common::{self, Upstream};

/// Budget roomy for a debug build on a busy machine; no breaker trips; no deny cache (a
/// rejection must reach Redis each time).
const STORE: &str =
    "timeout: 1s\n    breaker: { failures: 1000, probe_every: 50ms }\n    deny_cache: 0";

/// Requests sent, each with a new key.
const REQUESTS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shared_limits_on_cold_keys_cost_one_round_trip_per_phase() {
    let redis = RedisServer::start();
    let relay = Relay::start(([127, 0, 0, 1], redis.port()).into());
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      bucket: { kind: token_bucket, key: [customer], capacity: 100, refill: { amount: 1, every: 1s }, store: shared }\n\
                  \x20     rate: { kind: rate, key: [customer], max: 100, per: 1m, store: shared }\n\
                  \x20     window: { kind: rate, key: [customer], max: 100, per: 1h, store: shared }\n\
                  \x20     local: { kind: rate, key: [customer], max: 100, per: 1m }\n";
    let t = common::Tollgate::start(&config(up.addr, &relay.url(), STORE, limits)).await;
    wait_up(&t).await;
    let calls = t.metric(&requests("ok")).await;
    let before = relay.turns();
    for i in 0..REQUESTS {
        assert_eq!(
            status(&t, &format!("cold-{i}")).await,
            200,
            "{}",
            t.log_text()
        );
    }
    let turns = relay.turns() - before;
    let made = t.metric(&requests("ok")).await - calls;
    eprintln!(
        "{REQUESTS} requests, 3 shared limits each: {made} store calls in {turns} round trips"
    );
    assert_eq!(made, (3 * REQUESTS) as f64, "every limit decided in Redis");
    assert_eq!(
        turns, REQUESTS,
        "one round trip per request phase, not one per limit"
    );
}

/// The sum of the counts in a rate's hash in Redis (current and previous periods).
fn rate_count(redis: &RedisServer, limit: &str) -> i64 {
    let key = match redis.cmd(&["KEYS", &format!("tollgate:app:{limit}:*:rate")]) {
        redis::Value::Array(keys) if keys.len() == 1 => match &keys[0] {
            redis::Value::BulkString(k) => String::from_utf8_lossy(k).into_owned(),
            other => panic!("key {other:?}"),
        },
        other => panic!("one key for {limit}: {other:?}"),
    };
    match redis.cmd(&["HGETALL", &key]) {
        redis::Value::Array(kv) => kv
            .chunks(2)
            .filter_map(|pair| match pair {
                [redis::Value::BulkString(f), redis::Value::BulkString(v)]
                    if f.starts_with(b"c") =>
                {
                    String::from_utf8_lossy(v).parse::<i64>().ok()
                }
                _ => None,
            })
            .sum(),
        other => panic!("HGETALL {key}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_in_the_round_trip_gives_back_the_others_admissions() {
    let redis = RedisServer::start();
    let relay = Relay::start(([127, 0, 0, 1], redis.port()).into());
    let up = Upstream::start("127.0.0.1", "up").await;
    // `second` admits one request an hour; `first` and `third` are roomy.
    let limits = "      first: { kind: rate, key: [customer], max: 100, per: 1h, store: shared, lease: off }\n\
                  \x20     second: { kind: rate, key: [customer], max: 1, per: 1h, store: shared, lease: off }\n\
                  \x20     third: { kind: rate, key: [customer], max: 100, per: 1h, store: shared, lease: off }\n";
    let t = common::Tollgate::start(&config(up.addr, &relay.url(), STORE, limits)).await;
    wait_up(&t).await;
    assert_eq!(status(&t, "bob").await, 200);
    assert_eq!(rate_count(&redis, "first"), 1);
    let before = relay.turns();
    for _ in 0..3 {
        assert_eq!(status(&t, "bob").await, 429, "{}", t.log_text());
    }
    // Each rejected request: one round trip for its decisions (the refunds follow apart).
    assert!(relay.turns() - before >= 3);
    // `first` admitted each and was refunded; `third` admitted each too and was given back
    // uncounted (the loop, one call after another, would not have reached it).
    let refunded = "tollgate_limit_decisions_total{decision=\"refunded\",kind=\"rate\",limit=\"first\",origin=\"app\"}";
    t.wait_metric(refunded, 3.0).await;
    let rejected = "tollgate_limit_decisions_total{decision=\"rejected\",kind=\"rate\",limit=\"second\",origin=\"app\"}";
    assert_eq!(t.metric(rejected).await, 3.0);
    let third = "tollgate_limit_decisions_total{decision=\"refunded\",kind=\"rate\",limit=\"third\",origin=\"app\"}";
    assert_eq!(t.metric(third).await, 0.0);
    // The counts in Redis come back to the one admitted request.
    common::eventually("the refunds reach Redis", 200, || async {
        rate_count(&redis, "first") == 1 && rate_count(&redis, "third") == 1
    })
    .await;
}
