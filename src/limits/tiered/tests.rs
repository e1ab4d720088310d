//! The tiered limiter's tests: the paper's patterns, retry-after, the table, and a model
//! the proptests check every decision against.

use super::*;
use crate::limits::clock::NANOS_PER_SEC;
use crate::limits::testing::{self, fill_past_the_slots, spread};
use crate::limits::verdict::NEVER;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;
const MINUTE: Nanos = 60 * SEC;
const HOUR: Nanos = 60 * MINUTE;
const DAY: Nanos = 24 * HOUR;

fn tier(limit: u64, window: Nanos, active: Nanos, cooldown: Nanos) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable: false,
    }
}

fn skippable(t: Tier) -> Tier {
    Tier {
        skippable: true,
        ..t
    }
}

fn params(tiers: &[Tier], hard_limit: Option<u64>, global_limit: Option<u64>) -> TieredParams {
    TieredParams {
        tiers: tiers.to_vec(),
        hard_limit,
        global_limit,
    }
}

fn limiter(tiers: &[Tier]) -> TieredLimiter {
    TieredLimiter::new(&params(tiers, None, None), 1024).unwrap()
}

/// (allowed, tier, decided_by) of one decision.
fn brief(d: TieredDecision) -> (bool, usize, DecidedBy) {
    (d.verdict.allowed, d.tier, d.decided_by)
}

const ADMIT: DecidedBy = DecidedBy::TierWindow;

/// Replays `script` (which ends with a rejection of `min` copies of `key`) on two fresh
/// limiters: a retry one nanosecond before `retry_after` is rejected, one at it admitted.
/// Returns the rejection.
fn assert_retry_exact(
    build: impl Fn() -> TieredLimiter,
    script: impl Fn(&TieredLimiter) -> TieredDecision,
    key: u64,
    min: u64,
) -> TieredDecision {
    let early = build();
    let d = script(&early);
    assert!(!d.verdict.allowed, "the script must end with a rejection");
    let at = d.at + d.verdict.retry_after;
    assert!(
        !early.acquire_many(key, min, min, at - 1).verdict.allowed,
        "admitted 1 ns before retry_after: {d:?}"
    );
    let on_time = build();
    script(&on_time);
    assert!(
        on_time.acquire_many(key, min, min, at).verdict.allowed,
        "rejected at retry_after: {d:?}"
    );
    d
}

#[test]
fn a_first_request_bursts_from_tier_zero_into_tier_one() {
    let l = limiter(&[tier(3, SEC, 10 * SEC, 0)]);
    assert_eq!((l.current_tier(7, 0), l.available(7, 0)), (0, 3));
    assert!(l.is_empty(0), "reading holds no state");
    let d = l.acquire(7, 0);
    assert_eq!(brief(d), (true, 1, ADMIT));
    assert_eq!(d.verdict, Verdict::allow(2, SEC));
    assert_eq!((d.granted, d.first_tier, d.at), (1, 1, 0));
    assert_eq!(l.acquire(7, 400 * MS).verdict, Verdict::allow(1, SEC));
    assert_eq!(l.acquire(7, 500 * MS).verdict, Verdict::allow(0, SEC));
    // The last tier is full: nothing to burst into. Its oldest hit leaves at 1 s.
    let d = l.acquire(7, 600 * MS);
    assert_eq!(brief(d), (false, 1, DecidedBy::TierWindow));
    assert_eq!(d.verdict, Verdict::reject(0, 900 * MS, 400 * MS));
    assert_eq!(l.acquire(7, SEC).verdict, Verdict::allow(0, SEC));
    // The active period ends at 10 s; the next request enters tier 1 again.
    assert_eq!(l.current_tier(7, 10 * SEC - 1), 1);
    assert_eq!(l.current_tier(7, 10 * SEC), 0);
    assert_eq!(
        l.len(10 * SEC),
        0,
        "no tier active, windows empty: state dropped"
    );
    assert_eq!(brief(l.acquire(7, 10 * SEC)), (true, 1, ADMIT));
    assert_eq!(l.len(10 * SEC), 1);
    // Key 0 marks empty ways, so it is stored as key 1: a harmless hash collision.
    assert!(l.acquire(0, 10 * SEC).verdict.allowed);
    assert_eq!(l.available(1, 10 * SEC), 2);
}

