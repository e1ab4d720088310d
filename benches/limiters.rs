//! Limiter micro-benchmark: pingora-limits' published comparison, redone on tollgate's limiters.
//!
//! What it measures, per row: ns per decision on one thread, ns per decision per thread with
//! 2 and 8 threads sharing one structure, and the structure's peak heap and allocation count
//! (single-threaded run, construction included) from a counting global allocator.
//!
//! Rows: the raw `pingora_limits::estimator::Estimator` incr (the floor) and incr + decr,
//! pingora's own `Inflight` (incr + guard drop, the like-for-like reference for inflight),
//! tollgate's inflight (acquire + guard drop), rate and token bucket limiters (the exact per-key
//! tables with the proxy's default `max_keys` of 100 k, and with 1 M so that few are
//! evicted), all with the parameters of `conf/tollgate.yaml` and the default 4 × 8192 sketch
//! for inflight, the exact concurrency limiter (acquire + guard drop: key limit alone, then
//! with a global limit and a group that half the keys belong to), the exact sliding log
//! (Grab's frequency caps: 3 a day, then 3 a day and 10 a week, `max_keys` 1 M), Charon burst
//! tiers (two tiers with a hard and a global limit, `max_keys` 100 k and 1 M), and the two peers
//! of pingora's benchmark: a `Mutex<HashMap<u64, u64>>` counter (std hasher) and a
//! `DashMap<u64, u64>` counter (ahash).
//!
//! Events: `TOLLGATE_BENCH_EVENTS` (default 10 M) drawn uniformly by a xorshift from 1 M
//! composite keys, each `KeySpec::hash` of (customer, server IP, host) as the proxy builds
//! them. The key hashes, the xorshift index sequence and the index-to-key lookup are all done
//! before anything is timed: the timed loop reads the resulting key stream sequentially, so
//! no row pays a cache miss into the key table. Limiter time is synthetic: event `i` happens
//! at `i × STEP_NS`, no clock is read. Single-threaded timings are the median of 3 rounds, run
//! round-robin over the rows so that drift on a noisy machine hits every row alike.
//! Compare ratios from one run, never absolute figures across runs.
//!
//! Run: `cargo bench --bench limiters` (CI: `TOLLGATE_BENCH_EVENTS=20000 cargo bench --bench
//! limiters`). It prints a markdown table and PASS/MISS lines for the targets; a miss is
//! reported, not an error exit.

// A benchmark or example may unwrap: a failure aborts the measurement, not a user's request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use pingora_limits::estimator::Estimator;
use pingora_limits::inflight::Inflight;
use tollgate::limits::{
    path, ConcurrencyLimiter, ConcurrencyParams, Fact, Facts, InflightLimiter, KeyPart, KeySpec,
    LogWindow, Nanos, RateLimiter, RateParams, SketchSize, SlidingLog, Tier, TieredLimiter,
    TieredParams, TokenBucket, TokenBucketParams,
};

// ---------------------------------------------------------------------------------------
// Counting allocator: current and peak live bytes, and the number of allocations.

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            // A realloc counts as an allocation; its peak assumes the old block is gone.
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap use of one measured section: bytes above the live bytes at its start.
struct HeapMark {
    base: usize,
    allocs: u64,
}

impl HeapMark {
    fn start() -> Self {
        let base = CURRENT.load(Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        Self {
            base,
            allocs: ALLOCS.load(Ordering::SeqCst),
        }
    }

    /// (peak bytes above the start, allocations since the start).
    fn read(&self) -> (usize, u64) {
        (
            PEAK.load(Ordering::SeqCst) - self.base,
            ALLOCS.load(Ordering::SeqCst) - self.allocs,
        )
    }
}

// ---------------------------------------------------------------------------------------
// Workload.

/// Distinct keys the events are drawn from.
const KEYS: usize = 1_000_000;
/// Default number of events.
const DEFAULT_EVENTS: usize = 10_000_000;
/// Synthetic time between two events: 1 µs, i.e. 1 M decisions per second over all keys.
const STEP_NS: Nanos = 1_000;
const SEC: Nanos = 1_000_000_000;
/// Thread counts of the shared-structure runs.
const THREADS: [usize; 2] = [2, 8];
/// Single-threaded rounds; the median is reported.
const ROUNDS: usize = 3;

/// One request's key parts, as the proxy would see them.
struct Req {
    customer: String,
    server: IpAddr,
    host: String,
}

impl Facts for Req {
    fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
        match part {
            KeyPart::Customer => Some(Fact::Bytes(self.customer.as_bytes())),
            KeyPart::ServerIp => Some(Fact::Ip(self.server)),
            KeyPart::Host => Some(Fact::Bytes(self.host.as_bytes())),
            _ => None,
        }
    }
}

