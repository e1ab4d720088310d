//! A fleet for the binary-level store tests: tollgate processes sharing limits through a
//! real `redis-server`, a config builder, and a traffic loop that records every answer.
//!
//! Used by `tests/fleet.rs` and `tests/fleet_faults.rs` through `#[path]`, next to
//! `common/redis.rs` (the Redis processes and faults).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::common::{client, Tollgate, Upstream, SERVER};

/// The store settings of a test: roomy budget (a debug build on a busy 2-core machine
/// can miss 5 ms), a breaker that does not open on a slow answer, fast probes, a short
/// lease. Fault tests pass their own.
pub const ROOMY: &str =
    "timeout: 1s\n    breaker: { failures: 1000, probe_every: 50ms }\n    lease: 1s";

/// A config with one Redis store `shared` at `redis` (settings `store`, indented by 4),
/// one origin `app` with `limits` (indented by 6), keyed by the `x-customer-id` header
/// believed from loopback.
pub fn config(up: SocketAddr, redis: &str, store: &str, limits: &str) -> String {
    config_at(up, &format!("url: \"{redis}\""), store, limits)
}

/// [`config`] with the store's address written out: `url: ...`, or `urls: [...]` and
/// `cluster: true` (indented by 4).
pub fn config_at(up: SocketAddr, target: &str, store: &str, limits: &str) -> String {
    format!(
        r#"
{SERVER}  trusted_proxies: ["127.0.0.1/32"]
  customer_header: x-customer-id
stores:
  shared:
    kind: redis
    {target}
    {store}
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
    limits:
{limits}
"#
    )
}

/// One GET to `app.test` as customer `who`.
pub async fn get(t: &Tollgate, path: &str, who: &str) -> reqwest::Response {
    get_bytes(t, path, who.as_bytes()).await
}

/// One GET with a customer header of arbitrary bytes (obs-text included).
pub async fn get_bytes(t: &Tollgate, path: &str, who: &[u8]) -> reqwest::Response {
    client()
        .get(t.url(path))
        .header("host", "app.test")
        .header(
            "x-customer-id",
            reqwest::header::HeaderValue::from_bytes(who).expect("header value"),
        )
        .send()
        .await
        .expect("request")
}

/// The status of one GET.
pub async fn status(t: &Tollgate, who: &str) -> u16 {
    get(t, "/", who).await.status().as_u16()
}

/// `tollgate_store_up{store="shared"}`.
pub const UP: &str = "tollgate_store_up{store=\"shared\"}";
/// `tollgate_store_fallback_decisions_total{store="shared"}`.
pub const FALLBACK: &str = "tollgate_store_fallback_decisions_total{store=\"shared\"}";

/// `tollgate_store_requests_total{result=R,store="shared"}`.
pub fn requests(result: &str) -> String {
    format!("tollgate_store_requests_total{{result=\"{result}\",store=\"shared\"}}")
}

/// Waits (bounded) until the store of `t` is up: decisions go to Redis.
pub async fn wait_up(t: &Tollgate) {
    t.wait_metric(UP, 1.0).await;
}

/// One answer seen by the traffic loop.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// HTTP status, or 0 when the request itself failed (connection error, timeout).
    pub status: u16,
    /// Time from send to the end of the body.
    pub took: Duration,
    /// Wall-clock time at the answer (Redis runs on this machine's clock).
    pub at: SystemTime,
    /// Which instance answered.
    pub instance: usize,
}

/// Requests sent in a loop by `workers` tasks per instance until stopped; each answer is
/// recorded. Bounded: every loop stops when told, or after `max_for` at the latest.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    /// Starts the loops: each task sends GETs as customer `who` to one instance.
    pub fn start(urls: &[String], who: &str, workers: usize, max_for: Duration) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (instance, url) in urls.iter().enumerate() {
            for _ in 0..workers {
                let (stop, seen, url, who) =
                    (stop.clone(), seen.clone(), url.clone(), who.to_string());
                tasks.push(tokio::spawn(async move {
                    let c = reqwest::Client::builder()
                        .timeout(Duration::from_secs(10))
                        .build()
                        .expect("client");
                    let until = Instant::now() + max_for;
                    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                        let started = Instant::now();
                        let sent = c
                            .get(&url)
                            .header("host", "app.test")
                            .header("x-customer-id", &who)
                            .send()
                            .await;
                        let status = match sent {
                            Ok(r) => {
                                let s = r.status().as_u16();
                                match r.bytes().await {
                                    Ok(_) => s,
                                    Err(_) => 0,
                                }
                            }
                            Err(_) => 0,
                        };
                        let s = Seen {
                            status,
                            took: started.elapsed(),
                            at: SystemTime::now(),
                            instance,
                        };
                        seen.lock().expect("seen").push(s);
                    }
                }));
            }
        }
        Traffic { stop, seen, tasks }
    }

    /// Answers so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    /// Answers so far.
    pub fn count(&self) -> usize {
        self.seen.lock().expect("seen").len()
    }

    /// Waits until `n` more answers arrived than now (bounded: 20 s).
    pub async fn more(&self, n: usize) {
        let want = self.count() + n;
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.count() < want {
            assert!(
                Instant::now() < deadline,
                "traffic stalled at {}",
                self.count()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the loops and returns every answer.
    pub async fn stop(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let _ = t.await;
        }
        let seen = self.seen.lock().expect("seen").clone();
        seen
    }
}

/// Asserts that no answer was a 5xx or a failed request, and that each took less than
/// `budget` plus `slack`.
pub fn assert_no_5xx_within(seen: &[Seen], budget: Duration, slack: Duration, what: &str) {
    assert!(!seen.is_empty(), "{what}: no traffic");
    let bad: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.status == 0 || s.status >= 500)
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} failed answers: {bad:?}",
        bad.len()
    );
    let slow: Vec<&Seen> = seen.iter().filter(|s| s.took > budget + slack).collect();
    assert!(
        slow.is_empty(),
        "{what}: {} of {} answers took over {:?}: {slow:?}",
        slow.len(),
        seen.len(),
        budget + slack
    );
}