#[test]
fn penalty_pattern_stacks_tiers_with_proportional_cooldowns() {
    let l = limiter(&[
        tier(10, MINUTE, HOUR, 0),
        tier(5, MINUTE, 10 * MINUTE, 10 * MINUTE),
        tier(1, MINUTE, 20 * MINUTE, 20 * MINUTE),
    ]);
    let k = 42;
    for _ in 0..10 {
        assert_eq!(brief(l.acquire(k, 0)), (true, 1, ADMIT));
    }
    // Tier 1 is full: the 11th bursts into the penalty tier of 5.
    assert_eq!(l.acquire(k, 0).verdict, Verdict::allow(4, MINUTE));
    for _ in 0..4 {
        assert_eq!(brief(l.acquire(k, 0)), (true, 2, ADMIT));
    }
    // Then into the harshest, 1 per minute.
    assert_eq!(brief(l.acquire(k, 0)), (true, 3, ADMIT));
    let d = l.acquire(k, 2 * SEC);
    assert_eq!(brief(d), (false, 3, DecidedBy::TierWindow));
    assert_eq!(d.verdict.retry_after, MINUTE - 2 * SEC);
    // Tier 1's window is empty again, but tier 3 is current for 20 minutes.
    assert_eq!(l.available(k, 5 * MINUTE), 1);
    assert_eq!(brief(l.acquire(k, 5 * MINUTE)), (true, 3, ADMIT));
    assert!(!l.acquire(k, 5 * MINUTE).verdict.allowed);
    // Tier 3 ends at 20 min and cools until 40 min; tier 2 ended at 10 min and cooled
    // until 20 min: back in tier 1, a burst may enter tier 2 again but not tier 3.
    assert_eq!(l.current_tier(k, 20 * MINUTE), 1);
    for _ in 0..10 {
        assert_eq!(brief(l.acquire(k, 20 * MINUTE)), (true, 1, ADMIT));
    }
    for _ in 0..5 {
        assert_eq!(brief(l.acquire(k, 20 * MINUTE)), (true, 2, ADMIT));
    }
    let d = l.acquire(k, 20 * MINUTE);
    assert_eq!(brief(d), (false, 2, DecidedBy::NoTierEnterable));
    // The earliest pass: tier 2's oldest hit leaves its window at 21 min.
    assert_eq!(d.verdict.retry_after, MINUTE);
    // Tier 2 ends at 30 min; with tier 1 full again, a burst at 30 min meets tier 2
    // cooling (until 40 min) and stops there.
    for _ in 0..10 {
        assert!(l.acquire(k, 30 * MINUTE).verdict.allowed);
    }
    let d = l.acquire(k, 30 * MINUTE);
    assert_eq!(brief(d), (false, 1, DecidedBy::NoTierEnterable));
    assert_eq!(d.verdict.retry_after, MINUTE, "tier 1's window frees first");
}

#[test]
fn prison_tier_lets_nothing_through_until_it_ends() {
    let build = || limiter(&[tier(5, MINUTE, HOUR, 0), tier(1, DAY, DAY, 0)]);
    let enter_prison = |l: &TieredLimiter| {
        for _ in 0..5 {
            assert_eq!(brief(l.acquire(9, 0)), (true, 1, ADMIT));
        }
        // The burst into the prison is its one admission.
        let d = l.acquire(9, 0);
        assert_eq!(brief(d), (true, 2, ADMIT));
        assert_eq!(d.verdict, Verdict::allow(0, DAY));
        // Tier 1 has room again after a minute, but the prison is current all day.
        assert_eq!(l.available(9, 2 * MINUTE), 0);
        let d = l.acquire(9, 2 * MINUTE);
        assert_eq!(brief(d), (false, 2, DecidedBy::TierWindow));
        d
    };
    let d = assert_retry_exact(build, enter_prison, 9, 1);
    assert_eq!(d.verdict.retry_after, DAY - 2 * MINUTE);
    let l = build();
    enter_prison(&l);
    assert_eq!(l.current_tier(9, DAY - 1), 2);
    // At its end: tier 1 ended long ago, so from tier 0 the request enters tier 1 again.
    assert_eq!(brief(l.acquire(9, DAY)), (true, 1, ADMIT));
}

#[test]
fn batch_pattern_then_nothing_for_a_day() {
    // One tier: 5000 per 5 minutes, active 5 minutes, then a day of cooldown.
    let build = || limiter(&[tier(5000, 5 * MINUTE, 5 * MINUTE, DAY)]);
    let batch = |l: &TieredLimiter| {
        for i in 0..5000 {
            assert!(l.acquire(3, i * 12 * MS).verdict.allowed, "request {i}");
        }
        let d = l.acquire(3, MINUTE);
        assert_eq!(brief(d), (false, 1, DecidedBy::TierWindow));
        d
    };
    let d = assert_retry_exact(build, batch, 3, 1);
    // The first hit leaves the window at 5 min, exactly when the active period ends and
    // the cooldown starts: the next pass is the cooldown's end.
    assert_eq!(d.at + d.verdict.retry_after, 5 * MINUTE + DAY);
    let l = build();
    batch(&l);
    let d = l.acquire(3, 5 * MINUTE);
    assert_eq!(brief(d), (false, 0, DecidedBy::NoTierEnterable));
    assert_eq!(d.verdict, Verdict::reject(0, 0, DAY));
    assert!(!l.acquire(3, 5 * MINUTE + DAY - 1).verdict.allowed);
    let d = l.acquire(3, 5 * MINUTE + DAY);
    assert_eq!(brief(d), (true, 1, ADMIT));
    assert_eq!(d.verdict.remaining, 4999);
    // A whole batch at once: 5000 copies granted in one decision.
    let l = build();
    let d = l.acquire_many(3, 5000, 5000, 0);
    assert_eq!((d.granted, d.verdict.remaining), (5000, 0));
    assert!(!l.acquire(3, 0).verdict.allowed);
}

