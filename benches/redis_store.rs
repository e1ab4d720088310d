//! The Redis store's costs, against a `redis-server` this benchmark starts on a free
//! loopback port (and stops): `cargo bench --bench redis_store`.
//!
//! - decisions per second through one connection at 1, 16 and 64 concurrent callers, for
//!   the token bucket and for the sliding log, tiered and concurrency kinds;
//! - Redis's own CPU per decision (INFO `used_cpu_user` + `used_cpu_sys` deltas);
//! - this process's CPU per decision (getrusage: the callers, the store's runtime thread
//!   and its connection driver), next to a local token-bucket decision's;
//! - the latency a shared decision adds, p50 and p99, per kind;
//! - the store calls the deny cache saves under a flood from one key.
//!
//! Each phase runs for `TOLLGATE_BENCH_SECS` seconds (default 2 under `cargo bench`, 0.1
//! when `cargo test --all-targets` runs it as a smoke test), about 10 phases in all.
//! Loopback only; the load is bounded in time.

// A benchmark or example may unwrap: a failure aborts the measurement, not a user's request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/it/common/redis.rs"]
mod harness;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::limits::sliding_log::LogWindow;
use tollgate::limits::tiered::{Tier, TieredParams};
use tollgate::limits::{
    Clock, ConcurrencyParams, MonotonicClock, RateParams, SketchSize, TokenBucket,
    TokenBucketParams,
};
use tollgate::metrics::StoreMetrics;
use tollgate::store::{
    Endpoint, RedisStore, RedisStoreConfig, SharedConcurrency, SharedInflight, SharedRate,
    SharedSlidingLog, SharedTiered, SharedTokenBucket, Source, Variant,
};

const SEC: u64 = 1_000_000_000;

fn phase() -> Duration {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this as a smoke test,
    // with short phases so that the suite stays quick.
    let default = if std::env::args().any(|a| a == "--bench") {
        2.0
    } else {
        0.1
    };
    let secs = std::env::var("TOLLGATE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(default);
    Duration::from_secs_f64(secs.clamp(0.1, 60.0))
}

/// CPU seconds this process used so far (user + system, all threads).
fn process_cpu() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// What one row of the throughput table needs.
struct Row<'a> {
    rt: &'a tokio::runtime::Runtime,
    redis: &'a harness::RedisServer,
    metrics: &'a StoreMetrics,
    len: Duration,
}

