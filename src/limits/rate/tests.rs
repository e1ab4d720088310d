//! The rate limiter's tests, beside its file (`rate.rs`) to keep it one job long.

use super::*;
use crate::limits::testing::{
    admitted_on_threads, fill_past_the_slots, fresh_keys_on_threads, spread,
};
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
    let admitted = admitted_on_threads(THREADS, 100, |_, _| l.acquire(1, 50, 1, false, 0).allowed);
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
    let len = fill_past_the_slots(|key| l.acquire(key, 1, 1, false, 0).allowed, || l.len());
    // Every set filled up, then each newcomer evicted exactly one key.
    assert_eq!((len, l.evictions()), (1_000, 199_000));
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
    let admitted = admitted_on_threads(8, 100, |_, _| l.acquire(9, 50, 1, false, 0).allowed);
    assert_eq!(admitted, 50);
    assert_eq!(l.estimate(9, 0), 50.0);
}

#[test]
fn threads_on_many_keys_keep_the_bound() {
    let l = RateLimiter::new(SEC, 64);
    fresh_keys_on_threads(|key, at| l.acquire(key, 1, 1, false, at).allowed);
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
            let fits =
                scaled + u128::from(cost) * u128::from(per) <= u128::from(max) * u128::from(per);
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
