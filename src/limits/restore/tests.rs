//! Export and import round trips of every kind that can be saved, against an injected
//! clock: a table rebuilt from its export decides exactly as the original would, a
//! downtime between them counts as time that passed, and an import never evicts.

use proptest::prelude::*;

use crate::limits::clock::{Clock, ManualClock, Nanos, NANOS_PER_SEC};
use crate::limits::restore::Restored;
use crate::limits::testing::spread;
use crate::limits::tiered::{Tier, TieredEntry, TieredLimiter, TieredParams};
use crate::limits::{
    BucketEntry, LogWindow, RateLimiter, RateWindowEntry, SlidingLog, TokenBucket,
    TokenBucketParams,
};

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;
const HOUR: Nanos = 3_600 * SEC;
/// Where the clocks start: a process clock reads Unix time, far from 0.
const T0: Nanos = 1_700_000_000 * SEC;

fn bucket_params(capacity: u64, amount: u64, every: Nanos) -> TokenBucketParams {
    TokenBucketParams {
        capacity,
        amount,
        every,
        strict: false,
    }
}

/// `from`'s buckets exported, their times moved by `shift` (another process's clock),
/// and imported into `into` at `now`.
fn copy_buckets(from: &TokenBucket, into: &TokenBucket, shift: i64, now: Nanos) -> usize {
    let mut stored = 0;
    from.export(|e| {
        let moved = BucketEntry {
            last: e.last.saturating_add_signed(shift),
            ..e
        };
        if into.import(moved, now) == Restored::Stored {
            stored += 1;
        }
    });
    stored
}

#[test]
fn a_drained_bucket_refills_over_the_downtime() {
    let clock = ManualClock::new(T0);
    let p = bucket_params(10, 1, SEC);
    let old = TokenBucket::new(p, 1_000);
    assert!(old.acquire(7, 10, clock.now()).allowed);
    assert!(!old.acquire(7, 1, clock.now()).allowed);
    // The new process's clock reads 5 s less for the same instant, and starts 10 s later.
    let shift = -5 * SEC as i64;
    clock.advance(std::time::Duration::from_secs(10));
    let now = clock.now() - 5 * SEC;
    let new = TokenBucket::new(p, 1_000);
    assert_eq!(copy_buckets(&old, &new, shift, now), 0);
    assert_eq!(new.tokens(7, now), 10, "10 s of 1 token a second: full");
    assert!(new.is_empty(), "a bucket full by now is not stored");

    // After 4 s of downtime the bucket has 4 tokens, and keeps the refill phase.
    let old = TokenBucket::new(p, 1_000);
    assert!(old.acquire(7, 10, T0 + 300 * MS).allowed);
    let new = TokenBucket::new(p, 1_000);
    let now = T0 + 4_500 * MS + 7;
    assert_eq!(copy_buckets(&old, &new, 7, now), 1);
    assert_eq!(new.tokens(7, now), 4);
    let v = new.acquire(7, 5, now);
    assert!(!v.allowed);
    assert_eq!(v.retry_after, 800 * MS, "the fifth token comes at 5.3 s");
}

#[test]
fn a_restored_bucket_table_decides_as_the_original() {
    let p = bucket_params(20, 3, 700 * MS);
    let old = TokenBucket::new(p, 256);
    for i in 0..200u64 {
        old.acquire(spread(i % 60), 1 + i % 7, T0 + i * 37 * MS);
    }
    let now = T0 + 200 * 37 * MS;
    let new = TokenBucket::new(p, 256);
    copy_buckets(&old, &new, 0, now);
    for i in 0..60 {
        for later in [0, 350 * MS, 2 * SEC, 9 * SEC] {
            assert_eq!(
                old.tokens(spread(i), now + later),
                new.tokens(spread(i), now + later)
            );
        }
        assert_eq!(
            old.acquire(spread(i), 4, now + SEC),
            new.acquire(spread(i), 4, now + SEC)
        );
    }
}

