//! The rate limiter: events per key over a sliding window, exact per key, in a fixed-size
//! set-associative table.
//!
//! Time is cut into periods of length `per`; period `p` covers `[p·per, (p+1)·per)`. Each
//! key counts its events in its current period (`curr`) and keeps the count of the period
//! before (`prev`). At `now`, with `f = (now - p·per) / per ∈ [0, 1)` of the current period
//! elapsed, the estimate of the key's events in the last `per` is
//!
//! ```text
//! estimate = prev · (1 - f) + curr
//! ```
//!
//! which assumes the previous period's events were spread evenly (Cloudflare's "counting
//! things" estimate). Unlike `pingora_limits::rate::Rate` it counts the current period, so
//! it limits from the very first one, and it never reads the clock: any `per` from 100 ms to
//! a day works. Decisions are made in exact integer arithmetic (`estimate · per` in `u128`),
//! so `retry_after` is exact to the nanosecond: if nothing else happens, the same request
//! is admitted at `now + retry_after` and rejected one nanosecond earlier.
//!
//! **Exact per key.** A key's counts are its own, so other keys can never push it over
//! `max`. (A count-min sketch shares its counters: 1.28 M distinct keys in one minute made
//! two 4 × 8192 sketches reject 29% of those never-seen keys at `max: 100` per minute, see
//! `docs/performance.md`: a key flood became a denial for everyone.) A key's state is
//! `(period, prev, curr)`, moved forward when it is touched: one period on, `prev = curr`
//! and `curr = 0`; two or more, both 0. A key whose window is empty by now behaves exactly
//! like a key never seen, so it needs no state: an operation that leaves a window empty
//! frees its slot, and a slot whose window has emptied since is reused before anything is
//! evicted.
//!
//! **Table.** As in [`crate::limits::token_bucket`]: `sets = ⌈max_keys / 8⌉` sets of 8
//! slots, each set behind its own `parking_lot::Mutex` (no global lock). Keys are already
//! good 64-bit hashes, so Lemire's multiply-high `⌊key · sets / 2⁶⁴⌋` picks the set, with no
//! division and no rounding of `sets` to a power of two. A slot is
//! `(key, period, prev, curr)`, key 0 meaning empty, so a real key 0 is stored as 1 (a hash
//! collision of 2⁻⁶⁴ odds, harmless). A decision locks one set, scans its 8 slots and
//! unlocks: no allocation, no other lock, no syscall.
//!
//! **Memory bound.** 32 bytes a slot, and a set is 8 slots plus its 1-byte lock padded to
//! 8: 264 bytes, i.e. 33 bytes per key of `max_keys` (plus under 264 bytes of rounding to
//! whole sets and a 256-byte header), all allocated once by [`RateLimiter::new`], never
//! grown: 100 000 keys take 3.3 MB (3.15 MiB), 1 M keys 33 MB.
//!
//! **Eviction fails toward leniency.** A key that needs state takes an empty slot of its
//! set, else a slot whose window is empty by now (that equals absent: nothing is lost).
//! Failing both, it evicts the slot with the smallest estimate at `now` (among equals,
//! one picked by the newcomer's hash): the key nearest to empty, which restarts at 0. That is counted by
//! [`RateLimiter::evictions`]. Counts are therefore only ever lost, never gained: at every
//! instant a key's stored `prev` and `curr` are at most the counts of what it was let
//! through (and, with `strict`, of its rejections), so the limiter rejects a key only when
//! the exact window of that key's own traffic would. Other keys can make the limit more
//! lenient for a key, never stricter. A flood of new keys mostly evicts its own one-event
//! keys, and a key near `max` is the last its set gives up, so a flood does not free an
//! abuser either.
//!
//! A key can only use its own set, so eviction starts before `max_keys` keys hold state:
//! with `a` of them hashed uniformly, the share of keys beyond their set's 8 ways is 0.01%
//! at `a = max_keys / 4`, 0.8% at `max_keys / 2`, 5% at `3/4` and 14% at `max_keys` (see
//! the token bucket). A key holds state from its first event until its window is empty,
//! `per` to `2·per` after its last event: size `max_keys` at twice the distinct keys seen
//! in two periods.
//!
//! **Concurrency.** A decision reads and updates a key's counts under its set's lock, so
//! concurrent decisions are exact: racing threads never overshoot `max`, and no event is
//! lost at a period boundary. A caller whose `now` lags a period the key has already
//! entered (another thread read the clock later and got the lock first) counts at the
//! start of that period.

use crate::limits::clock::Nanos;
use crate::limits::restore::Restored;
use crate::limits::table::{self, Table};
use crate::limits::verdict::{Grant, Verdict, NEVER};
use crate::limits::victim::Rank;

/// Parameters of a rate limit: at most `max` events per sliding `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateParams {
    /// Events allowed per window.
    pub max: u64,
    /// Window length in nanoseconds (100 ms to 1 day).
    pub per: Nanos,
    /// Whether rejected events count too.
    pub strict: bool,
}

/// Sliding-window rate limiter, exact per key.
///
/// Only the window `per` and `max_keys` shape the state, so only they are fixed at
/// construction: `max` and `strict` come with every call, so that a reload or an override
/// changing them keeps the counts (and can never go stale in here).
pub struct RateLimiter {
    /// The windows, headed by the window's length in nanoseconds (at least 1).
    table: Table<Counts, Nanos>,
}

/// A key's counts as of the period they were last moved to: 24 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    /// The period `curr` counts.
    period: u64,
    /// Events in period `period - 1`.
    prev: u64,
    /// Events in period `period`.
    curr: u64,
}

/// A way's rank for eviction: its estimate · per; an empty window is free. Ways of equal
/// rank go in the order `way ^ (newcomer's hash & 7)` (see [`RateLimiter::with_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Estimate(u128);

