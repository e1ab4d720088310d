//! Snapshot benchmark: what writing and loading `stores.local.snapshot` costs for large
//! tables, and what a write does to decisions made meanwhile.
//!
//! One origin with a token bucket and a rate limit of `max_keys` N (half full), a sliding
//! log (`{max: 10, per: 1d}`, N/10 keys, 5 entries each) and a tiered limit (tiers of 20
//! and 50, hard limit 10, N/10 keys, 3 hits each), as the proxy holds them.
//! - *write*: `Snapshots::write` into a temporary directory: this thread's CPU time (the
//!   tables copied a set at a time, encoded, checksummed) and wall time (with `fsync` of the
//!   file and the directory), and the file's size.
//! - *load*: `Snapshots::load` into a fresh runtime of the same config: CPU time of the
//!   checksum pass, the parse pass and the restoring pass.
//! - *decisions during a write*: one thread decides token-bucket requests on random keys
//!   back to back for the length of a write, timing each (wall ns), once while idle and once
//!   while the main thread writes: percentiles and the maximum, i.e. how long a decision may
//!   wait for a set the writer holds. On a shared 2-core machine the tail is mostly the
//!   scheduler's; compare the two rows.
//!
//! Run: `nice cargo bench --bench snapshot` (N = 1 M; about a minute). `cargo test
//! --all-targets` runs this binary without `--bench`, as a smoke test with N = 10 000.

// A benchmark may unwrap: a failure aborts the measurement, not a user's request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use tollgate::config::parse_str;
use tollgate::limits::{Clock, MonotonicClock};
use tollgate::metrics::Metrics;
use tollgate::runtime::limiter::Limiter;
use tollgate::runtime::Runtime;
use tollgate::snapshot::format::Reason;
use tollgate::snapshot::{Loaded, Snapshots};

fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn config(n: usize, path: &std::path::Path) -> String {
    let tenth = (n / 10).max(8);
    format!(
        r#"
stores:
  local: {{ snapshot: "{path}", every: 1h }}
origins:
  app:
    hosts: [app.test]
    upstreams: ["127.0.0.1:9"]
    limits:
      tb: {{ kind: token_bucket, key: [client_ip], capacity: 100, refill: {{ amount: 1, every: 1s }}, max_keys: {n} }}
      rate: {{ kind: rate, key: [client_ip], max: 100, per: 1m, max_keys: {n} }}
      log: {{ kind: sliding_log, key: [client_ip], windows: [{{ max: 10, per: 1d }}], max_keys: {tenth} }}
      tiers:
        kind: tiered
        key: [client_ip]
        hard_limit: 10
        max_keys: {tenth}
        tiers:
          - {{ limit: 20, window: 1m, active: 10m, cooldown: 0s }}
          - {{ limit: 50, window: 1m, active: 5m, cooldown: 1h }}
"#,
        path = path.display()
    )
}

fn runtime(text: &str) -> Arc<ArcSwap<Runtime>> {
    let config = parse_str(text, "bench.yaml").unwrap().config;
    let rt = Runtime::build(Arc::new(config), None, &Metrics::new().unwrap())
        .unwrap()
        .0;
    Arc::new(ArcSwap::from_pointee(rt))
}

fn limiter<'a>(rt: &'a Runtime, name: &str) -> &'a Limiter {
    let l = rt.origins[0].all_limits().find(|l| l.name == name).unwrap();
    &l.variants[0].limiter
}

/// Spreads small integers over the key space, as hashed keys are.
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

fn fill(rt: &Runtime, n: u64, now: u64) {
    let (
        Limiter::TokenBucket(tb),
        Limiter::Rate(rate),
        Limiter::SlidingLog(log),
        Limiter::Tiered(tiers),
    ) = (
        limiter(rt, "tb"),
        limiter(rt, "rate"),
        limiter(rt, "log"),
        limiter(rt, "tiers"),
    )
    else {
        panic!("kinds")
    };
    for i in 0..n / 2 {
        tb.state.local().unwrap().acquire(key(i), 10, now);
        rate.state
            .local()
            .unwrap()
            .acquire(key(i), 100, 3, false, now);
    }
    for i in 0..n / 20 {
        log.state.local().unwrap().acquire(key(i), 5, now);
        for _ in 0..3 {
            tiers.state.local().unwrap().acquire(key(i), now);
        }
    }
}