#[test]
fn a_bucket_import_never_evicts() {
    let p = bucket_params(10, 1, SEC);
    // max_keys 8: one set of 8 ways, full of live buckets.
    let table = TokenBucket::new(p, 8);
    for key in 1..=8 {
        assert!(table.acquire(key, 5, T0).allowed);
    }
    let saved = BucketEntry {
        key: 99,
        tokens: 0,
        last: T0,
    };
    assert_eq!(table.import(saved, T0), Restored::NoRoom);
    assert_eq!((table.len(), table.evictions()), (8, 0));
    // Full by now: nothing to store, whatever the room.
    assert_eq!(table.import(saved, T0 + 10 * SEC), Restored::Empty);
    // A key already held is replaced, and a bucket full by now makes room.
    assert_eq!(
        table.import(BucketEntry { key: 3, ..saved }, T0),
        Restored::Stored
    );
    assert_eq!(table.tokens(3, T0), 0);
    assert_eq!(table.import(saved, T0 + 5 * SEC), Restored::Stored);
    assert_eq!(table.tokens(99, T0 + 5 * SEC), 5);
    // A `last` in the future (a wall clock set back) counts from now: never looser.
    let later = BucketEntry {
        key: 100,
        tokens: 2,
        last: T0 + HOUR,
    };
    let fresh = TokenBucket::new(p, 8);
    assert_eq!(fresh.import(later, T0), Restored::Stored);
    assert_eq!(fresh.tokens(100, T0 + SEC - 1), 2);
    assert_eq!(fresh.tokens(100, T0 + SEC), 3);
}