impl Rank for Estimate {
    fn is_free(self) -> bool {
        self.0 == 0
    }
}

/// `now` cut into its period and the nanoseconds elapsed in it.
#[derive(Debug, Clone, Copy)]
struct Moment {
    period: u64,
    elapsed: Nanos,
}

/// One key's counts at one instant, with the window's geometry.
#[derive(Debug, Clone, Copy)]
struct Window {
    per: Nanos,
    elapsed: Nanos,
    prev: u64,
    curr: u64,
}

impl RateLimiter {
    /// A limiter whose window is `per` nanoseconds, holding state for at most `max_keys`
    /// keys (see the module doc for the memory this allocates up front and for how
    /// eviction starts).
    ///
    /// `per` and `max_keys` of 0 are raised to 1, so bad parameters degrade the limit
    /// instead of panicking on the hot path (the config rejects them anyway).
    pub fn new(per: Nanos, max_keys: usize) -> Self {
        Self {
            table: Table::new(max_keys.min(Self::MAX_KEYS), per.max(1)),
        }
    }

    /// The most keys a table holds, whatever it is handed (the config refuses more): a
    /// bound on what a bad value can allocate, the same as the token bucket's.
    pub const MAX_KEYS: usize = table::MAX_KEYS;

    /// The bytes [`RateLimiter::new`] allocates for `max_keys` (after the same clamping):
    /// whole sets of 8 slots.
    pub fn table_bytes(max_keys: usize) -> usize {
        Table::<Counts>::bytes_for(max_keys.min(Self::MAX_KEYS))
    }

    /// The window, in nanoseconds (at least 1).
    pub fn per(&self) -> Nanos {
        *self.table.head()
    }

    /// Decides one event of weight `cost` for `key` at `now`, counting it when admitted
    /// (and when rejected if `strict`). `max` may differ from one call to the next (an
    /// override's or a reload's new `max` reuses the counts).
    ///
    /// Admitted iff `estimate + cost <= max`. A `cost` above `max` can never pass (with
    /// `max: 0` that is a deliberate block): its `retry_after` is [`NEVER`], so that no
    /// client is invited to retry.
    pub fn acquire(&self, key: u64, max: u64, cost: u64, strict: bool, now: Nanos) -> Verdict {
        let (per, at) = (self.per(), self.moment(now));
        let (admitted, counts) = self.with_counts(key, at, |counts| {
            let counted = Window {
                curr: counts.curr.saturating_add(cost),
                ..Window::of(per, counts, at)
            };
            let admitted = counted.fits(max);
            if admitted || strict {
                counts.curr = counted.curr;
            }
            admitted
        });
        // The verdict's divisions are done after the set is unlocked.
        let after = Window::of(per, &counts, at);
        if admitted {
            return Verdict::allow(after.remaining(max), after.reset_after());
        }
        Verdict::reject(
            after.remaining(max),
            after.reset_after(),
            after.retry_after(max, cost),
        )
    }

    /// Decides a request for between `min` and `want` events (a `min` above `want` is
    /// lowered to `want`) for `key` at `now`: counts the largest `n` in `[min, want]` with
    /// `estimate + n ≤ max`, or nothing if even `min` does not fit (then counts `min` if
    /// `strict`: the least the caller asked for is what was refused).
    ///
    /// `estimate + n ≤ max` is `(curr + n) · per ≤ max · per − prev · (per − e)`, so the
    /// largest `n` is `⌊(max · per − prev · (per − e)) / per⌋ − curr`: exactly the
    /// `remaining` the window reports before this request, computed in the same exact
    /// integers. A rejection's `retry_after` is the time until `min` fits ([`NEVER`] when
    /// `min > max`). `acquire_many(key, max, c, c, strict, now)` decides exactly as
    /// `acquire(key, max, c, strict, now)`.
    pub fn acquire_many(
        &self,
        key: u64,
        max: u64,
        min: u64,
        want: u64,
        strict: bool,
        now: Nanos,
    ) -> Grant {
        let min = min.min(want);
        let (per, at) = (self.per(), self.moment(now));
        let (granted, counts) = self.with_counts(key, at, |counts| {
            let window = Window::of(per, counts, at);
            let least = Window {
                curr: counts.curr.saturating_add(min),
                ..window
            };
            // `fits` rather than `room ≥ min`: a window already over `max` (strict) has
            // no room and refuses even a `min` of 0, as `acquire` refuses a cost of 0.
            if least.fits(max) {
                let n = window.remaining(max).min(want);
                counts.curr = counts.curr.saturating_add(n);
                return Some(n);
            }
            if strict {
                counts.curr = counts.curr.saturating_add(min);
            }
            None
        });
        let after = Window::of(per, &counts, at);
        match granted {
            Some(granted) => Grant {
                verdict: Verdict::allow(after.remaining(max), after.reset_after()),
                granted,
            },
            None => Grant::rejected(Verdict::reject(
                after.remaining(max),
                after.reset_after(),
                after.retry_after(max, min),
            )),
        }
    }

    /// Takes back an admitted event (a later limit rejected the request).
    ///
    /// It takes from the current period first, then from the previous one, and never
    /// drives a count below zero; a key without state has nothing to give back. The proxy
    /// refunds nanoseconds after admitting, so the period has almost always not rolled;
    /// when it has, the event sits in `prev` and, if the key already counts events in the
    /// new period, taking them from `curr` instead undercounts the key by at most `cost · f`
    /// until the window slides past it.
    pub fn refund(&self, key: u64, cost: u64, now: Nanos) {
        self.with_counts(key, self.moment(now), |counts| {
            let from_curr = cost.min(counts.curr);
            counts.curr -= from_curr;
            counts.prev -= (cost - from_curr).min(counts.prev);
        });
    }

