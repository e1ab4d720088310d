//! Issue 10 at the binary level: real tollgate processes sharing limits through a real
//! `redis-server` (started on a free loopback port), a real upstream, real HTTP clients.
//!
//! - Two and three instances share one token bucket exactly, and one rate within 1%.
//! - A rejection by a shared limit is the same response as a local one.
//! - Bad input: a wrong URL is a config error at its line; an unreachable Redis at start,
//!   or one that answers errors, fails open (logged) and comes back by itself; hostile key
//!   bytes work.
//! - An instance killed while it holds inflight units: its share is gone after one lease.
//! - A drained shared bucket is still drained after every instance restarts.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::fleet;
use crate::common::redis as harness;

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{eventually, Tollgate, Upstream};
use fleet::{
    bucket, burst, config, fleet, get, get_bytes, hold_admitted, no_fallback, status, wait_up,
    Traffic, EXACT, FALLBACK, ROOMY, SHARED, UP,
};
use harness::RedisServer;

async fn share_one_bucket(n: usize) {
    const C: usize = 25;
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let text = config(up.addr, &redis.url(), ROOMY, &bucket(C as u64, EXACT));
    let all = fleet(n, &text).await;
    // 3 C requests in all, at once, spread over the instances.
    let statuses = burst(&all, "acme", 3 * C / n + 1).await;
    // Every decision came from Redis, none from a fallback (else the count below means
    // nothing: this names the cause, with the instances' logs).
    no_fallback(&all).await;
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let rejected = statuses.iter().filter(|s| **s == 429).count();
    let mut logs = String::new();
    for t in &all {
        logs += &t.log_text();
    }
    assert_eq!(
        (ok, ok + rejected),
        (C, statuses.len()),
        "{n} instances admitted {ok} of a shared bucket of {C}: {statuses:?}\n{logs}"
    );
    // The bucket is empty for every instance; another customer's is full.
    for t in &all {
        assert_eq!(status(t, "acme").await, 429);
        assert_eq!(status(t, "other").await, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_one_token_bucket_exactly() {
    share_one_bucket(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_one_token_bucket_exactly() {
    share_one_bucket(3).await;
}

/// Seconds since the epoch, as a float.
fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_share_a_rate_within_one_percent_over_several_periods() {
    // max N per 1 s: the windows are whole seconds of Redis's clock, which is this
    // machine's clock. After the first (partial) window, a saturated sliding window admits
    // N per window at a steady pace, so the answers of whole windows count N each.
    // Low enough that a client on a loaded machine still sends several times the max in
    // every window (at 200, under stress-ng it sent 252 to 430: gaps it could not make up).
    const N: f64 = 50.0;
    const WINDOWS: u64 = 3;
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = format!(
        "      per_second:\n        kind: rate\n        key: [customer]\n        max: {N}\n        per: 1s\n{SHARED}"
    );
    let all = fleet(3, &config(up.addr, &redis.url(), ROOMY, &limits)).await;
    let urls: Vec<String> = all.iter().map(|t| t.url("/")).collect();
    let started = secs(SystemTime::now()).floor() as u64;
    let traffic = Traffic::start(&urls, "acme", 3, Duration::from_secs(15));
    // Skip the window traffic started in; count the next WINDOWS whole ones.
    let (from, to) = (started + 1, started + 1 + WINDOWS);
    let end = UNIX_EPOCH + Duration::from_millis(to * 1000 + 300);
    while SystemTime::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = traffic.stop().await;
    // Redis decided each request somewhere between its send and its answer. Those wholly
    // inside the counted windows count for sure; those straddling an edge (a slow answer on
    // a busy machine) may belong either side, so they widen the bounds instead of skewing
    // the count.
    let (lo, hi) = (from as f64, to as f64);
    let sent_at = |s: &fleet::Seen| secs(s.at) - s.took.as_secs_f64();
    let within: Vec<_> = seen
        .iter()
        .filter(|s| sent_at(s) >= lo && secs(s.at) < hi)
        .collect();
    let straddling = seen
        .iter()
        .filter(|s| s.status == 200)
        .filter(|s| {
            let (a, b) = (sent_at(s), secs(s.at));
            (a < lo && b >= lo) || (a < hi && b >= hi)
        })
        .count() as f64;
    let admitted = within.iter().filter(|s| s.status == 200).count() as f64;
    let bad = seen
        .iter()
        .filter(|s| s.status != 200 && s.status != 429)
        .count();
    assert_eq!(bad, 0, "answers other than 200 and 429");
    // The load must saturate the limit, or the count means nothing: more requests than
    // the max in every window (a busy machine's client may send few more; a gap before a
    // window's end is allowed for below).
    let mut sent_per_window = Vec::new();
    for w in from..to {
        let sent = within.iter().filter(|s| secs(s.at) as u64 == w).count() as f64;
        assert!(sent > N, "window {w}: only {sent} requests sent");
        sent_per_window.push(sent);
    }
    let want = N * WINDOWS as f64;
    let slack = want / 100.0;
    // A window's count reaches N only if requests keep arriving until its end: at a
    // fraction f of a window the sliding estimate leaves room for about N·f, and what a
    // gap before the window's end could have held is not made up by the next window (it
    // too stops at N). When the busy machine left such a gap, the admissions it could
    // have held (N per second of it, plus one) are allowed for: they are the client's,
    // not the limiter's, shortfall.
    let tail: f64 = (from..to)
        .map(|w| {
            let (start, end) = (w as f64, (w + 1) as f64);
            let last = seen
                .iter()
                .map(sent_at)
                .filter(|t| *t >= start && *t < end)
                .fold(start, f64::max);
            N * (end - last) + 1.0
        })
        .sum();
    assert!(
        admitted <= want + slack && admitted + straddling + tail >= want - slack,
        "admitted {admitted} (+ {straddling} straddling an edge, + {tail:.1} for idle window ends) in {WINDOWS} windows of max {N} (want {want} ± 1%; sent {sent_per_window:?})"
    );
    no_fallback(&all).await;
}

/// The headers of a response that a shared and a local rejection must share, with the
/// values that depend on time (`retry-after`, the `t=` of `ratelimit`) left out.
fn comparable(r: &reqwest::Response) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = r
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str() != "date")
        .map(|(name, v)| {
            let v = v.to_str().unwrap_or("<bytes>").to_string();
            let v = match name.as_str() {
                "retry-after" => "<secs>".to_string(),
                "x-request-id" => "<id>".to_string(),
                "ratelimit" => v.split(";t=").next().unwrap_or("").to_string(),
                _ => v,
            };
            (name.to_string(), v)
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_over_a_shared_limit_is_the_same_response_as_a_local_one() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let shared = fleet(1, &config(up.addr, &redis.url(), ROOMY, &bucket(2, SHARED))).await;
    let local = Tollgate::start(&config(up.addr, &redis.url(), ROOMY, &bucket(2, ""))).await;
    let mut answers = Vec::new();
    for t in [&shared[0], &local] {
        assert_eq!(status(t, "acme").await, 200);
        assert_eq!(status(t, "acme").await, 200);
        let r = get(t, "/", "acme").await;
        assert_eq!(r.status(), 429);
        let retry: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((3590..=3600).contains(&retry), "retry-after {retry}");
        let headers = comparable(&r);
        // The same problem, but for its request's own ID.
        let mut body: serde_json::Value =
            serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert!(body["request_id"].is_string(), "{body}");
        body["request_id"] = "<id>".into();
        answers.push((headers, body));
    }
    assert_eq!(answers[0].0, answers[1].0, "headers: shared vs local");
    assert_eq!(answers[0].1, answers[1].1, "body: shared vs local");
    assert!(
        answers[0].0.iter().any(|(n, _)| n == "ratelimit-policy"),
        "{:?}",
        answers[0].0
    );
    no_fallback(&shared).await;
}

/// `tollgate check` on `text`: exit code and stderr.
fn check(text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_redis_url_is_a_config_error_naming_its_line() {
    let up = Upstream::start("127.0.0.1", "up").await;
    for url in [
        "http://127.0.0.1:6379/0",
        "127.0.0.1:6379",
        "redis://127.0.0.1:notaport/0",
        "redis://[::1/0",
    ] {
        let text = config(up.addr, url, ROOMY, &bucket(2, SHARED))
            .replace("{listen}", "127.0.0.1:1")
            .replace("{metrics}", "127.0.0.1:2");
        let line = text.lines().position(|l| l.contains("url:")).unwrap() + 1;
        let (code, err) = check(&text);
        assert_eq!(code, 1, "{url}: {err}");
        let at = format!("tollgate.yaml:{line}:10: stores.shared.url:");
        assert!(err.contains(&at), "{url}: want `{at}` in:\n{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_at_start_fails_open_logs_it_and_comes_back() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let port = harness::free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    let t = Tollgate::start(&config(up.addr, &url, ROOMY, &bucket(2, SHARED))).await;
    // It serves: the local fallback decides at this instance's share (instances: 1).
    assert_eq!(status(&t, "acme").await, 200);
    assert_eq!(status(&t, "acme").await, 200);
    assert_eq!(status(&t, "acme").await, 429);
    assert_eq!(t.metric(UP).await, 0.0);
    assert_eq!(t.metric(FALLBACK).await, 3.0);
    let log = t.log_text();
    assert!(
        log.contains("store shared: probe failed"),
        "no log line about the store:\n{log}"
    );
    // Redis appears: the store comes up by itself and decides from Redis's state.
    let redis = RedisServer::start_on(port);
    wait_up(&t).await;
    assert_eq!(status(&t, "acme").await, 200);
    assert_eq!(t.metric(FALLBACK).await, 3.0);
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_answers_errors_fails_open_and_comes_back() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let store = "timeout: 1s\n    breaker: { failures: 3, probe_every: 50ms }";
    let all = fleet(
        1,
        &config(up.addr, &redis.url(), store, &bucket(1000, SHARED)),
    )
    .await;
    let t = &all[0];
    assert_eq!(status(t, "acme").await, 200);
    // Scripts are denied to the default user: every decision gets -NOPERM.
    redis.cmd(&["ACL", "SETUSER", "default", "-evalsha", "-eval"]);
    for _ in 0..10 {
        assert_eq!(status(t, "acme").await, 200);
    }
    assert!(t.metric(&fleet::requests("error")).await >= 3.0);
    assert_eq!(t.metric(UP).await, 0.0, "the breaker did not open");
    assert!(t.metric(FALLBACK).await >= 10.0);
    assert!(
        t.log_text().contains("store shared: down"),
        "{}",
        t.log_text()
    );
    // Allowed again: the probe closes the breaker, Redis decides again.
    redis.cmd(&["ACL", "SETUSER", "default", "+@all"]);
    wait_up(t).await;
    let before = t.metric(FALLBACK).await;
    assert_eq!(status(t, "acme").await, 200);
    assert_eq!(t.metric(FALLBACK).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_key_bytes_each_get_their_own_shared_bucket() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let all = fleet(2, &config(up.addr, &redis.url(), ROOMY, &bucket(2, SHARED))).await;
    let long = "k".repeat(200) + "{tag}";
    let hostile: Vec<Vec<u8>> = vec![
        b"{acme}".to_vec(),
        b"}{".to_vec(),
        b"a b:c\t*$3\\r\\n".to_vec(),
        "ключ🔑".as_bytes().to_vec(),
        vec![0x80, 0xfe, 0xff, b'x'],
        long.into_bytes(),
        "x".repeat(4000).into_bytes(),
    ];
    for key in &hostile {
        // Two tokens through two instances, then rejected by either.
        for (i, want) in [(0, 200), (1, 200), (0, 429), (1, 429)] {
            let r = get_bytes(&all[i], "/", key).await;
            assert_eq!(r.status().as_u16(), want, "key {key:?} at instance {i}");
        }
    }
    no_fallback(&all).await;
    // Each key is one Redis key, readable (prefix, origin, limit) whatever its bytes.
    let keys = match redis.cmd(&["KEYS", "tollgate:*"]) {
        redis::Value::Array(keys) => keys,
        other => panic!("KEYS: {other:?}"),
    };
    let names: Vec<String> = keys
        .iter()
        .map(|k| match k {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
            other => panic!("{other:?}"),
        })
        .filter(|k| k.contains("tokens"))
        .collect();
    assert_eq!(names.len(), hostile.len(), "{names:?}");
    for n in &names {
        assert!(n.is_ascii() && n.contains("app") && n.len() < 200, "{n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_killed_holding_inflight_units_loses_them_after_one_lease() {
    const MAX: usize = 4;
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = format!(
        "      conc:\n        kind: inflight\n        key: [customer]\n        max: {MAX}\n{SHARED}"
    );
    // A lease long enough that a busy machine's next request, right after the kill, still
    // sees the dead share (renewals every lease / 3: it lasts at least 2.67 s after).
    let store = "timeout: 1s\n    breaker: { failures: 1000, probe_every: 50ms }\n    lease: 4s";
    let mut all = fleet(2, &config(up.addr, &redis.url(), store, &limits)).await;
    // Instance 0 holds 3 units; instance 1 holds 1: the limit is full.
    let mut held = Vec::new();
    for (i, n) in [(0, 3), (1, 1)] {
        for _ in 0..n {
            let url = all[i].url("/hold");
            held.push(tokio::spawn(async move {
                common::client()
                    .get(url)
                    .header("host", "app.test")
                    .header("x-customer-id", "acme")
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            }));
        }
    }
    eventually("4 requests held upstream", 500, || async {
        up.held() == MAX
    })
    .await;
    assert_eq!(
        status(&all[1], "acme").await,
        503,
        "the shared limit is full"
    );
    // SIGKILL instance 0: no release is ever sent for its 3 units.
    let killed = Instant::now();
    all[0].signal(libc::SIGKILL);
    let _ = all[0].child.wait();
    // Its share is still counted until its lease (4 s) runs out...
    assert_eq!(status(&all[1], "acme").await, 503, "share gone at once");
    // ... and gone after it: instance 1 gets the 3 units back.
    eventually("the dead instance's share expires", 400, || async {
        status(&all[1], "acme").await == 200
    })
    .await;
    let after = killed.elapsed();
    // Renewed every lease / 3: the last renewal was at most 4/3 s before the kill.
    assert!(after >= Duration::from_millis(2600), "gone after {after:?}");
    // Instance 1 holds 1 unit: exactly 3 more fit, then the limit is full again. The
    // probe's own unit goes back to Redis in the background after its response, so a
    // request sent at once may still find it there: each is retried until held.
    eventually(
        "the killed instance's requests left the upstream",
        1_500,
        || async { up.held() == 1 },
    )
    .await;
    let mut extra = Vec::new();
    for n in 2..=MAX {
        extra.push(hold_admitted(&all[1], &up, "acme", n).await);
    }
    assert_eq!(status(&all[1], "acme").await, 503, "full again at {MAX}");
    up.release();
    for h in extra {
        assert_eq!(h.await.unwrap(), Some(200));
    }
    // The three held through the killed instance failed; the one through instance 1 ended.
    let mut ends = Vec::new();
    for h in held {
        ends.push(h.await.unwrap().ok());
    }
    assert_eq!(ends.iter().filter(|e| e.is_none()).count(), 3, "{ends:?}");
    assert!(ends.contains(&Some(200)), "{ends:?}");
    let _ = all.remove(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_shared_bucket_stays_drained_after_every_instance_restarts() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let text = config(up.addr, &redis.url(), ROOMY, &bucket(3, SHARED));
    let all = fleet(2, &text).await;
    for t in [&all[0], &all[1], &all[0]] {
        assert_eq!(status(t, "acme").await, 200);
    }
    assert_eq!(status(&all[1], "acme").await, 429);
    // Every instance goes (killed, so nothing is written at shutdown), new ones start.
    drop(all);
    let all = fleet(2, &text).await;
    for t in &all {
        assert_eq!(
            status(t, "acme").await,
            429,
            "a restart refilled the bucket"
        );
        assert_eq!(status(t, "other").await, 200);
    }
    no_fallback(&all).await;
}

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tollgate-fleet.yaml");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_example_checks_and_runs_as_its_comments_say() {
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    let (code, err) = check(&text);
    assert_eq!(code, 0, "{err}");
    // Run it on test ports against a test Redis: the first 5 requests of a customer pass,
    // the 6th gets 429, on any of two instances.
    let redis = RedisServer::start();
    let demo = format!("127.0.0.1:{}", common::free_port());
    let text = text
        .replace("127.0.0.1:8080", "{listen}")
        .replace("127.0.0.1:9100", "{metrics}")
        .replace("127.0.0.1:8081", &demo)
        .replace("redis://127.0.0.1:6379/0", &redis.url())
        // A roomy budget: a debug build on a busy machine can miss 5 ms, and a fallback
        // decision (at a third of the bucket on each instance) would change the count.
        .replace("timeout: 5ms", "timeout: 1s");
    let a = Tollgate::start(&text).await;
    wait_up(&a).await;
    let b_text = text.replace(&demo, &format!("127.0.0.1:{}", common::free_port()));
    let b = Tollgate::start(&b_text).await;
    wait_up(&b).await;
    let send = |t: &Tollgate| {
        let url = t.url("/");
        async move {
            common::client()
                .get(url)
                .header("x-customer-id", "acme")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let mut got = Vec::new();
    for t in [&a, &b, &a, &b, &a, &b] {
        got.push(send(t).await);
    }
    assert_eq!(got, [200, 200, 200, 200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_metrics_are_exposed_and_pass_promtool() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let all = fleet(1, &config(up.addr, &redis.url(), ROOMY, &bucket(1, SHARED))).await;
    let t = &all[0];
    assert_eq!(status(t, "acme").await, 200);
    assert_eq!(status(t, "acme").await, 429);
    let text = t.metrics_text().await;
    for line in [
        "tollgate_store_up{store=\"shared\"} 1",
        "tollgate_store_requests_total{result=\"ok\",store=\"shared\"} 2",
        "tollgate_store_latency_seconds_count{store=\"shared\"} 2",
        "tollgate_store_fallback_decisions_total{store=\"shared\"} 0",
        "tollgate_store_lease_calls_total{result=\"granted\",store=\"shared\"} 0",
        "tollgate_store_lease_calls_total{result=\"failed\",store=\"shared\"} 0",
    ] {
        assert!(text.contains(line), "missing `{line}` in\n{text}");
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (scripts/deps.sh installs it)");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
