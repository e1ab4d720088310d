//! Time for the limiters: a monotonic nanosecond count from an arbitrary origin.
//!
//! Limiters never read the time themselves; the caller passes `now`. The proxy reads a
//! [`MonotonicClock`] once per request (a vDSO read, no syscall), tests drive a
//! [`ManualClock`] so that every algorithm is checked without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// The real clock: nanoseconds since the clock was created.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        nanos(self.origin.elapsed())
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
