//! The adaptive concurrency estimator behind `max: auto`: how many requests one upstream
//! server takes at once before its latency says it is queueing.
//!
//! # The idea
//!
//! A server with `C` workers answers in its service time `S` while fewer than `C` requests
//! are in flight; above that, requests wait for a worker and the latency grows with the
//! queue (`S · n / C` for `n` in flight). So the ratio of the server's unloaded latency to
//! its current latency says how far over capacity it is being driven. Netflix's
//! concurrency-limits calls this ratio the *gradient* (its Gradient2 limiter); this module
//! applies the same idea with its own choices about what feeds the two latencies.
//!
//! # The maths
//!
//! Samples are gathered into *windows* of at least [`MIN_WINDOW`] (and twice the baseline,
//! so a slow server's window holds whole requests) and [`MIN_SAMPLES`] samples. A window
//! gives
//!
//! ```text
//! short    = mean of the window's latencies, each capped at 2 · long,
//!            a congestion signal (connect error, 5xx) counting as 2 · long
//! gradient = clamp(long / short, 0.5, 1)
//! busy     = Σ latencies / window length            (Little's law: mean in flight)
//! headroom = max(1, √limit / 2)                     (only when busy ≥ limit / 2)
//! target   = limit · gradient + headroom
//! limit'   = target                                 if target ≥ limit
//!            limit + (target − limit) · 0.5         otherwise
//! ```
//!
//! clamped to `[min, max]`. At a server of capacity `C` driven past it, `short = long ·
//! limit / C`, so the fixed point is `limit = C + headroom`: a queue of about `√C / 2`,
//! i.e. a latency `1 + 1 / (2√C)` times the unloaded one (11% at `C = 20`). Below capacity
//! the gradient is 1 and the limit grows by the headroom each window, but only while the
//! traffic uses at least half of it (`busy`): an idle server's limit does not run away.
//!
//! # The long-term baseline
//!
//! `long` is the server's unloaded latency, estimated from the measurements themselves:
//! no probe window ever forces concurrency down to measure it (Envoy's minRTT probes do,
//! and reject healthy traffic while they run). It moves toward each window's mean
//! (`short`, congestion signals excluded) with a weight `min(1, window / τ)`:
//!
//! - down with `τ =` [`TAU_FALL`] (fast: a lower latency is proof that the server can do
//!   better, queueing only ever adds);
//! - up with `τ =` [`TAU_RISE_IDLE`] when the window was not busy (the traffic stayed under
//!   half the limit, so the rise cannot be our own queue: the server itself slowed down),
//!   or when the gradient has driven the limit down as far as it goes (to `min + 1 / (1 -
//!   gradient)`, where the headroom of 1 balances the decrease): the latency at the least
//!   concurrency allowed *is* the unloaded latency, a lasting slowdown that cutting the
//!   concurrency did not cure. (A server whose capacity is under about 5 sits there too,
//!   so its baseline follows its queue: set `min` to what it surely takes.)
//! - up with `τ =` [`TAU_RISE_BUSY`] otherwise (ten minutes: a busy window's rise is mostly
//!   the queue the limit allows, and following it quickly is how Gradient2's limit drifts up
//!   under steady overload).
//!
//! Windows with congestion signals still count them in `short` (so the limit falls), but
//! their latencies never raise `long`. Steady timeouts or 5xx therefore drive the limit
//! down to `min` and keep it there: it never grows under them (concurrency-limits#137),
//! because there are no healthy samples to grow on.
//!
//! A single outlier is bounded by the cap: one sample of any latency raises a window's
//! mean by at most `2 · long / n`.
//!
//! # Concurrency
//!
//! [`Adaptive::record`] is lock-free: the sample is added to the window's sums with relaxed
//! `fetch_add`s; the thread whose sample closes the window claims it by one
//! compare-and-swap on the window's start and alone computes the new limit, then publishes
//! it with plain stores. Samples recorded between the claim and the reset of the sums
//! count in the next window. Readers ([`Adaptive::limit`]) do one relaxed load.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::limits::clock::{Nanos, NANOS_PER_SEC};

