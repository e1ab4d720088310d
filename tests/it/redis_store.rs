//! The Redis store against real `redis-server` processes (started by the harness on free
//! loopback ports; no mock of Redis anywhere).
//!
//! - One table of token-bucket, rate and inflight cases runs against the in-process
//!   limiters and the Redis scripts, with time driven by `at`: same inputs, same verdicts.
//! - Two stores (two proxies) share one bucket exactly.
//! - Key lifetimes at Redis TIME: a drained bucket's PTTL is the time until it is full
//!   again (full == absent), a rate key's the end of the next period.
//! - Faults while calls run: every call returns within its budget + 50 ms (a deadline,
//!   not a performance measurement), the breaker opens, the fallback decides, and the
//!   store comes back by itself once Redis does (polled, bounded).
//! - Inflight leases: a store that disappears while holding units loses them after one
//!   lease.
//! - Redis Cluster: sharing works, and the keys of one limit key share one slot.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::redis as harness;

mod concurrency;
mod lease;
mod lease_cases;
mod shared_kinds;
mod sliding_log;
mod tiered;

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{BlackHole, RedisCluster, RedisServer};
use tollgate::limits::{
    InflightLimiter, Nanos, RateLimiter, RateParams, SketchSize, TokenBucket, TokenBucketParams,
    Verdict, NEVER,
};
use tollgate::metrics::StoreMetrics;
use tollgate::store::{
    Endpoint, Fallback, KeyNames, RedisStore, RedisStoreConfig, SharedInflight, SharedRate,
    SharedTokenBucket, Source, StoreError, Variant,
};

const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000 * MS;
const DAY: Nanos = 86_400 * SEC;

/// A µs instant in Redis's clock that is a whole number of every window the cases use
/// (100 ms, 1 s, 7 s, 1 day), so that periods line up with the local limiter's, which
/// starts at 0.
const BASE_US: u64 = 604_800 * 2_811 * 1_000_000;

/// The generous deadline of a call under faults: budget + 250 ms (with `stress-ng --cpu 2`
/// beside a full run a 5 ms call took 64 ms; a call waiting on a frozen Redis takes
/// seconds).
const SLACK: Duration = Duration::from_millis(250);

/// A store config with a roomy budget: most tests check semantics, and a debug build on
/// a busy 2-core machine can miss 5 ms (with `stress-ng --cpu 2` beside a full run, a read
/// missed 250 ms once, a write 1 s). Fault tests use the default budget ([`fast`]).
fn config(endpoint: Endpoint) -> RedisStoreConfig {
    let mut c = RedisStoreConfig::new("shared", endpoint);
    c.tuning.probe_every = Duration::from_millis(50);
    c.tuning.timeout = Duration::from_secs(5);
    c
}

fn standalone(url: &str) -> RedisStoreConfig {
    config(Endpoint::Standalone(url.to_string()))
}

/// [`standalone`] with background calls (refunds, reads) given 1 s, their most: for the
/// tests that compare every reply with the local limiter, where a loaded machine missing
/// the 50 ms a probe interval of 50 ms leaves them (seen under `stress-ng`) is noise, and
/// a refund cannot be asked again (it may have been applied).
fn semantics(url: &str) -> RedisStoreConfig {
    let mut c = standalone(url);
    c.tuning.probe_every = Duration::from_secs(1);
    c
}

/// The default 5 ms budget, for the fault tests.
fn fast(url: &str) -> RedisStoreConfig {
    let mut c = standalone(url);
    c.tuning.timeout = Duration::from_millis(5);
    assert_eq!(
        c.tuning.timeout,
        RedisStoreConfig::new("x", Endpoint::Standalone(String::new()))
            .tuning
            .timeout
    );
    c
}

fn start(config: RedisStoreConfig) -> (RedisStore, StoreMetrics) {
    let metrics = StoreMetrics::unregistered(&config.name).unwrap();
    let store = RedisStore::new(config, metrics.clone()).unwrap();
    (store, metrics)
}

/// A shared concurrency limiter's fleet-wide totals. The read is a background call, whose
/// budget is the probe's (50 ms in these tests): a loaded machine can miss it, so a
/// timeout is asked again (for at most 30 s).
async fn fleet_totals(l: &tollgate::store::SharedConcurrency) -> Vec<u64> {
    let started = Instant::now();
    loop {
        match l.fleet_totals().await {
            Ok(totals) => return totals,
            Err(StoreError::Timeout) if started.elapsed() < Duration::from_secs(30) => {}
            Err(e) => panic!("fleet totals: {e:?}"),
        }
    }
}

async fn start_up(config: RedisStoreConfig) -> (RedisStore, StoreMetrics) {
    let (store, metrics) = start(config);
    assert!(
        store.wait_up(Duration::from_secs(5)).await,
        "store never came up"
    );
    (store, metrics)
}

fn names(store: &RedisStore, limit: &str) -> KeyNames {
    store.names("shop", limit, Variant::Base)
}

fn bucket(capacity: u64, amount: u64, every: Nanos, strict: bool) -> TokenBucketParams {
    TokenBucketParams {
        capacity,
        amount,
        every,
        strict,
    }
}

fn at(now: Nanos) -> Option<u64> {
    Some(BASE_US + now / 1_000)
}

/// A tiny deterministic generator for the randomized table rows.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---------------------------------------------------------------------------------------
// The shared table: the same cases against the local limiters and the Redis scripts.

/// One step of a token-bucket case: at `t`, take `cost`, or refund it.
#[derive(Debug, Clone, Copy)]
enum Step {
    Take(Nanos, u64),
    Refund(Nanos, u64),
}