/// Keys holding state in the four tables.
fn held(rt: &Runtime, now: u64) -> u64 {
    let n = match (
        limiter(rt, "tb"),
        limiter(rt, "rate"),
        limiter(rt, "log"),
        limiter(rt, "tiers"),
    ) {
        (
            Limiter::TokenBucket(tb),
            Limiter::Rate(rate),
            Limiter::SlidingLog(log),
            Limiter::Tiered(tiers),
        ) => {
            tb.state.local().unwrap().len()
                + rate.state.local().unwrap().len()
                + log.state.local().unwrap().len()
                + tiers.state.local().unwrap().len(now)
        }
        _ => panic!("kinds"),
    };
    n as u64
}

/// Decision times (wall ns) on the token bucket while `busy` holds, at least `min` of them.
fn decide_while(rt: &Runtime, clock: MonotonicClock, busy: &AtomicBool, n: u64) -> Vec<u64> {
    let Limiter::TokenBucket(tb) = limiter(rt, "tb") else {
        panic!("tb")
    };
    let tb = tb.state.local().unwrap();
    let mut times = Vec::with_capacity(1 << 20);
    let mut i = 0u64;
    while busy.load(Ordering::Relaxed) || times.len() < 1000 {
        let k = key(i % n);
        i += 1;
        let t = Instant::now();
        std::hint::black_box(tb.acquire(k, 1, clock.now()));
        times.push(t.elapsed().as_nanos() as u64);
    }
    times.sort_unstable();
    times
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn row(what: &str, t: &[u64]) {
    println!(
        "{what:<28} {:>9} decisions  p50 {:>6} ns  p99 {:>6} ns  p99.9 {:>7} ns  max {:>9} ns",
        t.len(),
        pct(t, 0.5),
        pct(t, 0.99),
        pct(t, 0.999),
        t[t.len() - 1]
    );
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let n: usize = if smoke { 10_000 } else { 1_000_000 };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.snap");
    let text = config(n, &path);
    let clock = MonotonicClock::from_unix_epoch();

    let live = runtime(&text);
    let metrics = Metrics::new().unwrap();
    let snaps = Snapshots::new(live.clone(), clock, &metrics).unwrap();
    let started = Instant::now();
    fill(&live.load(), n as u64, clock.now());
    println!(
        "N = {n}: filled {} bucket and rate keys, {} log and tier keys in {:?}",
        n / 2,
        n / 20,
        started.elapsed()
    );

    let (cpu, wall) = (cpu_ns(), Instant::now());
    assert!(snaps.write(Reason::Periodic));
    let (cpu, wall) = (cpu_ns() - cpu, wall.elapsed());
    let bytes = std::fs::metadata(&path).unwrap().len();
    println!(
        "write: {:.1} ms CPU, {:.1} ms wall (with fsync), {:.1} MB, {:.0} ns CPU per key",
        cpu as f64 / 1e6,
        wall.as_secs_f64() * 1e3,
        bytes as f64 / 1e6,
        cpu as f64 / (n as f64 + n as f64 / 10.0)
    );

    let fresh = runtime(&text);
    let loader = Snapshots::new(fresh.clone(), clock, &Metrics::new().unwrap()).unwrap();
    let cpu = cpu_ns();
    let Loaded::Restored(counts) = loader.load() else {
        panic!("not restored")
    };
    let cpu = cpu_ns() - cpu;
    println!(
        "load: {:.1} ms CPU for {} keys ({})",
        cpu as f64 / 1e6,
        counts.total(),
        counts.describe()
    );
    assert_eq!(
        counts.total(),
        held(&live.load(), clock.now()),
        "every key comes back"
    );

    // Decisions while idle, then while a write runs, for as long as a write takes.
    let rt = live.load_full();
    let busy = AtomicBool::new(true);
    let idle = std::thread::scope(|s| {
        let h = s.spawn(|| decide_while(&rt, clock, &busy, n as u64));
        std::thread::sleep(wall);
        busy.store(false, Ordering::Relaxed);
        h.join().unwrap()
    });
    busy.store(true, Ordering::Relaxed);
    let writing = std::thread::scope(|s| {
        let h = s.spawn(|| decide_while(&rt, clock, &busy, n as u64));
        snaps.write(Reason::Periodic);
        busy.store(false, Ordering::Relaxed);
        h.join().unwrap()
    });
    row("decisions, idle", &idle);
    row("decisions during a write", &writing);
}
