//! The rate limiter: events per key over a sliding window, in two count-min sketches.
//!
//! Time is cut into periods of length `per`; period `p` covers `[p·per, (p+1)·per)`. One
//! sketch counts the current period (`curr`), the other holds the previous one (`prev`).
//! At `now`, with `f = (now - p·per) / per ∈ [0, 1)` of the current period elapsed, the
//! estimate of events in the last `per` is
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
//! Each sketch of `h` hashes × `w` slots overcounts a key only when every row shares its
//! slot with another key: odds ≈ `(n/w)^h` for `n` keys seen in a period. Memory is fixed
//! at `2 × h × w × 8` bytes.
//!
//! **Races.** Counting is lock-free. The period is an `AtomicU64`; the thread whose
//! `compare_exchange` moves it forward clears the sketch being reused (both when two or more
//! periods were skipped). As in pingora's own `Rate`, events landing between the move and
//! the clear are lost or read stale counts, so for a moment at each boundary a key may be
//! counted slightly low or high. Admission increments first and undoes a rejection, so
//! racing acquires overshoot `max` by fewer than the number of racing threads.

use std::sync::atomic::{AtomicU64, Ordering};

use pingora_limits::estimator::Estimator;

use crate::limits::clock::Nanos;
use crate::limits::sketch::SketchSize;
use crate::limits::verdict::{Verdict, NEVER};

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

/// Sliding-window rate limiter.
///
/// Only the window `per` and the sketch size shape the state, so only they are fixed at
/// construction: `max` and `strict` come with every call, so that a reload or an override
/// changing them keeps the counts (and can never go stale in here).
pub struct RateLimiter {
    /// Period `p` counts into `sketches[p % 2]`; the other one holds period `p - 1`.
    sketches: [Estimator; 2],
    /// The latest period any caller has seen.
    period: AtomicU64,
    /// The window in nanoseconds, at least 1.
    per: Nanos,
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
    /// A limiter whose window is `per` nanoseconds and whose sketches are `size`.
    ///
    /// `per == 0` is raised to 1 ns and zero sketch dimensions to 1, so bad parameters
    /// degrade the limit instead of panicking on the hot path.
    pub fn new(per: Nanos, size: SketchSize) -> Self {
        let sketch = || Estimator::new(size.hashes.max(1), size.slots.max(1));
        Self {
            sketches: [sketch(), sketch()],
            period: AtomicU64::new(0),
            per: per.max(1),
        }
    }

    /// The window, in nanoseconds (at least 1).
    pub fn per(&self) -> Nanos {
        self.per
    }

    /// Decides one event of weight `cost` for `key` at `now`, counting it when admitted
    /// (and when rejected if `strict`). `max` may differ from the construction's (an
    /// override's or a reload's new `max` reuses the counts).
    ///
    /// Admitted iff `estimate + cost <= max`. A `cost` above `max` can never pass (with
    /// `max: 0` that is a deliberate block): its `retry_after` is [`NEVER`], so that no
    /// client is invited to retry.
    pub fn acquire(&self, key: u64, max: u64, cost: u64, strict: bool, now: Nanos) -> Verdict {
        let (period, elapsed) = self.advance(now);
        let curr = self.sketch(period);
        let counted = Window {
            per: self.per,
            elapsed,
            prev: count(self.sketch(period ^ 1).get(key)),
            curr: count(curr.incr(key, signed(cost))),
        };
        if counted.fits(max) {
            return Verdict::allow(counted.remaining(max), counted.reset_after());
        }
        let after = if strict {
            counted
        } else {
            curr.decr(key, signed(cost));
            Window {
                curr: counted.curr.saturating_sub(cost),
                ..counted
            }
        };
        Verdict::reject(
            after.remaining(max),
            after.reset_after(),
            after.retry_after(max, cost),
        )
    }

    /// Takes back an admitted event (a later limit rejected the request).
    ///
    /// It takes from the current period first, then from the previous one, and never
    /// drives a count below zero. The proxy refunds nanoseconds after admitting, so the
    /// period has almost always not rolled; when it has, the event sits in `prev` and, if
    /// the key already counts events in the new period, taking them from `curr` instead
    /// undercounts the key by at most `cost · f` until the window slides past it.
    pub fn refund(&self, key: u64, cost: u64, now: Nanos) {
        let (period, _) = self.advance(now);
        let mut left = cost;
        for sketch in [self.sketch(period), self.sketch(period ^ 1)] {
            let take = left.min(count(sketch.get(key)));
            if take > 0 {
                sketch.decr(key, signed(take));
                left -= take;
            }
        }
    }

    /// The sliding-window estimate for `key` at `now`, for tests and debugging; like every
    /// call it moves the window to `now`.
    pub fn estimate(&self, key: u64, now: Nanos) -> f64 {
        let (period, elapsed) = self.advance(now);
        let window = Window {
            per: self.per,
            elapsed,
            prev: count(self.sketch(period ^ 1).get(key)),
            curr: count(self.sketch(period).get(key)),
        };
        window.scaled() as f64 / window.per as f64
    }

    /// The sketch counting period `period`.
    fn sketch(&self, period: u64) -> &Estimator {
        &self.sketches[usize::from(period % 2 == 1)]
    }

    /// Moves the current period forward to `now`'s, clearing what it reuses; returns the
    /// period to count in and the nanoseconds elapsed in it. A caller whose `now` lags a
    /// period another thread already opened counts at the start of that period.
    fn advance(&self, now: Nanos) -> (u64, Nanos) {
        let per = self.per;
        let period = now / per;
        let mut seen = self.period.load(Ordering::Acquire);
        while seen < period {
            match self.period.compare_exchange_weak(
                seen,
                period,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.sketch(period).reset();
                    if period - seen >= 2 {
                        self.sketch(period ^ 1).reset();
                    }
                    return (period, now % per);
                }
                Err(actual) => seen = actual,
            }
        }
        if seen > period {
            (seen, 0)
        } else {
            (period, now % per)
        }
    }
}

impl Window {
    /// `estimate · per`, exact: `prev · (per - elapsed) + curr · per`.
    fn scaled(&self) -> u128 {
        let per = u128::from(self.per);
        u128::from(self.prev) * (per - u128::from(self.elapsed)) + u128::from(self.curr) * per
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

/// A sketch estimate as a count: negative values (races, overflow) read as 0.
fn count(estimate: isize) -> u64 {
    u64::try_from(estimate).unwrap_or(0)
}

/// A cost as a sketch increment, saturating.
fn signed(cost: u64) -> isize {
    isize::try_from(cost).unwrap_or(isize::MAX)
}

/// A `u128` back to `u64`, saturating.
fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: Nanos = 1_000_000_000;
    const MS: Nanos = 1_000_000;
    const DAY: Nanos = 86_400 * SEC;

    fn limiter(per: Nanos) -> RateLimiter {
        let size = SketchSize {
            hashes: 4,
            slots: 256,
        };
        RateLimiter::new(per, size)
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
}