#[test]
fn a_cooling_tier_blocks_the_burst_unless_skippable() {
    let t2 = tier(2, SEC, 2 * SEC, 5 * SEC);
    for skip in [false, true] {
        let t2 = if skip { skippable(t2) } else { t2 };
        let build = || limiter(&[tier(2, SEC, 20 * SEC, 0), t2, tier(2, SEC, 10 * SEC, 0)]);
        let script = |l: &TieredLimiter| {
            assert!(l.acquire_many(1, 2, 2, 0).verdict.allowed);
            // Tier 2 is entered at 0: active until 2 s, cooling until 7 s.
            assert_eq!(brief(l.acquire(1, 0)), (true, 2, ADMIT));
            assert_eq!(l.current_tier(1, 2 * SEC), 1);
            assert!(l.acquire_many(1, 2, 2, 3 * SEC).verdict.allowed);
            l.acquire(1, 3 * SEC)
        };
        if skip {
            // The burst passes over cooling tier 2 into tier 3.
            let l = build();
            let d = script(&l);
            assert_eq!(brief(d), (true, 3, ADMIT));
            assert_eq!(d.first_tier, 3);
            continue;
        }
        let d = assert_retry_exact(build, script, 1, 1);
        assert_eq!(brief(d), (false, 1, DecidedBy::NoTierEnterable));
        // Tier 1's oldest hit (3 s) leaves at 4 s, before tier 2's cooldown ends at 7 s.
        assert_eq!(d.verdict.retry_after, SEC);
    }
    // Skipping up to the last tier still finds no tier to enter.
    let l = limiter(&[
        tier(1, SEC, 20 * SEC, 0),
        skippable(tier(1, SEC, SEC, 10 * SEC)),
    ]);
    assert!(l.acquire(5, 0).verdict.allowed);
    assert_eq!(brief(l.acquire(5, 0)), (true, 2, ADMIT));
    assert!(l.acquire(5, 2 * SEC).verdict.allowed);
    let d = l.acquire(5, 2 * SEC);
    assert_eq!(brief(d), (false, 1, DecidedBy::NoTierEnterable));
    assert_eq!(d.verdict.retry_after, SEC);
}

#[test]
fn fallback_drops_several_levels_at_once() {
    let l = limiter(&[
        tier(1, SEC, 100 * SEC, 0),
        tier(1, SEC, 10 * SEC, 0),
        tier(1, SEC, 20 * SEC, 0),
    ]);
    let tiers: Vec<usize> = (0..3).map(|_| l.acquire(8, 0).tier).collect();
    assert_eq!(tiers, [1, 2, 3]);
    // Tier 2 ends at 10 s, under tier 3: nothing changes.
    assert_eq!(l.current_tier(8, 15 * SEC), 3);
    // Tier 3 ends at 20 s: straight down to tier 1, past the ended tier 2.
    assert_eq!(l.current_tier(8, 20 * SEC - 1), 3);
    assert_eq!(l.current_tier(8, 20 * SEC), 1);
    assert_eq!(brief(l.acquire(8, 20 * SEC)), (true, 1, ADMIT));
    // A burst from tier 1 enters tier 2 again (no cooldown), at a new active period.
    assert_eq!(brief(l.acquire(8, 20 * SEC)), (true, 2, ADMIT));
    assert_eq!(l.current_tier(8, 30 * SEC - 1), 2);
    assert_eq!(l.current_tier(8, 30 * SEC), 1);
    assert_eq!(l.current_tier(8, 100 * SEC), 0);
    // With two levels ending at the same instant, the fallback is to tier 0.
    let l = limiter(&[tier(1, SEC, 10 * SEC, 0), tier(1, SEC, 10 * SEC, 0)]);
    assert_eq!(l.acquire(8, 0).tier, 1);
    assert_eq!(l.acquire(8, 0).tier, 2);
    assert_eq!(l.current_tier(8, 10 * SEC), 0);
}

#[test]
fn hard_limit_rejects_whatever_the_tier_and_never_bursts() {
    let tiers = [tier(2, MINUTE, HOUR, 0), tier(100, MINUTE, HOUR, 0)];
    let build = || TieredLimiter::new(&params(&tiers, Some(3), None), 64).unwrap();
    let l = build();
    assert_eq!(brief(l.acquire(1, 0)), (true, 1, ADMIT));
    assert_eq!(brief(l.acquire(1, 0)), (true, 1, ADMIT));
    assert_eq!(
        l.available(1, 0),
        1,
        "the hard limit leaves room for one more"
    );
    assert_eq!(brief(l.acquire(1, 0)), (true, 2, ADMIT));
    let script = |l: &TieredLimiter| {
        for _ in 0..3 {
            assert!(l.acquire(1, 0).verdict.allowed);
        }
        l.acquire(1, 500 * MS)
    };
    let d = assert_retry_exact(build, script, 1, 1);
    // In tier 2, with 99 free, the hard limit rejects until the first hit is a second old.
    assert_eq!(brief(d), (false, 2, DecidedBy::HardLimit));
    assert_eq!(d.verdict, Verdict::reject(99, MINUTE - 500 * MS, 500 * MS));
    // A rejection by the hard limit does not burst: tier 1 full, tier 2 never entered.
    let l = TieredLimiter::new(&params(&tiers, Some(2), None), 64).unwrap();
    assert!(l.acquire_many(1, 2, 2, 0).verdict.allowed);
    let d = l.acquire(1, 0);
    assert_eq!(brief(d), (false, 1, DecidedBy::HardLimit));
    assert_eq!(l.current_tier(1, 0), 1);
    assert_eq!(brief(l.acquire(1, SEC)), (true, 2, ADMIT));
}

