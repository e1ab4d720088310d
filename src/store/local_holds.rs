//! The local fallback of a holding kind counted across a fleet
//! (`crate::store::shared_concurrency`): what decides while the store cannot answer, at
//! this instance's share of the limits. A concurrency limit's is the in-process
//! concurrency limiter (exact per key, global and groups); an inflight limit's is the
//! in-process inflight limiter's count-min sketch, as a local inflight limit counts (it
//! holds any number of keys in fixed memory, and never undercounts).

use crate::limits::concurrency::{ConcurrencyLimiter, Limit, Rejection};
use crate::limits::inflight::InflightLimiter;

/// A holding kind's fallback limiter (module doc).
pub(crate) enum LocalHolds {
    /// A concurrency limit's: the in-process limiter at this instance's share.
    Table(ConcurrencyLimiter),
    /// An inflight limit's: a sketch, and this instance's share of `max`.
    Sketch(InflightLimiter, u64),
}

impl LocalHolds {
    /// Takes the largest `n` in `[min, copies]` that fits, or names what did not: the
    /// sketch, which has no groups, takes `copies` or nothing, and reports its estimate
    /// before the take as in use (so that an inflight caller reads `in_use + 1`, the
    /// estimate that was over, as the in-process limiter reports it).
    pub(crate) fn reserve(
        &self,
        key: u64,
        groups: u64,
        copies: u64,
        min: u64,
    ) -> Result<u64, Rejection> {
        match self {
            LocalHolds::Table(table) => table.reserve(key, groups, copies, min),
            LocalHolds::Sketch(sketch, max) => {
                let over = |estimate: u64| Rejection {
                    limit: Limit::Key,
                    in_use: estimate.saturating_sub(copies),
                    max: *max,
                    wanted: copies,
                };
                sketch.take(key, copies, *max).map(|_| copies).map_err(over)
            }
        }
    }

    /// Gives back `copies` [`reserve`](Self::reserve) took for `key` in `groups`.
    pub(crate) fn release(&self, key: u64, groups: u64, copies: u64) {
        match self {
            LocalHolds::Table(table) => {
                // More than the table holds (a reload changed it): nothing to give back.
                let _ = table.release(key, groups, copies);
            }
            LocalHolds::Sketch(sketch, _) => sketch.put(key, copies),
        }
    }

    /// Keys the fallback admitted untracked (a concurrency table's full sets; a sketch
    /// tracks every key).
    pub(crate) fn untracked_total(&self) -> u64 {
        match self {
            LocalHolds::Table(table) => table.untracked_total(),
            LocalHolds::Sketch(..) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::concurrency::ConcurrencyParams;
    use crate::limits::sketch::SketchSize;

    #[test]
    fn the_sketch_takes_up_to_its_share_and_reports_the_estimate_that_was_over() {
        let local = LocalHolds::Sketch(InflightLimiter::new(SketchSize::DEFAULT), 2);
        assert_eq!(local.reserve(7, 0, 1, 1), Ok(1));
        assert_eq!(local.reserve(7, 0, 1, 1), Ok(1));
        let over = local.reserve(7, 0, 1, 1).unwrap_err();
        // The in-process inflight limiter reports 3 (the estimate with this request): an
        // inflight caller reads `in_use + 1`.
        assert_eq!((over.limit, over.in_use, over.max), (Limit::Key, 2, 2));
        local.release(7, 0, 1);
        assert_eq!(local.reserve(7, 0, 1, 1), Ok(1));
        // Another key has its own count; nothing is untracked in a sketch.
        assert_eq!(local.reserve(8, 0, 1, 1), Ok(1));
        assert_eq!(local.untracked_total(), 0);
    }

    #[test]
    fn the_table_is_the_concurrency_limiter() {
        let params = ConcurrencyParams {
            max: 3,
            global: None,
            groups: Vec::new(),
        };
        let local = LocalHolds::Table(ConcurrencyLimiter::new(params, 64).unwrap());
        assert_eq!(local.reserve(1, 0, 5, 1), Ok(3));
        assert_eq!(local.reserve(1, 0, 1, 1).unwrap_err().in_use, 3);
        local.release(1, 0, 2);
        assert_eq!(local.reserve(1, 0, 2, 2), Ok(2));
        // More than it holds: nothing changes, nothing panics.
        local.release(1, 0, 100);
        assert_eq!(local.reserve(1, 0, 1, 1).unwrap_err().in_use, 3);
    }
}