#[test]
fn rate_windows_round_trip_and_age() {
    let per = 10 * SEC;
    let old = RateLimiter::new(per, 1_000);
    for i in 0..30u64 {
        old.acquire(spread(i % 5), 100, 1, false, T0 + i * 300 * MS);
    }
    let now = T0 + 9 * SEC;
    let new = RateLimiter::new(per, 1_000);
    let mut seen = 0;
    old.export(|e| {
        seen += 1;
        assert_eq!(new.import(e, now), Restored::Stored);
    });
    assert_eq!(seen, 5);
    for i in 0..5 {
        for later in [0, 3 * SEC, 11 * SEC, 25 * SEC] {
            let (a, b) = (
                old.estimate(spread(i), now + later),
                new.estimate(spread(i), now + later),
            );
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
    }
    // Two periods later the window is empty: nothing is stored.
    let aged = RateLimiter::new(per, 1_000);
    old.export(|e| assert_eq!(aged.import(e, now + 3 * per), Restored::Empty));
    assert!(aged.is_empty());
    // A period after now's (a clock set back) counts as now's.
    let ahead = RateWindowEntry {
        key: 5,
        period: now / per + 40,
        prev: 0,
        curr: 3,
    };
    assert_eq!(aged.import(ahead, now), Restored::Stored);
    assert!(aged.estimate(5, now) >= 3.0);
}

fn log_windows() -> [LogWindow; 2] {
    [
        LogWindow {
            max: 3,
            per: 2 * SEC,
        },
        LogWindow { max: 5, per: HOUR },
    ]
}

/// `from`'s logs exported, moved by `shift`, imported into `into` at `now`.
fn copy_logs(from: &SlidingLog, into: &SlidingLog, shift: i64, now: Nanos) -> usize {
    let (mut buf, mut stored) = (Vec::new(), 0);
    from.export(&mut buf, |key, entries| {
        let mut moved: Vec<Nanos> = entries
            .iter()
            .map(|t| t.saturating_add_signed(shift))
            .collect();
        if into.import(key, &mut moved, now) == Restored::Stored {
            stored += 1;
        }
    });
    stored
}

#[test]
fn a_restored_sliding_log_decides_as_the_original() {
    let old = SlidingLog::new(&log_windows(), 512).expect("log");
    assert!(old.resolution() > 1, "an hour needs a unit above 1 ns");
    for i in 0..400u64 {
        old.acquire(spread(i % 40), 1 + i % 2, T0 + i * 113 * MS);
    }
    let now = T0 + 400 * 113 * MS;
    let new = SlidingLog::new(&log_windows(), 512).expect("log");
    assert!(copy_logs(&old, &new, 0, now) > 30);
    for i in 0..40 {
        for later in [0, SEC, 3 * SEC, 20 * 60 * SEC, HOUR] {
            assert_eq!(
                old.peek(spread(i), 1, now + later),
                new.peek(spread(i), 1, now + later),
                "key {i} at +{later}"
            );
        }
    }
}

#[test]
fn a_sliding_log_keeps_its_entries_over_the_downtime_and_never_evicts() {
    let old = SlidingLog::new(&log_windows(), 8).expect("log");
    for i in 0..3 {
        assert!(old.acquire(1, 1, T0 + i * SEC).allowed);
    }
    assert!(old.acquire(1, 2, T0 + 10 * SEC).allowed);
    assert!(!old.acquire(1, 1, T0 + 10 * SEC).allowed, "5 an hour");
    // 20 minutes later, in a process whose clock reads 1 h less.
    let shift = -(HOUR as i64);
    let now = T0 - HOUR + 20 * 60 * SEC;
    let new = SlidingLog::new(&log_windows(), 8).expect("log");
    assert_eq!(copy_logs(&old, &new, shift, now), 1);
    let v = new.acquire(1, 1, now);
    assert!(!v.allowed, "the hour's 5 entries came along");
    // The first entry leaves the hour at T0 + 1 h, 40 minutes from now (within a unit).
    let exact = 40 * 60 * SEC;
    assert!(v.retry_after >= exact && v.retry_after < exact + new.resolution());
    // Past the hour the log is empty: nothing is stored.
    let empty = SlidingLog::new(&log_windows(), 8).expect("log");
    assert_eq!(copy_logs(&old, &empty, 0, T0 + 2 * HOUR), 0);
    assert!(empty.is_empty());

    // A full set of live logs: the import finds no room and evicts nothing.
    let full = SlidingLog::new(&log_windows(), 8).expect("log");
    for key in 10..18 {
        assert!(full.acquire(key, 1, T0).allowed);
    }
    let mut saved = vec![T0, T0 + SEC];
    assert_eq!(full.import(1, &mut saved, T0 + 2 * SEC), Restored::NoRoom);
    assert_eq!((full.len(), full.evictions()), (8, 0));
    // More entries than the ring holds: the newest are kept.
    let mut many: Vec<Nanos> = (0..9).map(|i| T0 + i * MS).collect();
    let fresh = SlidingLog::new(&log_windows(), 8).expect("log");
    assert_eq!(fresh.import(1, &mut many, T0 + 9 * MS), Restored::Stored);
    assert_eq!(fresh.count(1, 1, T0 + 9 * MS), 5);
}

fn tiered_params(hard: Option<u64>) -> TieredParams {
    let tier = |limit, window, active, cooldown| Tier {
        limit,
        window,
        active,
        cooldown,
        skippable: false,
    };
    TieredParams {
        tiers: vec![
            tier(3, 2 * SEC, 10 * SEC, 0),
            tier(5, 2 * SEC, 4 * SEC, 30 * SEC),
            tier(2, 60 * SEC, 60 * SEC, HOUR),
        ],
        hard_limit: hard,
        global_limit: None,
    }
}

/// `from`'s keys exported, moved by `shift`, imported into `into` at `now`.
fn copy_tiers(from: &TieredLimiter, into: &TieredLimiter, shift: i64, now: Nanos) -> usize {
    let (mut entry, mut stored) = (TieredEntry::default(), 0);
    from.export(&mut entry, |e| {
        let mut moved = e.clone();
        for at in moved.entered.iter_mut().filter(|at| **at != Nanos::MAX) {
            *at = at.saturating_add_signed(shift);
        }
        for t in moved.hits.iter_mut().flatten() {
            *t = t.saturating_add_signed(shift);
        }
        if into.import(&mut moved, now) == Restored::Stored {
            stored += 1;
        }
    });
    stored
}

#[test]
fn a_restored_tiered_table_decides_as_the_original() {
    for hard in [None, Some(4)] {
        let p = tiered_params(hard);
        let old = TieredLimiter::new(&p, 256).expect("tiers");
        for i in 0..600u64 {
            old.acquire(spread(i % 25), T0 + i * 97 * MS);
        }
        let now = T0 + 600 * 97 * MS;
        let new = TieredLimiter::new(&p, 256).expect("tiers");
        assert!(copy_tiers(&old, &new, 0, now) > 10);
        for i in 0..25 {
            for later in [0, 500 * MS, 3 * SEC, 45 * SEC, 2 * HOUR] {
                let at = now + later;
                assert_eq!(
                    old.current_tier(spread(i), at),
                    new.current_tier(spread(i), at)
                );
                assert_eq!(old.available(spread(i), at), new.available(spread(i), at));
            }
            let (a, b) = (
                old.acquire(spread(i), now + SEC),
                new.acquire(spread(i), now + SEC),
            );
            assert_eq!(a, b, "key {i}, hard {hard:?}");
        }
    }
}

#[test]
fn a_tier_entry_survives_the_downtime_and_an_import_never_evicts() {
    let p = tiered_params(None);
    let old = TieredLimiter::new(&p, 8).expect("tiers");
    // Nine requests: tier 1 (3), tier 2 (5), then tier 3 (1).
    for i in 0..9 {
        assert!(old.acquire(1, T0 + i * MS).verdict.allowed);
    }
    assert_eq!(old.current_tier(1, T0 + 9 * MS), 3);
    // 20 s later (tiers 1 and 2 are over; tier 2 cools down until 34 s), in a process
    // whose clock reads 3 s more.
    let shift = 3 * SEC as i64;
    let now = T0 + 20 * SEC + 3 * SEC;
    let new = TieredLimiter::new(&p, 8).expect("tiers");
    assert_eq!(copy_tiers(&old, &new, shift, now), 1);
    assert_eq!(new.current_tier(1, now), 3, "tier 3 is active for a minute");
    assert!(new.acquire(1, now).verdict.allowed, "its second hit");
    let d = new.acquire(1, now);
    assert!(!d.verdict.allowed, "tier 3 full, nothing above it");
    // Past every active period and cooldown the key is new again: nothing is stored.
    let gone = TieredLimiter::new(&p, 8).expect("tiers");
    assert_eq!(copy_tiers(&old, &gone, 0, T0 + 2 * HOUR), 0);
    assert!(gone.is_empty(T0 + 2 * HOUR));

    // A full set of live keys: no room, no eviction.
    let full = TieredLimiter::new(&p, 8).expect("tiers");
    for key in 10..18 {
        assert!(full.acquire(key, T0).verdict.allowed);
    }
    let mut entry = TieredEntry::default();
    old.export(&mut entry, |_| {});
    assert_eq!(full.import(&mut entry, T0 + SEC), Restored::NoRoom);
    assert_eq!((full.len(T0 + SEC), full.evictions()), (8, 0));
}

proptest! {
    #[test]
    fn buckets_round_trip_at_any_instant(
        steps in prop::collection::vec((0u64..6, 0u64..900, 0u64..12), 1..80),
        downtime in 0u64..20_000,
    ) {
        let p = bucket_params(10, 2, 700 * MS);
        let old = TokenBucket::new(p, 64);
        let mut now = T0;
        for &(key, advance, cost) in &steps {
            now += advance * MS;
            old.acquire(spread(key), cost, now);
        }
        let new = TokenBucket::new(p, 64);
        let later = now + downtime * MS;
        copy_buckets(&old, &new, 0, later);
        for key in 0..6 {
            prop_assert_eq!(old.tokens(spread(key), later), new.tokens(spread(key), later));
        }
    }

    #[test]
    fn tiers_round_trip_at_any_instant(
        steps in prop::collection::vec((0u64..4, 0u64..2_000), 1..120),
        downtime in 0u64..120_000,
    ) {
        let p = tiered_params(Some(3));
        let old = TieredLimiter::new(&p, 64).expect("tiers");
        let mut now = T0;
        for &(key, advance) in &steps {
            now += advance * MS;
            old.acquire(spread(key), now);
        }
        let new = TieredLimiter::new(&p, 64).expect("tiers");
        let later = now + downtime * MS;
        copy_tiers(&old, &new, 0, later);
        for key in 0..4 {
            prop_assert_eq!(old.available(spread(key), later), new.available(spread(key), later));
            prop_assert_eq!(old.acquire(spread(key), later), new.acquire(spread(key), later));
        }
    }
}