    /// The sliding-window estimate for `key` at `now` (the admin API's `/state`, tests). It
    /// changes nothing.
    pub fn state(&self, key: u64, now: Nanos) -> f64 {
        let at = self.moment(now);
        let held = self.table.get(key, |_| true);
        let counts = held.map_or(Counts::new(at.period), |c| c.at(at.period));
        let window = Window::of(self.per(), &counts, at);
        window.scaled() as f64 / window.per as f64
    }

    /// Keys currently holding state (a window empty by now still counts until its slot is
    /// reused or the key is touched).
    ///
    /// Locks each set in turn, so it is for metrics and tests, not the hot path.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys evicted while their window still counted events, since construction.
    ///
    /// Each is a key that restarts at 0 and may be let through more than `max` in one
    /// window, never less: a rising count means `max_keys` is too small for the keys
    /// seen within two periods (or a key flood is under way). Reusing the slot of a window
    /// that is empty by now loses nothing and is not counted.
    pub fn evictions(&self) -> u64 {
        self.table.evictions()
    }

    /// `now`'s period and the nanoseconds elapsed in it.
    fn moment(&self, now: Nanos) -> Moment {
        let per = self.per();
        let period = now / per;
        Moment {
            period,
            // period · per ≤ now: no overflow.
            elapsed: now - period * per,
        }
    }

    /// Runs `f` on `key`'s counts moved to `at`, then stores them, or frees the key's slot
    /// if its window is empty (a key without state that stays empty takes no slot).
    /// Returns `f`'s result and the counts after it.
    ///
    /// A new key finding its set full takes the way with the smallest estimate at `at`: a
    /// window empty by now has estimate 0 and is reused for free; any other is evicted, and
    /// counted. Among equal estimates (a flood's one-event keys all weigh 1) the newcomer's
    /// low hash bits pick, so in effect at random: a fixed choice would make every newcomer
    /// land in the same way and be the next one evicted, so that a key sending a few events
    /// between a flood's arrivals would never keep its count.
    #[inline(always)]
    fn with_counts<R>(
        &self,
        key: u64,
        at: Moment,
        f: impl FnOnce(&mut Counts) -> R,
    ) -> (R, Counts) {
        let per = self.per();
        self.table.update(
            key,
            |_| true,
            |held| held.map_or(Counts::new(at.period), |c| c.at(at.period)),
            f,
            |c| !c.is_empty(),
            |_, c| Estimate(Window::of(per, &c.at(at.period), at).scaled()),
            table::stored(key) as usize,
        )
    }
}

impl Counts {
    /// A key without state, in `period`.
    fn new(period: u64) -> Self {
        Self {
            period,
            prev: 0,
            curr: 0,
        }
    }

    /// The counts moved forward to `period`: one period on, `curr` becomes `prev`; two or
    /// more, nothing is left. Never moved back: counts already in a later period (a caller
    /// whose clock lags) stay there.
    fn at(self, period: u64) -> Self {
        match period.saturating_sub(self.period) {
            0 => self,
            1 => Self {
                period,
                prev: self.curr,
                curr: 0,
            },
            _ => Self::new(period),
        }
    }

    /// Whether the window holds no event: then the key equals one never seen.
    fn is_empty(&self) -> bool {
        self.prev == 0 && self.curr == 0
    }
}

impl Window {
    /// `counts` (already moved to `at`) as a window at `at`. Counts in a later period than
    /// `at`'s are seen from that period's start.
    fn of(per: Nanos, counts: &Counts, at: Moment) -> Self {
        Self {
            per,
            elapsed: if counts.period == at.period {
                at.elapsed
            } else {
                0
            },
            prev: counts.prev,
            curr: counts.curr,
        }
    }

    /// `estimate · per`, exact: `prev · (per - elapsed) + curr · per` (saturating, which
    /// only absurd counts and windows could reach).
    fn scaled(&self) -> u128 {
        let per = u128::from(self.per);
        (u128::from(self.prev) * (per - u128::from(self.elapsed)))
            .saturating_add(u128::from(self.curr) * per)
    }

    /// Whether the counted estimate is within `max`.
    fn fits(&self, max: u64) -> bool {
        self.scaled() <= u128::from(max) * u128::from(self.per)
    }

    /// `floor(max - estimate)`, at least 0.
    fn remaining(&self, max: u64) -> u64 {
        let room = (u128::from(max) * u128::from(self.per)).saturating_sub(self.scaled());
        saturate(room / u128::from(self.per))
    }

    /// Nanoseconds until the estimate reaches 0 with no further events. This is exact: the
    /// current period's events weigh until the end of the next period, the previous
    /// period's until the end of this one.
    fn reset_after(&self) -> Nanos {
        let to_end = self.per - self.elapsed;
        if self.curr > 0 {
            to_end.saturating_add(self.per)
        } else if self.prev > 0 {
            to_end
        } else {
            0
        }
    }

    /// Nanoseconds until `estimate + cost <= max` with no further events, at least 1;
    /// [`NEVER`] when `cost > max`.
    ///
    /// The estimate only falls: in this period as `prev`'s weight decays, then in the next
    /// one as `curr` (become `prev`) decays. If `curr + cost` fits, the wait ends in this
    /// period at the first `e` with `prev · (per - e) <= (max - curr - cost) · per`;
    /// otherwise at the first `e'` of the next with `curr · (per - e') <= (max - cost) · per`.
    fn retry_after(&self, max: u64, cost: u64) -> Nanos {
        if cost > max {
            return NEVER;
        }
        let per = u128::from(self.per);
        let elapsed = u128::from(self.elapsed);
        let (prev, curr) = (u128::from(self.prev), u128::from(self.curr));
        let (max, cost) = (u128::from(max), u128::from(cost));
        let wait = if curr + cost <= max {
            let budget = (max - curr - cost) * per;
            let at = per - (budget / prev.max(1)).min(per);
            at.saturating_sub(elapsed)
        } else {
            // curr > max - cost >= 0, so budget / curr < per.
            let budget = (max - cost) * per;
            (per - elapsed) + (per - budget / curr)
        };
        saturate(wait).max(1)
    }
}

