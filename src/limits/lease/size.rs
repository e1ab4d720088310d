//! How much quota one slice takes: about `renew_every` worth at the key's local rate,
//! capped at `max_share` of the limit, shrinking toward 1 as the shared remainder nears
//! `instances × slice`.
//!
//! With `c` decisions counted over `d` nanoseconds on this instance, `renew_every = e`,
//! the limit `L`, `max_share = m` and `n` instances:
//!
//! ```text
//!     base  = max(1, ⌈c · e / d⌉)            about e's worth at the local rate
//!     cap   = max(1, ⌊m · L⌋)                no instance holds more than m of L per key
//!     s     = min(base, cap)
//!     s     = max(1, ⌊R / n⌋)   if R < n · s  (R: the shared remainder last reported)
//! ```
//!
//! The last rule is what keeps a limit that is being reached exact: when what is left for
//! the fleet could not give every instance a full slice, each takes its fair part of it,
//! and once fewer than `n` units are left, one at a time, so the quota held unused by the
//! whole fleet is at most `R + n` (the bound in [`crate::limits::lease`]).
//!
//! The limit `L` of each kind: a rate's `max` per period, a concurrency or inflight `max`,
//! and for a token bucket the larger of its capacity and its refill per second (the quota
//! it hands out in a second when drained).

use crate::limits::clock::Nanos;
use crate::limits::lease::{LeaseParams, PPM};

/// Slice sizes for one limit on one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceSizer {
    renew_every: Nanos,
    cap: u64,
    instances: u64,
}

impl SliceSizer {
    /// The sizer of a limit `limit` (see the module doc for each kind's) shared by
    /// `instances` instances (at least 1).
    pub fn new(params: &LeaseParams, limit: u64, instances: u64) -> Self {
        let cap = u128::from(limit) * u128::from(params.max_share.min(PPM)) / u128::from(PPM);
        Self {
            renew_every: params.renew_every,
            cap: u64::try_from(cap).unwrap_or(u64::MAX).max(1),
            instances: instances.max(1),
        }
    }

    /// The most one slice takes: `max(1, ⌊max_share · limit⌋)`.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// The next slice for a key decided `count` times in the last `over` nanoseconds on
    /// this instance (`over = 0` reads as one `renew_every`), when the store last reported
    /// `remaining` units left for the fleet (`None`: not known yet).
    pub fn size(&self, count: u64, over: Nanos, remaining: Option<u64>) -> u64 {
        let base = if over == 0 {
            count
        } else {
            let b = (u128::from(count) * u128::from(self.renew_every)).div_ceil(u128::from(over));
            u64::try_from(b).unwrap_or(u64::MAX)
        };
        let mut s = base.clamp(1, self.cap);
        if let Some(r) = remaining {
            if u128::from(r) < u128::from(self.instances) * u128::from(s) {
                s = (r / self.instances).max(1);
            }
        }
        s
    }

    /// The low-water mark of a slice of `size`: a renewal is asked for once at most this
    /// much is left, a quarter of the slice (about `renew_every / 4` at the local rate,
    /// ample for one round trip), so a steady hot key never waits for the store.
    pub fn low_water(size: u64) -> u64 {
        size / 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::clock::NANOS_PER_SEC;
    use proptest::prelude::*;

    fn sizer(limit: u64, instances: u64) -> SliceSizer {
        SliceSizer::new(&LeaseParams::default(), limit, instances)
    }

    #[test]
    fn a_slice_lasts_renew_every_at_the_local_rate() {
        let s = sizer(1_000_000, 3);
        assert_eq!(s.cap(), 10_000, "1% of the limit");
        // 1000 decisions in 1 s: 100 ms worth is 100.
        assert_eq!(s.size(1000, NANOS_PER_SEC, None), 100);
        // 1001 in 1 s: rounded up.
        assert_eq!(s.size(1001, NANOS_PER_SEC, None), 101);
        // 30 in 200 ms: 150/s, 15 in 100 ms.
        assert_eq!(s.size(30, NANOS_PER_SEC / 5, None), 15);
        // No history: at least 1.
        assert_eq!(s.size(0, NANOS_PER_SEC, None), 1);
        assert_eq!(s.size(7, 0, None), 7);
    }

    #[test]
    fn a_slice_is_capped_at_max_share() {
        let s = sizer(5_000, 3);
        assert_eq!(s.cap(), 50);
        assert_eq!(s.size(100_000, NANOS_PER_SEC, None), 50);
        // A limit too small for 1% of it: one unit at a time.
        assert_eq!(sizer(10, 3).cap(), 1);
        assert_eq!(sizer(10, 3).size(1_000_000, NANOS_PER_SEC, None), 1);
        // max_share above 100% reads as 100%.
        let p = LeaseParams {
            max_share: 5 * PPM,
            ..LeaseParams::default()
        };
        assert_eq!(SliceSizer::new(&p, 40, 1).cap(), 40);
    }

    #[test]
    fn a_slice_shrinks_toward_one_as_the_remainder_nears_instances_times_slice() {
        let s = sizer(1_000_000, 10);
        assert_eq!(
            s.size(1000, NANOS_PER_SEC, Some(1_000)),
            100,
            "10 × 100 left"
        );
        assert_eq!(s.size(1000, NANOS_PER_SEC, Some(999)), 99);
        assert_eq!(s.size(1000, NANOS_PER_SEC, Some(250)), 25);
        assert_eq!(s.size(1000, NANOS_PER_SEC, Some(19)), 1);
        assert_eq!(s.size(1000, NANOS_PER_SEC, Some(0)), 1);
        assert_eq!(
            sizer(1_000_000, 0).size(5, 0, Some(3)),
            3,
            "0 instances reads as 1"
        );
    }

    #[test]
    fn low_water_is_a_quarter() {
        assert_eq!([1, 4, 100, 101].map(SliceSizer::low_water), [0, 1, 25, 25]);
    }

    proptest! {
        #[test]
        fn sizes_stay_within_one_and_the_cap_and_never_grow_as_the_remainder_falls(
            limit in 0u64..u64::MAX,
            share in 0u64..2 * PPM,
            instances in 0u64..1000,
            count in 0u64..u64::MAX,
            over in 0u64..u64::MAX,
            r in 0u64..u64::MAX,
            r2 in 0u64..u64::MAX,
        ) {
            let p = LeaseParams { max_share: share, ..LeaseParams::default() };
            let s = SliceSizer::new(&p, limit, instances);
            let a = s.size(count, over, Some(r));
            prop_assert!(a >= 1 && a <= s.cap());
            prop_assert!(a <= s.size(count, over, None));
            let (lo, hi) = (r.min(r2), r.max(r2));
            prop_assert!(s.size(count, over, Some(lo)) <= s.size(count, over, Some(hi)));
            // When the remainder is short, the fleet's slices fit in it (or are single
            // units): n · s ≤ max(R, n).
            let n = instances.max(1);
            prop_assert!(
                u128::from(n) * u128::from(a) <= u128::from(r.max(n))
                    || a == s.size(count, over, None)
            );
        }
    }
}