/// 1 M distinct composite key hashes: 1000 customers, 16 upstream servers, and a host per
/// (server, 16 keys), so every (customer, server IP, host) triple differs.
fn key_hashes() -> Vec<u64> {
    let spec = KeySpec::new(vec![KeyPart::Customer, KeyPart::ServerIp, KeyPart::Host]);
    (0..KEYS)
        .map(|i| {
            let req = Req {
                customer: format!("customer-{}", i % 1000),
                server: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1 + (i % 16) as u8)),
                host: format!("www{}.example.com", i / 16),
            };
            spec.hash(&req).unwrap()
        })
        .collect()
}

/// The event stream: `events` keys drawn uniformly from `keys` by xorshift64*.
fn event_stream(keys: &[u64], events: usize) -> Vec<u64> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..events)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
            // Lemire's multiply-shift: uniform in [0, len) without a division.
            keys[((r * keys.len() as u64) >> 32) as usize]
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The structures under test.

/// One row: a structure built fresh per measurement, and one decision per event.
trait Subject: Sync {
    /// Builds the structure (its heap counts toward the row's peak).
    fn build() -> Self;
    /// One event of `key` at `now`; returns whether it was admitted (counters: always).
    fn op(&self, key: u64, now: Nanos) -> bool;
}

const INFLIGHT_MAX: u64 = 1000;
const RATE: RateParams = RateParams {
    max: 50,
    per: SEC,
    strict: false,
    window: tollgate::limits::RateWindow::Sliding,
};
const BUCKET: TokenBucketParams = TokenBucketParams {
    capacity: 20,
    amount: 5,
    every: SEC,
    strict: false,
};
/// The proxy's default `max_keys`: a tenth of the keys, so most events evict.
const DEFAULT_MAX_KEYS: usize = 100_000;

struct RawEstimator(Estimator);
impl Subject for RawEstimator {
    fn build() -> Self {
        let s = SketchSize::DEFAULT;
        Self(Estimator::new(s.hashes, s.slots))
    }
    fn op(&self, key: u64, _: Nanos) -> bool {
        black_box(self.0.incr(key, 1));
        true
    }
}

struct EstimatorPair(Estimator);
impl Subject for EstimatorPair {
    fn build() -> Self {
        let s = SketchSize::DEFAULT;
        Self(Estimator::new(s.hashes, s.slots))
    }
    fn op(&self, key: u64, _: Nanos) -> bool {
        black_box(self.0.incr(key, 1));
        self.0.decr(key, 1);
        true
    }
}

struct PingoraInflight(Inflight);
impl Subject for PingoraInflight {
    fn build() -> Self {
        Self(Inflight::new())
    }
    fn op(&self, key: u64, _: Nanos) -> bool {
        let (guard, estimate) = self.0.incr(key, 1);
        let admitted = estimate as u64 <= INFLIGHT_MAX;
        drop(black_box(guard));
        admitted
    }
}

struct TollInflight(InflightLimiter);
impl Subject for TollInflight {
    fn build() -> Self {
        Self(InflightLimiter::new(SketchSize::DEFAULT))
    }
    fn op(&self, key: u64, _: Nanos) -> bool {
        match self.0.acquire(key, INFLIGHT_MAX) {
            Ok((guard, _)) => {
                drop(black_box(guard));
                true
            }
            Err(_) => false,
        }
    }
}

/// Per-key sliding windows for at most `MAX_KEYS` keys.
struct TollRate<const MAX_KEYS: usize>(RateLimiter);
impl<const MAX_KEYS: usize> Subject for TollRate<MAX_KEYS> {
    fn build() -> Self {
        Self(RateLimiter::new(RATE.per, MAX_KEYS))
    }
    fn op(&self, key: u64, now: Nanos) -> bool {
        black_box(self.0.acquire(key, RATE.max, 1, RATE.strict, now)).allowed
    }
}

