//! One key in a Redis store that a script cannot use (another type written over it, data
//! no script wrote) is that key's failure, not the store's: through the real binary, a
//! real `redis-server` and `redis-cli` writing over a bucket's key as an operator would.
//!
//! The key's decisions go to the fallback and are counted as
//! `tollgate_store_requests_total{result="key_error"}`; the key is repaired (deleted, so
//! the next decision starts afresh); the breaker never opens, so `tollgate_store_up`
//! stays 1, no probe runs (`SCRIPT LOAD` stays at 0 once the store is up) and the log
//! says so within its budget. Each test prints the figures it measured over its fixed
//! number of requests (`--nocapture`).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::api;
use crate::common::fleet;
use crate::common::redis as harness;

use api::redis_cli;
use common::{Tollgate, Upstream};
use fleet::{config, requests, status, wait_up, UP};
use harness::RedisServer;
use redis::Value;

/// Requests sent to the broken key in each test.
const REQUESTS: usize = 200;

/// Roomy budget, the default breaker (5 failures), fast probes: were a key's error a
/// store failure, the breaker would open after 5 of them and a probe would follow
/// within 50 ms.
const STORE: &str =
    "timeout: 1s\n    breaker: { failures: 5, probe_every: 50ms }\n    deny_cache: 0";

/// A bucket of 1 000 000 tokens per customer: every request is admitted, by the store or
/// by the fallback. Not leased: these tests count one script call per decision (the
/// exact path), and a hot key's slice would admit with none.
const LIMITS: &str = "      tokens:
        kind: token_bucket
        key: [customer]
        capacity: 1000000
        refill: { amount: 1, every: 1s }
        store: shared
        lease: off";

/// What the run cost Redis and the log.
#[derive(Debug)]
struct Figures {
    script_loads: u64,
    failed_evalsha: u64,
    store_log_lines: usize,
    down_lines: usize,
    down_samples: usize,
    key_errors: f64,
}

/// `calls` or `failed_calls` of one command in `INFO commandstats` (0 when absent).
fn commandstat(redis: &RedisServer, command: &str, field: &str) -> u64 {
    redis
        .info_field("commandstats", &format!("cmdstat_{command}"))
        .and_then(|line| {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn bucket_keys(redis: &RedisServer) -> Vec<String> {
    match redis.cmd(&["KEYS", "tollgate:app:tokens:*"]) {
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("a key, got {other:?}"),
            })
            .collect(),
        other => panic!("KEYS: {other:?}"),
    }
}

fn type_of(redis: &RedisServer, key: &str) -> String {
    match redis.cmd(&["TYPE", key]) {
        Value::SimpleString(s) => s,
        Value::Okay => "ok".to_string(),
        other => panic!("TYPE: {other:?}"),
    }
}

/// Starts tollgate on `redis`, makes `victim`'s bucket exist, lets `corrupt` write over
/// it with `redis-cli`, then sends [`REQUESTS`] requests as `victim`, scraping
/// `tollgate_store_up` after each; returns the figures.
async fn run(redis: &RedisServer, corrupt: impl Fn(&str)) -> (Tollgate, String, Figures) {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, &redis.url(), STORE, LIMITS)).await;
    wait_up(&t).await;
    assert_eq!(status(&t, "victim").await, 200);
    let keys = bucket_keys(redis);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = keys[0].clone();
    corrupt(&key);
    redis.cmd(&["CONFIG", "RESETSTAT"]);
    let lines_before = t.log_text().lines().count();
    let mut down_samples = 0;
    for _ in 0..REQUESTS {
        assert_eq!(status(&t, "victim").await, 200);
        if t.metric(UP).await != 1.0 {
            down_samples += 1;
        }
    }
    let log = t.log_text();
    let new: Vec<&str> = log.lines().skip(lines_before).collect();
    let figures = Figures {
        script_loads: commandstat(redis, "script|load", "calls"),
        failed_evalsha: commandstat(redis, "evalsha", "failed_calls"),
        store_log_lines: new.iter().filter(|l| l.contains("store shared")).count(),
        down_lines: new
            .iter()
            .filter(|l| l.contains("store shared: down"))
            .count(),
        down_samples,
        key_errors: t.metric(&requests("key_error")).await,
    };
    eprintln!("{REQUESTS} requests on a corrupted key: {figures:?}");
    for line in new.iter().filter(|l| l.contains("store shared")).take(3) {
        eprintln!("  {line}");
    }
    (t, key, figures)
}