/// A window lasts at least this long (and twice the baseline latency).
pub const MIN_WINDOW: Nanos = NANOS_PER_SEC / 10;
/// A window closes only once it holds this many samples.
pub const MIN_SAMPLES: u64 = 8;
/// Time constant of the baseline's fall toward a lower window mean.
pub const TAU_FALL: Nanos = NANOS_PER_SEC / 5;
/// Time constant of the baseline's rise in windows that did not use half the limit.
pub const TAU_RISE_IDLE: Nanos = 2 * NANOS_PER_SEC;
/// Time constant of the baseline's rise in busy windows.
pub const TAU_RISE_BUSY: Nanos = 600 * NANOS_PER_SEC;
/// The lowest gradient: one window at most halves the target.
pub const MIN_GRADIENT: f64 = 0.5;
/// A latency counts at most this many baselines (and a congestion signal counts as this).
pub const CAP: f64 = 2.0;
/// The share of a decrease applied per window.
pub const DECREASE_SMOOTHING: f64 = 0.5;
/// The highest `max` accepted (the config's bound, too).
pub const MAX_LIMIT: u64 = 1_000_000;

/// `max: {auto: {min, max, initial}}`: where the learned limit starts and what it may
/// reach. `min ≤ initial ≤ max`, `min ≥ 1`, `max ≤` [`MAX_LIMIT`] (the config checks;
/// [`AdaptiveBounds::normalized`] repairs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdaptiveBounds {
    /// The limit never goes below this.
    pub min: u64,
    /// The limit never goes above this.
    pub max: u64,
    /// The limit of a server nothing was learned about yet.
    pub initial: u64,
}

impl AdaptiveBounds {
    /// `max: auto`'s bounds: from 1 to 10 000, starting at 20 (a modest pool of workers).
    pub const DEFAULT: AdaptiveBounds = AdaptiveBounds {
        min: 1,
        max: 10_000,
        initial: 20,
    };

    /// The bounds made consistent: `1 ≤ min ≤ initial ≤ max ≤ MAX_LIMIT`.
    pub fn normalized(self) -> AdaptiveBounds {
        let max = self.max.clamp(1, MAX_LIMIT);
        let min = self.min.clamp(1, max);
        AdaptiveBounds {
            min,
            max,
            initial: self.initial.clamp(min, max),
        }
    }
}

impl Default for AdaptiveBounds {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What one upstream attempt says about the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    /// A response whose headers arrived this long after the attempt began.
    Latency(Nanos),
    /// The server is not coping: the connection failed or timed out, or it answered 5xx.
    Congestion,
}

/// What the estimator knows, for the admin API and the metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveState {
    /// The limit in force.
    pub limit: u64,
    /// The last window's gradient (1 before the first window).
    pub gradient: f64,
    /// The last window's mean latency, seconds (0 before the first).
    pub short_secs: f64,
    /// The long-term baseline, seconds (0 before the first window).
    pub long_secs: f64,
}

/// One server's learned concurrency limit. See the module's documentation for the maths.
#[derive(Debug)]
pub struct Adaptive {
    bounds: AdaptiveBounds,
    /// The limit in force, rounded: what the hot path reads.
    limit: AtomicU64,
    /// The limit as a real number (`f64` bits), so that small steps accumulate.
    exact: AtomicU64,
    /// `f64` bits, nanoseconds; 0 until the first window.
    long: AtomicU64,
    /// `f64` bits, nanoseconds; the last window's mean.
    short: AtomicU64,
    /// `f64` bits; the last window's gradient.
    gradient: AtomicU64,
    /// When the current window began.
    window_start: AtomicU64,
    /// The current window's sum of capped latencies, nanoseconds.
    sum: AtomicU64,
    /// The current window's latency samples.
    count: AtomicU64,
    /// The current window's congestion signals.
    congested: AtomicU64,
}

fn load_f(a: &AtomicU64) -> f64 {
    f64::from_bits(a.load(Relaxed))
}

fn store_f(a: &AtomicU64, v: f64) {
    a.store(v.to_bits(), Relaxed);
}

/// Nanoseconds as `f64` (exact below 2^53 ns, 104 days).
#[allow(clippy::cast_precision_loss)]
fn real(n: u64) -> f64 {
    n as f64
}

/// A non-negative real as a count, saturating.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn count(v: f64) -> u64 {
    if v.is_nan() || v <= 0.0 {
        0
    } else {
        v.round().min(real(u64::MAX)) as u64
    }
}

impl Adaptive {
    /// A server's estimator at `initial`, its first window starting `now` (0: at the first
    /// sample).
    pub fn new(bounds: AdaptiveBounds, now: Nanos) -> Self {
        let bounds = bounds.normalized();
        Self {
            bounds,
            limit: AtomicU64::new(bounds.initial),
            exact: AtomicU64::new(real(bounds.initial).to_bits()),
            long: AtomicU64::new(0f64.to_bits()),
            short: AtomicU64::new(0f64.to_bits()),
            gradient: AtomicU64::new(1f64.to_bits()),
            window_start: AtomicU64::new(now),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
            congested: AtomicU64::new(0),
        }
    }