impl Row<'_> {
    /// Runs `decide` from `callers` concurrent tasks for one phase, each over its own run
    /// of 10 000 keys, and prints the row.
    fn run<F, Fut>(&self, kind: &str, callers: usize, decide: F)
    where
        F: Fn(u64) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let done = Arc::new(AtomicU64::new(0));
        let fallback_before = self.metrics.fallback.get();
        let (cpu0, redis_cpu0) = (process_cpu(), self.redis.cpu_seconds());
        let started = Instant::now();
        let len = self.len;
        let latencies = self.rt.block_on(async {
            let tasks: Vec<_> = (0..callers)
                .map(|c| {
                    let (decide, done) = (decide.clone(), Arc::clone(&done));
                    tokio::spawn(async move {
                        let mut lat = Vec::with_capacity(100_000);
                        let mut key = c as u64 * 1_000_003;
                        while started.elapsed() < len {
                            key = key.wrapping_add(1);
                            let t = Instant::now();
                            decide(key % 10_000).await;
                            lat.push(t.elapsed());
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        lat
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all
        });
        let elapsed = started.elapsed().as_secs_f64();
        let n = done.load(Ordering::Relaxed) as f64;
        // Let background releases land before the CPU is read.
        std::thread::sleep(Duration::from_millis(50));
        let cpu = (process_cpu() - cpu0) / n;
        let redis_cpu = (self.redis.cpu_seconds() - redis_cpu0) / n;
        let mut lat = latencies;
        lat.sort();
        println!(
            "{:<14} {:>8} {:>12.0} {:>10.1} {:>10.1} {:>11.2} µs {:>11.2} µs {:>9}",
            kind,
            callers,
            n / elapsed,
            us(percentile(&lat, 0.5)),
            us(percentile(&lat, 0.99)),
            cpu * 1e6,
            redis_cpu * 1e6,
            self.metrics.fallback.get() - fallback_before,
        );
    }
}

fn main() {
    let redis = harness::RedisServer::start();
    let mut config = RedisStoreConfig::new("bench", Endpoint::Standalone(redis.url()));
    // A roomy budget: the benchmark measures the store, not its fallback.
    config.tuning.timeout = Duration::from_millis(100);
    let metrics = StoreMetrics::unregistered("bench").unwrap();
    let store = RedisStore::new(config, metrics.clone()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    assert!(
        rt.block_on(store.wait_up(Duration::from_secs(5))),
        "store never came up"
    );
    let len = phase();
    println!(
        "redis_store: redis-server {} on 127.0.0.1:{}, {len:?} per phase, 2 caller threads",
        redis
            .info_field("server", "redis_version")
            .unwrap_or_default(),
        redis.port()
    );

    // Local baseline: one in-process token-bucket decision.
    let local = TokenBucket::new(
        TokenBucketParams {
            capacity: u64::MAX / 2,
            amount: 1,
            every: SEC,
            strict: false,
        },
        100_000,
    );
    let clock = MonotonicClock::new();
    let (cpu0, started) = (process_cpu(), Instant::now());
    let mut n = 0u64;
    while started.elapsed() < len / 4 {
        for i in 0..1_000u64 {
            std::hint::black_box(local.acquire(
                i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                1,
                clock.now(),
            ));
        }
        n += 1_000;
    }
    let local_cpu = (process_cpu() - cpu0) / n as f64;
    println!(
        "local token bucket: {:.0} ns CPU per decision",
        local_cpu * 1e9
    );

    // Throughput through one connection.
    let p = TokenBucketParams {
        capacity: 1_000_000_000,
        amount: 1,
        every: SEC,
        strict: false,
    };
    let bucket = Arc::new(SharedTokenBucket::new(
        &store,
        store.names("bench", "tb", Variant::Base),
        p,
        1_000,
        0,
    ));
    let row = Row {
        rt: &rt,
        redis: &redis,
        metrics: &metrics,
        len,
    };
    println!("\nshared decisions, one connection:");
    println!(
        "{:<14} {:>8} {:>12} {:>10} {:>10} {:>14} {:>14} {:>9}",
        "kind",
        "callers",
        "decisions/s",
        "p50 µs",
        "p99 µs",
        "tollgate CPU",
        "redis CPU",
        "fallback"
    );
    for callers in [1usize, 16, 64] {
        let bucket = Arc::clone(&bucket);
        row.run("token_bucket", callers, move |key| {
            let bucket = Arc::clone(&bucket);
            async move {
                std::hint::black_box(bucket.acquire(key, 1, 0).await);
            }
        });
    }
    // Sliding log: Grab's caps, two windows, roomy enough to admit throughout.
    let windows = [
        LogWindow {
            max: 1_000,
            per: 86_400 * SEC,
        },
        LogWindow {
            max: 5_000,
            per: 7 * 86_400 * SEC,
        },
    ];
    let log = Arc::new(
        SharedSlidingLog::new(
            &store,
            store.names("bench", "log", Variant::Base),
            &windows,
            1_000,
            0,
        )
        .unwrap(),
    );
    for callers in [1usize, 16, 64] {
        let log = Arc::clone(&log);
        row.run("sliding_log", callers, move |key| {
            let log = Arc::clone(&log);
            async move {
                std::hint::black_box(log.acquire(key, 1, 0).await);
            }
        });
    }
    // Tiered: two tiers and a hard limit, roomy.
    let tier = |limit, active, cooldown| Tier {
        limit,
        window: 60 * SEC,
        active,
        cooldown,
        skippable: false,
    };
    let tiers = TieredParams {
        tiers: vec![
            tier(1_000, 3_600 * SEC, 0),
            tier(1_000, 600 * SEC, 3_600 * SEC),
        ],
        hard_limit: Some(10_000),
        global_limit: None,
    };
    let tiered = Arc::new(
        SharedTiered::new(
            &store,
            store.names("bench", "tiers", Variant::Base),
            &tiers,
            1_000,
        )
        .unwrap(),
    );
    for callers in [1usize, 16, 64] {
        let tiered = Arc::clone(&tiered);
        row.run("tiered", callers, move |key| {
            let tiered = Arc::clone(&tiered);
            async move {
                std::hint::black_box(tiered.acquire(key, 0).await);
            }
        });
    }
    // Concurrency with a global limit and a group: one script takes from the key's, the
    // global and the group's counters; the guard's release is a second script, sent in
    // the background (counted in Redis's CPU per decision).
    let conc = Arc::new(
        SharedConcurrency::new(
            &store,
            store.names("bench", "slots", Variant::Base),
            ConcurrencyParams {
                max: 1_000_000,
                global: Some(1_000_000),
                groups: vec![1_000_000],
            },
            &["all"],
            1_000,
        )
        .unwrap(),
    );
    for callers in [1usize, 16, 64] {
        let conc = Arc::clone(&conc);
        row.run("concurrency", callers, move |key| {
            let conc = Arc::clone(&conc);
            async move {
                let o = conc.acquire(key, 1, 1).await;
                assert_eq!(o.source, Source::Store);
                drop(o);
            }
        });
    }
    println!("(tollgate CPU: this whole process per decision, callers + the store's thread; local decision: {:.2} µs)", local_cpu * 1e6);

    // Latency per kind, one caller (a round trip each).
    let rate = SharedRate::new(
        &store,
        store.names("bench", "rate", Variant::Base),
        RateParams {
            max: 1_000_000_000,
            per: SEC,
            strict: false,
            window: Default::default(),
        },
        100_000,
        0,
    );
    let inflight = SharedInflight::new(
        &store,
        store.names("bench", "conc", Variant::Base),
        1_000_000,
        SketchSize::DEFAULT,
    );
    println!("\nadded latency per decision, one caller (p50 / p99 µs):");
    rt.block_on(async {
        let mut lat = Vec::new();
        let started = Instant::now();
        let mut key = 0u64;
        while started.elapsed() < len / 2 {
            key += 1;
            let t = Instant::now();
            std::hint::black_box(rate.acquire(key % 10_000, 1, 0).await);
            lat.push(t.elapsed());
        }
        lat.sort();
        println!(
            "  rate           {:>8.1} / {:>8.1}",
            us(percentile(&lat, 0.5)),
            us(percentile(&lat, 0.99))
        );
        let mut lat = Vec::new();
        let started = Instant::now();
        while started.elapsed() < len / 2 {
            key += 1;
            let t = Instant::now();
            let o = inflight.acquire(key % 10_000).await;
            lat.push(t.elapsed());
            assert_eq!(o.source, Source::Store);
            drop(o);
        }
        lat.sort();
        println!(
            "  inflight       {:>8.1} / {:>8.1}  (acquire; the release is sent in the background)",
            us(percentile(&lat, 0.5)),
            us(percentile(&lat, 0.99))
        );
    });

    // The deny cache under a flood from one key, on a store of its own (the inflight
    // limiter's renewals must not count as the flood's store calls).
    drop((rate, inflight));
    let flood_metrics = StoreMetrics::unregistered("flood").unwrap();
    let mut flood_config = RedisStoreConfig::new("flood", Endpoint::Standalone(redis.url()));
    flood_config.tuning.timeout = Duration::from_millis(100);
    let flood_store = RedisStore::new(flood_config, flood_metrics.clone()).unwrap();
    assert!(rt.block_on(flood_store.wait_up(Duration::from_secs(5))));
    let (store, metrics) = (flood_store, flood_metrics);
    println!("\ndeny cache, a flood from one key (capacity 10, refill 1 per second):");
    for cache in [0usize, 4_096] {
        let p = TokenBucketParams {
            capacity: 10,
            amount: 1,
            every: SEC,
            strict: false,
        };
        let names = store.names(
            "bench",
            if cache == 0 { "flood_off" } else { "flood_on" },
            Variant::Base,
        );
        let l = SharedTokenBucket::new(&store, names, p, 1_000, cache);
        let sent_before = metrics.ok.get() + metrics.timeout.get() + metrics.error.get();
        let (n, admitted) = rt.block_on(async {
            let started = Instant::now();
            let (mut n, mut admitted) = (0u64, 0u64);
            while started.elapsed() < len / 2 {
                let v = l.acquire(1, 1, clock.now()).await;
                n += 1;
                admitted += u64::from(v.value.allowed);
            }
            (n, admitted)
        });
        let sent = metrics.ok.get() + metrics.timeout.get() + metrics.error.get() - sent_before;
        println!(
            "  cache {:>5}: {n:>7} requests, {admitted:>3} admitted, {sent:>7} store calls ({:.2}% of requests; {} answered locally)",
            if cache == 0 { "off" } else { "on" },
            100.0 * sent as f64 / n as f64,
            l.deny_cache_hits(),
        );
    }
    println!(
        "\nflood store: {} ok, {} timeout, {} error, {} breaker_open, {} fallback",
        metrics.ok.get(),
        metrics.timeout.get(),
        metrics.error.get(),
        metrics.breaker_open.get(),
        metrics.fallback.get()
    );
}