/// Token buckets holding state for at most `MAX_KEYS` keys.
struct TollBucket<const MAX_KEYS: usize>(TokenBucket);
impl<const MAX_KEYS: usize> Subject for TollBucket<MAX_KEYS> {
    fn build() -> Self {
        Self(TokenBucket::new(BUCKET, MAX_KEYS))
    }
    fn op(&self, key: u64, now: Nanos) -> bool {
        black_box(self.0.acquire(key, 1, now)).allowed
    }
}

/// Copies one key may hold, as in the `uploads` example of the config.
const CONCURRENCY_MAX: u64 = 10;
/// `max_keys` of the concurrency table: the proxy's default, far above the keys holding
/// copies at once here (one per thread).
const CONCURRENCY_MAX_KEYS: usize = 100_000;

/// Exact concurrency: the key limit alone (`FULL` false), or with a global limit and one
/// group that the keys with an odd hash belong to (`FULL` true).
struct TollConcurrency<const FULL: bool>(ConcurrencyLimiter);
impl<const FULL: bool> Subject for TollConcurrency<FULL> {
    fn build() -> Self {
        let params = ConcurrencyParams {
            max: CONCURRENCY_MAX,
            global: FULL.then_some(1_000),
            groups: if FULL { vec![500] } else { Vec::new() },
        };
        Self(ConcurrencyLimiter::new(params, CONCURRENCY_MAX_KEYS).unwrap())
    }
    fn op(&self, key: u64, _: Nanos) -> bool {
        match self.0.acquire(key, key & 1, 1) {
            Ok(guard) => {
                drop(black_box(guard));
                true
            }
            Err(_) => false,
        }
    }
}

const DAY: Nanos = 86_400 * SEC;
/// Grab's frequency caps: 3 a day, and 10 a week.
const CAPS: [LogWindow; 2] = [
    LogWindow { max: 3, per: DAY },
    LogWindow {
        max: 10,
        per: 7 * DAY,
    },
];

/// Exact sliding logs for 1 M keys (no eviction) with the first `WINDOWS` of [`CAPS`].
struct TollSlidingLog<const WINDOWS: usize>(SlidingLog);
impl<const WINDOWS: usize> Subject for TollSlidingLog<WINDOWS> {
    fn build() -> Self {
        Self(SlidingLog::new(&CAPS[..WINDOWS], KEYS).unwrap())
    }
    fn op(&self, key: u64, now: Nanos) -> bool {
        black_box(self.0.acquire(key, 1, now)).allowed
    }
}

/// Burst tiers: 20 per second for 10 s, then a burst tier of 50 per second for 5 s that
/// cools down for a minute, at most 10 per second per key and 2 M per second in all (above
/// the synthetic 1 M per second, so the global limit is checked but never rejects). The
/// windows are short so that the arenas stay small: 410 bytes per key of `max_keys` (and
/// only the 64-byte metadata line is touched for a key that stays light, as here).
fn tiered_params() -> TieredParams {
    TieredParams {
        tiers: vec![
            Tier {
                limit: 20,
                window: SEC,
                active: 10 * SEC,
                cooldown: 0,
                skippable: false,
            },
            Tier {
                limit: 50,
                window: SEC,
                active: 5 * SEC,
                cooldown: 60 * SEC,
                skippable: false,
            },
        ],
        hard_limit: Some(10),
        global_limit: Some(2_000_000),
    }
}

/// Burst tiers holding state for at most `MAX_KEYS` keys.
struct TollTiered<const MAX_KEYS: usize>(TieredLimiter);
impl<const MAX_KEYS: usize> Subject for TollTiered<MAX_KEYS> {
    fn build() -> Self {
        Self(TieredLimiter::new(&tiered_params(), MAX_KEYS).unwrap())
    }
    fn op(&self, key: u64, now: Nanos) -> bool {
        black_box(self.0.acquire(key, now)).verdict.allowed
    }
}

struct MutexMap(Mutex<HashMap<u64, u64>>);
impl Subject for MutexMap {
    fn build() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
    fn op(&self, key: u64, _: Nanos) -> bool {
        *self.0.lock().unwrap().entry(key).or_insert(0) += 1;
        true
    }
}

struct Dash(DashMap<u64, u64, ahash::RandomState>);
impl Subject for Dash {
    fn build() -> Self {
        Self(DashMap::with_hasher(ahash::RandomState::new()))
    }
    fn op(&self, key: u64, _: Nanos) -> bool {
        *self.0.entry(key).or_insert(0) += 1;
        true
    }
}

// ---------------------------------------------------------------------------------------
// Measurement.

