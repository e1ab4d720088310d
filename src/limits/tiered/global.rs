//! The global limit: every key's admissions in the current aligned second, in one atomic
//! word, taken and given back with compare-and-swap (module doc, "Hard and global limits").

use std::sync::atomic::Ordering;

use crate::limits::clock::{Nanos, NANOS_PER_SEC};

use super::*;

impl Global {
    pub(super) fn unpack(v: u64) -> (u32, u64) {
        ((v >> 32) as u32, v & u64::from(u32::MAX))
    }

    /// The aligned second of `t`, as stored (clocks run from boot or from the epoch, so real
    /// instants stay far below 2^32 seconds).
    pub(super) fn second(t: Nanos) -> u32 {
        (t / NANOS_PER_SEC) as u32
    }

    /// Whether `t` is in a second after the stored second `s`.
    pub(super) fn later(t: Nanos, s: u32) -> bool {
        t / NANOS_PER_SEC > u64::from(s)
    }

    /// Takes between `min` and `want` admissions at `now`; returns how many (0 if fewer than
    /// `min` are left).
    pub(super) fn take(&self, min: u64, want: u64, now: Nanos) -> u64 {
        let second = Self::second(now);
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let (mut s, mut c) = Self::unpack(cur);
            if Self::later(now, s) {
                (s, c) = (second, 0);
            }
            let room = self.limit.saturating_sub(c);
            if room < min {
                return 0;
            }
            let take = want.min(room);
            let next = u64::from(s) << 32 | (c + take);
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return take,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Gives back `count` admissions taken at `at`, if their second is still the counted one
    /// at `now`.
    pub(super) fn refund(&self, count: u64, at: Nanos, now: Nanos) {
        let second = Self::second(at);
        if Self::second(now) != second {
            return;
        }
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let (s, c) = Self::unpack(cur);
            if s != second || c == 0 {
                return;
            }
            let next = u64::from(s) << 32 | (c - c.min(count));
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Room at `t`, assuming no other key takes any.
    pub(super) fn room_at(&self, t: Nanos) -> u64 {
        let (s, c) = Self::unpack(self.state.load(Ordering::Relaxed));
        if Self::later(t, s) {
            self.limit
        } else {
            self.limit.saturating_sub(c)
        }
    }

    /// When the counted second ends, if it is after `t` and holds admissions.
    pub(super) fn turns_after(&self, t: Nanos) -> Option<Nanos> {
        let (s, c) = Self::unpack(self.state.load(Ordering::Relaxed));
        let end = (u64::from(s) + 1).saturating_mul(NANOS_PER_SEC);
        (c > 0 && end > t).then_some(end)
    }
}