/// What every corruption must give: the key's decision failed once (a request may have
/// raced the repair: a few), was counted, repaired; nothing else happened to the store.
fn assert_contained(redis: &RedisServer, key: &str, f: &Figures, log: &str) {
    assert_eq!(f.script_loads, 0, "no probe ran: {f:?}\n{log}");
    assert_eq!(f.down_lines, 0, "the breaker never opened: {f:?}\n{log}");
    assert_eq!(f.down_samples, 0, "store_up never left 1: {f:?}");
    assert!(
        (1..=3).contains(&f.failed_evalsha),
        "the key failed, then was repaired: {f:?}"
    );
    assert_eq!(f.key_errors, f.failed_evalsha as f64, "{f:?}");
    assert!(
        (1..=3).contains(&f.store_log_lines),
        "logged within its budget: {f:?}\n{log}"
    );
    assert!(
        log.contains("WRONGTYPE") || log.contains("user_script"),
        "the line says what Redis answered:\n{log}"
    );
    // Repaired: the bucket is Redis's again (a hash), or absent (a full bucket).
    let t = type_of(redis, key);
    assert!(t == "hash" || t == "none", "{key} is a {t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_fails_alone_and_is_repaired() {
    let redis = RedisServer::start();
    let (t, key, f) = run(&redis, |key| {
        assert_eq!(redis_cli(redis.port(), &["SET", key, "oops"]).trim(), "OK");
    })
    .await;
    assert_contained(&redis, &key, &f, &t.log_text());
    // The repaired key decides in Redis again: the store's count moved, not the fallback's.
    let ok = t.metric(&requests("ok")).await;
    assert_eq!(status(&t, "victim").await, 200);
    assert!(t.metric(&requests("ok")).await > ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_data_no_script_wrote_fails_alone_and_is_repaired() {
    let redis = RedisServer::start();
    let (t, key, f) = run(&redis, |key| {
        // Right type, unreadable data: the script fails on it (`attempt to compare nil`).
        assert_eq!(
            redis_cli(redis.port(), &["HSET", key, "t", "lots", "l", "0"]).trim(),
            "0"
        );
    })
    .await;
    assert_contained(&redis, &key, &f, &t.log_text());
}

/// A repair deletes only what tollgate did not write: one tier log of a tiered key
/// overwritten, the key's tier state (a hash of entry times) stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_deletes_only_the_keys_tollgate_did_not_write() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      search:
        kind: tiered
        key: [customer]
        store: shared
        tiers:
          - { limit: 100, window: 1m, active: 10m, cooldown: 0s }
          - { limit: 100, window: 1m, active: 10m, cooldown: 0s }";
    let t = Tollgate::start(&config(up.addr, &redis.url(), STORE, limits)).await;
    wait_up(&t).await;
    assert_eq!(status(&t, "victim").await, 200);
    let key = |kind: &str| match redis.cmd(&["KEYS", &format!("tollgate:app:search:*:{kind}")]) {
        Value::Array(items) if items.len() == 1 => match &items[0] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("a key, got {other:?}"),
        },
        other => panic!("one {kind} key, got {other:?}"),
    };
    let (state, log) = (key("ts"), key("t1"));
    let entered = redis.cmd(&["HGET", &state, "e1"]);
    assert_eq!(redis_cli(redis.port(), &["SET", &log, "oops"]).trim(), "OK");
    assert_eq!(status(&t, "victim").await, 200);
    eventually_deleted(&redis, &log).await;
    assert_eq!(type_of(&redis, &state), "hash");
    assert_eq!(
        redis.cmd(&["HGET", &state, "e1"]),
        entered,
        "tier 1's entry kept"
    );
    assert_eq!(t.metric(&requests("key_error")).await, 1.0);
    assert_eq!(t.metric(UP).await, 1.0);
    // The next decision runs in Redis on the kept state: tier 1 is still the current one.
    assert_eq!(status(&t, "victim").await, 200);
    assert_eq!(type_of(&redis, &log), "zset");
    assert_eq!(redis.cmd(&["HGET", &state, "e1"]), entered);
}

/// Waits (bounded) until the background repair removed `key` (or a decision rewrote it
/// as a sorted set).
async fn eventually_deleted(redis: &RedisServer, key: &str) {
    common::eventually("the repair ran", 250, || async {
        type_of(redis, key) != "string"
    })
    .await;
}
