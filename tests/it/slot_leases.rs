//! Issue 22, leases of the holding kinds at the binary level: inflight and concurrency
//! limits whose hot keys lease blocks of slots, real tollgate processes on one real
//! `redis-server` (ephemeral port), a real upstream that counts the requests it serves at
//! once, and h2load as the client.
//!
//! - Three instances offered three times a limit of 12 on one hot key: the fleet's
//!   in-use count, sampled every 10 ms at the upstream (and its exact peak), never exceeds
//!   12, and reaches at least half of it.
//! - A steady hot key far under its limit costs almost no store call per request with
//!   leases (a release puts its slot back into the block), two with `lease: off`.
//! - An instance killed (SIGKILL) while holding a block: the survivor reaches the whole
//!   limit again within one store lease.
//! - A reload that changes the lease, and SIGTERM, give a block's free slots back at once
//!   (the store lease is a minute: only the give-back empties Redis's count).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::fleet::{config, fleet, wait_up, ROOMY};
use crate::common::h2load::{self, Summary};
use crate::common::redis::RedisServer;
use crate::common::{eventually, Tollgate, Upstream};

/// The limit all three instances share.
const MAX: usize = 12;

/// The free slots this instance holds in blocks of the limit `held`.
const LEASED: &str = "tollgate_store_leased{limit=\"held\",origin=\"app\",store=\"shared\"}";

/// A holding limit `held` of `kind` (`inflight` or `concurrency`) on the customer, `max`
/// at most at once across the fleet, in the shared store, with `lease`.
fn holding(kind: &str, max: usize, lease: &str) -> String {
    format!(
        "      held:\n        kind: {kind}\n        key: [customer]\n        max: {max}\n        store: shared\n        lease: {lease}\n"
    )
}

/// `n` requests to `/slow` as customer `acme` over `c` connections of `t` (blocking).
fn slow_as_acme(t: &Tollgate, n: u64, c: u64) -> Summary {
    h2load::as_acme(&t.url("/slow"), n, c)
}

/// Samples `up.busy()` every 10 ms until told to stop; the most it saw.
fn sample_every_10ms(up: &Arc<Upstream>, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    let (up, stop) = (Arc::clone(up), Arc::clone(stop));
    std::thread::spawn(move || {
        let most = AtomicUsize::new(0);
        while !stop.load(Ordering::SeqCst) {
            most.fetch_max(up.busy(), Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(10));
        }
        most.into_inner()
    })
}

