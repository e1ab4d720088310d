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
//! short     = mean of the window's latencies, each capped at 2 · long,
//!             a congestion signal (connect error, 5xx) counting as 2 · long
//! noise     = moving average of |short − previous short| / long / 1.128 over pairs of
//!             calm windows under one limit (the σ of a window's mean, relative;
//!             taken as at least 10% until 16 pairs measured it)
//! tolerance = 1 + 2 · noise
//! queue     = short > tolerance · long
//! gradient  = clamp(tolerance · long / short, 0.5, 1)
//! busy      = Σ latencies / window length            (Little's law: mean in flight)
//! headroom  = max(1, √limit / 4) · min(q − wait, 8)   (only when busy and no queue for
//!             q > wait windows; wait = 16, or 8 when noise ≥ 1%; at most limit / 4)
//! target    = limit · gradient + headroom
//! limit'    = target                                 if target ≥ limit
//!             limit + (target − limit) · 0.5         otherwise
//! ```
//!
//! clamped to `[min, max]`; the limit in force is `limit'` rounded down. At a server of
//! capacity `C` driven past it, `short = long · limit / C` (Little's law), so `limit ·
//! gradient = tolerance · C`: **the fixed point is `tolerance · C`**, and at a server whose
//! latencies do not vary the noise is 0 and the fixed point is `C` itself, no queue. The
//! tolerance is measured, not chosen: a window's mean varies by `noise` on its own, and a
//! band of two of those keeps noise from reading as a queue (with exponential service
//! times, about 18% at `C = 16`: a queue of a few requests, which costs such a tail
//! little). A fixed tolerance (1.1 here before, Gradient2's 1.5) is a standing queue of
//! `0.1 · C` at a server that has no noise, and there every queued request waits a whole
//! service time: the p99 doubles. The noise is learned only from *calm* pairs (no queue
//! beyond twice the band, nor of half a request, `1 + 0.5 / limit`), since a queue's own
//! coming and going would widen the band that hides it; twice, not once, since differences
//! cut off at the band they estimate would learn it too low, and then ever lower.
//!
//! Growth is a probe: with no queue seen the limit may be below the capacity, so after
//! `wait` quiet windows it grows by the headroom, then by two, three... headrooms while it
//! stays quiet (a ramp: a recovered capacity is grown back into in about a second, not one
//! step per probe). At the fixed point a probe costs one window with a queue of one, i.e.
//! about `1 / ((wait + 2) · C)` of the requests wait; the wait is shorter on a noisy server,
//! whose false cuts have to be grown back as often as they come. Below capacity the growth
//! needs the traffic to use at least half the limit (`busy`): an idle server's limit does
//! not run away.
//!
//! The first window only primes: it saw only the requests quicker than itself (none began
//! before it), a mean biased low; the second window sets the baseline.
//!
//! # The long-term baseline
//!
//! `long` is the server's unloaded latency, estimated from the measurements themselves:
//! no probe window ever forces concurrency down to measure it (Envoy's minRTT probes do,
//! and reject healthy traffic while they run). It moves toward each window's mean
//! (`short`, congestion signals excluded) with a weight `min(1, window / τ)`:
//!
//! - down with `τ =` [`TAU_FALL`] when the window mean is below the baseline by more than
//!   the noise band (2 s: a lower latency is evidence that the server can do better,
//!   queueing only ever adds; within the band it is no evidence and the baseline stays, or
//!   it would sit at the lower edge of the noise and ordinary noise would read as a queue);
//! - up with `τ =` [`TAU_RISE_IDLE`] when the window was not busy (the traffic stayed under
//!   half the limit, so the rise cannot be our own queue: the server itself slowed down);
//! - up with `τ =` [`TAU_RISE_BUSY`] otherwise (ten minutes: a busy window's rise is mostly
//!   the queue the limit allows, and following it quickly is how Gradient2's limit drifts up
//!   under steady overload).
//!
//! **A slowdown at full load** is told from a queue by the limit's own decrease, with no
//! probe: when the latency first rises, the limit, the concurrency and the latency are
//! noted (the anchor; again whenever the latency rises above the anchor's by more than the
//! tolerance). A queue shrinks with the concurrency, so once the gradient has cut the
//! limit *and the measured concurrency* to half the anchor's (or, for a rise beyond the
//! noise, to where the rise's queue would be gone: see `gone`) the latency must have
//! fallen; if it is still at least 90% of the anchor's, the latency is the server's own
//! pace and becomes the baseline at once (and the limit grows back). If it fell, the
//! anchor moves to the new point. The anchor follows every rise beyond the band (it once
//! waited for 11%): a FIFO queue's latency lags its concurrency, so the first window that
//! reads as a queue holds a queue still building; anchored there, a cut of a few percent
//! later met the grown latency and adopted a queue as the baseline (a simulated halving
//! to 8 workers put its p99 at 1.8 × unloaded so; re-anchored, 1.28 ×). A healthy window or a congestion signal clears it. The
//! test asks only that the concurrency fell, not that the traffic filled the limit (it
//! once required 80%): where it does not (a share of the limit per customer, a customer
//! under its share) the concurrency follows the limit only in part, and waiting for a
//! full window let a slowdown cut the limit to its floor first.
//!
//! **The floor test.** That test needs a cut, and below `2 · min` (`min / CUT`) the floor
//! is in the way: a latency that reads as a queue there can be neither tested nor acted on,
//! and growth waits for quiet windows. A slower server at the floor read as a queue in
//! every window, so the floor was a trap (a real proxy's limit stayed at its floor of 2
//! while a test's small customer got half its requests through). Below `2 · min` the limit
//! therefore tests upward: after [`FLOOR_AFTER`] busy windows without congestion there it
//! notes the window's latency `m₀` and concurrency `n₀` and probes to
//! `max(limit / CUT, limit + 1)`. The next window (`m₁`, `n₁`) gives the verdict, from
//! the same fact as the anchor's test read the other way: at a queue the latency grows
//! with the concurrency (`m ∝ n`, an elasticity `d ln m / d ln n` of 1); at a server with
//! room it does not (0). With `rose = n₁ / n₀ ≥ 1.25` (a probe the traffic did not use says
//! nothing):
//!
//! ```text
//! m₁ < m₀ · √rose   not our queue: long = max(long, min(m₀, m₁)), growth resumes at once
//! otherwise         a queue: the limit returns to where the probe began, and the next
//!                   probe waits twice as long (up to 16 windows)
//! ```
//!
//! The midpoint `√rose` (elasticity ½) is as far from either answer as the noise allows: a
//! doubling moves a queue's latency by `ln 2 = 0.69` and the verdict's threshold by half
//! that, several noise deviations of a window's mean. The fixed point stays `tolerance · C`
//! for any `C ≥ 2 · min` (the test never runs there); a server of less than `2 · min` sees
//! one window at twice the limit every 16 windows at most, which the operator's `min` says
//! it takes.
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
/// Time constant of the baseline's fall toward a lower window mean: slow enough that the
/// baseline is an average of the quieter windows, not the luckiest one (a baseline at the
/// lower edge of the noise would read ordinary noise as a queue and hold the limit down).
pub const TAU_FALL: Nanos = 2 * NANOS_PER_SEC;
/// How many measured noise deviations above the baseline a window's mean may be before it
/// counts as a queue (the tolerance is `1 + NOISE_BAND · noise`, measured, not fixed:
/// Gradient2's fixed 50% lets a queue of half the capacity build, and any fixed tolerance
/// is a queue at a server whose latencies do not vary).
pub const NOISE_BAND: f64 = 2.0;
/// `E|X − Y| = (2 / √π) · σ` for two independent normal window means of deviation `σ`.
pub const MEAN_ABS_DIFF: f64 = 1.128;
/// The least noise the tolerance assumes until [`PRIOR_PAIRS`] pairs measured it: a real
/// machine's latencies vary from window to window (scheduling, other processes), and a
/// noise of 0 before any is measured read all of that as a queue (a real proxy's limit
/// once fell to its floor so). 10%: through the debug proxy beside `stress-ng --cpu 2`,
/// windows of 8 to 30 responses measured 4% to 13%, and with 3% the first windows of such
/// a machine cut the limit by a third before a pair was measured. The two errors do not
/// cost alike: a prior too wide is a queue of up to `0.2 · C` for the seconds until 16
/// calm pairs are measured; one too narrow turns healthy requests away, and the cuts keep
/// the limit from the steady windows that would measure the noise. The probes' wait
/// follows the measured noise only: a server that does not vary is not probed more often
/// for the prior.
pub const NOISE_PRIOR: f64 = 0.1;
/// Measured pairs of windows after which the noise is the measured one alone.
pub const PRIOR_PAIRS: u64 = 16;
/// Weight of one window's difference in the noise's moving average.
pub const NOISE_WEIGHT: f64 = 0.1;
/// A difference counts at most this share of the baseline in the noise (one outlier or a
/// step in the server's pace is not noise).
pub const NOISE_CAP: f64 = 0.5;
/// Quiet windows after a queue before the limit probes upward again: a probe costs one
/// window with a queue, so probing every `PROBE_AFTER + 2` windows keeps the share of
/// requests that waited below `1 / ((PROBE_AFTER + 2) · C)`.
pub const PROBE_AFTER: u64 = 16;
/// ...but only this many where the noise is at least [`NOISY`]: where service times vary, a
/// queue of one request costs the tail little, and the noise's false cuts must be grown
/// back from as often as they come.
pub const PROBE_AFTER_NOISY: u64 = 8;
/// The relative noise of a window's mean from which the server counts as noisy.
pub const NOISY: f64 = 0.01;
/// Each further quiet window adds one more headroom to the step, up to this many: growth
/// back into a recovered capacity is quadratic in time, not one headroom per probe.
pub const MAX_RAMP: u64 = 8;
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
/// The least slowdown (a share of the baseline) that `gone`'s shorter test considers.
pub const SLOWER: f64 = 0.1;
/// The test of a latency rise: once the limit is cut to this share of the anchor's...
pub const CUT: f64 = 0.5;
/// ...a latency at least this share of the anchor's is not a queue.
pub const NOT_BETTER: f64 = 0.9;
/// A latency counts at most this many baselines in the test of a slowdown (a bound, so
/// that sums cannot overflow).
pub const RAW_CAP: f64 = 64.0;
/// The floor test (see the module's documentation): below `min / CUT` the gradient cannot
/// cut the limit by [`CUT`] to learn whether a raised latency is a queue, so the limit
/// probes upward instead, to `limit / CUT`, after this many windows there (doubled after
/// each probe that found a queue, up to [`PROBE_AFTER`]; back to this after one that found
/// none). One: the test costs one window, and at the floor every window waited is a window
/// of healthy requests turned away.
pub const FLOOR_AFTER: u64 = 1;
/// The floor test concludes only when the probe raised the measured concurrency by at
/// least this factor (a probe the traffic did not use says nothing).
pub const FLOOR_ROSE: f64 = 1.25;
/// The floor test's verdict: at a queue the latency rises with the concurrency (elasticity
/// `d ln latency / d ln concurrency` of 1), at a server with room it does not (0). The
/// latency counts as not ours below the midpoint, `rose ^ FLOOR_ELASTICITY`.
pub const FLOOR_ELASTICITY: f64 = 0.5;
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