#[test]
fn global_limit_counts_all_keys_whatever_their_tier() {
    let tiers = [tier(1, MINUTE, HOUR, 0), tier(10, MINUTE, HOUR, 0)];
    let build = || TieredLimiter::new(&params(&tiers, None, Some(3)), 64).unwrap();
    let script = |l: &TieredLimiter| {
        assert_eq!(brief(l.acquire(1, 100 * MS)), (true, 1, ADMIT));
        assert_eq!(brief(l.acquire(1, 100 * MS)), (true, 2, ADMIT));
        assert!(l.acquire(2, 200 * MS).verdict.allowed);
        // Key 1 (tier 2, 9 free) and key 2 are both over the global limit.
        let d = l.acquire(2, 300 * MS);
        assert_eq!(brief(d), (false, 1, DecidedBy::GlobalLimit));
        assert_eq!(
            l.current_tier(2, 300 * MS),
            1,
            "a global rejection does not burst"
        );
        let d = l.acquire(1, 300 * MS);
        assert_eq!(brief(d), (false, 2, DecidedBy::GlobalLimit));
        d
    };
    let d = assert_retry_exact(build, script, 1, 1);
    assert_eq!(d.verdict.retry_after, 700 * MS, "the next aligned second");
    assert_eq!(d.verdict.remaining, 9);
    // A refund gives a global admission back within its second.
    let l = build();
    script(&l);
    let d = l.acquire(1, SEC);
    assert!(d.verdict.allowed);
    assert!(l.acquire(3, SEC).verdict.allowed);
    assert!(l.acquire(4, SEC).verdict.allowed);
    assert!(!l.acquire(5, SEC).verdict.allowed);
    l.refund(1, &d, SEC + 1);
    assert!(l.acquire(5, SEC + 2).verdict.allowed);
    // A refund in a later second changes nothing: that second has its own count.
    let d = l.acquire(6, 2 * SEC);
    l.refund(6, &d, 3 * SEC);
    assert_eq!(l.available(7, 2 * SEC), 2);
}

#[test]
fn key_state_shows_phases_and_window_counts_and_changes_nothing() {
    let p = params(
        &[tier(2, SEC, 10 * SEC, 5 * SEC), tier(3, SEC, 20 * SEC, 0)],
        Some(10),
        Some(100),
    );
    let build = || TieredLimiter::new(&p, 1024).unwrap();
    let (l, twin) = (build(), build());
    let at = |phase, count| TierState { phase, count };
    let fresh = l.key_state(7, 0);
    assert_eq!(
        fresh,
        TieredKeyState {
            current_tier: 0,
            available: 5,
            tiers: vec![at(Phase::Inactive, 0), at(Phase::Inactive, 0)],
            hard_count: Some(0),
            global_room: Some(100),
        }
    );
    assert!(l.is_empty(0), "reading holds no state");
    // Two fill tier 1, the third bursts into tier 2 (entered at 200 ms).
    for t in [0, 100 * MS, 200 * MS] {
        assert!(l.acquire(7, t).verdict.allowed);
        assert!(twin.acquire(7, t).verdict.allowed);
    }
    let s = l.key_state(7, 300 * MS);
    assert_eq!(
        s,
        TieredKeyState {
            current_tier: 2,
            available: 2,
            tiers: vec![at(Phase::Active, 2), at(Phase::Active, 1)],
            hard_count: Some(3),
            global_room: Some(97),
        }
    );
    assert_eq!(l.key_state(7, 300 * MS), s, "a read is repeatable");
    assert_eq!(s.available, l.available(7, 300 * MS));
    // The hit at 0 has left tier 1's window and the hard second; a new global second.
    let later = l.key_state(7, SEC + 50 * MS);
    assert_eq!(
        later.tiers,
        [at(Phase::Active, 1), at(Phase::Active, 1)],
        "{later:?}"
    );
    assert_eq!(
        (later.hard_count, later.global_room, later.available),
        (Some(2), Some(100), 2)
    );
    // The later read dropped no hit: read at 300 ms again, the state is as it was.
    assert_eq!(l.key_state(7, 300 * MS), s);
    // Tier 1 cools down from 10 s to 15 s; tier 2 is active until 20.2 s.
    let cooling = l.key_state(7, 12 * SEC);
    assert_eq!(
        (cooling.current_tier, &cooling.tiers[..]),
        (2, &[at(Phase::Cooling, 0), at(Phase::Active, 0)][..])
    );
    assert_eq!(l.key_state(7, 16 * SEC).tiers[0].phase, Phase::Inactive);
    let over = l.key_state(7, 21 * SEC);
    assert_eq!(over.current_tier, 0);
    assert_eq!(over.tiers, [at(Phase::Inactive, 0), at(Phase::Inactive, 0)]);
    // Every read left the decisions as a limiter never read makes them.
    for t in [
        SEC + 100 * MS,
        SEC + 150 * MS,
        SEC + 200 * MS,
        SEC + 250 * MS,
    ] {
        assert_eq!(l.acquire(7, t), twin.acquire(7, t), "at {t}");
    }
    // Neither a hard nor a global limit: none shown.
    let plain = limiter(&[tier(2, SEC, SEC, 0)]).key_state(7, 0);
    assert_eq!((plain.hard_count, plain.global_room), (None, None));
    assert_eq!(Phase::Cooling.name(), "cooling");
}

