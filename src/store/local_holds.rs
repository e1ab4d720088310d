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
