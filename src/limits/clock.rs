//! Time for the limiters: a monotonic nanosecond count from an arbitrary origin.
//!
//! Limiters never read the time themselves; the caller passes `now`. The proxy reads a
//! [`MonotonicClock`] once per request (a vDSO read, no syscall), tests drive a
//! [`ManualClock`] so that every algorithm is checked without sleeping.
//!
//! The proxy's clock starts at the wall-clock time of the process's start
//! ([`MonotonicClock::from_unix_epoch`]) and then moves only with the monotonic clock: its
//! instants are near Unix time, so state saved by one process (whose times lie before the
//! next process started) maps into the next one without going below zero, and rate periods
//! stay aligned to the same instants across restarts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Nanoseconds since the clock's origin. `u64` nanoseconds last 584 years.
pub type Nanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// Converts a [`Duration`] to [`Nanos`], saturating at `u64::MAX`.
pub fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of monotonic time.
pub trait Clock: Send + Sync {
    /// The current time. Never goes backwards.
    fn now(&self) -> Nanos;
}

/// The real clock: nanoseconds since the clock was created, plus the value it started at.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
    start: Nanos,
}

impl MonotonicClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A clock that reads `start` now and counts up from there.
    pub fn starting_at(start: Nanos) -> Self {
        Self {
            origin: Instant::now(),
            start,
        }
    }

    /// A clock that reads the Unix time now (nanoseconds since 1970, 0 if the system clock
    /// is before it) and from then on moves with the monotonic clock, never with steps of
    /// the wall clock.
    pub fn from_unix_epoch() -> Self {
        let unix = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, nanos);
        Self::starting_at(unix)
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        self.start.saturating_add(nanos(self.origin.elapsed()))
    }
}

/// A clock that moves only when told to: the injected clock of every algorithm test.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: AtomicU64::new(start),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(nanos(by), Ordering::SeqCst);
    }

    /// Sets the clock to `to`; callers keep it monotonic.
    pub fn set(&self, to: Nanos) {
        self.now.store(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}