#[test]
fn refund_takes_back_hits_but_not_tier_entries() {
    let tiers = [
        tier(2, MINUTE, 10 * MINUTE, 0),
        tier(5, MINUTE, 10 * MINUTE, HOUR),
    ];
    let l = TieredLimiter::new(&params(&tiers, Some(4), None), 64).unwrap();
    assert!(l.acquire(1, 0).verdict.allowed);
    let d = l.acquire(1, 0);
    l.refund(1, &d, 10 * MS);
    assert_eq!(brief(l.acquire(1, 20 * MS)), (true, 1, ADMIT));
    // The burst into tier 2 is refunded: its hit comes back, its active period stays.
    let d = l.acquire(1, 30 * MS);
    assert_eq!(brief(d), (true, 2, ADMIT));
    l.refund(1, &d, 40 * MS);
    assert_eq!(l.current_tier(1, 40 * MS), 2);
    // Hard limit: 2 of 4 taken in this second, tier 2 all free.
    assert_eq!(l.available(1, 40 * MS), 2);
    assert_eq!(l.acquire(1, 40 * MS).verdict, Verdict::allow(4, MINUTE));
    // A rejected decision has nothing to give back.
    assert!(l.acquire(1, 50 * MS).verdict.allowed);
    let d = l.acquire(1, 60 * MS);
    assert_eq!(brief(d), (false, 2, DecidedBy::HardLimit));
    l.refund(1, &d, 60 * MS);
    assert_eq!(l.available(1, 60 * MS), 0);
    // A batch's refund takes back every copy, across the tiers it filled.
    let l = limiter(&tiers);
    assert!(l.acquire(2, 0).verdict.allowed);
    let d = l.acquire_many(2, 1, 4, 0);
    assert_eq!((d.granted, d.first_tier, d.tier), (4, 1, 2));
    l.refund(2, &d, 0);
    // Tier 2 stays current with its 5 back; tier 1's freed slot is below it.
    assert_eq!((l.current_tier(2, 0), l.available(2, 0)), (2, 5));
    assert_eq!(
        l.available(2, 10 * MINUTE),
        2,
        "back in tier 0, then tier 1"
    );
    // A key evicted or emptied since: nothing to do, nothing breaks.
    l.refund(99, &d, 0);
    l.refund(2, &d, 2 * HOUR);
    assert_eq!(l.available(2, 2 * HOUR), 7);
}

#[test]
fn copies_fill_the_current_tier_then_burst() {
    let tiers = [tier(5, SEC, 10 * SEC, 0), tier(3, SEC, 10 * SEC, 10 * SEC)];
    let l = TieredLimiter::new(&params(&tiers, Some(20), None), 64).unwrap();
    assert_eq!(l.available(1, 0), 8);
    let d = l.acquire_many(1, 1, 4, 0);
    assert_eq!((d.granted, d.tier, d.verdict.remaining), (4, 1, 1));
    // 1 left in tier 1 and 3 in tier 2: the largest count in [3, 10] that fits is 4.
    let d = l.acquire_many(1, 3, 10, 0);
    assert_eq!(
        (d.granted, d.first_tier, d.tier, d.verdict.remaining),
        (4, 1, 2, 0)
    );
    let d = l.acquire_many(1, 1, 1, 0);
    assert_eq!(brief(d), (false, 2, DecidedBy::TierWindow));
    // Exactly filling tier 1 does not enter tier 2.
    let d = l.acquire_many(2, 5, 5, 0);
    assert_eq!((d.granted, d.tier), (5, 1));
    assert_eq!(l.current_tier(2, 0), 1);
    // More than can ever fit: rejected, and a refusal changes nothing (no tier entered,
    // the key as fresh as before); no retry can help it.
    let d = l.acquire_many(3, 9, 9, 0);
    assert_eq!(brief(d), (false, 0, DecidedBy::TierWindow));
    assert_eq!(
        (d.granted, l.available(3, 0), l.current_tier(3, 0)),
        (0, 8, 0)
    );
    assert_eq!(d.verdict.retry_after, NEVER, "never fits");
    // A grant the hard limit cut says so: 20 wanted, 8 in the tiers, then a key whose
    // hard limit (20 a second) is the smaller room.
    let d = l.acquire_many(5, 1, 20, 0);
    assert_eq!((d.granted, d.decided_by), (8, DecidedBy::TierWindow));
    let hard = TieredLimiter::new(&params(&tiers, Some(3), None), 64).unwrap();
    let d = hard.acquire_many(1, 1, 20, 0);
    assert_eq!((d.granted, d.decided_by), (3, DecidedBy::HardLimit));
    let d = hard.acquire_many(2, 4, 20, 0);
    assert_eq!(
        (d.granted, d.decided_by, d.verdict.retry_after),
        (0, DecidedBy::HardLimit, NEVER),
        "MIN above the hard limit never fits"
    );
    let global = TieredLimiter::new(&params(&tiers, Some(20), Some(2)), 64).unwrap();
    let d = global.acquire_many(1, 1, 20, 0);
    assert_eq!((d.granted, d.decided_by), (2, DecidedBy::GlobalLimit));
    // Retry-After of a batch is exact too: 3 copies fit once tier 1 has 3 free.
    let build = || TieredLimiter::new(&params(&tiers, Some(20), None), 64).unwrap();
    let script = |l: &TieredLimiter| {
        assert!(l.acquire_many(4, 2, 2, 0).verdict.allowed);
        assert!(l.acquire_many(4, 2, 2, 100 * MS).verdict.allowed);
        assert!(l.acquire_many(4, 1, 1, 200 * MS).verdict.allowed);
        assert!(l.acquire_many(4, 2, 2, 300 * MS).verdict.allowed);
        l.acquire_many(4, 3, 3, 400 * MS)
    };
    let d = assert_retry_exact(build, script, 4, 3);
    // Tier 2 is current (1 free) until its two hits of 300 ms leave at 1.3 s.
    assert_eq!(d.verdict.retry_after, SEC - 100 * MS);
}