/// A `u128` back to `u64`, saturating.
fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// One key's stored window, as [`RateLimiter::export`] reads it and [`RateLimiter::import`]
/// takes it back: the period `curr` counts (period `p` covers `[p·per, (p+1)·per)`) and the
/// counts of that period and the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateWindowEntry {
    /// The key's hash (never 0: key 0 is stored as 1).
    pub key: u64,
    /// The period `curr` counts.
    pub period: u64,
    /// Events in the period before it.
    pub prev: u64,
    /// Events in `period`.
    pub curr: u64,
}

impl RateLimiter {
    /// Calls `f` for every key holding state (a window empty by now is included until
    /// touched; [`RateLimiter::import`] drops it). Each set is locked only while its 8
    /// slots are copied, and `f` runs with no lock held.
    pub fn export(&self, mut f: impl FnMut(RateWindowEntry)) {
        self.table.each(|slot| {
            f(RateWindowEntry {
                key: slot.key,
                period: slot.value.period,
                prev: slot.value.prev,
                curr: slot.value.curr,
            })
        });
    }

    /// Puts a saved window back at `now`: moved forward to `now`'s period (a period after
    /// `now`'s is taken as `now`'s), it is stored unless it is empty by then. It replaces
    /// the key's state if the key has some, else takes an empty slot or one whose window is
    /// empty by now; it never evicts (see [`crate::limits::restore`]).
    pub fn import(&self, entry: RateWindowEntry, now: Nanos) -> Restored {
        let at = self.moment(now);
        let saved = Counts {
            period: entry.period.min(at.period),
            prev: entry.prev,
            curr: entry.curr,
        };
        let counts = saved.at(at.period);
        let kept = (!counts.is_empty()).then_some(counts);
        self.table
            .put(entry.key, kept, |c| c.at(at.period).is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: Nanos = 1_000_000_000;
    const MS: Nanos = 1_000_000;
    const DAY: Nanos = 86_400 * SEC;

    impl RateLimiter {
        /// [`RateLimiter::state`]: the tests' shorthand.
        pub(crate) fn estimate(&self, key: u64, now: Nanos) -> f64 {
            self.state(key, now)
        }
    }

    fn limiter(per: Nanos) -> RateLimiter {
        RateLimiter::new(per, 1_000)
    }

    /// Admissions of unit events at `now` until the first rejection (at most 1 000).
    fn admit_all(l: &RateLimiter, max: u64, strict: bool, now: Nanos) -> u64 {
        (0..1_000)
            .take_while(|_| l.acquire(1, max, 1, strict, now).allowed)
            .count() as u64
    }

    /// Asserts the `retry_after` promise: rejected one nanosecond before, admitted at it.
    fn assert_retry_exact(l: &RateLimiter, max: u64, cost: u64, now: Nanos, retry: Nanos) {
        assert!(retry >= 1);
        let before = l.acquire(1, max, cost, false, now + retry - 1);
        assert!(!before.allowed, "admitted {retry}ns early minus one");
        assert!(
            l.acquire(1, max, cost, false, now + retry).allowed,
            "not at retry_after"
        );
    }

    #[test]
    fn limits_from_the_first_period() {
        let l = limiter(SEC);
        let remaining: Vec<_> = (0..4)
            .map(|i| l.acquire(1, 3, 1, false, i * MS))
            .map(|v| (v.allowed, v.remaining))
            .collect();
        assert_eq!(remaining, [(true, 2), (true, 1), (true, 0), (false, 0)]);
        assert_eq!(l.estimate(1, 10 * MS), 3.0);
        assert_eq!(admit_all(&l, 3, false, 10 * MS), 0);
        assert_eq!(l.estimate(2, 10 * MS), 0.0, "keys are independent");
    }

    #[test]
    fn the_window_slides() {
        let l = limiter(SEC);
        assert_eq!(admit_all(&l, 10, false, 0), 10);
        assert_eq!(l.estimate(1, SEC + SEC / 2), 5.0);
        assert_eq!(admit_all(&l, 10, false, SEC + SEC / 2), 5);
        assert_eq!(l.estimate(1, SEC + SEC / 2), 10.0);
        // At 1.9 s: 10 · 0.1 + 5 = 6, so 4 more.
        assert_eq!(admit_all(&l, 10, false, SEC + 9 * SEC / 10), 4);
        // In period 2, prev = 9 (5 + 4); at 2.5 s: 4.5, so floor(10 - 4.5) = 5 more.
        assert_eq!(admit_all(&l, 10, false, 2 * SEC + SEC / 2), 5);
    }

    #[test]
    fn verdict_reports_remaining_and_reset() {
        let l = limiter(SEC);
        let v = l.acquire(1, 10, 1, false, SEC / 4);
        assert_eq!(v, Verdict::allow(9, 3 * SEC / 4 + SEC));
        // In period 1 the event only weighs through prev: 1 · 0.5 + 1 = 1.5.
        let v = l.acquire(1, 10, 1, false, SEC + SEC / 2);
        assert_eq!(v, Verdict::allow(8, SEC / 2 + SEC));
        // In period 2 only the second event weighs, until the end of period 2.
        assert_eq!(l.estimate(1, 2 * SEC + SEC / 4), 0.75);
        let v = l.acquire(2, 0, 1, false, 2 * SEC + SEC / 4);
        assert_eq!((v.allowed, v.remaining, v.reset_after), (false, 0, 0));
    }

    #[test]
    fn sub_second_and_day_periods() {
        let l = limiter(100 * MS);
        assert_eq!(admit_all(&l, 2, false, 0), 2);
        assert_eq!(admit_all(&l, 2, false, 99 * MS), 0);
        assert_eq!(admit_all(&l, 2, false, 150 * MS), 1);
        assert_eq!(admit_all(&l, 2, false, 250 * MS), 1);

        let l = limiter(DAY);
        assert_eq!(admit_all(&l, 5, false, 7), 5);
        assert_eq!(admit_all(&l, 5, false, DAY - 1), 0);
        // 5 · 0.5 = 2.5 at 1.5 days: 3.5 and 4.5 fit, 5.5 does not.
        assert_eq!(admit_all(&l, 5, false, DAY + DAY / 2), 2);
        assert_eq!(l.estimate(1, DAY + DAY / 2), 4.5);
    }

    #[test]
    fn strict_counts_rejections() {
        let lax = limiter(SEC);
        let strict = limiter(SEC);
        for (l, s) in [(&lax, false), (&strict, true)] {
            assert_eq!(admit_all(l, 2, s, 0), 2);
            for _ in 0..3 {
                assert!(!l.acquire(1, 2, 1, s, SEC / 2).allowed);
            }
        }
        assert_eq!(lax.estimate(1, SEC / 2), 2.0);
        // admit_all's own closing rejection counts too: 2 + 1 + 3.
        assert_eq!(strict.estimate(1, SEC / 2), 6.0);
        // At 1.5 s: lax 1 (one more fits), strict 3 (still rejected, and counted).
        assert_eq!(admit_all(&lax, 2, false, SEC + SEC / 2), 1);
        assert_eq!(admit_all(&strict, 2, true, SEC + SEC / 2), 0);
        assert_eq!(strict.estimate(1, SEC + SEC / 2), 4.0);
    }

    #[test]
    fn refund_takes_back_without_going_negative() {
        let l = limiter(SEC);
        assert_eq!(admit_all(&l, 3, false, 0), 3);
        l.refund(1, 1, 0);
        assert_eq!(l.estimate(1, 0), 2.0);
        assert_eq!(admit_all(&l, 3, false, 0), 1);
        l.refund(1, 10, SEC / 2);
        assert_eq!(l.estimate(1, SEC / 2), 0.0);
        l.refund(1, 1, SEC / 2);
        l.refund(9, 1, SEC / 2);
        assert_eq!(admit_all(&l, 3, false, SEC / 2), 3);
        // After a roll, the refund comes out of prev.
        l.refund(1, 2, SEC + SEC / 2);
        assert_eq!(l.estimate(1, SEC + SEC / 2), 0.5);
    }

    #[test]
    fn skipping_two_periods_forgets_everything() {
        let l = limiter(SEC);
        assert_eq!(admit_all(&l, 4, true, 0), 4);
        assert!(!l.acquire(1, 4, 1, true, SEC + 1).allowed);
        assert_eq!(l.estimate(1, 3 * SEC), 0.0);
        assert_eq!(admit_all(&l, 4, true, 3 * SEC), 4);
        assert_eq!(l.estimate(1, 5 * SEC + 1), 0.0);
    }

    #[test]
    fn retry_after_is_exact() {
        // (per, max, cost, strict, script of (now, cost), probe time)
        type Case = (Nanos, u64, u64, bool, &'static [(Nanos, u64)], Nanos);
        let cases: [Case; 7] = [
            // prev's weight decays within the period: 10·(1-f) + 1 <= 10 at f = 0.1.
            (SEC, 10, 1, false, &[(0, 10)], SEC + 50 * MS),
            // curr alone is full: wait into the next period.
            (SEC, 5, 1, false, &[(900 * MS, 5)], 950 * MS),
            // prev and curr both weigh.
            (
                SEC,
                10,
                1,
                false,
                &[(100 * MS, 6), (1500 * MS, 7)],
                1600 * MS,
            ),
            // strict rejections push the wait out.
            (SEC, 3, 1, true, &[(0, 3), (500 * MS, 3)], 600 * MS),
            // a heavier request.
            (SEC, 10, 4, false, &[(0, 8)], 100 * MS),
            (100 * MS, 5, 1, false, &[(90 * MS, 5)], 95 * MS),
            (
                DAY,
                5,
                2,
                true,
                &[(DAY / 3, 5), (DAY + 1, 4)],
                DAY + DAY / 5,
            ),
        ];
        let expected = [
            50 * MS,
            250 * MS,
            1_000_000_000 - 333_333_333 - 600 * MS,
            400 * MS + (1_000_000_000 - 2_000_000_000 / 7),
            900 * MS + 250 * MS,
            5 * MS + 20 * MS,
            0, // checked by the property only
        ];
        for ((per, max, cost, strict, script, probe), want) in cases.into_iter().zip(expected) {
            let l = limiter(per);
            for &(now, n) in script {
                for _ in 0..n {
                    l.acquire(1, max, 1, strict, now);
                }
            }
            let v = l.acquire(1, max, cost, strict, probe);
            assert!(!v.allowed, "probe at {probe} admitted");
            if want != 0 {
                assert_eq!(v.retry_after, want, "case per={per} max={max}");
            }
            assert_retry_exact(&l, max, cost, probe, v.retry_after);
        }
    }

    #[test]
    fn cost_above_max_never_passes() {
        let l = limiter(SEC);
        let v = l.acquire(1, 3, 4, false, 0);
        assert_eq!(v, Verdict::reject(3, 0, NEVER));
        // `max: 0` is a deliberate block: no retry is invited.
        assert!(l.acquire(1, 0, 1, false, 0).is_block());
        assert!(!l.acquire(1, 3, 4, false, 10 * SEC).allowed);
    }

    #[test]
    fn threads_never_overshoot_by_more_than_the_racers() {
        const THREADS: u64 = 8;
        let l = limiter(SEC);
        let admitted: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .filter(|_| l.acquire(1, 50, 1, false, 0).allowed)
                            .count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        assert!(
            (1..=50 + THREADS).contains(&admitted),
            "admitted {admitted}"
        );
        assert_eq!(l.estimate(1, 0), admitted as f64, "rejections were undone");
    }

    proptest! {
        /// Every rejection's `retry_after` is exact, whatever happened before.
        #[test]
        fn retry_after_property(
            per in prop::sample::select(vec![100 * MS, SEC, 7 * SEC + 3, DAY]),
            max in 1u64..12,
            strict in any::<bool>(),
            steps in prop::collection::vec((0u64..1_500, 1u64..4), 1..40),
        ) {
            let times: Vec<Nanos> = steps
                .iter()
                .scan(0, |t, &(advance, _)| {
                    *t += advance * per / 1_000;
                    Some(*t)
                })
                .collect();
            let replay = |upto: usize| {
                let l = limiter(per);
                for (i, &(_, cost)) in steps.iter().enumerate().take(upto) {
                    l.acquire(1, max, cost, strict, times[i]);
                }
                l
            };
            let l = replay(0);
            for (i, &(_, cost)) in steps.iter().enumerate() {
                let v = l.acquire(1, max, cost, strict, times[i]);
                if !v.allowed && cost > max {
                    prop_assert!(v.is_block(), "a cost above max can never pass");
                } else if !v.allowed {
                    let probe = replay(i + 1);
                    let before = probe.acquire(1, max, cost, false, times[i] + v.retry_after - 1);
                    prop_assert!(!before.allowed);
                    let at = probe.acquire(1, max, cost, false, times[i] + v.retry_after);
                    prop_assert!(at.allowed);
                }
            }
        }
    }

    /// Spreads small test keys over the sets, as real (hashed) keys are.
    fn spread(i: u64) -> u64 {
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    #[test]
    fn empty_windows_hold_no_state() {
        let l = limiter(SEC);
        assert!(l.acquire(1, 3, 0, false, 0).allowed);
        assert!(l.is_empty(), "cost 0 leaves the window empty");
        assert!(!l.acquire(1, 0, 1, false, 0).allowed);
        assert!(
            l.is_empty(),
            "a lax rejection takes nothing, not even a slot"
        );
        assert!(!l.acquire(1, 0, 1, true, 0).allowed);
        assert_eq!(l.len(), 1, "a strict rejection counts, so it needs state");
        l.refund(1, 1, 0);
        assert!(l.is_empty(), "refunded to empty: the slot is freed");
        assert!(l.acquire(2, 3, 1, false, 0).allowed);
        // Two periods on, key 2's window is empty: touching it frees its slot.
        l.refund(2, 1, 2 * SEC);
        assert!(l.is_empty());
        assert_eq!(l.evictions(), 0);
        // Key 0 marks empty slots, so it is stored as key 1: a harmless hash collision.
        assert!(l.acquire(0, 3, 1, false, 0).allowed);
        assert_eq!((l.estimate(1, 0), l.len()), (1.0, 1));
    }

    #[test]
    fn windows_empty_by_now_are_reused_before_any_eviction() {
        // max_keys 8: one set, shared by every key.
        let l = RateLimiter::new(SEC, 8);
        for key in 1..=8 {
            // Keys 1..=4 count in period 0 only, keys 5..=8 in period 1 as well.
            assert!(l.acquire(key, 5, 1, false, 0).allowed);
            if key > 4 {
                assert!(l.acquire(key, 5, 1, false, SEC).allowed);
            }
        }
        // At 2 s keys 1..=4 are empty (period 0 no longer weighs): four newcomers take
        // their slots, exactly, and nothing is evicted.
        for key in 9..=12 {
            assert!(l.acquire(key, 5, 1, false, 2 * SEC).allowed);
        }
        assert_eq!((l.len(), l.evictions()), (8, 0));
        assert!((5..=12).all(|key| l.estimate(key, 2 * SEC) == 1.0));
        // Nothing is empty now: the next newcomer evicts.
        assert!(l.acquire(13, 5, 1, false, 2 * SEC).allowed);
        assert_eq!((l.len(), l.evictions()), (8, 1));
    }

    #[test]
    fn eviction_takes_the_nearest_to_empty_which_restarts_at_zero() {
        let l = RateLimiter::new(SEC, 8);
        // Key k counts k events.
        for key in 1..=8 {
            assert!(l.acquire(key, 10, key, false, 0).allowed);
        }
        assert!(l.acquire(9, 10, 5, false, 0).allowed);
        assert_eq!(l.evictions(), 1);
        assert_eq!(
            l.estimate(1, 0),
            0.0,
            "key 1 (1 event) evicted: it restarts at 0"
        );
        assert!((2..=8).all(|key| l.estimate(key, 0) == key as f64));
        // Key 1 comes back with a clean window (lenient: it had 1 event), and evicts key 2.
        assert_eq!(l.acquire(1, 10, 10, false, 0), Verdict::allow(0, 2 * SEC));
        assert_eq!((l.estimate(2, 0), l.evictions()), (0.0, 2));

        // The estimate at `now` decides, not the raw counts: 8 events of the previous
        // period weigh 0.8 at 1.9 s, less than 1 event of this one.
        let l = RateLimiter::new(SEC, 8);
        assert!(l.acquire(20, 10, 8, false, 0).allowed);
        for key in 21..=27 {
            assert!(l.acquire(key, 10, 1, false, SEC).allowed);
        }
        assert!(l.acquire(28, 10, 1, false, SEC + 9 * SEC / 10).allowed);
        let held = |key| l.estimate(key, SEC + 9 * SEC / 10);
        assert_eq!((held(20), held(21), l.evictions()), (0.0, 1.0, 1));
    }

    #[test]
    fn the_table_never_holds_more_than_its_slots() {
        // max_keys 1 000: 125 sets of 8 ways.
        let l = RateLimiter::new(SEC, 1_000);
        for i in 0..200_000 {
            assert!(l.acquire(spread(i), 1, 1, false, 0).allowed);
            if i % 997 == 0 {
                assert!(l.len() <= 1_000, "len {}", l.len());
            }
        }
        // Every set filled up, then each newcomer evicted exactly one key.
        assert_eq!((l.len(), l.evictions()), (1_000, 199_000));
        // 33 bytes per key and a 256-byte header, as documented.
        assert_eq!(
            [size_of::<table::Set<Counts>>(), size_of::<RateLimiter>()],
            [264, 256]
        );
        let sets = |n| RateLimiter::new(SEC, n).table.sets();
        assert_eq!([sets(100_000), sets(9), sets(1)], [12_500, 2, 1]);
        // per 0 is 1 ns and max_keys 0 is 1: one set of 8 ways.
        let l = RateLimiter::new(0, 0);
        assert_eq!(l.per(), 1);
        for key in 1..=9 {
            assert!(l.acquire(key, 1, 1, false, 0).allowed);
        }
        assert_eq!((l.len(), l.evictions()), (8, 1));
    }

    #[test]
    fn a_key_flood_rejects_no_new_key_and_still_limits_the_abuser() {
        // A table of 1 000 keys against 200 000 one-event keys in one period, with an
        // innocent key (8 events) and an abuser (10 bursts of 40) among them.
        let l = RateLimiter::new(SEC, 1_000);
        let (innocent, abuser) = (spread(1 << 40), spread(1 << 41));
        let (mut flood_rejected, mut innocent_rejected, mut abuser_admitted) = (0, 0, 0);
        for i in 0..200_000u64 {
            let now = i * 4_000; // 0.8 s in all
            flood_rejected += u64::from(!l.acquire(spread(i), 10, 1, false, now).allowed);
            if i % 25_000 == 0 {
                innocent_rejected += u64::from(!l.acquire(innocent, 10, 1, false, now).allowed);
            }
            if i % 20_000 == 0 {
                for _ in 0..40 {
                    abuser_admitted += u64::from(l.acquire(abuser, 10, 1, false, now).allowed);
                }
            }
        }
        assert!(l.evictions() > 190_000, "evictions {}", l.evictions());
        assert_eq!((flood_rejected, innocent_rejected), (0, 0));
        // Past its first event the abuser's count is the highest of its set: it is never
        // evicted, so it stays exactly limited.
        assert_eq!(abuser_admitted, 10);
    }

    #[test]
    fn threads_share_one_window_exactly() {
        let l = limiter(SEC);
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .filter(|_| l.acquire(9, 50, 1, false, 0).allowed)
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        assert_eq!(admitted, 50);
        assert_eq!(l.estimate(9, 0), 50.0);
    }

    #[test]
    fn threads_on_many_keys_keep_the_bound() {
        let l = RateLimiter::new(SEC, 64);
        std::thread::scope(|s| {
            for t in 0..4 {
                let l = &l;
                s.spawn(move || {
                    let key = |i| spread(t << 20 | i);
                    assert!((0..20_000).all(|i| l.acquire(key(i), 1, 1, false, i).allowed))
                });
            }
        });
        assert!(l.len() <= 64 && l.evictions() > 0, "len {}", l.len());
    }

    /// One key's window written literally from the semantics, with no table and no
    /// eviction: the oracle of the proptest. Estimates are compared as `estimate · per`,
    /// exact integers, so that the comparison itself cannot round.
    #[derive(Debug, Clone, Copy, Default)]
    struct Model {
        period: u64,
        prev: u64,
        curr: u64,
    }

    impl Model {
        /// Moves to `now`'s period; returns the nanoseconds elapsed in it.
        fn roll(&mut self, per: Nanos, now: Nanos) -> Nanos {
            let period = now / per;
            if period == self.period + 1 {
                self.prev = self.curr;
            } else if period > self.period + 1 {
                self.prev = 0;
            }
            if period > self.period {
                self.curr = 0;
                self.period = period;
            }
            now % per
        }

        /// `(prev · (1 - elapsed/per) + curr) · per`.
        fn scaled(&self, per: Nanos, elapsed: Nanos) -> u128 {
            let per = u128::from(per);
            u128::from(self.prev) * (per - u128::from(elapsed)) + u128::from(self.curr) * per
        }

        fn refund(&mut self, cost: u64) {
            let from_curr = cost.min(self.curr);
            self.curr -= from_curr;
            self.prev -= (cost - from_curr).min(self.prev);
        }
    }

    /// Steps of (key, advance in thousandths of `per` below `pace`, cost, refund instead
    /// of acquire).
    fn arb_steps(keys: u64, pace: u64) -> impl Strategy<Value = Vec<(u64, u64, u64, bool)>> {
        let step = (0..keys, 0..pace, 0u64..4, prop::bool::weighted(0.2));
        prop::collection::vec(step, 1..200)
    }

    /// Runs `steps` through a table of `max_keys` and one literal [`Model`] per key, fed
    /// with what the limiter actually let through (and, strict, rejected). Always: a
    /// rejection is justified by the model (the key's own traffic is over `max`), and the
    /// stored estimate is never above the model's. While nothing was evicted, the two agree
    /// exactly, verdict for verdict.
    fn check_against_model(
        per: Nanos,
        max: u64,
        strict: bool,
        max_keys: usize,
        steps: &[(u64, u64, u64, bool)],
    ) -> Result<(), TestCaseError> {
        let l = RateLimiter::new(per, max_keys);
        let mut models: std::collections::HashMap<u64, Model> = Default::default();
        let mut now = 0;
        for &(key, advance, cost, refund) in steps {
            now += advance * per / 1_000;
            let model = models.entry(key).or_default();
            let elapsed = model.roll(per, now);
            if refund {
                l.refund(spread(key), cost, now);
                model.refund(cost);
            } else {
                let v = l.acquire(spread(key), max, cost, strict, now);
                let scaled = model.scaled(per, elapsed);
                let fits = scaled + u128::from(cost) * u128::from(per)
                    <= u128::from(max) * u128::from(per);
                prop_assert!(v.allowed || !fits, "rejected although its own window fits");
                if l.evictions() == 0 {
                    prop_assert_eq!(v.allowed, fits);
                    let counted = if fits || strict { cost } else { 0 };
                    let room = u128::from(max) * u128::from(per);
                    let after = scaled + u128::from(counted) * u128::from(per);
                    let remaining = room.saturating_sub(after) / u128::from(per);
                    prop_assert_eq!(u128::from(v.remaining), remaining);
                }
                if v.allowed || strict {
                    model.curr += cost;
                }
            }
            for (&k, m) in &models {
                let mut m = *m;
                let elapsed = m.roll(per, now);
                let exact = m.scaled(per, elapsed) as f64 / per as f64;
                let stored = l.estimate(spread(k), now);
                prop_assert!(
                    stored <= exact,
                    "key {} stored {} above {}",
                    k,
                    stored,
                    exact
                );
                if l.evictions() == 0 {
                    prop_assert_eq!(stored, exact);
                }
            }
        }
        Ok(())
    }

    #[test]
    fn acquire_many_counts_the_largest_count_that_fits() {
        let l = limiter(SEC);
        // 10 per second, empty: 4 to 6 gets 6, then 3 to 8 gets the 4 left.
        assert_eq!(l.acquire_many(1, 10, 4, 6, false, 0).granted, 6);
        let g = l.acquire_many(1, 10, 3, 8, false, 0);
        assert_eq!((g.granted, g.verdict.remaining), (4, 0));
        // Full: 3 fit once the window has slid far enough: at 1.3 s the 10 of the previous
        // period weigh 7.
        let g = l.acquire_many(1, 10, 3, 8, false, 0);
        assert_eq!(g.granted, 0);
        assert_eq!(g.verdict.retry_after, SEC + 3 * SEC / 10);
        assert_eq!(
            l.acquire_many(1, 10, 3, 8, false, SEC + 3 * SEC / 10 - 1)
                .granted,
            0
        );
        // At 1.3 s exactly: 10 · 0.7 = 7, so 3 fit.
        assert_eq!(
            l.acquire_many(1, 10, 3, 8, false, SEC + 3 * SEC / 10)
                .granted,
            3
        );
        // min above max never fits.
        assert!(l.acquire_many(2, 10, 11, 12, false, 0).verdict.is_block());
        // A strict refusal counts min.
        let s = limiter(SEC);
        assert_eq!(s.acquire_many(3, 4, 1, 4, true, 0).granted, 4);
        assert_eq!(s.acquire_many(3, 4, 2, 3, true, 0).granted, 0);
        assert_eq!(s.estimate(3, 0), 6.0);
        // A fixed cost decides exactly as `acquire`.
        let (x, y) = (limiter(SEC), limiter(SEC));
        for (i, cost) in [3u64, 2, 4, 1, 5].into_iter().enumerate() {
            let now = i as u64 * SEC / 4;
            assert_eq!(
                x.acquire_many(9, 6, cost, cost, true, now).verdict,
                y.acquire(9, 6, cost, true, now)
            );
        }
    }

    proptest! {
        /// `acquire_many` grants the largest count the exact window holds.
        #[test]
        fn acquire_many_matches_the_model(
            per in prop::sample::select(vec![100 * MS, SEC, 7 * SEC + 3]),
            max in 0u64..10,
            strict in any::<bool>(),
            steps in prop::collection::vec((0u64..1_200, 0u64..6, 0u64..8), 1..80),
        ) {
            let l = RateLimiter::new(per, 1 << 10);
            let mut model = Model::default();
            let mut now = 0;
            for &(advance, min, want) in &steps {
                now += advance * per / 1_000;
                let min = min.min(want);
                let elapsed = model.roll(per, now);
                let scaled = model.scaled(per, elapsed);
                let fits = |n: u64| {
                    scaled + u128::from(n) * u128::from(per) <= u128::from(max) * u128::from(per)
                };
                let best = (min..=want).rev().find(|&n| fits(n));
                let g = l.acquire_many(7, max, min, want, strict, now);
                prop_assert_eq!(g.granted, best.unwrap_or(0));
                prop_assert_eq!(g.verdict.allowed, best.is_some());
                match best {
                    Some(n) => model.curr += n,
                    None if strict => model.curr += min,
                    None => {}
                }
            }
        }

        /// A table large enough never evicts: the limiter is the literal model.
        #[test]
        fn matches_the_model_without_eviction(
            per in prop::sample::select(vec![100 * MS, SEC, 7 * SEC + 3]),
            max in 0u64..8,
            strict in any::<bool>(),
            steps in arb_steps(6, 1_200),
        ) {
            check_against_model(per, max, strict, 1 << 12, &steps)?;
        }

        /// One set of 8 ways for up to 40 keys, about 200 events a period so that the set
        /// is full of live windows: evictions only ever make it more lenient.
        #[test]
        fn evictions_are_only_ever_lenient(
            per in prop::sample::select(vec![100 * MS, SEC, 7 * SEC + 3]),
            max in 0u64..8,
            strict in any::<bool>(),
            steps in arb_steps(40, 10),
        ) {
            check_against_model(per, max, strict, 8, &steps)?;
        }
    }
}