/// Runs `events` on one thread against a fresh structure: (elapsed, admitted, peak heap
/// bytes, allocations). The structure is dropped outside the heap mark's reading.
fn single<S: Subject>(events: &[u64]) -> (Duration, u64, usize, u64) {
    let mark = HeapMark::start();
    let subject = S::build();
    let start = Instant::now();
    let mut admitted = 0u64;
    for (i, &key) in events.iter().enumerate() {
        admitted += u64::from(subject.op(key, i as Nanos * STEP_NS));
    }
    let elapsed = start.elapsed();
    let (peak, allocs) = mark.read();
    drop(black_box(subject));
    (elapsed, admitted, peak, allocs)
}

/// Runs `events` split in `threads` contiguous chunks on one shared structure. Thread `t`'s
/// `j`-th event happens at `(j × threads + t) × STEP_NS`, so all threads' clocks move
/// together. Returns the wall time from the first thread's start to the last one's end.
fn threaded<S: Subject>(events: &[u64], threads: usize) -> Duration {
    let subject = S::build();
    let barrier = Barrier::new(threads);
    let chunk = events.len().div_ceil(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let (subject, barrier) = (&subject, &barrier);
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                // A tiny event count can leave the last threads without a chunk.
                let mine = events.chunks(chunk).nth(t).unwrap_or(&[]);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut admitted = 0u64;
                    for (j, &key) in mine.iter().enumerate() {
                        let now = (j * threads + t) as Nanos * STEP_NS;
                        admitted += u64::from(subject.op(key, now));
                    }
                    black_box(admitted);
                    (start, Instant::now())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = spans.iter().map(|s| s.0).min().unwrap();
    let last = spans.iter().map(|s| s.1).max().unwrap();
    last - first
}

/// One row's results.
struct Row {
    name: &'static str,
    single: Vec<Duration>,
    threaded: Vec<Duration>,
    admitted: u64,
    peak: usize,
    allocs: u64,
}

type Single = fn(&[u64]) -> (Duration, u64, usize, u64);
type Threaded = fn(&[u64], usize) -> Duration;

fn entry<S: Subject>(name: &'static str) -> (&'static str, Single, Threaded) {
    (name, single::<S>, threaded::<S>)
}

fn ns_per_op(d: Duration, ops: usize) -> f64 {
    d.as_nanos() as f64 / ops.max(1) as f64
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mib(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

fn check(name: &str, pass: bool, detail: String) {
    println!(
        "- {}: {name} — {detail}",
        if pass { "PASS" } else { "MISS" }
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without
    // it, as a smoke test that the bench still builds and runs, on a tiny event count.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let events: usize = std::env::var("TOLLGATE_BENCH_EVENTS")
        .ok()
        .map(|v| v.trim().parse().expect("TOLLGATE_BENCH_EVENTS: a count"))
        .unwrap_or(if smoke { 20_000 } else { DEFAULT_EVENTS })
        .max(1);

    let prep = Instant::now();
    let keys = key_hashes();
    let stream = event_stream(&keys, events);
    drop(keys);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    eprintln!(
        "prepared {events} events over {KEYS} keys in {:.2?}; {cores} cores",
        prep.elapsed()
    );

    let rows_spec = [
        entry::<RawEstimator>("pingora Estimator incr (floor)"),
        entry::<EstimatorPair>("pingora Estimator incr + decr"),
        entry::<PingoraInflight>("pingora Inflight incr + guard drop"),
        entry::<TollInflight>("tollgate inflight acquire + guard drop"),
        entry::<TollRate<DEFAULT_MAX_KEYS>>("tollgate rate acquire (max_keys 100 k)"),
        entry::<TollRate<KEYS>>("tollgate rate acquire (max_keys 1 M)"),
        entry::<TollBucket<DEFAULT_MAX_KEYS>>("tollgate token bucket acquire (max_keys 100 k)"),
        entry::<TollBucket<KEYS>>("tollgate token bucket acquire (max_keys 1 M, no eviction)"),
        entry::<TollConcurrency<false>>("tollgate concurrency acquire + guard drop (key max)"),
        entry::<TollConcurrency<true>>(
            "tollgate concurrency acquire + guard drop (key max, global, 1 group)",
        ),
        entry::<TollSlidingLog<1>>("tollgate sliding log acquire (3/day, max_keys 1 M)"),
        entry::<TollSlidingLog<2>>("tollgate sliding log acquire (3/day + 10/week, max_keys 1 M)"),
        entry::<TollTiered<DEFAULT_MAX_KEYS>>("tollgate tiered acquire (max_keys 100 k)"),
        entry::<TollTiered<KEYS>>("tollgate tiered acquire (max_keys 1 M, no eviction)"),
        entry::<MutexMap>("Mutex<HashMap<u64,u64>> counter"),
        entry::<Dash>("DashMap<u64,u64> counter"),
    ];
    let mut rows: Vec<Row> = rows_spec
        .iter()
        .map(|&(name, _, _)| Row {
            name,
            single: Vec::new(),
            threaded: Vec::new(),
            admitted: 0,
            peak: 0,
            allocs: 0,
        })
        .collect();

    // Single-threaded rounds, round-robin over the rows.
    for round in 0..ROUNDS {
        for (row, &(name, run, _)) in rows.iter_mut().zip(&rows_spec) {
            let (elapsed, admitted, peak, allocs) = run(&stream);
            row.single.push(elapsed);
            if round == 0 {
                (row.admitted, row.peak, row.allocs) = (admitted, peak, allocs);
            }
            eprintln!(
                "round {round} {name}: {:.1} ns/op",
                ns_per_op(elapsed, events)
            );
        }
    }
    for &threads in &THREADS {
        for (row, &(name, _, run)) in rows.iter_mut().zip(&rows_spec) {
            let wall = run(&stream, threads);
            row.threaded.push(wall);
            eprintln!(
                "{threads} threads {name}: {:.1} ns/op/thread",
                ns_per_op(wall, events) * threads as f64
            );
        }
    }

    println!();
    println!(
        "## tollgate limiters: {events} events drawn uniformly from {KEYS} composite keys \
         (KeySpec::hash of customer, server IP, host)"
    );
    println!();
    println!(
        "Synthetic clock: {STEP_NS} ns between events. 1 thread: median of {ROUNDS} rounds. \
         N threads: one shared structure, the events split evenly, figure = wall time × N / \
         total events = ns per op per thread ({cores} cores here, so above {cores} threads the \
         figure also counts time-sharing). Heap and allocations: the 1-thread run, \
         construction included."
    );
    println!();
    println!(
        "| structure | 1 thread ns/op | 2 threads ns/op/thread | 8 threads ns/op/thread \
         | peak heap | allocations | admitted |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let one = ns_per_op(median(row.single.clone()), events);
        let many: Vec<String> = THREADS
            .iter()
            .zip(&row.threaded)
            .map(|(&t, &w)| format!("{:.1}", ns_per_op(w, events) * t as f64))
            .collect();
        println!(
            "| {} | {one:.1} | {} | {} | {} | {} | {:.1}% |",
            row.name,
            many[0],
            many[1],
            mib(row.peak),
            row.allocs,
            row.admitted as f64 * 100.0 / events as f64,
        );
    }

    let row = |prefix: &str| rows.iter().find(|r| r.name.starts_with(prefix)).unwrap();
    let one = |prefix: &str| ns_per_op(median(row(prefix).single.clone()), events);
    let (est, pair, pin, inf) = (
        one("pingora Estimator incr (floor)"),
        one("pingora Estimator incr + decr"),
        one("pingora Inflight"),
        one("tollgate inflight"),
    );
    let (tb, tb_all) = (
        one("tollgate token bucket acquire (max_keys 100 k)"),
        one("tollgate token bucket acquire (max_keys 1 M"),
    );
    let (conc, conc_full) = (
        one("tollgate concurrency acquire + guard drop (key max)"),
        one("tollgate concurrency acquire + guard drop (key max, global"),
    );
    let (log1, log2) = (
        row("tollgate sliding log acquire (3/day,"),
        row("tollgate sliding log acquire (3/day + 10/week"),
    );
    let (rate, rate_all) = (
        one("tollgate rate acquire (max_keys 100 k)"),
        one("tollgate rate acquire (max_keys 1 M)"),
    );
    let (tiered, tiered_all) = (
        one("tollgate tiered acquire (max_keys 100 k)"),
        one("tollgate tiered acquire (max_keys 1 M"),
    );
    let tb_heap = row("tollgate token bucket acquire (max_keys 100 k)").peak;
    let dash_heap = row("DashMap").peak;
    println!();
    println!(
        "Admitted: the share of events each limiter let through. Inflight holds one event at a \
         time. Rate allows {} per {} s per key, token buckets hold {} and get {} per {} s, as \
         in conf/tollgate.yaml; each key sees about {:.1} events per second.",
        RATE.max,
        RATE.per / SEC,
        BUCKET.capacity,
        BUCKET.amount,
        BUCKET.every / SEC,
        SEC as f64 / STEP_NS as f64 / KEYS as f64
    );
    println!();
    println!("### Targets (ratios from this run)");
    println!();
    check(
        "inflight ≤ 1.3× raw Estimator incr",
        inf <= 1.3 * est,
        format!(
            "{inf:.1} / {est:.1} ns = {:.2}×; an acquire + drop is an incr, a decr and an Arc \
             clone + drop: vs Estimator incr + decr {:.2}×, vs pingora's own Inflight {:.2}×",
            inf / est,
            inf / pair,
            inf / pin
        ),
    );
    check(
        "token bucket < 60 ns/op at 1 M keys",
        tb < 60.0,
        format!(
            "{tb:.1} ns/op with the default max_keys 100 k (most events evict); \
             {tb_all:.1} ns/op with max_keys 1 M"
        ),
    );
    let rate_admitted = row("tollgate rate acquire (max_keys 100 k)").admitted;
    check(
        "rate admits every event (no key goes over its limit; exact per key)",
        rate_admitted == events as u64,
        format!(
            "{rate_admitted} of {events}; {rate:.1} ns/op with max_keys 100 k, {rate_all:.1} \
             with 1 M (token bucket: {tb:.1} and {tb_all:.1})"
        ),
    );
    check(
        "concurrency acquire + guard drop ≤ 100 ns/op on one thread",
        conc.max(conc_full) <= 100.0,
        format!(
            "{conc:.1} ns/op for the key limit alone, {conc_full:.1} ns/op with a global \
             limit and a group (token bucket at 1 M keys: {tb_all:.1} ns/op)"
        ),
    );
    for (log, windows) in [(log1, &CAPS[..1]), (log2, &CAPS[..])] {
        let expected = SlidingLog::memory_bytes(windows, KEYS).unwrap();
        check(
            "sliding log peak heap as documented (25 + 4E bytes per key of max_keys)",
            log.peak <= expected + 4096,
            format!(
                "{}: {} for {KEYS} keys, documented {} (E = {}); {:.1} ns/op",
                log.name,
                mib(log.peak),
                mib(expected),
                windows.iter().max_by_key(|w| w.per).map_or(0, |w| w.max),
                ns_per_op(median(log.single.clone()), events),
            ),
        );
    }
    check(
        "tiered ≤ 150 ns/op",
        tiered <= 150.0,
        format!(
            "{tiered:.1} ns/op with max_keys 100 k (most events evict), {tiered_all:.1} ns/op \
             with max_keys 1 M; token bucket {tb:.1} and {tb_all:.1} ns/op in this run"
        ),
    );
    path_normalization(events);
    check(
        "token-bucket peak heap ≤ 1/10 of the DashMap counter's",
        tb_heap * 10 <= dash_heap,
        format!(
            "{} / {} = {:.3} (max_keys 100 k)",
            mib(tb_heap),
            mib(dash_heap),
            tb_heap as f64 / dash_heap.max(1) as f64
        ),
    );
}

/// What a request whose origin has a path-keyed limit pays to read its path in normal form
/// (`tollgate::limits::path`): a normal path is scanned once and borrowed (no allocation);
/// another spelling is copied into its normal form.
fn path_normalization(events: usize) {
    let normal = b"/api/v2/customers/1234/orders/recent".as_slice();
    let odd = b"/api//v2/./customers/%31234/../1234/orders/recent".as_slice();
    println!();
    println!("## reading a path in normal form ({events} calls each)");
    println!();
    println!("| path | ns/call | allocations per call |");
    println!("|---|---:|---:|");
    for (name, path) in [
        ("normal (borrowed)", normal),
        ("another spelling (copied)", odd),
    ] {
        let mark = HeapMark::start();
        let start = Instant::now();
        for _ in 0..events {
            black_box(path::normalize(black_box(path)));
        }
        let elapsed = start.elapsed();
        let (_, allocs) = mark.read();
        println!(
            "| {name}: `{}` | {:.1} | {:.2} |",
            String::from_utf8_lossy(path),
            ns_per_op(elapsed, events),
            allocs as f64 / events as f64
        );
    }
}