#[test]
fn retry_after_is_exact_with_coarse_time_units() {
    // A day-long window: 131 072 ns units, hits rounded up to them.
    let tiers = [tier(2, DAY, 2 * DAY, 0), tier(1, HOUR, HOUR, DAY)];
    let build = || TieredLimiter::new(&params(&tiers, Some(3), None), 64).unwrap();
    assert_eq!(build().shape.shift, 17);
    for offsets in [[0, 1, 2], [12_345, 999_999, 1_000_001], [7, 7, 131_073]] {
        let script = |l: &TieredLimiter| {
            for (i, o) in offsets.iter().enumerate() {
                assert!(l.acquire(6, i as Nanos * HOUR + o).verdict.allowed);
            }
            l.acquire(6, 3 * HOUR)
        };
        let d = assert_retry_exact(build, script, 6, 1);
        // Hits count at most one unit longer than exactly, never shorter.
        let exact = DAY + offsets[0] - 3 * HOUR;
        assert!((exact..exact + (1 << 17)).contains(&d.verdict.retry_after));
    }
}

#[test]
fn offsets_rebase_without_losing_hits() {
    // 1 ns units: the base moves every ~1.07 s of a key's continuous traffic.
    let l = limiter(&[tier(3, SEC, 1000 * SEC, 0)]);
    let mut model: Vec<Nanos> = Vec::new();
    for i in 0..400u64 {
        let now = i * 77 * MS;
        model.retain(|&h| h + SEC > now);
        let d = l.acquire(2, now);
        assert_eq!(d.verdict.allowed, model.len() < 3, "at {now}");
        if d.verdict.allowed {
            model.push(now);
        } else {
            assert_eq!(d.verdict.retry_after, model[0] + SEC - now);
        }
    }
}

#[test]
fn the_table_never_holds_more_than_its_slots() {
    let tiers = [tier(10, SEC, 10 * SEC, 0)];
    let l = TieredLimiter::new(&params(&tiers, None, None), 1_000).unwrap();
    let len = fill_past_the_slots(|key| l.acquire(key, 0).verdict.allowed, || l.len(0));
    // Every set filled up, then each newcomer evicted exactly one key.
    assert_eq!((len, l.evictions()), (1_000, 199_000));
    assert_eq!(size_of::<Set>(), 200);
    // 26 bytes of table and hints, a 64-byte metadata line and 4 bytes per log slot, per
    // key.
    let p = |tiers: &[Tier], hard| params(tiers, hard, None);
    let (small, design) = (
        [tier(20, SEC, 10 * SEC, 0), tier(50, SEC, 5 * SEC, MINUTE)],
        [
            tier(100, MINUTE, 10 * MINUTE, 0),
            tier(300, MINUTE, 5 * MINUTE, HOUR),
        ],
    );
    assert_eq!(TieredLimiter::bytes_per_key(&p(&small, Some(10))), 410);
    assert_eq!(TieredLimiter::bytes_per_key(&p(&design, Some(50))), 1_890);
    let three = [small[0], small[1], small[0]];
    assert_eq!(
        TieredLimiter::bytes_per_key(&p(&three, None)),
        26 + 128 + 360
    );
    assert_eq!(TieredLimiter::bytes_per_key(&p(&[], None)), 0);
    let l = TieredLimiter::new(&p(&design, Some(50)), 100_000).unwrap();
    assert_eq!(
        l.reserved_bytes(),
        2_500_000 + 100_000 + 6_400_128 + 180_000_000
    );
    // max_keys 0 is 1: one set of 8 ways.
    let l = TieredLimiter::new(&p(&tiers, None), 0).unwrap();
    for key in 1..=9 {
        assert!(l.acquire(key, 0).verdict.allowed);
    }
    assert_eq!((l.len(0), l.evictions()), (8, 1));
    assert!(matches!(
        TieredLimiter::new(&p(&design, None), usize::MAX),
        Err(TieredError::TooLarge { .. })
    ));
}