fn bucket_cases() -> Vec<(TokenBucketParams, Vec<Step>)> {
    use Step::*;
    let mut cases = vec![
        // New keys start full; discrete refills; a refill clock that keeps its phase.
        (
            bucket(5, 2, SEC, false),
            vec![
                Take(0, 5),
                Take(SEC - 1_000, 1),
                Take(SEC, 1),
                Take(SEC + SEC / 2, 1),
                Take(2 * SEC, 3),
                Take(2 * SEC, 1),
                Take(5 * SEC, 0),
            ],
        ),
        // Strict: a hammering client stays blocked until it pauses a whole interval.
        (
            bucket(2, 1, SEC, true),
            vec![
                Take(0, 2),
                Take(SEC / 2, 1),
                Take(SEC, 1),
                Take(3 * SEC / 2, 1),
                Take(2 * SEC, 1),
                Take(5 * SEC / 2, 1),
                Take(3 * SEC, 1),
                Take(7 * SEC / 2, 1),
                Take(9 * SEC / 2 - 1_000, 1),
                Take(11 * SEC / 2 - 1_000, 1),
            ],
        ),
        // Cost above the tokens, and above the capacity.
        (
            bucket(10, 2, SEC, false),
            vec![
                Take(0, 7),
                Take(600 * MS, 8),
                Take(600 * MS, 11),
                Take(SEC, 3),
            ],
        ),
        // Refunds, capped at capacity, and of a full key.
        (
            bucket(4, 1, SEC, false),
            vec![
                Take(0, 3),
                Refund(0, 2),
                Take(0, 4),
                Refund(SEC, 5),
                Take(SEC, 4),
                Refund(3 * SEC, 3),
                Take(3 * SEC, 2),
            ],
        ),
        // The local limiter's retry_after cases.
        (
            bucket(5, 1, SEC, false),
            vec![Take(0, 5), Take(300 * MS, 1)],
        ),
        (
            bucket(5, 2, SEC, false),
            vec![Take(0, 4), Take(1500 * MS, 3), Take(1700 * MS, 4)],
        ),
        (
            bucket(8, 3, 100 * MS, true),
            vec![Take(0, 8), Take(50 * MS, 1), Take(70 * MS, 7)],
        ),
        (
            bucket(3, 1, DAY, false),
            vec![Take(5_000, 3), Take(10 * SEC, 3)],
        ),
        (
            bucket(10, 10, SEC, true),
            vec![Take(0, 10), Take(999 * MS, 1), Take(999 * MS, 10)],
        ),
    ];
    // Randomized rows, like the local proptests: times in thousandths of `every`.
    let mut rng = Rng(0x5eed_1234_5678_9abc);
    for _ in 0..40 {
        let every = [MS, 7 * MS, SEC, 100 * MS][rng.below(4) as usize];
        let p = bucket(
            1 + rng.below(11),
            1 + rng.below(4),
            every,
            rng.below(2) == 1,
        );
        let mut now = 0;
        let steps = (0..1 + rng.below(40))
            .map(|_| {
                now += rng.below(3_000) * every / 1_000 / 1_000 * 1_000;
                let cost = rng.below(p.capacity + 2);
                if rng.below(4) == 0 {
                    Refund(now, cost)
                } else {
                    Take(now, cost)
                }
            })
            .collect();
        cases.push((p, steps));
    }
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_table_matches_the_local_limiter() {
    let redis = RedisServer::start();
    let (store, _) = start_up(semantics(&redis.url())).await;
    let n = names(&store, "tb");
    for (case, (p, steps)) in bucket_cases().into_iter().enumerate() {
        let local = TokenBucket::new(p, 16);
        let key = 1_000 + case as u64;
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Step::Take(now, cost) => {
                    let want = local.acquire(key, cost, now);
                    let got = store
                        .token_bucket_many(&n, key, &p, cost, cost, at(now))
                        .await
                        .unwrap()
                        .verdict;
                    assert_eq!(got, want, "case {case} step {i} {step:?} {p:?}");
                    let (tokens, _) = store.token_bucket_get(&n, key, &p, at(now)).await.unwrap();
                    assert_eq!(
                        tokens,
                        local.state(key, now).0,
                        "case {case} step {i} (get)"
                    );
                }
                Step::Refund(now, cost) => {
                    local.refund(key, cost, now);
                    let tokens = store
                        .token_bucket_refund(&n, key, &p, cost, at(now))
                        .await
                        .unwrap();
                    assert_eq!(
                        tokens,
                        local.state(key, now).0,
                        "case {case} step {i} {step:?}"
                    );
                }
            }
        }
    }
    // A full bucket is absent: no key is left behind by buckets that refilled.
    let key = n.key(1_000, tollgate::store::StateKind::TokenBucket);
    assert_eq!(redis.cmd(&["EXISTS", &key]), redis::Value::Int(0));
}

/// A rate case: (per, max, strict, steps of (t, cost)).
type RateCase = (Nanos, u64, bool, Vec<(Nanos, u64)>);

fn rate_cases() -> Vec<RateCase> {
    let mut cases: Vec<RateCase> = vec![
        (
            SEC,
            3,
            false,
            vec![(0, 1), (MS, 1), (2 * MS, 1), (3 * MS, 1), (10 * MS, 1)],
        ),
        (
            SEC,
            10,
            false,
            [
                (0, 10),
                (SEC + SEC / 2, 6),
                (SEC + 9 * SEC / 10, 5),
                (2 * SEC + SEC / 2, 6),
            ]
            .iter()
            .flat_map(|&(t, n)| std::iter::repeat_n((t, 1), n))
            .collect(),
        ),
        (
            100 * MS,
            2,
            false,
            vec![
                (0, 1),
                (0, 1),
                (0, 1),
                (99 * MS, 1),
                (150 * MS, 1),
                (150 * MS, 1),
            ],
        ),
        (
            DAY,
            5,
            false,
            vec![
                (7 * MS, 5),
                (DAY - MS, 1),
                (DAY + DAY / 2, 1),
                (DAY + DAY / 2, 1),
                (DAY + DAY / 2, 1),
            ],
        ),
        (
            SEC,
            2,
            true,
            vec![
                (0, 1),
                (0, 1),
                (SEC / 2, 1),
                (SEC / 2, 1),
                (SEC / 2, 1),
                (SEC + SEC / 2, 1),
            ],
        ),
        (SEC, 10, false, vec![(0, 8), (100 * MS, 4)]),
        (SEC, 3, false, vec![(0, 4), (10 * SEC, 4)]),
        (
            7 * SEC,
            4,
            true,
            vec![(0, 2), (SEC, 2), (8 * SEC, 3), (9 * SEC, 1)],
        ),
    ];
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for _ in 0..40 {
        let per = [100 * MS, SEC, 7 * SEC, DAY][rng.below(4) as usize];
        let (max, strict) = (1 + rng.below(11), rng.below(2) == 1);
        let mut now = 0;
        let steps = (0..1 + rng.below(40))
            .map(|_| {
                now += rng.below(1_500) * per / 1_000;
                (now, 1 + rng.below(3))
            })
            .collect();
        cases.push((per, max, strict, steps));
    }
    cases
}