async fn three_instances_never_hold_more_than_max(kind: &str) {
    let redis = RedisServer::start();
    let up = Arc::new(Upstream::start("127.0.0.1", "up").await);
    // Hot from 5 decisions a second; blocks of up to a quarter of the limit (3 slots).
    let lease = "{ hot_above: 5/s, max_share: 25% }";
    let text = config(up.addr, &redis.url(), ROOMY, &holding(kind, MAX, lease));
    let all = fleet(3, &text).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_every_10ms(&up, &stop);
    // 12 connections each, 36 at once for a limit of 12.
    let runs: Vec<_> = all
        .iter()
        .map(|t| {
            let url = t.url("/slow");
            std::thread::spawn(move || h2load::as_acme(&url, 1500, 12))
        })
        .collect();
    let runs: Vec<Summary> = runs.into_iter().map(|r| r.join().unwrap()).collect();
    stop.store(true, Ordering::SeqCst);
    let sampled = sampler.join().unwrap();
    let (ok, refused): (u64, u64) = runs
        .iter()
        .map(|s| (s.ok, s.too_many + s.unavailable))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    for s in &runs {
        assert_eq!((s.errored, s.done), (0, 1500), "{}", s.text);
    }
    let granted = "tollgate_store_lease_calls_total{result=\"granted\",store=\"shared\"}";
    let mut slices = 0.0;
    for t in &all {
        slices += t.metric(granted).await;
    }
    eprintln!(
        "{kind}: sampled at most {sampled} in use, peak {}, {ok} admitted, {refused} refused, {slices} blocks granted",
        up.peak()
    );
    assert!(up.peak() <= MAX, "{} in use at once > {MAX}", up.peak());
    assert!(sampled <= MAX, "sampled {sampled} > {MAX}");
    assert!(refused > 0, "the load was past the limit");
    assert!(up.peak() >= MAX / 2, "peak {} far below {MAX}", up.peak());
    assert!(slices > 0.0, "blocks were leased");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inflight_three_instances_on_one_hot_key_never_hold_more_than_max() {
    three_instances_never_hold_more_than_max("inflight").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_three_instances_on_one_hot_key_never_hold_more_than_max() {
    three_instances_never_hold_more_than_max("concurrency").await;
}

/// Store calls per request of `requests` to `/slow` for one hot key under a roomy holding
/// limit of `kind` at `lease`.
async fn holding_calls_per_request(kind: &str, lease: &str, requests: u64) -> f64 {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let text = config(up.addr, &redis.url(), ROOMY, &holding(kind, 1000, lease));
    let t = Tollgate::start(&text).await;
    wait_up(&t).await;
    let before = redis.script_calls();
    let s = tokio::task::block_in_place(|| slow_as_acme(&t, requests, 8));
    assert_eq!((s.ok, s.done), (requests, requests), "{}", s.text);
    // Releases are sent in the background: wait for the last of them.
    let releases = if lease == "off" { requests } else { 0 };
    eventually("the releases landed", 500, || async {
        redis.script_calls() - before >= requests + releases
            || lease != "off" && redis.script_calls() > before
    })
    .await;
    (redis.script_calls() - before) as f64 / requests as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steady_hot_holding_key_costs_almost_no_call_and_lease_off_two_a_request() {
    for kind in ["inflight", "concurrency"] {
        let leased = holding_calls_per_request(kind, "{ max_share: 2% }", 3_000).await;
        let exact = holding_calls_per_request(kind, "off", 1_000).await;
        eprintln!("{kind}: {leased:.4} store calls per request leased, {exact:.4} exact");
        // A few takes and renewals while the block grows to the key's concurrency (8),
        // then none: the slots go round within the block.
        assert!(leased <= 0.05, "{kind}: {leased} calls per request leased");
        assert!(
            exact >= 1.99,
            "{kind}: {exact} calls per request with lease: off"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_killed_holding_a_block_loses_it_after_one_lease() {
    let redis = RedisServer::start();
    let up = Arc::new(Upstream::start("127.0.0.1", "up").await);
    // Blocks of up to half the limit, never idle: only the lease ends a dead one's.
    let lease = "{ hot_above: 5/s, max_share: 50%, idle: 1h }";
    let text = config(
        up.addr,
        &redis.url(),
        ROOMY,
        &holding("inflight", MAX, lease),
    );
    let mut all = fleet(2, &text).await;
    let victim = all.pop().unwrap();
    let s = tokio::task::block_in_place(|| slow_as_acme(&victim, 400, 2));
    assert_eq!(s.done, 400, "{}", s.text);
    eventually("the victim holds free slots", 500, || async {
        victim.metric(LEASED).await > 0.0
    })
    .await;
    // SIGKILL (the harness kills on drop): nothing is given back. The survivor, holding
    // requests open, reaches the whole limit once the dead instance's lease (ROOMY: 1 s)
    // has ended.
    drop(victim);
    let survivor = &all[0];
    let mut holds = Vec::new();
    for n in 1..=MAX {
        holds.push(crate::common::fleet::hold_admitted(survivor, &up, "acme", n).await);
    }
    up.release();
    for h in holds {
        assert_eq!(h.await.unwrap(), Some(200));
    }
}

/// The slots Redis counts for the inflight limit `held` of customer `acme`: the sum of
/// every holder's field in the key's counter (its one `...:ic` hash).
fn counted_slots(redis: &RedisServer) -> u64 {
    redis.hash_counts("tollgate:app:held:*:ic").iter().sum()
}

/// A store whose lease outlives the test (a minute): only a give-back empties a block.
const LONG_LEASE: &str =
    "timeout: 1s\n    breaker: { failures: 1000, probe_every: 50ms }\n    lease: 60s";

/// One instance whose hot key holds a block of free slots (never idle), then `end`:
/// Redis must count no slot afterwards, long before the store lease would lapse.
async fn the_block_goes_back(end: impl AsyncFnOnce(&Tollgate, &str)) {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let lease = "{ hot_above: 5/s, max_share: 50%, idle: 1h }";
    let text = config(
        up.addr,
        &redis.url(),
        LONG_LEASE,
        &holding("inflight", MAX, lease),
    );
    let t = Tollgate::start(&text).await;
    wait_up(&t).await;
    let s = tokio::task::block_in_place(|| slow_as_acme(&t, 400, 4));
    assert_eq!((s.ok, s.done), (400, 400), "{}", s.text);
    // Nothing in use: Redis counts exactly the block's free slots (the gauge follows
    // within a sweep).
    eventually("a block held and counted in Redis", 500, || async {
        let free = t.metric(LEASED).await as u64;
        free > 0 && counted_slots(&redis) == free
    })
    .await;
    end(&t, &text).await;
    eventually("the block is back in Redis", 500, || async {
        counted_slots(&redis) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_that_changes_the_lease_gives_the_block_back() {
    the_block_goes_back(async |t, text| {
        let reloads = "tollgate_config_reloads_total{result=\"success\"}";
        let before = t.metric(reloads).await;
        t.write_config(&text.replace("idle: 1h }", "idle: 1h, renew_every: 50ms }"));
        t.signal(libc::SIGHUP);
        eventually("reloaded", 500, || async {
            t.metric(reloads).await > before
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_gives_the_block_back() {
    the_block_goes_back(async |t, _| {
        t.signal(libc::SIGTERM);
    })
    .await;
}