#[test]
fn light_keys_never_touch_the_log_arena() {
    let tiers = [tier(5, SEC, 10 * SEC, 0), tier(5, SEC, 10 * SEC, 0)];
    let l = TieredLimiter::new(&params(&tiers, Some(5), None), 64).unwrap();
    let untouched = |l: &TieredLimiter| l.logs.iter().all(|w| w.load(Ordering::Relaxed) == 0);
    // Two hits per window at most: both ends of each ring live in the metadata.
    for i in 0..40 {
        assert!(l.acquire(spread(i % 8), i * 300 * MS).verdict.allowed);
    }
    assert!(untouched(&l));
    // A third hit in a window turns the newest into a hit in between: a slot is written.
    // (Offsets count from the key's first hit, so an earlier hit makes them non-zero.)
    let at = 40 * 300 * MS;
    assert!(l.acquire(spread(9), at - 100 * MS).verdict.allowed);
    assert!(l.acquire_many(spread(9), 3, 3, at).verdict.allowed);
    assert!(!untouched(&l));
    assert_eq!(l.available(spread(9), at), 1);
    assert_eq!(l.available(spread(9), at + SEC), 5);
}

#[test]
fn emptied_state_is_reused_and_eviction_fails_open() {
    // max_keys 8: one set, shared by every key.
    let tiers = [tier(2, MINUTE, 10 * MINUTE, 0)];
    let l = TieredLimiter::new(&params(&tiers, None, None), 8).unwrap();
    assert!(l.acquire_many(1, 2, 2, 0).verdict.allowed);
    assert!(!l.acquire(1, 0).verdict.allowed);
    for key in 2..=8 {
        assert!(l.acquire(key, SEC).verdict.allowed);
    }
    // Key 9 evicts the key whose forgetting admits least: one of those with one hit
    // (key 8, in the first way of equals), never key 1, at its limit.
    assert!(l.acquire(9, SEC).verdict.allowed);
    assert_eq!((l.len(SEC), l.evictions()), (8, 1));
    assert!(!l.acquire(1, SEC).verdict.allowed);
    // Key 8 starts again as new: it fails open, never wrongly denied.
    assert_eq!(l.available(8, SEC), 2);
    assert_eq!(brief(l.acquire(8, SEC)), (true, 1, ADMIT));
    assert_eq!(l.evictions(), 2);
    assert_eq!(l.available(1, SEC), 0);
    // At 10 min 1 s every state has emptied: newcomers reuse ways without evicting.
    let later = 10 * MINUTE + SEC;
    assert!(l.is_empty(later));
    for key in 10..=17 {
        assert!(l.acquire(key, later).verdict.allowed);
    }
    assert_eq!((l.len(later), l.evictions()), (8, 2));
}

/// Requests of new keys, each sent `times` times 10 µs apart from `from`, until `user`
/// would be admitted again; `None` if it is still refused after `most`.
fn flood_frees(l: &TieredLimiter, user: u64, times: u64, most: u64, from: Nanos) -> Option<u64> {
    testing::flood_frees(
        |key, at| {
            l.acquire(key, at);
        },
        |at| l.available(user, at) > 0,
        (times, most),
        from,
    )
}

#[test]
fn a_flood_of_new_keys_never_frees_a_capped_key() {
    // A user at its limit of 3 a day, then a flood of fresh keys. Before victims were
    // scored, the idle capped key was the one emptying first, so it was evicted: after
    // 940 requests with max_keys 1 000, 92 545 with 100 000 (this test on the old
    // choice).
    let capped = [tier(3, DAY, DAY, 0)];
    // Or held in a closed penalty tier: 2 more in a minute, then closed for an hour.
    let penalty = [tier(3, DAY, DAY, 0), tier(2, MINUTE, MINUTE, HOUR)];
    for (tiers, needed) in [(&capped[..], 3), (&penalty[..], 5)] {
        for max_keys in [1_000, 100_000] {
            let l = TieredLimiter::new(&params(tiers, None, None), max_keys).unwrap();
            let user = spread(7);
            for i in 0..needed {
                assert!(l.acquire(user, i * MINUTE / 10).verdict.allowed);
            }
            assert!(!l.acquire(user, 2 * MINUTE).verdict.allowed);
            let freed = flood_frees(&l, user, 1, 350_000, 3 * MINUTE);
            assert_eq!(freed, None, "max_keys {max_keys}, {} tiers", tiers.len());
            assert!(
                l.evictions() > 350_000 - max_keys as u64,
                "{}",
                l.evictions()
            );
            assert!(!l.acquire(user, 4 * MINUTE).verdict.allowed);
        }
    }
}