    /// A new estimator with `bounds` that continues what `previous` learned (a reload that
    /// keeps the limit): the limit is re-clamped to the new bounds, the baseline kept.
    pub fn carried(previous: &Adaptive, bounds: AdaptiveBounds, now: Nanos) -> Self {
        let next = Self::new(bounds, now);
        let b = next.bounds;
        let exact = load_f(&previous.exact).clamp(real(b.min), real(b.max));
        store_f(&next.exact, exact);
        next.limit.store(count(exact).clamp(b.min, b.max), Relaxed);
        for (to, from) in [
            (&next.long, &previous.long),
            (&next.short, &previous.short),
            (&next.gradient, &previous.gradient),
        ] {
            to.store(from.load(Relaxed), Relaxed);
        }
        next
    }

    /// The bounds in force.
    pub fn bounds(&self) -> AdaptiveBounds {
        self.bounds
    }

    /// The limit in force: one relaxed load.
    pub fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    /// What the estimator knows now.
    pub fn state(&self) -> AdaptiveState {
        let secs = |a: &AtomicU64| load_f(a) / real(NANOS_PER_SEC);
        AdaptiveState {
            limit: self.limit(),
            gradient: load_f(&self.gradient),
            short_secs: secs(&self.short),
            long_secs: secs(&self.long),
        }
    }

    /// Records one attempt's outcome at `now` and, when it closes the window, updates the
    /// limit. Lock-free; no allocation; returns whether this call updated the limit.
    pub fn record(&self, sample: Sample, now: Nanos) -> bool {
        let long = load_f(&self.long);
        match sample {
            Sample::Latency(n) => {
                let n = if long > 0.0 {
                    n.min(count(long * CAP))
                } else {
                    n
                };
                self.sum.fetch_add(n.max(1), Relaxed);
                self.count.fetch_add(1, Relaxed);
            }
            Sample::Congestion => {
                self.congested.fetch_add(1, Relaxed);
            }
        }
        let start = self.window_start.load(Relaxed);
        if start == 0 {
            // Built without a clock (at a reload): the first sample starts the window.
            let _ = self
                .window_start
                .compare_exchange(0, now.max(1), Relaxed, Relaxed);
            return false;
        }
        let length = now.saturating_sub(start);
        if length < MIN_WINDOW.max(count(long * 2.0)) {
            return false;
        }
        if self.count.load(Relaxed) + self.congested.load(Relaxed) < MIN_SAMPLES {
            return false;
        }
        if self
            .window_start
            .compare_exchange(start, now, Relaxed, Relaxed)
            .is_err()
        {
            // Another thread closed this window.
            return false;
        }
        let sum = self.sum.swap(0, Relaxed);
        let samples = self.count.swap(0, Relaxed);
        let congested = self.congested.swap(0, Relaxed);
        self.close(sum, samples, congested, length);
        true
    }

    /// The window's update; only the thread that claimed the window runs it.
    fn close(&self, sum: u64, samples: u64, congested: u64, length: Nanos) {
        let mut long = load_f(&self.long);
        let limit = load_f(&self.exact);
        let mean = (samples > 0).then(|| real(sum) / real(samples));
        if long <= 0.0 {
            match mean {
                Some(m) => long = m,
                // Nothing but congestion and no baseline yet: the only safe move is down.
                None => {
                    self.publish(limit * (1.0 - DECREASE_SMOOTHING * (1.0 - MIN_GRADIENT)));
                    return;
                }
            }
        }
        let all = real(samples + congested);
        let short = (real(sum) + real(congested) * long * CAP) / all;
        let gradient = (long / short).clamp(MIN_GRADIENT, 1.0);
        let busy = real(sum) / real(length.max(1)) >= limit / 2.0;
        let headroom = if busy {
            (limit.sqrt() / 2.0).max(1.0)
        } else {
            0.0
        };
        let target = limit * gradient + headroom;
        let next = if target >= limit {
            target
        } else {
            limit + (target - limit) * DECREASE_SMOOTHING
        };
        if let Some(m) = mean {
            // Driven down as far as this gradient drives it: a headroom of 1 balances the
            // decrease at `1 / (1 - gradient)` above `min`.
            let at_min = limit <= real(self.bounds.min) + 1.0 / (1.0 - gradient).max(1e-3);
            let tau = if m < long {
                TAU_FALL
            } else if busy && !at_min {
                TAU_RISE_BUSY
            } else {
                TAU_RISE_IDLE
            };
            let weight = (real(length) / real(tau)).min(1.0);
            long += (m - long) * weight;
        }
        store_f(&self.long, long);
        store_f(&self.short, short);
        store_f(&self.gradient, gradient);
        self.publish(next);
    }