/// `fixed_window.lua` (envoyproxy/ratelimit's windows for `rls.window: fixed`) decides
/// every row of the rate table as the in-process fixed window does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_script_matches_the_local_limiter() {
    let redis = RedisServer::start();
    let (store, _) = start_up(semantics(&redis.url())).await;
    let n = names(&store, "fixed");
    for (case, (per, max, strict, steps)) in rate_cases().into_iter().enumerate() {
        let window = tollgate::limits::RateWindow::Fixed;
        let p = RateParams {
            max,
            per,
            strict,
            window,
        };
        let local = RateLimiter::with_window(per, window, 1_000);
        let key = 5_000 + case as u64;
        let tick = if per > 134 * SEC { MS } else { 1_000 };
        for (i, &(now, cost)) in steps.iter().enumerate() {
            let want = local.acquire(key, max, cost, strict, now);
            let got = store
                .rate_many(&n, key, &p, cost, cost, at(now))
                .await
                .unwrap()
                .verdict;
            let what = format!("case {case} step {i} t={now} cost={cost} {p:?}");
            assert_eq!(
                (got.allowed, got.remaining, got.reset_after),
                (want.allowed, want.remaining, want.reset_after),
                "{what}"
            );
            if want.retry_after == NEVER {
                assert_eq!(got.retry_after, NEVER, "{what}");
            } else {
                let rounded = want.retry_after.div_ceil(tick) * tick;
                assert_eq!(got.retry_after, rounded, "{what}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_table_matches_the_local_limiter() {
    let redis = RedisServer::start();
    let (store, _) = start_up(semantics(&redis.url())).await;
    let n = names(&store, "rate");
    for (case, (per, max, strict, steps)) in rate_cases().into_iter().enumerate() {
        let p = RateParams {
            max,
            per,
            strict,
            window: Default::default(),
        };
        let local = RateLimiter::new(per, 1_000);
        let key = 2_000 + case as u64;
        // The script's tick: 1 µs up to 134 s windows, 1 ms for a day.
        let tick = if per > 134 * SEC { MS } else { 1_000 };
        for (i, &(now, cost)) in steps.iter().enumerate() {
            let want = local.acquire(key, max, cost, strict, now);
            let got = store
                .rate_many(&n, key, &p, cost, cost, at(now))
                .await
                .unwrap()
                .verdict;
            let what = format!("case {case} step {i} t={now} cost={cost} {p:?}");
            assert_eq!(
                (got.allowed, got.remaining, got.reset_after),
                (want.allowed, want.remaining, want.reset_after),
                "{what}"
            );
            // retry_after is exact to the tick: the local one rounded up to it (a cost
            // above max can never pass: NEVER in both).
            if want.retry_after == NEVER {
                assert_eq!(got.retry_after, NEVER, "{what}");
            } else {
                assert_eq!(
                    got.retry_after,
                    want.retry_after.div_ceil(tick) * tick,
                    "{what}"
                );
            }
            if !got.allowed && cost <= max {
                // The promise itself, on Redis: rejected one tick early, admitted at it.
                let probe = 9_000_000 + (case * 100 + i) as u64;
                let sim = |t: Nanos| {
                    let l = RateLimiter::new(per, 1_000);
                    for &(now, c) in &steps[..=i] {
                        l.acquire(probe, max, c, strict, now);
                    }
                    l.acquire(probe, max, cost, false, t).allowed
                };
                assert!(!sim(now + got.retry_after - tick), "{what}: early");
                assert!(sim(now + got.retry_after), "{what}: on time");
            }
        }
        // Refund, then the next decision still agrees.
        let last = steps.last().map_or(0, |s| s.0);
        local.refund(key, 1, last);
        store.rate_refund(&n, key, &p, 1, at(last)).await.unwrap();
        let want = local.acquire(key, max, 1, strict, last);
        let got = store
            .rate_many(&n, key, &p, 1, 1, at(last))
            .await
            .unwrap()
            .verdict;
        assert_eq!(
            (got.allowed, got.remaining),
            (want.allowed, want.remaining),
            "case {case} after refund"
        );
    }
}

/// `PTTL key`.
fn pttl_ms(redis: &RedisServer, key: &str) -> i64 {
    match redis.cmd(&["PTTL", key]) {
        redis::Value::Int(ms) => ms,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

/// Asserts that a key whose expiry was set to `want_ms` by a call sent at `sent` has a
/// PTTL within it: at most `want_ms`, and at least that less the time from `sent` to the
/// PTTL's answer (1 ms of slack each side for Redis's millisecond clock).
fn assert_pttl(redis: &RedisServer, key: &str, want_ms: i64, sent: Instant, what: &str) {
    let got = pttl_ms(redis, key);
    let took = sent.elapsed().as_millis() as i64;
    assert!(
        got <= want_ms + 1 && got >= want_ms - took - 1,
        "{what}: PTTL {got} ms, want {want_ms} ms (less at most the {took} ms the calls took)"
    );
}

/// "A full bucket equals an absent one; otherwise the key expires when it would be full
/// again": at Redis TIME, after a partial drain the bucket's PTTL is the time until it is
/// full (its `reset_after`, whole ms rounded up), and a refund that fills it deletes it.
/// A rate key expires when its estimate reaches 0: the end of the next period once the
/// current one counts (rate.lua), its `reset_after` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_when_full_again_or_when_their_estimate_reaches_zero() {
    let redis = RedisServer::start();
    let (store, _) = start_up(semantics(&redis.url())).await;
    let n = names(&store, "ttl");
    let kind = tollgate::store::StateKind::TokenBucket;
    // 10 tokens, one back per second: 4 taken, full again 4 s later.
    let p = bucket(10, 1, SEC, false);
    let started = Instant::now();
    let v = store
        .token_bucket_many(&n, 1, &p, 4, 4, None)
        .await
        .unwrap()
        .verdict;
    assert!(v.allowed);
    assert_eq!(v.remaining, 6);
    assert_eq!(v.reset_after, 4 * SEC, "refilled from the drain's instant");
    assert_pttl(&redis, &n.key(1, kind), 4_000, started, "4 of 10 taken");
    // One more taken a moment later: 5 missing, due 5 s after the first drain (the refill
    // clock is not reset by a take), so the PTTL is that less the time between them.
    let second = Instant::now();
    let v = store
        .token_bucket_many(&n, 1, &p, 1, 1, None)
        .await
        .unwrap()
        .verdict;
    assert_eq!(v.remaining, 5);
    let since = second.duration_since(started);
    let reset_ms = (v.reset_after as i64 + 999_999) / 1_000_000;
    assert!(
        (5 * SEC - v.reset_after) as u128 <= started.elapsed().as_nanos(),
        "reset_after {} ns, {since:?} after the first drain",
        v.reset_after
    );
    assert_pttl(&redis, &n.key(1, kind), reset_ms, second, "5 of 10 taken");
    // Refunded to full: the key is gone (full == absent).
    let tokens = store.token_bucket_refund(&n, 1, &p, 5, None).await.unwrap();
    assert_eq!(tokens, 10);
    assert_eq!(
        redis.cmd(&["EXISTS", &n.key(1, kind)]),
        redis::Value::Int(0)
    );
    // Fractional refills: 100 per 250 ms, 150 taken: full after 2 refills, 500 ms.
    let p = bucket(1_000, 100, 250 * MS, false);
    let started = Instant::now();
    let v = store
        .token_bucket_many(&n, 2, &p, 150, 150, None)
        .await
        .unwrap()
        .verdict;
    assert_eq!(v.reset_after, 500 * MS);
    assert_pttl(&redis, &n.key(2, kind), 500, started, "150 of 1000 taken");

    // A rate of 5 per second, one request: the key lives until the end of the next
    // period, which is what reset_after says (from the same Redis TIME).
    let r = RateParams {
        max: 5,
        per: SEC,
        strict: false,
        window: Default::default(),
    };
    let started = Instant::now();
    let v = store
        .rate_many(&n, 3, &r, 1, 1, None)
        .await
        .unwrap()
        .verdict;
    assert!(v.allowed);
    assert!(
        v.reset_after > SEC && v.reset_after <= 2 * SEC,
        "one count in this period: gone at the end of the next, {} ns",
        v.reset_after
    );
    let reset_ms = (v.reset_after as i64 + 999_999) / 1_000_000;
    assert_pttl(
        &redis,
        &n.key(3, tollgate::store::StateKind::Rate),
        reset_ms,
        started,
        "rate, one request",
    );
}

/// Requests for between `min` and `want` (the limiter API's `CH.REQUEST ... MIN n`): one
/// script call grants the same largest count as the in-process `acquire_many`, for token
/// buckets and rates, randomized over parameters and histories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_grants_match_the_local_limiters() {
    let redis = RedisServer::start();
    let (store, _) = start_up(semantics(&redis.url())).await;
    let (nb, nr) = (names(&store, "tb_many"), names(&store, "rate_many"));
    let mut rng = Rng(0x005e_ed0f_c4a7_0001);
    for case in 0..30u64 {
        let strict = rng.below(2) == 1;
        let p = bucket(1 + rng.below(12), 1 + rng.below(4), SEC, strict);
        let r = RateParams {
            max: 1 + rng.below(12),
            per: [100 * MS, SEC, 7 * SEC][rng.below(3) as usize],
            strict,
            window: Default::default(),
        };
        let (bucket, rate) = (TokenBucket::new(p, 16), RateLimiter::new(r.per, 16));
        let mut now = 0;
        for i in 0..25 {
            now += rng.below(1_200) * MS;
            let want = rng.below(8);
            let min = rng.below(want + 1);
            let what = format!("case {case} step {i} t={now} [{min}, {want}]");
            let local = bucket.acquire_many(case, min, want, now);
            let got = store
                .token_bucket_many(&nb, case, &p, min, want, at(now))
                .await
                .unwrap();
            assert_eq!(got, local, "bucket {what} {p:?}");
            let local = rate.acquire_many(case, r.max, min, want, strict, now);
            let got = store
                .rate_many(&nr, case, &r, min, want, at(now))
                .await
                .unwrap();
            assert_eq!(
                (got.granted, got.verdict.allowed, got.verdict.remaining),
                (
                    local.granted,
                    local.verdict.allowed,
                    local.verdict.remaining
                ),
                "rate {what} {r:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_table_matches_the_local_limiter() {
    let redis = RedisServer::start();
    // A release is a background call, within the probe's timeout: 1 s here, so that a
    // loaded machine does not miss it (a missed one may or may not have run, and the
    // comparison would be off by one).
    let mut config = standalone(&redis.url());
    config.tuning.probe_every = Duration::from_secs(1);
    let (store, _) = start_up(config).await;
    let n = names(&store, "conc");
    let mut rng = Rng(0xfeed_beef_0bad_cafe);
    for case in 0..20u64 {
        let max = rng.below(5);
        let local = InflightLimiter::new(SketchSize {
            hashes: 4,
            slots: 1024,
        });
        let mut held = Vec::new();
        let mut remote = 0u64;
        for step in 0..40 {
            let key = 3_000 + case * 10 + rng.below(2);
            if rng.below(3) == 0 && !held.is_empty() {
                let i = rng.below(held.len() as u64) as usize;
                let (k, guard): (u64, _) = held.swap_remove(i);
                drop(guard);
                store.inflight_release(&n, k).await.unwrap();
                remote -= 1;
                continue;
            }
            let want = local.acquire(key, max).map(|(g, est)| (est, g));
            let got = store.inflight_acquire(&n, key, max).await.unwrap();
            match (want, got) {
                (Ok((est, g)), Ok(total)) => {
                    assert_eq!(est, total, "case {case} step {step}");
                    held.push((key, g));
                    remote += 1;
                }
                (Err(est), Err(total)) => assert_eq!(est, total, "case {case} step {step}"),
                (want, got) => panic!(
                    "case {case} step {step}: local {:?}, redis {got:?}",
                    want.map(|w| w.0)
                ),
            }
        }
        let total = |k| store.inflight_total(&n, k);
        let sum = total(3_000 + case * 10).await.unwrap() + total(3_001 + case * 10).await.unwrap();
        assert_eq!(sum, remote, "case {case}");
        for (k, g) in held.drain(..) {
            drop(g);
            store.inflight_release(&n, k).await.unwrap();
        }
        assert_eq!(local.get(3_000 + case * 10), 0);
    }
    // Every release left nothing behind.
    assert_eq!(
        redis.cmd(&["DBSIZE"]),
        redis::Value::Int(1),
        "only the probe key"
    );
}

// ---------------------------------------------------------------------------------------
// Runtimes, sharing, the deny cache.

#[test]
fn calls_work_from_runtimes_other_than_the_creators() {
    let redis = RedisServer::start();
    // Created inside one runtime, which is then dropped.
    let creator = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = creator.block_on(async { start_up(standalone(&redis.url())).await.0 });
    drop(creator);
    let p = bucket(3, 1, DAY, false);
    let n = names(&store, "rt");
    // A current-thread runtime without even a timer: the budget runs on the store's.
    let bare = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let v = bare
        .block_on(store.token_bucket_many(&n, 1, &p, 1, 1, None))
        .unwrap()
        .verdict;
    assert_eq!((v.allowed, v.remaining), (true, 2));
    // And a multi-thread runtime, with concurrent callers on one connection.
    let other = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let admitted = other.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (store, n) = (store.clone(), n.clone());
                tokio::spawn(async move { store.token_bucket_many(&n, 1, &p, 1, 1, None).await })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += u64::from(t.await.unwrap().unwrap().verdict.allowed);
        }
        admitted
    });
    assert_eq!(admitted, 2);
    // A timeout fires on the store's timer too: a frozen Redis, from the bare runtime.
    let mut redis = redis;
    redis.freeze();
    let started = Instant::now();
    let e = bare.block_on(store.token_bucket_many(&n, 2, &p, 1, 1, None));
    assert!(matches!(e, Err(StoreError::Timeout)), "{e:?}");
    assert!(started.elapsed() < store.config().tuning.timeout + SLACK);
    redis.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_share_one_bucket_exactly() {
    let redis = RedisServer::start();
    let (a, _) = start_up(standalone(&redis.url())).await;
    let (b, _) = start_up(standalone(&redis.url())).await;
    let p = bucket(100, 1, DAY, false);
    let la = Arc::new(SharedTokenBucket::new(&a, names(&a, "burst"), p, 1_000, 0));
    let lb = Arc::new(SharedTokenBucket::new(&b, names(&b, "burst"), p, 1_000, 0));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let l = Arc::clone(if i % 2 == 0 { &la } else { &lb });
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..10 {
                let v = l.acquire(77, 1, 0).await;
                assert_eq!(v.source, Source::Store);
                admitted += u64::from(v.value.allowed);
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    assert_eq!(
        admitted, 100,
        "320 requests across two proxies, capacity 100"
    );
    // 32 concurrent callers, one connection per store (plus this INFO's own).
    assert_eq!(
        redis.info_field("clients", "connected_clients").as_deref(),
        Some("3")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_answers_a_flood_locally() {
    let redis = RedisServer::start();
    let (store, metrics) = start_up(standalone(&redis.url())).await;
    let p = bucket(10, 1, 10 * SEC, false);
    let l = SharedTokenBucket::new(&store, names(&store, "flood"), p, 1_000, 1_024);
    let strict = SharedTokenBucket::new(
        &store,
        names(&store, "flood_strict"),
        TokenBucketParams { strict: true, ..p },
        1_000,
        1_024,
    );
    let mut sources = std::collections::HashMap::new();
    for i in 0..1_000 {
        // A local clock moving 1 ms per request: the flood lasts 1 s, under one refill.
        let v = l.acquire(5, 1, i * MS).await;
        *sources.entry(v.source).or_insert(0) += 1;
        assert_eq!(v.value.allowed, i < 10, "request {i}");
        strict.acquire(5, 1, i * MS).await;
    }
    // 10 admitted and 1 rejected by Redis; the rest answered from the cache.
    assert_eq!(sources.get(&Source::Store), Some(&11));
    assert_eq!(sources.get(&Source::DenyCache), Some(&989));
    assert_eq!(l.deny_cache_hits(), 989);
    assert_eq!(strict.deny_cache_hits(), 0, "strict limits do not cache");
    let sent = metrics.ok.get() + metrics.timeout.get() + metrics.error.get();
    assert_eq!(sent, 11 + 1_000, "calls avoided: 989 of 1 000");
    // A cached rejection counts down from Redis's retry_after.
    let v = l.acquire(5, 1, 1_000 * MS).await;
    assert_eq!(v.source, Source::DenyCache);
    assert!(v.value.retry_after <= 10 * SEC - 990 * MS, "{v:?}");
}

// ---------------------------------------------------------------------------------------
// Faults.

/// Runs `n` decisions of a shared bucket (a fresh key each) and asserts each returned
/// within budget + 50 ms; returns their sources.
async fn decide_within_budget(
    l: &SharedTokenBucket,
    store: &RedisStore,
    n: u64,
    key0: u64,
) -> Vec<Source> {
    let mut sources = Vec::new();
    for i in 0..n {
        let started = Instant::now();
        let v = l.acquire(key0 + i, 1, 0).await;
        let took = started.elapsed();
        assert!(
            took < store.config().tuning.timeout + SLACK,
            "decision {i} took {took:?} (source {:?})",
            v.source
        );
        sources.push(v.source);
    }
    sources
}

/// Polls until a decision comes from the store again, at most `within`.
async fn until_store_decides(l: &SharedTokenBucket, within: Duration) -> Duration {
    let started = Instant::now();
    let mut key = 900_000;
    while started.elapsed() < within {
        key += 1;
        if l.acquire(key, 1, 0).await.source == Source::Store {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the store never decided again within {within:?}");
}

/// The store counters, to compare before and after a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    ok: u64,
    timeout: u64,
    error: u64,
    breaker_open: u64,
    fallback: u64,
}

impl Counts {
    fn of(m: &StoreMetrics) -> Counts {
        Counts {
            ok: m.ok.get(),
            timeout: m.timeout.get(),
            error: m.error.get(),
            breaker_open: m.breaker_open.get(),
            fallback: m.fallback.get(),
        }
    }

    fn since(&self, before: &Counts) -> Counts {
        Counts {
            ok: self.ok - before.ok,
            timeout: self.timeout - before.timeout,
            error: self.error - before.error,
            breaker_open: self.breaker_open - before.breaker_open,
            fallback: self.fallback - before.fallback,
        }
    }
}

fn fault_bucket(store: &RedisStore) -> SharedTokenBucket {
    SharedTokenBucket::new(
        store,
        names(store, "fault"),
        bucket(5, 1, SEC, false),
        1_000,
        0,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_falls_back_within_budget_and_recovers() {
    let mut redis = RedisServer::start();
    let (store, metrics) = start_up(fast(&redis.url())).await;
    let l = fault_bucket(&store);
    until_store_decides(&l, Duration::from_secs(5)).await;
    let before = Counts::of(&metrics);
    redis.freeze();
    let sources = decide_within_budget(&l, &store, 20, 10).await;
    assert!(
        sources.iter().all(|s| *s == Source::Fallback),
        "{sources:?}"
    );
    assert!(!store.is_up(), "the breaker opened");
    let d = Counts::of(&metrics).since(&before);
    assert_eq!(d.timeout, 5, "five timeouts, then the breaker");
    assert_eq!((d.breaker_open, d.fallback), (15, 20));
    assert_eq!(metrics.up.get(), 0);
    redis.thaw();
    let took = until_store_decides(&l, Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(1),
        "enforcement resumed after {took:?}"
    );
    assert_eq!(metrics.up.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_redis_recovers_with_its_scripts_reloaded() {
    let mut redis = RedisServer::start();
    let (store, metrics) = start_up(fast(&redis.url())).await;
    let l = fault_bucket(&store);
    until_store_decides(&l, Duration::from_secs(5)).await;
    redis.kill();
    // Once the connection saw the reset, one call opens the breaker: a connection error.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = Counts::of(&metrics);
    let sources = decide_within_budget(&l, &store, 20, 10).await;
    assert!(
        sources.iter().all(|s| *s == Source::Fallback),
        "{sources:?}"
    );
    assert!(!store.is_up());
    let d = Counts::of(&metrics).since(&before);
    assert_eq!((d.error, d.timeout, d.breaker_open), (1, 0, 19), "{d:?}");
    redis.restart();
    let took = until_store_decides(&l, Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(1),
        "enforcement resumed after {took:?}"
    );
    // The restarted Redis lost the scripts; the probe loaded every one of them again.
    let scripts = tollgate::store::redis::Scripts::new();
    let mut exists = vec!["SCRIPT", "EXISTS"];
    exists.extend(scripts.all().iter().map(|s| s.sha.as_str()));
    assert_eq!(
        redis.cmd(&exists),
        redis::Value::Array(vec![redis::Value::Int(1); scripts.all().len()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_is_answered_transparently() {
    let redis = RedisServer::start();
    let (store, metrics) = start_up(standalone(&redis.url())).await;
    let l = fault_bucket(&store);
    assert!(l.acquire(1, 1, 0).await.value.allowed);
    redis.cmd(&["SCRIPT", "FLUSH"]);
    let v = l.acquire(1, 1, 0).await;
    assert_eq!((v.source, v.value.remaining), (Source::Store, 3));
    assert_eq!((metrics.error.get(), metrics.timeout.get()), (0, 0));
    assert!(store.is_up());
    // One EVAL answered the NOSCRIPT and cached the script again: the next call is a plain
    // EVALSHA.
    let evals = || {
        redis
            .info_field("commandstats", "cmdstat_eval")
            .and_then(|v| {
                v.strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
    };
    assert_eq!(evals(), Some(1));
    assert_eq!(l.acquire(1, 1, 0).await.value.remaining, 2);
    assert_eq!(evals(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_falls_back_and_recovers() {
    let redis = RedisServer::start();
    let (store, metrics) = start_up(fast(&redis.url())).await;
    let l = fault_bucket(&store);
    until_store_decides(&l, Duration::from_secs(5)).await;
    let before = Counts::of(&metrics);
    redis.client_pause(1_500);
    let sources = decide_within_budget(&l, &store, 20, 10).await;
    assert!(
        sources.iter().all(|s| *s == Source::Fallback),
        "{sources:?}"
    );
    assert_eq!(Counts::of(&metrics).since(&before).timeout, 5);
    let took = until_store_decides(&l, Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_millis(2_500),
        "resumed {took:?} after the pause began"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_never_comes_up_and_costs_nothing() {
    let hole = BlackHole::start();
    let (store, metrics) = start(fast(&hole.url()));
    let l = fault_bucket(&store);
    let sources = decide_within_budget(&l, &store, 50, 10).await;
    assert!(sources.iter().all(|s| *s == Source::Fallback));
    assert!(!store.is_up());
    assert_eq!(metrics.breaker_open.get(), 50, "nothing was sent");
    let started = Instant::now();
    while hole.accepted() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the probe never tried"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!store.is_up(), "a black hole never answers the probe");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_at_start_then_redis_appears() {
    let port = harness::free_port();
    let (store, metrics) = start(fast(&format!("redis://127.0.0.1:{port}/0")));
    let l = fault_bucket(&store);
    let sources = decide_within_budget(&l, &store, 10, 10).await;
    assert!(sources.iter().all(|s| *s == Source::Fallback));
    assert_eq!(metrics.up.get(), 0);
    let _redis = RedisServer::start_on(port);
    let took = until_store_decides(&l, Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(1),
        "came up {took:?} after Redis did"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_urls() {
    let metrics = || StoreMetrics::unregistered("shared").unwrap();
    // Malformed: an error at construction, for the config to report.
    for url in [
        "redis//127.0.0.1:6380",
        "redis://127.0.0.1:99999/0",
        "tcp://x",
    ] {
        let e = RedisStore::new(standalone(url), metrics());
        assert!(matches!(e, Err(StoreError::BadUrl { .. })), "{url}");
    }
    // Well formed and reachable, but wrong: a database that does not exist, a password the
    // server does not have. The store starts down, stays down and decides locally.
    let redis = RedisServer::start();
    let port = redis.port();
    for url in [
        format!("redis://127.0.0.1:{port}/99"),
        format!("redis://:secret@127.0.0.1:{port}/0"),
    ] {
        let (store, m) = start(fast(&url));
        let l = fault_bucket(&store);
        let sources = decide_within_budget(&l, &store, 10, 10).await;
        assert!(sources.iter().all(|s| *s == Source::Fallback), "{url}");
        assert_eq!(m.fallback.get(), 10);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!store.is_up(), "{url}: a probe never succeeds");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answering_errors_opens_the_breaker_until_it_heals() {
    let redis = RedisServer::start();
    let (store, metrics) = start_up(fast(&redis.url())).await;
    let l = fault_bucket(&store);
    until_store_decides(&l, Duration::from_secs(5)).await;
    let before = Counts::of(&metrics);
    // Out of memory: every script that writes answers an error (and so does the probe).
    redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let sources = decide_within_budget(&l, &store, 20, 10).await;
    assert!(
        sources.iter().all(|s| *s == Source::Fallback),
        "{sources:?}"
    );
    let d = Counts::of(&metrics).since(&before);
    // Five failures in a row (errors; a timeout if the machine is very busy) open it.
    assert!(d.error >= 1 && d.error + d.timeout == 5, "{d:?}");
    assert!(!store.is_up());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!store.is_up(), "the probe's write fails too: it stays open");
    redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    let took = until_store_decides(&l, Duration::from_secs(3)).await;
    assert!(took < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_modes_and_local_shares() {
    let port = harness::free_port();
    let down = |fallback: Fallback| {
        let mut c = standalone(&format!("redis://127.0.0.1:{port}/0"));
        c.tuning.fallback = fallback;
        c.tuning.instances = 3;
        start(c).0
    };
    // Local: a third of the fleet's bucket and rate.
    let store = down(Fallback::Local);
    let l = SharedTokenBucket::new(
        &store,
        names(&store, "b"),
        bucket(30, 3, SEC, false),
        100,
        0,
    );
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u64::from(l.acquire(1, 1, 0).await.value.allowed);
    }
    assert_eq!(admitted, 10);
    let r = SharedRate::new(
        &store,
        names(&store, "r"),
        RateParams {
            max: 10,
            per: SEC,
            strict: false,
            window: Default::default(),
        },
        1_000,
        0,
    );
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u64::from(r.acquire(1, 1, 0).await.value.allowed);
    }
    assert_eq!(admitted, 4, "ceil(10 / 3)");
    // A fallback admission is refunded locally.
    let v = l.acquire(2, 10, 0).await;
    assert_eq!((v.source, v.value.remaining), (Source::Fallback, 0));
    l.refund(2, 10, v.source, 0);
    assert!(l.acquire(2, 10, 0).await.value.allowed);
    // Allow and deny.
    let store = down(Fallback::Allow);
    let l = SharedTokenBucket::new(&store, names(&store, "b"), bucket(1, 1, SEC, false), 100, 0);
    for _ in 0..5 {
        assert!(l.acquire(1, 1, 0).await.value.allowed);
    }
    let store = down(Fallback::Deny);
    let l = SharedTokenBucket::new(&store, names(&store, "b"), bucket(1, 1, SEC, false), 100, 0);
    let v = l.acquire(1, 1, 0).await.value;
    assert_eq!(v, Verdict::reject(0, 0, 50 * MS));
    let i = SharedInflight::new(&store, names(&store, "i"), 10, SketchSize::DEFAULT);
    let o = i.acquire(1).await;
    assert_eq!((o.value.err(), o.source), (Some(11), Source::Fallback));
}

// ---------------------------------------------------------------------------------------
// Inflight leases.

fn leased(url: &str, instance: &str) -> RedisStoreConfig {
    let mut c = standalone(url);
    c.instance = instance.to_string();
    c.tuning.lease = Duration::from_millis(600);
    c
}

/// Set in the child process of the crash test: the Redis URL it holds units in.
const CHILD_URL: &str = "TOLLGATE_TEST_INFLIGHT_CHILD_URL";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_loses_its_share_after_one_lease() {
    if let Ok(url) = std::env::var(CHILD_URL) {
        // The child (this same test, re-run in a process of its own): instance "a" takes 3
        // units and keeps renewing them until the parent kills it with SIGKILL.
        let (a, _) = start_up(leased(&url, "a")).await;
        let la = SharedInflight::new(&a, names(&a, "conc"), 5, SketchSize::DEFAULT);
        let mut guards = Vec::new();
        for _ in 0..3 {
            let o = la.acquire(7).await;
            assert_eq!(o.source, Source::Store);
            guards.push(o.value.unwrap());
        }
        println!("CHILD HOLDS 3");
        tokio::time::sleep(Duration::from_secs(30)).await;
        panic!("the parent never killed the child");
    }
    let redis = RedisServer::start();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "redis_store::a_killed_instance_loses_its_share_after_one_lease",
            "--nocapture",
        ])
        .env(CHILD_URL, redis.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let ready = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut line = String::new();
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("CHILD HOLDS 3") {
                return true;
            }
            line.clear();
        }
        false
    });
    let ready = tokio::time::timeout(Duration::from_secs(20), ready).await;
    if !matches!(ready, Ok(Ok(true))) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the child never held its units");
    }
    let (b, _) = start_up(leased(&redis.url(), "b")).await;
    let n = names(&b, "conc");
    let lb = SharedInflight::new(&b, n.clone(), 5, SketchSize::DEFAULT);
    let b1 = lb.acquire(7).await.value.unwrap();
    let b2 = lb.acquire(7).await.value.unwrap();
    assert_eq!(
        lb.acquire(7).await.value.err(),
        Some(6),
        "the fleet holds 5 of 5"
    );
    // The child's renewals keep its units alive past several leases.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(b.inflight_total(&n, 7).await.unwrap(), 5);
    // SIGKILL: no release, no more renewals. Its share is gone one lease later.
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    loop {
        let total = b.inflight_total(&n, 7).await.unwrap();
        if total == 2 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "a's share stayed: {total}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b3 = lb.acquire(7).await;
    assert!(b3.value.is_ok(), "room again");
    // b's own guards give their units back.
    drop((b1, b2, b3));
    let released = Instant::now();
    while b.inflight_total(&n, 7).await.unwrap() != 0 {
        assert!(
            released.elapsed() < Duration::from_secs(2),
            "releases never landed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_repair_redis_from_the_local_count() {
    let mut redis = RedisServer::start();
    let (store, _) = start_up(leased(&redis.url(), "a")).await;
    let n = names(&store, "conc");
    let l = SharedInflight::new(&store, n.clone(), 10, SketchSize::DEFAULT);
    let guards: Vec<_> = futures_join((0..4).map(|_| l.acquire(9))).await;
    let guards: Vec<_> = guards.into_iter().map(|o| o.value.unwrap()).collect();
    // Redis loses everything; the units are still held here.
    redis.kill();
    let during = l.acquire(9).await;
    assert_eq!(during.source, Source::Fallback);
    let during = during.value.unwrap();
    assert_eq!(l.holdings().in_use(9), 5);
    redis.restart();
    assert!(store.wait_up(Duration::from_secs(3)).await);
    // Within a renewal interval (200 ms) Redis holds the local truth again: 4 + 1.
    let started = Instant::now();
    while store.inflight_total(&n, 9).await.unwrap() != 5 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never repaired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A request admitted before Redis went away is never failed: dropping works as usual.
    drop(during);
    drop(guards);
    assert_eq!(l.holdings().in_use(9), 0);
    let started = Instant::now();
    while store.inflight_total(&n, 9).await.unwrap() != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never back to 0"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_skip_keys_whose_releases_landed() {
    let redis = RedisServer::start();
    let mut c = leased(&redis.url(), "a");
    c.tuning.lease = Duration::from_millis(300);
    let (store, metrics) = start_up(c).await;
    let n = names(&store, "conc");
    let l = SharedInflight::new(&store, n.clone(), 10, SketchSize::DEFAULT);
    let held = l.acquire(1).await.value.unwrap();
    let before = Counts::of(&metrics);
    let since = Instant::now();
    // 20 keys come and go: an acquire and a release each.
    for key in 100..120 {
        drop(l.acquire(key).await.value.unwrap());
    }
    let started = Instant::now();
    while Counts::of(&metrics).since(&before).ok < 40 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "releases never landed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Only the held key is renewed, about once an interval (lease / 3 = 100 ms): were the
    // 20 released keys renewed too, each interval would add about 21 calls. Waits for a
    // few renewals, however slow a loaded machine makes them, then compares with the
    // intervals that passed.
    let mut renewals = 0;
    while renewals < 4 {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{renewals} renewals"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        renewals = Counts::of(&metrics).since(&before).ok.saturating_sub(40);
    }
    let intervals = since.elapsed().as_millis() as u64 / 100 + 2;
    assert!(
        renewals <= 2 * intervals,
        "{renewals} renewal calls in {intervals} intervals"
    );
    assert_eq!(store.inflight_total(&n, 1).await.unwrap(), 1);
    assert_eq!(store.inflight_total(&n, 100).await.unwrap(), 0);
    drop(held);
}

async fn futures_join<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut out = Vec::new();
    for f in fs {
        out.push(f.await);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Redis Cluster.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_shares_limits_and_keeps_a_limit_key_in_one_slot() {
    let cluster = RedisCluster::start();
    let endpoint = Endpoint::Cluster(cluster.urls());
    let (a, _) = start_up(config(endpoint.clone())).await;
    let (b, _) = start_up(config(endpoint)).await;
    // Two proxies share a bucket exactly.
    let p = bucket(50, 1, DAY, false);
    let la = SharedTokenBucket::new(&a, names(&a, "burst"), p, 100, 0);
    let lb = SharedTokenBucket::new(&b, names(&b, "burst"), p, 100, 0);
    let mut admitted = 0;
    for i in 0..120 {
        let l = if i % 2 == 0 { &la } else { &lb };
        let v = l.acquire(42, 1, 0).await;
        assert_eq!(v.source, Source::Store);
        admitted += u64::from(v.value.allowed);
    }
    assert_eq!(admitted, 50);
    // Keys of many limit keys land on every node; each decision is one script.
    let r = SharedRate::new(
        &a,
        names(&a, "rate"),
        RateParams {
            max: 3,
            per: SEC,
            strict: false,
            window: Default::default(),
        },
        100_000,
        0,
    );
    for key in 0..60 {
        let v = r.acquire(key, 1, 0).await;
        assert_eq!(
            (v.source, v.value.allowed),
            (Source::Store, true),
            "key {key}"
        );
    }
    assert!(
        cluster.dbsizes().iter().all(|&n| n > 0),
        "{:?}",
        cluster.dbsizes()
    );
    // Inflight touches two keys per script: they must share a slot (else CROSSSLOT).
    let n = names(&a, "conc");
    let i = SharedInflight::new(&a, n.clone(), 2, SketchSize::DEFAULT);
    let g1 = i.acquire(5).await;
    let g2 = i.acquire(5).await;
    assert_eq!(g1.source, Source::Store);
    assert!(g1.value.is_ok() && g2.value.is_ok());
    assert_eq!(i.acquire(5).await.value.err(), Some(3));
    use tollgate::store::StateKind::{InflightCounts, InflightLeases};
    let (counts, leases) = (n.key(5, InflightCounts), n.key(5, InflightLeases));
    assert_eq!(cluster.keyslot(&counts), cluster.keyslot(&leases));
    assert_eq!(
        cluster.keyslot(&counts),
        i64::from(tollgate::store::key::cluster_slot(counts.as_bytes()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloads_old_and_new_inflight_limiters_keep_their_own_fields() {
    let redis = RedisServer::start();
    let (store, _) = start_up(leased(&redis.url(), "a")).await;
    let n = names(&store, "conc");
    // A reload rebuilt the limit (its max changed) while the old one's guards are out.
    let old = SharedInflight::new(&store, n.clone(), 10, SketchSize::DEFAULT);
    let new = SharedInflight::new(&store, n.clone(), 8, SketchSize::DEFAULT);
    let mut old_guards = Vec::new();
    for _ in 0..2 {
        old_guards.push(old.acquire(7).await.value.unwrap());
    }
    let mut new_guards = Vec::new();
    for _ in 0..3 {
        new_guards.push(new.acquire(7).await.value.unwrap());
    }
    // One field each: a renewal of one (which writes its own count where Redis may
    // disagree) can never overwrite the other's.
    assert_eq!(redis.hash_counts("*:ic"), [2, 3]);
    drop(old_guards);
    // The guards' releases are sent in the background.
    crate::common::eventually("the old limiter's units released", 500, || async {
        store.inflight_total(&n, 7).await.unwrap() == 3
    })
    .await;
    assert_eq!(redis.hash_counts("*:ic"), [3]);
    drop(new_guards);
}