#[test]
fn normalize_removes_shortens_and_trims_with_warnings() {
    let given = params(
        &[
            tier(10, MINUTE, 0, 0),
            tier(20, 10 * MINUTE, 5 * MINUTE, 0),
            tier(30, MINUTE, 10 * MINUTE + 30 * SEC, HOUR),
            tier(0, SEC, SEC, 0),
        ],
        Some(5),
        Some(100),
    );
    let n = normalize(&given).unwrap();
    assert_eq!(
        n.params,
        params(
            &[
                tier(20, 5 * MINUTE, 5 * MINUTE, 0),
                tier(30, MINUTE, 10 * MINUTE, HOUR),
                tier(0, SEC, SEC, 0),
            ],
            Some(5),
            Some(100),
        )
    );
    assert_eq!(
        n.changes,
        [
            TierChange::Removed { tier: 1 },
            TierChange::WindowShortened {
                tier: 2,
                from: 10 * MINUTE,
                to: 5 * MINUTE
            },
            TierChange::ActiveTrimmed {
                tier: 3,
                from: 10 * MINUTE + 30 * SEC,
                to: 10 * MINUTE
            },
            TierChange::ZeroLimit { tier: 4 },
        ]
    );
    let warnings: Vec<bool> = n.changes.iter().map(TierChange::is_warning).collect();
    assert_eq!(warnings, [true, false, true, true]);
    assert_eq!(
        n.changes[2].to_string(),
        "tier 3: active time 10m 30s is not a multiple of the window, trimmed to 10m \
         (a partial last window would let a customer over the limit)"
    );
    assert_eq!(
        n.changes[1].to_string(),
        "tier 2: window 10m is longer than the active time, shortened to 5m"
    );
    // The limiter runs on the normalized tiers: tier 1 is the given tier 2.
    let l = TieredLimiter::new(&given, 64).unwrap();
    assert_eq!(l.params(), &n.params);
    assert_eq!(l.acquire_many(1, 5, 5, 0).tier, 1);
    // A tier of limit 0 passes every burst on.
    let l = limiter(&[tier(0, SEC, SEC, 0), tier(1, SEC, SEC, 0)]);
    assert_eq!(brief(l.acquire(1, 0)), (true, 2, ADMIT));
    assert_eq!(l.current_tier(1, 0), 2);
    // Durations are clamped, not overflowed.
    let huge = normalize(&params(
        &[tier(1, u64::MAX, u64::MAX, u64::MAX)],
        None,
        None,
    ));
    assert_eq!(huge.unwrap().params.tiers[0].cooldown, MAX_DURATION);
}

#[test]
fn normalize_rejects_unusable_parameters() {
    let ok = tier(1, SEC, SEC, 0);
    let err = |tiers: &[Tier], hard, global| normalize(&params(tiers, hard, global)).err();
    assert_eq!(err(&[], None, None), Some(TieredError::NoTiers));
    assert_eq!(
        err(&[tier(1, SEC, 0, 0)], None, None),
        Some(TieredError::NoActiveTier)
    );
    assert_eq!(
        err(&[ok; MAX_TIERS + 1], None, None),
        Some(TieredError::TooManyTiers { count: 17 })
    );
    assert!(err(&[ok; MAX_TIERS], None, None).is_none());
    assert_eq!(
        err(&[ok, tier(1, 0, SEC, 0)], None, None),
        Some(TieredError::ZeroWindow { tier: 2 })
    );
    assert_eq!(
        err(&[tier(MAX_LIMIT + 1, SEC, SEC, 0)], None, None),
        Some(TieredError::LimitTooLarge {
            tier: 1,
            limit: MAX_LIMIT + 1
        })
    );
    assert_eq!(err(&[ok], Some(0), None), Some(TieredError::HardLimit(0)));
    assert_eq!(err(&[ok], None, Some(0)), Some(TieredError::GlobalLimit(0)));
    assert_eq!(
        err(&[ok], None, Some(MAX_GLOBAL_LIMIT + 1)),
        Some(TieredError::GlobalLimit(MAX_GLOBAL_LIMIT + 1))
    );
    assert_eq!(
        TieredError::ZeroWindow { tier: 2 }.to_string(),
        "tier 2: window must be longer than 0"
    );
    assert!(TieredLimiter::new(&params(&[], None, None), 8).is_err());
}

#[test]
fn threads_share_one_key_exactly() {
    let tiers = [tier(600, DAY, DAY, 0), tier(400, DAY, DAY, 0)];
    let l = TieredLimiter::new(&params(&tiers, None, Some(5_000)), 64).unwrap();
    let admitted =
        testing::admitted_on_threads(8, 500, |t, i| l.acquire(9, t * 1_000 + i).verdict.allowed);
    assert_eq!(admitted, 1_000);
    assert_eq!((l.current_tier(9, 10_000), l.available(9, 10_000)), (2, 0));
}

#[test]
fn threads_on_many_keys_keep_the_bound() {
    let tiers = [tier(2, SEC, 10 * SEC, 0), tier(2, SEC, 10 * SEC, 0)];
    let l = TieredLimiter::new(&params(&tiers, Some(3), Some(1 << 30)), 64).unwrap();
    testing::fresh_keys_on_threads(|key, at| l.acquire(key, at).verdict.allowed);
    assert!(l.len(20_000) <= 64 && l.evictions() > 0);
}

mod model;
