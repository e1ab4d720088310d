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
//!
//! **Fixed windows** ([`RateWindow::Fixed`], for envoyproxy/ratelimit's answers byte for
//! byte): the same table and periods, but a period's events stop weighing at its end
//! (`estimate = curr`, the previous period's weight is 0): a key may spend `max` just
//! before a boundary and `max` again just after it, and a window's counts reset at the
//! boundary. Moving a key's counts one period on then gives `prev = 0`, so `reset_after`
//! is the time to the boundary (`per - e`, while `curr > 0`) and a rejection's
//! `retry_after` is that same boundary (the new period admits up to `max`).

use crate::limits::clock::Nanos;
use crate::limits::restore::Restored;
use crate::limits::table::{self, Table};
use crate::limits::verdict::{Grant, Verdict, NEVER};
use crate::limits::victim::Rank;

/// Parameters of a rate limit: at most `max` events per sliding (or fixed) `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateParams {
    /// Events allowed per window.
    pub max: u64,
    /// Window length in nanoseconds (100 ms to 1 day).
    pub per: Nanos,
    /// Whether rejected events count too.
    pub strict: bool,
    /// Sliding (the default) or fixed, aligned to multiples of `per`.
    pub window: RateWindow,
}

/// How a rate's window moves (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RateWindow {
    /// The last `per` at every instant, estimated from two periods: no double burst at a
    /// period's edge.
    #[default]
    Sliding,
    /// The current period `[p·per, (p+1)·per)` only: counts reset at each boundary, so up
    /// to `2·max` may pass within `per` around one (envoyproxy/ratelimit's windows).
    Fixed,
}

impl RateWindow {
    /// The name the config spells it with.
    pub fn name(self) -> &'static str {
        match self {
            RateWindow::Sliding => "sliding",
            RateWindow::Fixed => "fixed",
        }
    }
}

/// Sliding-window rate limiter, exact per key.
///
/// Only the window `per` and `max_keys` shape the state, so only they are fixed at
/// construction: `max` and `strict` come with every call, so that a reload or an override
/// changing them keeps the counts (and can never go stale in here).
pub struct RateLimiter {
    /// The windows, headed by their geometry.
    table: Table<Counts, Shape>,
}

/// What every decision reads besides the key's counts: the window's length in
/// nanoseconds (at least 1) and whether it is fixed.
#[derive(Debug, Clone, Copy)]
struct Shape {
    per: Nanos,
    fixed: bool,
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

/// One key's counts at one instant, with the window's geometry (`prev` is always 0 in a
/// fixed window).
#[derive(Debug, Clone, Copy)]
struct Window {
    per: Nanos,
    fixed: bool,
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
        Self::with_window(per, RateWindow::Sliding, max_keys)
    }

    /// [`RateLimiter::new`] with the window's kind: [`RateWindow::Fixed`] resets each
    /// key's count at every multiple of `per`.
    pub fn with_window(per: Nanos, window: RateWindow, max_keys: usize) -> Self {
        let shape = Shape {
            per: per.max(1),
            fixed: window == RateWindow::Fixed,
        };
        Self {
            table: Table::new(max_keys.min(Self::MAX_KEYS), shape),
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
        self.table.head().per
    }

    /// Whether the window is sliding or fixed.
    pub fn window(&self) -> RateWindow {
        if self.fixed() {
            RateWindow::Fixed
        } else {
            RateWindow::Sliding
        }
    }

    fn fixed(&self) -> bool {
        self.table.head().fixed
    }

    /// Decides one event of weight `cost` for `key` at `now`, counting it when admitted
    /// (and when rejected if `strict`). `max` may differ from one call to the next (an
    /// override's or a reload's new `max` reuses the counts).
    ///
    /// Admitted iff `estimate + cost <= max`. A `cost` above `max` can never pass (with
    /// `max: 0` that is a deliberate block): its `retry_after` is [`NEVER`], so that no
    /// client is invited to retry.
    pub fn acquire(&self, key: u64, max: u64, cost: u64, strict: bool, now: Nanos) -> Verdict {
        let (shape, at) = (*self.table.head(), self.moment(now));
        let (admitted, counts) = self.with_counts(key, at, |counts| {
            let counted = Window {
                curr: counts.curr.saturating_add(cost),
                ..Window::of(shape, counts, at)
            };
            let admitted = counted.fits(max);
            if admitted || strict {
                counts.curr = counted.curr;
            }
            admitted
        });
        // The verdict's divisions are done after the set is unlocked.
        let after = Window::of(shape, &counts, at);
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
        let (shape, at) = (*self.table.head(), self.moment(now));
        let (granted, counts) = self.with_counts(key, at, |counts| {
            let window = Window::of(shape, counts, at);
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
        let after = Window::of(shape, &counts, at);
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
        let shape = *self.table.head();
        let counts = held.map_or(Counts::new(at.period), |c| c.at(at.period, shape.fixed));
        let window = Window::of(shape, &counts, at);
        window.scaled() as f64 / window.per as f64
    }

    table::table_accessors! {
        len:
        /// Keys currently holding state (a window empty by now still counts until its slot
        /// is reused or the key is touched).
        evictions:
        /// Keys evicted while their window still counted events, since construction.
        ///
        /// Each is a key that restarts at 0 and may be let through more than `max` in one
        /// window, never less: a rising count means `max_keys` is too small for the keys
        /// seen within two periods (or a key flood is under way). Reusing the slot of a
        /// window that is empty by now loses nothing and is not counted.
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
        let shape = *self.table.head();
        let fixed = shape.fixed;
        self.table.update(
            key,
            |_| true,
            |held| held.map_or(Counts::new(at.period), |c| c.at(at.period, fixed)),
            f,
            |c| !c.is_empty(),
            |_, c| Estimate(Window::of(shape, &c.at(at.period, fixed), at).scaled()),
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

    /// The counts moved forward to `period`: one period on, `curr` becomes `prev` (in a
    /// fixed window nothing is left); two or more, nothing is left. Never moved back:
    /// counts already in a later period (a caller whose clock lags) stay there.
    fn at(self, period: u64, fixed: bool) -> Self {
        match period.saturating_sub(self.period) {
            0 => self,
            1 if !fixed => Self {
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
    fn of(shape: Shape, counts: &Counts, at: Moment) -> Self {
        Self {
            per: shape.per,
            fixed: shape.fixed,
            elapsed: if counts.period == at.period {
                at.elapsed
            } else {
                0
            },
            prev: if shape.fixed { 0 } else { counts.prev },
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
    /// period's until the end of this one. A fixed window empties at the end of this one.
    fn reset_after(&self) -> Nanos {
        let to_end = self.per - self.elapsed;
        if self.fixed {
            return if self.curr > 0 { to_end } else { 0 };
        }
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
        if self.fixed {
            // `curr + cost > max` (else there is no wait): the next period starts at 0.
            let wait = if self.curr.saturating_add(cost) <= max {
                0
            } else {
                self.per - self.elapsed
            };
            return wait.max(1);
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
        let fixed = self.fixed();
        let saved = Counts {
            period: entry.period.min(at.period),
            prev: if fixed { 0 } else { entry.prev },
            curr: entry.curr,
        };
        let counts = saved.at(at.period, fixed);
        let kept = (!counts.is_empty()).then_some(counts);
        self.table
            .put(entry.key, kept, |c| c.at(at.period, fixed).is_empty())
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fixed_tests;
