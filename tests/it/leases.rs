//! Issue 22, leases at the binary level: real tollgate processes sharing a token bucket
//! or a rate through a real `redis-server` (ephemeral port), a real upstream, h2load and
//! reqwest clients.
//!
//! - Three instances drive one hot key of a token bucket far past its limit: they admit
//!   at most capacity + refill × elapsed, and nearly that.
//! - The same for a rate: at most its max in a period, and every count Redis gave out
//!   admitted or held (`tollgate_store_leased`).
//! - A steady hot key costs a small number of store calls per second whatever its rate
//!   (counted in Redis's `INFO commandstats`; at most 0.05 a request here, 0.004 at
//!   700 requests a second); `lease: off` costs one per request.
//! - Redis killed mid-run: no 5xx, then recovery once it is back.
//! - A reload that changes the lease settings gives the slices back: Redis's count of the
//!   rate's period falls back to exactly what was admitted.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::common::fleet::{self, assert_no_5xx_within, config, fleet, wait_up, Traffic, ROOMY};
use crate::common::h2load::{self, Summary};
use crate::common::redis::RedisServer;
use crate::common::{eventually, Tollgate, Upstream};

/// A limit `name` of `kind` keyed by customer in the shared store, with `body` (indented
/// by 8) and `lease`.
fn limit(name: &str, body: &str, lease: &str) -> String {
    format!(
        "      {name}:\n        key: [customer]\n{body}        store: shared\n        lease: {lease}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_on_one_hot_bucket_admit_at_most_its_limit_and_nearly_all_of_it() {
    // The refill is well under what three debug builds serve on a loaded 2-core machine
    // (about 200 requests a second in all), so the load stays past the limit for the
    // whole run and an unused refill never lowers what could be admitted. A slice is at
    // most 1% of 300 = 3 tokens: what three instances can hold unspent (9) is under the
    // 3% the lower bound allows of the ~400 the run admits (measured: 98.9-99.7%, beside
    // `stress-ng --cpu 2` too).
    const CAPACITY: f64 = 300.0;
    const REFILL: f64 = 30.0; // a second
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let body = "        kind: token_bucket\n        capacity: 300\n        refill: { amount: 3, every: 100ms }\n";
    let limits = limit("tokens", body, "{ max_share: 1% }");
    let text = config(up.addr, &redis.url(), ROOMY, &limits);
    let all = fleet(3, &text).await;
    let started = Instant::now();
    let runs: Vec<_> = all
        .iter()
        .map(|t| {
            let t = t.url("/");
            std::thread::spawn(move || {
                h2load::run(&[
                    "--h1",
                    "-n",
                    "3000",
                    "-c",
                    "4",
                    "-H",
                    ":authority: app.test",
                    "-H",
                    "x-customer-id: acme",
                    &t,
                ])
            })
        })
        .collect();
    let runs: Vec<Summary> = runs.into_iter().map(|r| r.join().unwrap()).collect();
    let elapsed = started.elapsed().as_secs_f64();
    let ok: u64 = runs.iter().map(|s| s.ok).sum();
    let too_many: u64 = runs.iter().map(|s| s.too_many).sum();
    for s in &runs {
        assert_eq!(
            (s.unavailable, s.errored, s.done),
            (0, 0, 3000),
            "{}",
            s.text
        );
    }
    let bound = CAPACITY + REFILL * elapsed;
    let offered = (ok + too_many) as f64;
    eprintln!(
        "bucket: admitted {ok} of a bound {bound:.0} in {elapsed:.2} s ({:.1}%), offered {offered}",
        100.0 * ok as f64 / bound
    );
    assert!(
        offered > 2.0 * bound,
        "offered {offered}, bound {bound}: too little load"
    );
    assert!(ok as f64 <= bound.ceil(), "admitted {ok} > {bound}");
    assert!(
        ok as f64 >= 0.97 * bound,
        "admitted {ok}, below 97% of {bound}"
    );
    // Leases were taken and the decisions came from Redis, none from a fallback.
    for t in &all {
        assert_eq!(t.metric(fleet::FALLBACK).await, 0.0, "{}", t.log_text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_on_one_hot_rate_admit_at_most_its_max_and_account_for_every_count() {
    // One period a day: the max is what the period admits. 9000 offered for 2000.
    const MAX: u64 = 2_000;
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let body = "        kind: rate\n        max: 2000\n        per: 1d\n";
    let limits = limit("per_day", body, "{ max_share: 5% }");
    let all = fleet(3, &config(up.addr, &redis.url(), ROOMY, &limits)).await;
    let runs: Vec<_> = all
        .iter()
        .map(|t| {
            let url = t.url("/");
            std::thread::spawn(move || {
                h2load::run(&[
                    "--h1",
                    "-n",
                    "3000",
                    "-c",
                    "4",
                    "-H",
                    ":authority: app.test",
                    "-H",
                    "x-customer-id: acme",
                    &url,
                ])
            })
        })
        .collect();
    let runs: Vec<Summary> = runs.into_iter().map(|r| r.join().unwrap()).collect();
    let ok: u64 = runs.iter().map(|s| s.ok).sum();
    for s in &runs {
        assert_eq!(
            (s.unavailable, s.errored, s.done),
            (0, 0, 3000),
            "{}",
            s.text
        );
    }
    eprintln!(
        "rate: admitted {ok} of {MAX} ({:.1}%)",
        100.0 * ok as f64 / MAX as f64
    );
    assert!(ok <= MAX, "admitted {ok} > {MAX}");
    // Every count Redis gave out is admitted or still held in a slice (the gauges).
    let gauge = "tollgate_store_leased{limit=\"per_day\",origin=\"app\",store=\"shared\"}";
    eventually("Redis's count = admitted + held", 500, || async {
        let mut held = 0;
        for t in &all {
            held += t.metric(gauge).await as u64;
        }
        period_count(&redis) == ok + held
    })
    .await;
    assert!(
        ok as f64 >= 0.97 * MAX as f64,
        "admitted {ok}, far below {MAX}"
    );
}

/// Store calls per request of `requests` for one hot key at `lease`, and the requests'
/// summary.
async fn calls_per_request(lease: &str, requests: u64) -> (f64, Summary, Tollgate, RedisServer) {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let body = "        kind: rate\n        max: 1000000\n        per: 1d\n";
    let text = config(up.addr, &redis.url(), ROOMY, &limit("per_day", body, lease));
    let t = Tollgate::start(&text).await;
    wait_up(&t).await;
    let before = redis.script_calls();
    let s = tokio::task::block_in_place(|| h2load::as_acme(&t.url("/"), requests, 8));
    assert_eq!((s.ok, s.done), (requests, requests), "{}", s.text);
    let calls = redis.script_calls() - before;
    (calls as f64 / requests as f64, s, t, redis)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steady_hot_key_costs_a_few_calls_a_second_and_lease_off_one_a_request() {
    // A slice lasts about renew_every at the key's local rate, so a key costs about
    // 1.3 / renew_every takes a second (renewed at the low-water mark, a quarter left):
    // 0.01 per request from about 1300 requests a second at the default 100 ms, and from
    // about 260 a second at 500 ms, below what a debug build on a shared 2-core machine
    // serves (the first slices, while the key's rate is learnt, add a few calls). A rate's
    // slice also ends with its period, so the period is a day here.
    let (leased, s, t, _redis) = calls_per_request("{ renew_every: 500ms }", 8_000).await;
    let rate = t
        .metric("tollgate_store_lease_calls_total{result=\"granted\",store=\"shared\"}")
        .await;
    eprintln!(
        "lease auto: {leased:.4} store calls per request, {rate} slices granted\n{}",
        s.text
    );
    assert!(rate > 0.0, "slices were granted");
    // The calls a leased key makes are per second, not per request (about 1.3 /
    // renew_every, plus a few while its rate is learnt), so calls per request depend on
    // the request rate the machine serves: 0.004 at about 700 a second, 0.014 at about
    // 250 beside a build. The bound here (0.05, a twentieth of `lease: off`'s one a
    // request) holds down to about 50 requests a second; the 0.01 target is a
    // benchmark's figure (docs/fleet.md).
    assert!(leased <= 0.05, "{leased} calls per request with leases");
    let (exact, s, _, _) = calls_per_request("off", 3_000).await;
    eprintln!("lease off: {exact:.4} store calls per request\n{}", s.text);
    assert!(
        (0.99..=1.01).contains(&exact),
        "{exact} calls per request with lease: off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_run_no_5xx_and_recovery() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let body = "        kind: rate\n        max: 1000000\n        per: 1s\n";
    let store = "timeout: 50ms\n    breaker: { failures: 3, probe_every: 50ms }\n    lease: 1s";
    let text = config(
        up.addr,
        &redis.url(),
        store,
        &limit("per_second", body, "auto"),
    );
    let t = Tollgate::start(&text).await;
    wait_up(&t).await;
    let traffic = Traffic::start(&[t.url("/")], "acme", 4, Duration::from_secs(60));
    let granted = "tollgate_store_lease_calls_total{result=\"granted\",store=\"shared\"}";
    eventually("a slice granted", 500, || async {
        t.metric(granted).await > 0.0
    })
    .await;
    traffic.more(200).await;
    redis.kill();
    // Slices held, then the fallback, admit.
    eventually("the fallback decides", 500, || async {
        t.metric(fleet::FALLBACK).await > 0.0
    })
    .await;
    traffic.more(300).await;
    redis.restart();
    wait_up(&t).await;
    let before = t.metric(granted).await;
    eventually("slices again", 500, || async {
        t.metric(granted).await > before
    })
    .await;
    traffic.more(200).await;
    let seen = traffic.stop().await;
    assert_no_5xx_within(
        &seen,
        Duration::from_secs(2),
        Duration::from_secs(3),
        "leases",
    );
    assert!(
        seen.iter().all(|s| s.status == 200),
        "all admitted: a roomy limit"
    );
}

/// The count of the rate's current period in Redis (`c` of its one key).
fn period_count(redis: &RedisServer) -> u64 {
    let keys = match redis.cmd(&["KEYS", "tollgate:app:*"]) {
        redis::Value::Array(v) => v,
        other => panic!("KEYS: {other:?}"),
    };
    assert_eq!(keys.len(), 1, "one key: {keys:?}");
    let key = match &keys[0] {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
        other => panic!("{other:?}"),
    };
    match redis.cmd(&["HGET", &key, "c"]) {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).parse().unwrap(),
        other => panic!("HGET: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_that_changes_the_lease_gives_the_slices_back() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    // One period a day, and slices never idle here: only the reload gives them back.
    let body = "        kind: rate\n        max: 1000000\n        per: 1d\n";
    let with = |lease: &str| config(up.addr, &redis.url(), ROOMY, &limit("per_day", body, lease));
    let t = Tollgate::start(&with("{ idle: 1h, max_share: 5% }")).await;
    wait_up(&t).await;
    let s = tokio::task::block_in_place(|| h2load::as_acme(&t.url("/"), 4_000, 4));
    assert_eq!(s.ok, 4_000, "{}", s.text);
    let gauge = "tollgate_store_leased{limit=\"per_day\",origin=\"app\",store=\"shared\"}";
    // Redis counts the admitted and the held (the gauge follows within a sweep).
    eventually("the gauge shows the slice Redis counts", 500, || async {
        let held = t.metric(gauge).await as u64;
        held > 0 && period_count(&redis) == 4_000 + held
    })
    .await;
    let reloads = "tollgate_config_reloads_total{result=\"success\"}";
    let before = t.metric(reloads).await;
    t.write_config(&with("off"));
    t.signal(libc::SIGHUP);
    eventually("reloaded", 500, || async {
        t.metric(reloads).await > before
    })
    .await;
    eventually("the slices are back in Redis", 500, || async {
        period_count(&redis) == 4_000
    })
    .await;
    assert_eq!(t.metric(gauge).await, 0.0);
    // Exact from now on: one more request, one more count.
    assert_eq!(fleet::status(&t, "acme").await, 200);
    assert_eq!(period_count(&redis), 4_001);
}
