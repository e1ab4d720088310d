//! Redis faults while traffic runs through the real binary: Redis frozen (SIGSTOP), killed
//! and restarted (and its scripts flushed: the NOSCRIPT path), `CLIENT PAUSE`, and a
//! listener that accepts and never answers.
//!
//! And a request admitted through a shared limit while Redis was up, held at the upstream
//! while Redis is killed: it still ends 200, and its unit is released in this instance's
//! ledger (a fresh Redis gets no leaked share from the renewals).
//!
//! Each fault: no 5xx and no failed request; every answer within the store's budget plus a
//! generous slack (a deadline that catches a request waiting on Redis, not a performance
//! measurement); the breaker opens (`tollgate_store_up` 0) and the fallback decides
//! (its counter rises); once Redis is back, enforcement from Redis's state resumes within
//! a second (probes every 100 ms).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::fleet;
use crate::common::redis as harness;

use std::time::{Duration, Instant};

use common::{client, eventually, Tollgate, Upstream};
use fleet::{assert_no_5xx_within, config, status, wait_up, Traffic, FALLBACK, ROOMY, UP};
use harness::{BlackHole, RedisServer};

/// The store's budget per decision.
const BUDGET: Duration = Duration::from_millis(100);
/// What a request may take beyond the budget: proxying, a debug build, a busy machine.
/// Not "a little": this is a deadline that catches a request waiting on a frozen Redis (it
/// would wait seconds), not a latency measurement. These tests run the debug binary, five
/// at once, on a shared 2-core machine: under parallel builds a request through the
/// killed-Redis test took 214 ms once (a 25 ms budget + 189 ms of scheduling), and with
/// `stress-ng --cpu 2` loading the machine beside a full run of the suite and other
/// builds (load average 15 on 2 cores), 1.5 s: 3 s stays. It catches a request that hangs
/// on a frozen Redis, not a slow one; what a decision costs is measured, not asserted. The tight checks are
/// at the library level, in `tests/redis_store.rs`: every call
/// under a fault returns within its budget + 250 ms, with the default 5 ms budget; and the
/// end-to-end figure (added p99 with Redis frozen <= budget + 1 ms, release build) is
/// measured by `benches/e2e_store.sh`, not asserted.
const SLACK: Duration = Duration::from_secs(3);
/// How soon after Redis is back its state must decide again: within a second, as
/// promised. With probes every 100 ms it took 28-193 ms over 8 runs of this file under load.
const RESUME_WITHIN: Duration = Duration::from_millis(1000);

/// Budget 100 ms (25 ms missed too often beside `stress-ng --cpu 2`: a drain's decisions
/// kept falling back), 3 failures open the breaker, probes every 100 ms, fail open (`allow`),
/// no deny cache (a rejection remembered from Redis would hide the fallback).
const STORE: &str = "timeout: 100ms\n    breaker: { failures: 3, probe_every: 100ms }\n    fallback: allow\n    deny_cache: 0";

/// A roomy shared bucket for the traffic, with an override of 2 tokens (one an hour) for
/// `drained`.
const LIMITS: &str = "      tokens:
        kind: token_bucket
        key: [customer]
        capacity: 1000000
        refill: { amount: 1000, every: 1s }
        store: shared
        overrides:
          - match: { customer: drained }
            capacity: 2
            refill: { amount: 1, every: 1h }
";

async fn start(redis_url: &str) -> (Upstream, Tollgate) {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, redis_url, STORE, LIMITS)).await;
    (up, t)
}

/// Drains `drained` through Redis: two tokens, then rejected. The fallback (`allow`) never
/// rejects, so the 429 is Redis's. A decision that missed the budget on a busy
/// machine is admitted by the fallback without taking a token, so a few more tries are
/// allowed (bounded); when the fallback decided nothing meanwhile (the traffic loop shares
/// its counter), exactly two were admitted.
async fn drain(t: &Tollgate) {
    let before = t.metric(FALLBACK).await;
    let mut admitted = 0;
    loop {
        match status(t, "drained").await {
            429 => break,
            200 => admitted += 1,
            other => panic!("drained answered {other}"),
        }
        assert!(admitted <= 50, "never rejected:\n{}", t.log_text());
    }
    let fell_back = t.metric(FALLBACK).await - before;
    assert!(admitted >= 2, "{admitted} admitted of 2 tokens");
    assert!(
        admitted == 2 || fell_back >= (admitted - 2) as f64,
        "{admitted} admitted of 2 tokens, {fell_back} decisions by the fallback"
    );
}

