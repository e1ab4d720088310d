//! Log lines that clients can cause, rate-limited so that a flood cannot turn logging
//! into the bottleneck.
//!
//! A flood of rejected requests would otherwise write one line per request: I/O on the
//! request path, and a log that drowns what matters. A [`LogBudget`] lets the first
//! [`LogBudget::PER_SECOND`] lines of each second through and counts the rest; the first line
//! let through in a later second carries the count suppressed since, so the log says how
//! much it left out. A budget is two atomics: no lock, no allocation, no syscall.
//! Suppressed lines are reported with the next line let through; if the flood stops and
//! nothing else is logged, the last count stays unreported (the metrics still count every
//! rejection).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::limits::clock::{Nanos, NANOS_PER_SEC};

/// Bits of the packed state that hold the count of lines let through in the current
/// second; the second sits above them.
const COUNT_BITS: u32 = 16;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// A per-second allowance of log lines for one source (a limit, a cause).
#[derive(Debug, Default)]
pub struct LogBudget {
    /// `second << COUNT_BITS | lines let through in that second`.
    state: AtomicU64,
    /// Lines suppressed since the last one let through.
    suppressed: AtomicU64,
}

impl LogBudget {
    /// Lines let through per second per budget: enough to see who is being rejected,
    /// few enough that a flood writes a handful of lines a second.
    pub const PER_SECOND: u64 = 5;

    /// A fresh budget.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a line may be written at `now` (monotonic nanoseconds). `Some(n)`: write
    /// it, and say that `n` similar lines were suppressed before it; `None`: suppressed
    /// (counted).
    pub fn admit(&self, now: Nanos) -> Option<u64> {
        let second = now / NANOS_PER_SEC;
        let mut seen = self.state.load(Ordering::Relaxed);
        loop {
            let (at, count) = (seen >> COUNT_BITS, seen & COUNT_MASK);
            let next = if at != second {
                second << COUNT_BITS | 1
            } else if count < Self::PER_SECOND {
                seen + 1
            } else {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            match self
                .state
                .compare_exchange_weak(seen, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(self.suppressed.swap(0, Ordering::Relaxed)),
                Err(actual) => seen = actual,
            }
        }
    }

    /// Writes `line` at info level if the budget lets a line through at `now`, saying how
    /// many it suppressed before it; formats nothing otherwise.
    pub fn info(&self, now: Nanos, line: fmt::Arguments<'_>) {
        if let Some(suppressed) = self.admit(now) {
            log::info!("{line}{}", suppressed_note(suppressed));
        }
    }
}

/// The suffix for a line let through after `suppressed` others: empty, or
/// ` (N similar lines suppressed)`.
pub fn suppressed_note(suppressed: u64) -> String {
    if suppressed == 0 {
        String::new()
    } else {
        format!(" ({suppressed} similar lines suppressed)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_a_few_lines_a_second_through_and_counts_the_rest() {
        let b = LogBudget::new();
        let first: Vec<_> = (0..8).map(|i| b.admit(i)).collect();
        assert_eq!(
            first,
            [
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                None,
                None,
                None
            ]
        );
        // The next second's first line reports the three suppressed.
        assert_eq!(b.admit(NANOS_PER_SEC), Some(3));
        assert_eq!(b.admit(NANOS_PER_SEC + 1), Some(0));
        // Seconds later, a new allowance and nothing pending.
        assert_eq!(b.admit(10 * NANOS_PER_SEC), Some(0));
        assert_eq!(suppressed_note(0), "");
        assert_eq!(suppressed_note(3), " (3 similar lines suppressed)");
    }

    #[test]
    fn threads_never_exceed_the_allowance() {
        let b = LogBudget::new();
        let through: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1_000).filter(|_| b.admit(7).is_some()).count() as u64))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(through, LogBudget::PER_SECOND);
        assert_eq!(
            b.admit(NANOS_PER_SEC * 8),
            Some(4_000 - LogBudget::PER_SECOND)
        );
    }
}