/// Starts `n` instances on the same config and waits until each one's store is up.
pub async fn fleet(n: usize, text: &str) -> Vec<Tollgate> {
    let mut all = Vec::new();
    for _ in 0..n {
        let t = Tollgate::start(text).await;
        wait_up(&t).await;
        all.push(t);
    }
    all
}

/// Sends `per_instance` concurrent requests as `who` to every instance at once (one
/// client, so the burst does not build a TLS-capable client per request on a busy
/// machine); returns the statuses, 0 for a request that failed (printed, so that a
/// failing count says why).
pub async fn burst(fleet: &[Tollgate], who: &str, per_instance: usize) -> Vec<u16> {
    let shared = client();
    let mut tasks = Vec::new();
    for t in fleet {
        for _ in 0..per_instance {
            let (url, who, c) = (t.url("/"), who.to_string(), shared.clone());
            tasks.push(tokio::spawn(async move {
                let sent = c
                    .get(url)
                    .header("host", "app.test")
                    .header("x-customer-id", who)
                    .send()
                    .await;
                match sent {
                    Ok(r) => r.status().as_u16(),
                    Err(e) => {
                        eprintln!("burst: a request failed: {e:?}");
                        0
                    }
                }
            }));
        }
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// Asserts that no instance decided anything by its fallback.
pub async fn no_fallback(fleet: &[Tollgate]) {
    for t in fleet {
        assert_eq!(t.metric(FALLBACK).await, 0.0, "{}", t.log_text());
    }
}

/// A bucket `tokens` of `capacity` keyed by customer that refills one token an hour,
/// with `store` lines (indented by 8) appended.
pub fn bucket(capacity: u64, store: &str) -> String {
    format!(
        "      tokens:\n        kind: token_bucket\n        key: [customer]\n        capacity: {capacity}\n        refill: {{ amount: 1, every: 1h }}\n{store}"
    )
}

/// The `store:` line of a limit in the shared store.
pub const SHARED: &str = "        store: shared\n";

/// A token bucket, rate, concurrency or inflight limit in the shared store deciding
/// every request exactly (`lease: off`): for the tests that count a small limit's
/// admissions one by one. With leases a burst makes the key hot, and its last units may
/// sit in another instance's slice (an under-admission of at most one unit per
/// instance there, the documented bound, which `tests/it/leases.rs` checks).
pub const EXACT: &str = "        store: shared\n        lease: off\n";

/// Starts a request to `/hold` as `who` through `t`; it answers once the upstream is
/// released (or fails if `t` dies).
pub fn hold(t: &Tollgate, who: &str) -> tokio::task::JoinHandle<Option<u16>> {
    let (url, who) = (t.url("/hold"), who.to_string());
    tokio::spawn(async move {
        client()
            .get(url)
            .header("host", "app.test")
            .header("x-customer-id", who)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    })
}

/// A request to `/hold` as `who` through `t`, sent again while it is refused, until the
/// upstream holds `n` requests. A limit in a store gets a finished request's copy back in
/// the background, after its response: a request sent right after may still find it
/// there, and be refused once; a dead instance's leased units stay counted until its
/// lease ends (at most 3 000 tries).
pub async fn hold_admitted(
    t: &Tollgate,
    up: &Upstream,
    who: &str,
    n: usize,
) -> tokio::task::JoinHandle<Option<u16>> {
    for _ in 0..3_000 {
        let task = hold(t, who);
        let mut tries = 0;
        while up.held() < n && !task.is_finished() {
            tries += 1;
            assert!(
                tries < 3_000,
                "{who}: neither held nor answered within 30 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if up.held() == n {
            return task;
        }
        assert_eq!(task.await.unwrap(), Some(503), "{who}: refused, or held");
    }
    panic!("{who} was never admitted");
}