/// Traffic as customer `load` through `t`, two loops, at most 60 s.
fn traffic(t: &Tollgate) -> Traffic {
    Traffic::start(&[t.url("/")], "load", 2, Duration::from_secs(60))
}

/// Waits (bounded) until the breaker opened and the fallback decided some requests.
///
/// The traffic's key is hot, so it may hold a leased slice when Redis goes: the slice
/// keeps admitting (as the store's, no call) until it is spent, and only then does the
/// fallback decide (docs/fleet.md, "Leases"). A slice is at most about `renew_every` of
/// the key's rate, so the traffic goes on in batches of 20 until the fallback has decided
/// 10, for at most 1 000 requests: far more than any slice this traffic takes.
async fn breaker_opens(t: &Tollgate, traffic: &Traffic) {
    t.wait_metric(UP, 0.0).await;
    let before = t.metric(FALLBACK).await;
    for _ in 0..50 {
        traffic.more(20).await;
        if t.metric(FALLBACK).await >= before + 10.0 {
            return;
        }
    }
    panic!(
        "the fallback did not decide: {} decisions in 1 000 requests",
        t.metric(FALLBACK).await - before
    );
}

/// Waits until the drained key is rejected again (Redis decides), at most
/// [`RESUME_WITHIN`] after `back`.
async fn enforcement_resumes(t: &Tollgate, back: Instant) {
    while status(t, "drained").await != 429 {
        assert!(
            back.elapsed() < RESUME_WITHIN,
            "still not enforced {:?} after Redis came back:\n{}",
            back.elapsed(),
            t.log_text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(t.metric(UP).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_frozen_by_sigstop() {
    let mut redis = RedisServer::start();
    let (_up, t) = start(&redis.url()).await;
    wait_up(&t).await;
    drain(&t).await;
    let load = traffic(&t);
    load.more(20).await;
    redis.freeze();
    breaker_opens(&t, &load).await;
    // While frozen the drained key is admitted: fail open.
    assert_eq!(status(&t, "drained").await, 200);
    redis.thaw();
    enforcement_resumes(&t, Instant::now()).await;
    load.more(20).await;
    let seen = load.stop().await;
    assert_no_5xx_within(&seen, BUDGET, SLACK, "frozen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_and_restarted_and_its_scripts_flushed() {
    let mut redis = RedisServer::start();
    let (_up, t) = start(&redis.url()).await;
    wait_up(&t).await;
    let load = traffic(&t);
    load.more(20).await;
    redis.kill();
    breaker_opens(&t, &load).await;
    redis.restart();
    let back = Instant::now();
    // A restarted Redis has no data: the store comes up and drains the key from scratch.
    eventually("the store comes back", 100, || async {
        t.metric(UP).await == 1.0
    })
    .await;
    assert!(
        back.elapsed() < RESUME_WITHIN,
        "up after {:?}",
        back.elapsed()
    );
    drain(&t).await;
    // Scripts lost while connected (what a restart between probes looks like): the
    // decision gets NOSCRIPT, sends the script itself, and Redis still decides.
    // The fallback (`allow`) never rejects: a 429 is Redis's. (Retried: on a busy machine
    // the EVAL after NOSCRIPT can miss the budget; Redis keeps the script it ran.)
    redis.cmd(&["SCRIPT", "FLUSH"]);
    let mut tries = 0;
    while status(&t, "drained").await != 429 {
        tries += 1;
        assert!(tries < 50, "Redis never decided again:\n{}", t.log_text());
    }
    // The line is written before the answer, but read from the process's stderr by
    // another thread: wait for it rather than race it.
    eventually("the lost script is logged", 100, || async {
        t.log_text().contains("Redis lost script")
    })
    .await;
    load.more(20).await;
    let seen = load.stop().await;
    assert_no_5xx_within(&seen, BUDGET, SLACK, "killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_paused_by_client_pause() {
    // Long enough for the breaker to open while paused on a loaded machine.
    const PAUSE: Duration = Duration::from_millis(3000);
    let redis = RedisServer::start();
    let (_up, t) = start(&redis.url()).await;
    wait_up(&t).await;
    drain(&t).await;
    let load = traffic(&t);
    load.more(20).await;
    redis.client_pause(PAUSE.as_millis() as u64);
    let paused = Instant::now();
    breaker_opens(&t, &load).await;
    assert!(
        paused.elapsed() < PAUSE,
        "the breaker opened too late to tell"
    );
    assert_eq!(status(&t, "drained").await, 200);
    let back = paused + PAUSE;
    tokio::time::sleep_until(back.into()).await;
    enforcement_resumes(&t, back).await;
    load.more(20).await;
    let seen = load.stop().await;
    assert_no_5xx_within(&seen, BUDGET, SLACK, "paused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_accepts_and_never_answers() {
    let hole = BlackHole::start();
    let (up, t) = start(&hole.url()).await;
    let load = traffic(&t);
    load.more(40).await;
    // Never up; every decision by the fallback; the hole did get our bytes.
    assert_eq!(t.metric(UP).await, 0.0);
    assert!(t.metric(FALLBACK).await >= 40.0);
    assert!(
        hole.accepted() >= 1 && hole.received() > 0,
        "never connected"
    );
    // Pointed at a real Redis by a reload: its state decides within a second.
    let redis = RedisServer::start();
    t.write_config(&config(up.addr, &redis.url(), STORE, LIMITS));
    t.signal(libc::SIGHUP);
    let back = Instant::now();
    eventually("the reloaded store comes up", 100, || async {
        t.metric(UP).await == 1.0
    })
    .await;
    assert!(
        back.elapsed() < RESUME_WITHIN,
        "up after {:?}",
        back.elapsed()
    );
    drain(&t).await;
    load.more(20).await;
    let seen = load.stop().await;
    assert_no_5xx_within(&seen, BUDGET, SLACK, "black hole");
}

/// Starts a request to `/hold` as `who` through `t`: it answers once the upstream is
/// released; `None` when the request itself failed.
fn hold(t: &Tollgate, who: &str) -> tokio::task::JoinHandle<Option<(u16, String)>> {
    let (url, who) = (t.url("/hold"), who.to_string());
    tokio::spawn(async move {
        let r = client()
            .get(url)
            .header("host", "app.test")
            .header("x-customer-id", who)
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.ok()?))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_admitted_before_redis_is_killed_still_succeeds_and_releases() {
    const MAX: usize = 2;
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    // A shared inflight limit (its unit released after the response, through Redis) and a
    // shared token bucket, both deciding in Redis. A roomy budget (nothing here may be
    // decided by the fallback on a busy machine; a killed Redis still opens the breaker at
    // once: a connection error); lease 1 s: renewals every 333 ms.
    let limits = format!(
        "      conc:\n        kind: inflight\n        key: [customer]\n        max: {MAX}\n        store: shared\n{LIMITS}"
    );
    let t = Tollgate::start(&config(up.addr, &redis.url(), ROOMY, &limits)).await;
    wait_up(&t).await;
    let inflight = "tollgate_inflight_requests{origin=\"app\"}";
    let held: Vec<_> = (0..MAX).map(|_| hold(&t, "acme")).collect();
    eventually("both requests held upstream", 500, || async {
        up.held() == MAX
    })
    .await;
    // Redis counted them: the limit is full, and nothing was decided by the fallback.
    assert_eq!(status(&t, "acme").await, 503, "{}", t.log_text());
    assert_eq!(t.metric(FALLBACK).await, 0.0, "{}", t.log_text());
    assert_eq!(t.metric(inflight).await, MAX as f64);
    // Redis goes away while both are held upstream; then the upstream answers.
    redis.kill();
    up.release();
    for h in held {
        let (code, body) = h.await.unwrap().expect("the held request failed");
        assert_eq!(code, 200, "{body}");
        assert_eq!(body, "hello from up\n");
    }
    // Released here, although Redis never heard of it: the gauge is back to 0 and ...
    t.wait_metric(inflight, 0.0).await;
    // (The failed release, or a renewal, opened the breaker.)
    t.wait_metric(UP, 0.0).await;
    // ... a fresh Redis gets no leaked share from this instance's renewals: once up and a
    // lease's worth of renewals later, MAX new requests fit again, and no more.
    redis.restart();
    wait_up(&t).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let again: Vec<_> = (0..MAX).map(|_| hold(&t, "acme")).collect();
    eventually("both new requests held upstream", 500, || async {
        up.held() == MAX
    })
    .await;
    assert_eq!(status(&t, "acme").await, 503, "full again at {MAX}");
    up.release();
    for h in again {
        assert_eq!(h.await.unwrap().map(|(c, _)| c), Some(200));
    }
}