    fn publish(&self, exact: f64) {
        let b = self.bounds;
        let exact = exact.clamp(real(b.min), real(b.max));
        store_f(&self.exact, exact);
        self.limit.store(count(exact).clamp(b.min, b.max), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::clock::{Clock, ManualClock};
    use std::time::Duration;

    const MS: Nanos = NANOS_PER_SEC / 1000;

    fn bounds(min: u64, max: u64, initial: u64) -> AdaptiveBounds {
        AdaptiveBounds { min, max, initial }
    }

    /// A server of `capacity` workers with service time `service`, driven by `demand`
    /// closed-loop clients through the estimator's limit: per 10 ms tick, the requests in
    /// flight (`min(demand, limit)`) complete at the rate Little's law gives, each with
    /// the latency a FIFO queue in front of `capacity` workers gives.
    struct Origin {
        clock: ManualClock,
        est: Adaptive,
        owed: f64,
    }

    impl Origin {
        fn new(b: AdaptiveBounds) -> Self {
            Self {
                clock: ManualClock::new(0),
                est: Adaptive::new(b, 0),
                owed: 0.0,
            }
        }

        /// Runs for `secs` seconds; returns the limits seen at each tick.
        fn run(&mut self, secs: f64, capacity: f64, service: Nanos, demand: u64) -> Vec<u64> {
            let tick = 10 * MS;
            let mut seen = Vec::new();
            for _ in 0..count(secs * 100.0) {
                self.clock.advance(Duration::from_nanos(tick));
                let inflight = real(demand.min(self.est.limit()));
                let latency = real(service) * (inflight / capacity).max(1.0);
                self.owed += inflight * real(tick) / latency;
                while self.owed >= 1.0 {
                    self.owed -= 1.0;
                    self.est
                        .record(Sample::Latency(count(latency)), self.clock.now());
                }
                seen.push(self.est.limit());
            }
            seen
        }
    }

    fn within(value: u64, target: f64, tolerance: f64) -> bool {
        (real(value) - target).abs() <= target * tolerance
    }

    #[test]
    fn steady_overload_settles_just_above_capacity() {
        let mut o = Origin::new(bounds(1, 1000, 10));
        let seen = o.run(20.0, 40.0, 50 * MS, 160);
        let last = *seen.last().unwrap();
        // The fixed point is C + √C / 2 ≈ 43; never far above it once settled.
        assert!(within(last, 43.0, 0.15), "settled at {last}");
        let tail = &seen[seen.len() / 2..];
        assert!(tail.iter().all(|&l| (36..=52).contains(&l)), "{tail:?}");
        let st = o.est.state();
        assert!((st.long_secs - 0.05).abs() < 0.005, "baseline {st:?}");
    }

    #[test]
    fn a_capacity_drop_is_followed_within_five_seconds_and_recovered() {
        let mut o = Origin::new(bounds(1, 1000, 10));
        o.run(20.0, 40.0, 50 * MS, 160);
        let before = o.est.limit();
        // The server loses half its workers.
        let after = o.run(5.0, 20.0, 50 * MS, 160);
        let at_5s = *after.last().unwrap();
        assert!(within(at_5s, 20.0, 0.2), "{before} -> {at_5s}");
        // And gets them back.
        let back = o.run(10.0, 40.0, 50 * MS, 160);
        let last = *back.last().unwrap();
        assert!(within(last, 43.0, 0.15), "recovered to {last}");
    }

    #[test]
    fn under_capacity_the_limit_stays_above_the_demand() {
        let mut o = Origin::new(bounds(1, 1000, 10));
        let seen = o.run(30.0, 40.0, 50 * MS, 20);
        // Grows past the 20 clients and then stops: an idle half is not grown into.
        assert!(seen[seen.len() / 3..].iter().all(|&l| l >= 20), "{seen:?}");
        assert!(*seen.last().unwrap() <= 60, "{:?}", seen.last());
    }

    #[test]
    fn steady_timeouts_drive_the_limit_down_and_never_up() {
        let clock = ManualClock::new(0);
        let est = Adaptive::new(bounds(2, 1000, 100), 0);
        // A healthy start: a baseline of 20 ms.
        for _ in 0..200 {
            clock.advance(Duration::from_millis(1));
            est.record(Sample::Latency(20 * MS), clock.now());
        }
        let mut last = est.limit();
        for _ in 0..20_000 {
            clock.advance(Duration::from_millis(1));
            est.record(Sample::Congestion, clock.now());
            let now = est.limit();
            assert!(now <= last, "grew under timeouts: {last} -> {now}");
            last = now;
        }
        assert_eq!(last, 2, "pinned at min");
        let st = est.state();
        assert!((st.long_secs - 0.02).abs() < 1e-6, "baseline moved: {st:?}");
    }

    #[test]
    fn timeouts_before_any_baseline_only_lower_the_limit() {
        let clock = ManualClock::new(0);
        let est = Adaptive::new(bounds(1, 100, 50), 0);
        for _ in 0..5_000 {
            clock.advance(Duration::from_millis(1));
            est.record(Sample::Congestion, clock.now());
        }
        assert_eq!(est.limit(), 1);
    }

    #[test]
    fn a_single_outlier_barely_moves_the_limit() {
        let mut o = Origin::new(bounds(1, 1000, 10));
        o.run(20.0, 40.0, 50 * MS, 160);
        let before = o.est.limit();
        o.clock.advance(Duration::from_millis(1));
        o.est
            .record(Sample::Latency(30 * NANOS_PER_SEC), o.clock.now());
        let seen = o.run(1.0, 40.0, 50 * MS, 160);
        let lowest = *seen.iter().min().unwrap();
        assert!(real(lowest) >= real(before) * 0.85, "{before} -> {lowest}");
        assert!((o.est.state().long_secs - 0.05).abs() < 0.005);
    }

    #[test]
    fn a_lasting_slowdown_at_light_load_becomes_the_baseline() {
        let mut o = Origin::new(bounds(1, 1000, 30));
        o.run(10.0, 100.0, 20 * MS, 10);
        // The server now takes 40 ms whatever the load (a slower dependency, not a queue).
        o.run(20.0, 100.0, 40 * MS, 10);
        let st = o.est.state();
        assert!((st.long_secs - 0.04).abs() < 0.004, "{st:?}");
        assert!(st.limit >= 10, "{st:?}");
    }

    #[test]
    fn the_limit_stays_within_its_bounds() {
        let mut o = Origin::new(bounds(5, 30, 10));
        let seen = o.run(20.0, 1000.0, 10 * MS, 10_000);
        assert_eq!(*seen.last().unwrap(), 30);
        for _ in 0..10_000 {
            o.clock.advance(Duration::from_millis(1));
            o.est.record(Sample::Congestion, o.clock.now());
            assert!((5..=30).contains(&o.est.limit()));
        }
        assert_eq!(o.est.limit(), 5);
    }

    #[test]
    fn bounds_are_normalized() {
        let b = bounds(0, u64::MAX, 0).normalized();
        assert_eq!(b, bounds(1, MAX_LIMIT, 1));
        assert_eq!(bounds(50, 10, 99).normalized(), bounds(10, 10, 10));
    }

    #[test]
    fn a_carried_estimator_keeps_what_was_learned_within_new_bounds() {
        let mut o = Origin::new(bounds(1, 1000, 10));
        o.run(20.0, 40.0, 50 * MS, 160);
        let learned = o.est.state();
        let kept = Adaptive::carried(&o.est, bounds(1, 1000, 10), 0);
        assert_eq!(kept.state(), learned);
        let capped = Adaptive::carried(&o.est, bounds(1, 25, 10), 0);
        assert_eq!(capped.limit(), 25);
    }

    #[test]
    fn racing_threads_close_each_window_once() {
        let est = Adaptive::new(bounds(1, 1000, 10), 0);
        let clock = ManualClock::new(0);
        let updates = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..5_000 {
                        clock.advance(Duration::from_micros(50));
                        if est.record(Sample::Latency(5 * MS), clock.now()) {
                            updates.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        // 4 × 5 000 × 50 µs = 1 s of samples: about ten 100 ms windows, each closed once.
        let n = updates.load(Relaxed);
        assert!((8..=10).contains(&n), "{n} updates");
        assert!(est.limit() >= 10);
    }
}
