//! A tiered limit's global limit on a Redis Cluster, where it cannot be counted in the
//! store beside a key's state (another slot): this instance counts its share,
//! `⌈G / instances⌉` per aligned second of its own clock, and passes the room it reserved
//! to the key's script (`crate::store::shared_tiered`, `docs/architecture.md`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::limits::clock::{Nanos, NANOS_PER_SEC};

/// This instance's share of a global limit, per aligned second of its own clock: the
/// second and its count in one atomic word, `second << 32 | count`, as in the in-process
/// limiter.
pub(crate) struct GlobalShare {
    /// The share: admissions per second this instance may count.
    pub(crate) limit: u64,
    state: AtomicU64,
}

impl GlobalShare {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit: limit.min(u64::from(u32::MAX)),
            state: AtomicU64::new(0),
        }
    }

    fn second(t: Nanos) -> u64 {
        (t / NANOS_PER_SEC) & u64::from(u32::MAX)
    }

    /// Reserves up to `want` admissions at `now` (possibly fewer, possibly none); returns
    /// them and the time until the counted second ends (0 if nothing is counted).
    pub(crate) fn reserve(&self, want: u64, now: Nanos) -> (u64, Nanos) {
        let second = Self::second(now);
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let (mut s, mut c) = (cur >> 32, cur & u64::from(u32::MAX));
            if second > s {
                (s, c) = (second, 0);
            }
            let take = want.min(self.limit.saturating_sub(c));
            let next = s << 32 | (c + take);
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    let end = (s + 1).saturating_mul(NANOS_PER_SEC);
                    let turns_in = if c + take > 0 {
                        end.saturating_sub(now)
                    } else {
                        0
                    };
                    return (take, turns_in);
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// Gives back `n` admissions reserved at `at`, if their second is still counted at
    /// `now`.
    pub(crate) fn give_back(&self, n: u64, at: Nanos, now: Nanos) {
        let second = Self::second(at);
        if n == 0 || Self::second(now) != second {
            return;
        }
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let (s, c) = (cur >> 32, cur & u64::from(u32::MAX));
            if s != second || c == 0 {
                return;
            }
            let next = s << 32 | (c - c.min(n));
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = NANOS_PER_SEC;

    #[test]
    fn the_global_share_counts_per_second_and_gives_back_within_it() {
        let g = GlobalShare::new(3);
        assert_eq!(g.reserve(2, SEC / 2), (2, SEC / 2));
        assert_eq!(g.reserve(2, SEC / 2), (1, SEC / 2));
        assert_eq!(g.reserve(1, SEC / 2), (0, SEC / 2));
        g.give_back(1, SEC / 2, SEC - 1);
        assert_eq!(g.reserve(5, SEC - 1), (1, 1));
        // A new second counts from 0; a give-back of the old one changes nothing.
        g.give_back(3, SEC / 2, SEC);
        assert_eq!(g.reserve(5, SEC), (3, SEC));
        // Nothing counted: no turn to wait for.
        let fresh = GlobalShare::new(2);
        assert_eq!(fresh.reserve(0, 7), (0, 0));
    }
}
