//! The circuit breaker in front of a shared store.
//!
//! Closed: calls go to the store. `failures` consecutive failed calls (timeouts or error
//! answers) open it, and so does a single connection error (a dropped or refused
//! connection will not answer the next call either). Open: calls return at once without
//! touching the store, so a dead store costs an atomic load per decision. A background
//! probe (see `crate::store::redis`) closes it once the store answers again.
//!
//! The state is two atomics read with relaxed loads on the hot path: a decision that races
//! a transition may go either way, which is harmless (one extra call, or one extra
//! fallback). A success only writes when the failure count is not already 0, so a healthy
//! store's decisions do not bounce a shared cache line between cores.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Consecutive-failure breaker (module doc).
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    consecutive: AtomicU32,
    open: AtomicBool,
}

/// What a recorded failure did to the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing changed state.
    None,
    /// This failure opened the breaker.
    Opened,
}

impl Breaker {
    /// A breaker that opens after `threshold` consecutive failures (0 is raised to 1). It
    /// starts open: a store is presumed down until a probe proves otherwise.
    pub fn new(threshold: u32) -> Self {
        Self {
            threshold: threshold.max(1),
            consecutive: AtomicU32::new(0),
            open: AtomicBool::new(true),
        }
    }

    /// Whether calls may go to the store.
    pub fn is_closed(&self) -> bool {
        !self.open.load(Ordering::Relaxed)
    }

    /// A call succeeded: the failure streak ends.
    pub fn success(&self) {
        if self.consecutive.load(Ordering::Relaxed) != 0 {
            self.consecutive.store(0, Ordering::Relaxed);
        }
    }

    /// A call failed (timeout or error answer): opens the breaker at the threshold.
    pub fn failure(&self) -> Transition {
        let n = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.threshold {
            return self.trip();
        }
        Transition::None
    }

    /// Opens the breaker now (a connection error). Returns whether this call opened it.
    pub fn trip(&self) -> Transition {
        if self.open.swap(true, Ordering::AcqRel) {
            Transition::None
        } else {
            Transition::Opened
        }
    }

    /// Closes the breaker (a probe succeeded), with a fresh failure count.
    pub fn close(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_open_then_counts_consecutive_failures() {
        let b = Breaker::new(3);
        assert!(!b.is_closed(), "presumed down until probed");
        b.close();
        assert!(b.is_closed());
        assert_eq!(b.failure(), Transition::None);
        assert_eq!(b.failure(), Transition::None);
        b.success();
        assert_eq!(b.failure(), Transition::None);
        assert_eq!(b.failure(), Transition::None);
        assert!(b.is_closed(), "a success reset the streak");
        assert_eq!(b.failure(), Transition::Opened);
        assert!(!b.is_closed());
        assert_eq!(b.failure(), Transition::None, "already open");
        b.close();
        assert_eq!(
            b.trip(),
            Transition::Opened,
            "a connection error opens at once"
        );
        assert_eq!(b.trip(), Transition::None);
        assert_eq!(Breaker::new(0).threshold, 1);
    }
}