/// A closed window's sums.
struct Window {
    sum: u64,
    raw_sum: u64,
    samples: u64,
    congested: u64,
    length: Nanos,
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
    /// `f64` bits: the noise of a window's mean relative to the baseline (a standard
    /// deviation, from the differences of consecutive windows under one limit).
    noise: AtomicU64,
    /// How many pairs of windows the noise was measured on (saturating at
    /// [`PRIOR_PAIRS`]): until then the tolerance assumes at least [`NOISE_PRIOR`].
    pairs: AtomicU64,
    /// How many window closes in a row left the limit in force unchanged.
    same: AtomicU64,
    /// Quiet windows (no queue seen) since the last queue.
    quiet: AtomicU64,
    /// Whether the last window was calm (1) or held a queue (0): see the noise.
    calm: AtomicU64,
    /// `f64` bits: the limit when the latency last rose above the baseline while the
    /// limit was binding (0: no anchor).
    anchor_limit: AtomicU64,
    /// `f64` bits: the mean concurrency then (Little's law).
    anchor_inflight: AtomicU64,
    /// `f64` bits, nanoseconds: the latency then.
    anchor_short: AtomicU64,
    /// `f64` bits, nanoseconds: the mean latency of the window before a floor probe (0: no
    /// probe pending).
    probe_short: AtomicU64,
    /// `f64` bits: the mean concurrency of that window (Little's law).
    probe_inflight: AtomicU64,
    /// `f64` bits: the limit before the probe (where a probe that found a queue returns).
    probe_limit: AtomicU64,
    /// Windows spent below the floor test's bound since the last probe.
    floor_windows: AtomicU64,
    /// Windows to wait there before the next probe (from [`FLOOR_AFTER`], doubling).
    floor_wait: AtomicU64,
    /// When the current window began.
    window_start: AtomicU64,
    /// The current window's sum of capped latencies, nanoseconds.
    sum: AtomicU64,
    /// The current window's sum of latencies capped only at [`RAW_CAP`] baselines: what
    /// the test of a slowdown compares (the [`CAP`] would flatten a deep queue into a
    /// latency that does not shrink with the concurrency).
    raw_sum: AtomicU64,
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

/// The limit in force for a real limit: rounded down (a limit of 16.5 at a server of 16
/// workers is a queue of one half the time), with a little slack for the float's error.
fn whole(v: f64) -> u64 {
    count((v + 1e-6).floor())
}

/// How far the concurrency must fall below the anchor's before a latency that did not
/// fall with it is the server's pace rather than a queue. A halving ([`CUT`]) clears any
/// queue. A latency beyond twice the noise band (`m ≥ long · (1 + 2 · NOISE_BAND ·
/// noise)`) needs less: a queue that slowed the anchor's requests by `r = anchor_short /
/// long` is gone at `1 / r` of its concurrency (`tolerance / r` with the band), so a
/// machine that became 20% slower is told from a queue after a cut of a sixth, not a half
/// (which, with a share, could starve a small customer). Within twice the band the latency
/// may be noise at the band's edge, where the shorter test would adopt a small queue as
/// the baseline and let it grow by a band at a time.
fn gone(m: f64, long: f64, tolerance: f64, anchor_short: f64) -> f64 {
    let beyond_noise = m >= long * (1.0 + (2.0 * (tolerance - 1.0)).max(SLOWER));
    if beyond_noise && anchor_short > 0.0 {
        (tolerance * long / anchor_short).clamp(CUT, 1.0)
    } else {
        CUT
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
            noise: AtomicU64::new(0f64.to_bits()),
            pairs: AtomicU64::new(0),
            same: AtomicU64::new(0),
            quiet: AtomicU64::new(PROBE_AFTER),
            calm: AtomicU64::new(0),
            anchor_limit: AtomicU64::new(0f64.to_bits()),
            anchor_inflight: AtomicU64::new(0f64.to_bits()),
            anchor_short: AtomicU64::new(0f64.to_bits()),
            probe_short: AtomicU64::new(0f64.to_bits()),
            probe_inflight: AtomicU64::new(0f64.to_bits()),
            probe_limit: AtomicU64::new(0f64.to_bits()),
            floor_windows: AtomicU64::new(0),
            floor_wait: AtomicU64::new(FLOOR_AFTER),
            window_start: AtomicU64::new(now),
            sum: AtomicU64::new(0),
            raw_sum: AtomicU64::new(0),
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
        next.limit.store(whole(exact).clamp(b.min, b.max), Relaxed);
        for (to, from) in [
            (&next.long, &previous.long),
            (&next.short, &previous.short),
            (&next.gradient, &previous.gradient),
            (&next.noise, &previous.noise),
            (&next.pairs, &previous.pairs),
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
                let (n, raw) = if long > 0.0 {
                    (n.min(count(long * CAP)), n.min(count(long * RAW_CAP)))
                } else {
                    (n, n)
                };
                self.sum.fetch_add(n.max(1), Relaxed);
                self.raw_sum.fetch_add(raw.max(1), Relaxed);
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
        let raw_sum = self.raw_sum.swap(0, Relaxed);
        let samples = self.count.swap(0, Relaxed);
        let congested = self.congested.swap(0, Relaxed);
        self.close(Window {
            sum,
            raw_sum,
            samples,
            congested,
            length,
        });
        true
    }

    /// The window's update; only the thread that claimed the window runs it.
    fn close(&self, w: Window) {
        let Window {
            sum,
            raw_sum,
            samples,
            congested,
            length,
        } = w;
        let mut long = load_f(&self.long);
        let limit = load_f(&self.exact);
        let mean = (samples > 0).then(|| real(sum) / real(samples));
        if long <= 0.0 {
            match mean {
                // The first window saw only the requests quicker than itself (none began
                // before it): a mean biased low. It only primes; the second sets the baseline.
                Some(m) if load_f(&self.short) <= 0.0 => {
                    store_f(&self.short, m);
                    return;
                }
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
        // The noise of a window's mean, from two consecutive quiet windows under one
        // limit: neither held a queue beyond the noise, so their difference is the noise
        // (a queue's own coming and going would widen the band that hides it).
        let mut noise = load_f(&self.noise);
        let pairs = self.pairs.load(Relaxed);
        let assumed = if pairs < PRIOR_PAIRS {
            noise.max(NOISE_PRIOR)
        } else {
            noise
        };
        let tolerance = 1.0 + NOISE_BAND * assumed;
        let in_flight = real(raw_sum) / real(length.max(1));
        let raw_mean = (samples > 0).then(|| real(raw_sum) / real(samples));
        // The floor test's verdict on the probe that the last window made (see `floor`).
        let probed = f64::from_bits(self.probe_short.swap(0f64.to_bits(), Relaxed));
        let mut found_queue = false;
        if let (true, Some(m)) = (probed > 0.0 && congested == 0, raw_mean) {
            let rose = in_flight / load_f(&self.probe_inflight).max(f64::MIN_POSITIVE);
            if rose >= FLOOR_ROSE {
                if m < probed * rose.powf(FLOOR_ELASTICITY) {
                    // More requests in flight and the latency did not follow: it is the
                    // server's pace, not our queue. The lower of the two is the baseline.
                    long = long.max(m.min(probed));
                    store_f(&self.anchor_limit, 0.0);
                    self.floor_wait.store(FLOOR_AFTER, Relaxed);
                    self.quiet.fetch_max(PROBE_AFTER, Relaxed);
                } else {
                    found_queue = true;
                    let wait = self.floor_wait.load(Relaxed);
                    self.floor_wait.store((wait * 2).min(PROBE_AFTER), Relaxed);
                }
            }
        }
        let queue = short > tolerance * long;
        // Calm: no queue beyond twice the band, nor of half a request (`1 + 0.5 / limit`).
        // Wider than the band itself: a sample cut off at the band it estimates would be
        // biased low (only the differences of windows under it), and a noise learned too
        // low reads more windows as queues, which then teach it nothing.
        let band = 1.0 + 2.0 * NOISE_BAND * assumed;
        let calm = congested == 0 && short <= long * band.max(1.0 + 0.5 / limit.max(1.0));
        let previous = load_f(&self.short);
        if let Some(m) = mean {
            let steady = self.same.load(Relaxed) >= 2 && self.calm.load(Relaxed) != 0;
            if steady && calm && previous > 0.0 {
                let diff = ((m - previous).abs() / long).min(NOISE_CAP) / MEAN_ABS_DIFF;
                noise += (diff - noise) * NOISE_WEIGHT;
                self.pairs.store((pairs + 1).min(PRIOR_PAIRS), Relaxed);
            }
        }
        self.calm.store(u64::from(calm), Relaxed);
        let gradient = (tolerance * long / short).clamp(MIN_GRADIENT, 1.0);
        let busy = real(sum) / real(length.max(1)) >= limit / 2.0;
        let quiet = if queue {
            0
        } else {
            self.quiet.load(Relaxed).saturating_add(1)
        };
        self.quiet.store(quiet, Relaxed);
        // Probe upward only after PROBE_AFTER quiet windows, and by more the longer it
        // stays quiet (the server has room), never above a quarter of the limit at once.
        let wait = if noise < NOISY {
            PROBE_AFTER
        } else {
            PROBE_AFTER_NOISY
        };
        let headroom = if busy && quiet > wait {
            let ramp = real((quiet - wait).min(MAX_RAMP));
            ((limit.sqrt() / 4.0).max(1.0) * ramp).min((limit / 4.0).max(1.0))
        } else {
            0.0
        };
        let target = limit * gradient + headroom;
        let mut next = if target >= limit {
            target
        } else {
            limit + (target - limit) * DECREASE_SMOOTHING
        };
        if found_queue {
            // The probe's step was a queue: back to where it started at once.
            next = next.min(load_f(&self.probe_limit));
        }
        // The floor test: below `min / CUT` a cut cannot tell a queue from the server's
        // pace, so probe upward and let the next window's verdict (above) tell.
        let floor = real(self.bounds.min) / CUT;
        if real(whole(limit)) < floor && probed <= 0.0 {
            let waited = self.floor_windows.fetch_add(1, Relaxed) + 1;
            if let (true, Some(m)) = (congested == 0 && busy, raw_mean) {
                if waited >= self.floor_wait.load(Relaxed) {
                    store_f(&self.probe_short, m);
                    store_f(&self.probe_inflight, in_flight);
                    store_f(&self.probe_limit, limit);
                    self.floor_windows.store(0, Relaxed);
                    next = next.max(limit / CUT).max(limit + 1.0);
                }
            }
        } else {
            self.floor_windows.store(0, Relaxed);
        }
        if let Some(m) = mean {
            let tau = if m < long * (1.0 - NOISE_BAND * assumed) {
                TAU_FALL
            } else if m < long {
                // Within the noise: no evidence either way (the baseline stays).
                Nanos::MAX
            } else if busy {
                TAU_RISE_BUSY
            } else {
                TAU_RISE_IDLE
            };
            let weight = (real(length) / real(tau)).min(1.0);
            long += (m - long) * weight;
            // Was the latency our queue? Compare with the anchor taken when it first rose.
            let m = real(raw_sum) / real(samples);
            let anchor = load_f(&self.anchor_limit);
            let anchor_short = load_f(&self.anchor_short);
            if !queue || congested > 0 {
                store_f(&self.anchor_limit, 0.0);
            } else if anchor <= 0.0 || m > anchor_short * tolerance {
                // The latency rose (first, or again beyond the band): anchor here, where a
                // queue still building has caught up.
                store_f(&self.anchor_limit, limit);
                store_f(&self.anchor_inflight, in_flight);
                store_f(&self.anchor_short, m);
            } else if anchor > 0.0 {
                let ratio = gone(m, long, tolerance, anchor_short);
                let cut =
                    limit <= ratio * anchor && in_flight <= ratio * load_f(&self.anchor_inflight);
                if cut && m >= NOT_BETTER * anchor_short {
                    // The concurrency was cut and the latency did not follow: not a queue
                    // but the server's own pace (or the machine's). It is the new baseline.
                    long = m;
                    store_f(&self.anchor_limit, 0.0);
                } else if cut {
                    store_f(&self.anchor_limit, limit);
                    store_f(&self.anchor_inflight, in_flight);
                    store_f(&self.anchor_short, m);
                }
            }
        }
        store_f(&self.long, long);
        store_f(&self.short, short);
        store_f(&self.gradient, gradient);
        store_f(&self.noise, noise);
        self.publish(next);
    }

    fn publish(&self, exact: f64) {
        let b = self.bounds;
        let exact = exact.clamp(real(b.min), real(b.max));
        store_f(&self.exact, exact);
        let whole = whole(exact).clamp(b.min, b.max);
        if self.limit.swap(whole, Relaxed) == whole {
            self.same.fetch_add(1, Relaxed);
        } else {
            self.same.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod sim;
