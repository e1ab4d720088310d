//! The concurrency limiter's tests, beside its file (`concurrency.rs`) to keep it one job long.

use super::*;
use crate::limits::testing::spread;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Barrier;

#[test]
fn what_can_never_fit_is_never_retried() {
    let p = ConcurrencyParams {
        max: 4,
        global: Some(10),
        groups: vec![0, 2, 6],
    };
    let rej = |limit, wanted| Rejection {
        limit,
        in_use: 4,
        max: 4,
        wanted,
    };
    // A group of max 0 (bit 0) blocks whichever limit was full first.
    assert!(p.never_fits(0b001, 1));
    assert_eq!(p.refusal(&rej(Limit::Key, 1), 0b001).retry_after, NEVER);
    // Room some day: retry in a second.
    assert!(!p.never_fits(0b110, 2));
    assert_eq!(
        p.refusal(&rej(Limit::Key, 2), 0b110).retry_after,
        RETRY_AFTER
    );
    // MIN above the key's max, the global, or a group the key is in.
    assert!(p.never_fits(0, 5));
    assert!(p.never_fits(0b010, 3));
    assert!(!p.never_fits(0b100, 3));
    let global = ConcurrencyParams {
        max: 20,
        global: Some(10),
        groups: vec![],
    };
    assert!(global.never_fits(0, 11) && !global.never_fits(0, 10));
    assert_eq!(
        global.refusal(&rej(Limit::Global, 11), 0).retry_after,
        NEVER
    );
}

fn limiter(max: u64, global: Option<u64>, groups: &[u64]) -> ConcurrencyLimiter {
    let params = ConcurrencyParams {
        max,
        global,
        groups: groups.to_vec(),
    };
    ConcurrencyLimiter::new(params, 1_000).unwrap()
}

fn rejection(limit: Limit, in_use: u64, max: u64, wanted: u64) -> Rejection {
    reject(limit, in_use, max, wanted)
}

#[test]
fn reserve_up_to_the_key_limit() {
    let l = limiter(5, None, &[]);
    assert_eq!(l.reserve(1, 0, 3, 3), Ok(3));
    assert_eq!(l.reserve(1, 0, 3, 3), Err(rejection(Limit::Key, 3, 5, 3)));
    // The largest n in [min, copies] that fits.
    assert_eq!(l.reserve(1, 0, 3, 1), Ok(2));
    assert_eq!(l.reserve(1, 0, 1, 1), Err(rejection(Limit::Key, 5, 5, 1)));
    assert_eq!(l.reserve(1, 0, 4, 0), Ok(0), "min 0 may grant nothing");
    assert_eq!(l.held(1), 5);
    assert_eq!(l.reserve(2, 0, 5, 5), Ok(5), "keys are independent");
    assert_eq!(l.in_use_global(), 10, "summed without a global limit");
    assert_eq!(l.len(), 2);
    // min above copies is lowered to copies.
    assert_eq!(l.reserve(3, 0, 2, 9), Ok(2));
    // A request bigger than max never fits.
    assert_eq!(l.reserve(4, 0, 6, 6), Err(rejection(Limit::Key, 0, 5, 6)));
    assert_eq!(l.len(), 3, "a rejected new key takes no slot");
}

#[test]
fn reserve_up_to_the_global_limit() {
    let l = limiter(10, Some(12), &[]);
    assert_eq!(l.reserve(1, 0, 10, 10), Ok(10));
    assert_eq!(l.reserve(2, 0, 5, 1), Ok(2));
    assert_eq!(
        l.reserve(3, 0, 1, 1),
        Err(rejection(Limit::Global, 12, 12, 1))
    );
    assert_eq!((l.in_use_global(), l.held(2), l.held(3)), (12, 2, 0));
    l.release(1, 0, 4).unwrap();
    assert_eq!(l.reserve(3, 0, 9, 1), Ok(4));
    assert_eq!(l.in_use_global(), 12);
}

#[test]
fn reserve_up_to_a_group_limit_and_group_bits_are_per_request() {
    let l = limiter(10, None, &[4, 100]);
    assert_eq!(l.reserve(1, 0b01, 3, 3), Ok(3));
    assert_eq!(l.reserve(2, 0b01, 3, 1), Ok(1));
    assert_eq!(
        l.reserve(3, 0b01, 1, 1),
        Err(rejection(Limit::Group(0), 4, 4, 1))
    );
    // The same key outside the group is not limited by it.
    assert_eq!(l.reserve(3, 0b10, 5, 5), Ok(5));
    assert_eq!((l.in_use(0), l.in_use(1), l.in_use(7)), (4, 5, 0));
    // Bits beyond the configured groups are ignored.
    assert_eq!(l.reserve(4, !0b11, 2, 2), Ok(2));
    assert_eq!((l.in_use(0), l.in_use(1)), (4, 5));
    l.release(4, !0b11, 2).unwrap();
    assert_eq!((l.in_use(0), l.in_use(1), l.held(4)), (4, 5, 0));
}

#[test]
fn a_key_in_two_groups_takes_a_copy_from_each() {
    let l = limiter(10, Some(100), &[3, 5]);
    let both = 0b11;
    assert_eq!(l.reserve(1, both, 2, 2), Ok(2));
    assert_eq!((l.in_use(0), l.in_use(1), l.in_use_global()), (2, 2, 2));
    // Group 1 has 3 left, group 0 only 1: the smaller bulkhead decides.
    assert_eq!(l.reserve(2, both, 3, 1), Ok(1));
    assert_eq!(l.reserve(3, 0b10, 2, 2), Ok(2));
    assert_eq!((l.in_use(0), l.in_use(1), l.in_use_global()), (3, 5, 5));
    assert_eq!(
        l.reserve(5, both, 1, 1),
        Err(rejection(Limit::Group(0), 3, 3, 1))
    );
    l.release(1, both, 2).unwrap();
    assert_eq!((l.in_use(0), l.in_use(1), l.in_use_global()), (1, 3, 3));
    assert_eq!(l.reserve(3, 0b10, 2, 2), Ok(2));
    assert_eq!(
        l.reserve(5, both, 1, 1),
        Err(rejection(Limit::Group(1), 5, 5, 1))
    );
    assert_eq!((l.held(1), l.held(2), l.held(3), l.held(5)), (0, 1, 4, 0));
}

#[test]
fn a_rejection_takes_nothing_anywhere() {
    let l = limiter(5, Some(10), &[3, 10]);
    let _a = l.acquire(1, 0b10, 4).unwrap();
    let _b = l.acquire(2, 0b01, 3).unwrap();
    let snapshot = |l: &ConcurrencyLimiter| {
        (
            l.held(1),
            l.held(3),
            l.in_use_global(),
            l.in_use(0),
            l.in_use(1),
            l.len(),
        )
    };
    let before = snapshot(&l);
    // Fits its key, the global count and group 1, not group 0 (full): nothing moves.
    assert_eq!(
        l.acquire(3, 0b11, 2).err(),
        Some(rejection(Limit::Group(0), 3, 3, 2))
    );
    // Fits groups, not its key.
    assert_eq!(
        l.acquire(1, 0b10, 2).err(),
        Some(rejection(Limit::Key, 4, 5, 2))
    );
    // Fits its key and group, not the global count.
    let _c = l.acquire(4, 0, 3).unwrap();
    assert_eq!(
        l.acquire(3, 0b10, 1).err(),
        Some(rejection(Limit::Global, 10, 10, 1))
    );
    assert_eq!(snapshot(&l).0, before.0);
    assert_eq!((l.held(3), l.in_use(0), l.in_use(1)), (0, 3, 4));
    assert_eq!(l.in_use_global(), 10);
    let v = l.acquire(3, 0, 1).err().unwrap().verdict();
    assert_eq!(v, Verdict::reject(0, 0, NANOS_PER_SEC));
}

#[test]
fn release_restores_and_frees_the_slot() {
    let l = limiter(5, Some(20), &[8]);
    assert_eq!(l.reserve(1, 1, 5, 5), Ok(5));
    assert_eq!(l.release(1, 1, 2), Ok(()));
    assert_eq!((l.held(1), l.in_use(0), l.in_use_global()), (3, 3, 3));
    assert_eq!(l.reserve(1, 1, 2, 2), Ok(2));
    assert_eq!(l.release(1, 1, 5), Ok(()));
    assert_eq!((l.held(1), l.in_use(0), l.in_use_global()), (0, 0, 0));
    assert!(l.is_empty(), "a key holding nothing has no slot");
    assert_eq!(l.release(1, 1, 0), Ok(()), "releasing nothing is fine");
}

#[test]
fn an_over_release_is_an_error_and_changes_nothing() {
    let l = limiter(10, Some(20), &[8, 8]);
    assert_eq!(l.reserve(1, 0b01, 3, 3), Ok(3));
    assert_eq!(l.reserve(2, 0b10, 2, 2), Ok(2));
    let snapshot = |l: &ConcurrencyLimiter| {
        (
            l.held(1),
            l.held(2),
            l.in_use_global(),
            l.in_use(0),
            l.in_use(1),
        )
    };
    let before = snapshot(&l);
    let over = |limit, held, released| OverRelease {
        limit,
        held,
        released,
    };
    assert_eq!(l.release(1, 0b01, 4), Err(over(Limit::Key, 3, 4)));
    assert_eq!(l.release(3, 0, 1), Err(over(Limit::Key, 0, 1)));
    // The key holds 3, but group 1 holds only 2 (the copies were not reserved in it):
    // global and group 0 were given back first, then rolled back.
    assert_eq!(l.release(1, 0b11, 3), Err(over(Limit::Group(1), 2, 3)));
    assert_eq!(snapshot(&l), before);
    assert_eq!(l.release(1, 0b01, 3), Ok(()));
    assert_eq!(snapshot(&l), (0, 2, 2, 0, 2));
}

#[test]
fn a_guard_releases_exactly_once_even_after_its_limiter_is_gone() {
    let l = limiter(3, Some(3), &[3]);
    let g = l.acquire(7, 1, 2).unwrap();
    assert_eq!(
        (g.key(), g.copies(), g.groups(), g.tracked()),
        (7, 2, 1, true)
    );
    assert_eq!(g.remaining(), 1);
    assert_eq!(g.verdict(), Verdict::allow(1, 0));
    assert_eq!((l.held(7), l.in_use(0), l.in_use_global()), (2, 2, 2));
    assert_eq!(l.acquire(8, 1, 2).err().unwrap().limit, Limit::Global);
    drop(g);
    assert_eq!((l.held(7), l.in_use(0), l.in_use_global()), (0, 0, 0));
    assert!(l.is_empty());
    // Dropping a guard after the limiter (a config reload) still releases into its
    // own state, which lives as long as the guard.
    let g = l.acquire(7, 1, 3).unwrap();
    let state = Arc::clone(&l.state);
    drop(l);
    assert_eq!(state.global.0.load(Relaxed), 3);
    drop(g);
    assert_eq!(state.global.0.load(Relaxed), 0);
    assert_eq!(state.groups[0].0.load(Relaxed), 0);
    assert_eq!(Arc::strong_count(&state), 1);
    // Zero copies: admitted, nothing held.
    let l = limiter(0, None, &[]);
    let g = l.acquire(1, 0, 0).unwrap();
    assert_eq!((g.copies(), l.len()), (0, 0));
    assert_eq!(
        l.acquire(1, 0, 1).err(),
        Some(rejection(Limit::Key, 0, 0, 1))
    );
}

#[test]
fn a_guard_and_a_hand_release_never_wrap_a_count() {
    let l = limiter(5, Some(5), &[5]);
    let g = l.acquire(1, 1, 2).unwrap();
    // The caller's error: releasing the guard's copies by hand.
    l.release(1, 1, 2).unwrap();
    drop(g);
    assert_eq!((l.held(1), l.in_use_global(), l.in_use(0)), (0, 0, 0));
    assert_eq!(l.reserve(1, 1, 5, 5), Ok(5));
}

#[test]
fn too_many_groups_is_an_error() {
    let params = |n| ConcurrencyParams {
        max: 1,
        global: None,
        groups: vec![1; n],
    };
    assert_eq!(
        ConcurrencyLimiter::new(params(65), 10).err(),
        Some(ConcurrencyError::TooManyGroups(65))
    );
    let l = ConcurrencyLimiter::new(params(64), 10).unwrap();
    assert_eq!(l.state.valid, u64::MAX);
    assert_eq!(l.reserve(1, 1 << 63, 1, 1), Ok(1));
    assert_eq!(l.in_use(63), 1);
    let l = ConcurrencyLimiter::new(params(0), 10).unwrap();
    assert_eq!(l.state.valid, 0);
    let l = ConcurrencyLimiter::new(params(3), 10).unwrap();
    assert_eq!(l.state.valid, 0b111);
    assert_eq!(l.params().groups.len(), 3);
}

#[test]
fn the_table_bound_admits_untracked_and_counts_it() {
    // max_keys 8: one set, shared by every key.
    let l = ConcurrencyLimiter::new(
        ConcurrencyParams {
            max: 2,
            global: Some(100),
            groups: vec![100],
        },
        8,
    )
    .unwrap();
    assert_eq!([size_of::<Set>(), size_of::<Counter>()], [136, 128]);
    assert_eq!(l.state.table.sets(), 1);
    let guards: Vec<_> = (1..=8).map(|k| l.acquire(k, 1, 1).unwrap()).collect();
    assert!(guards.iter().all(ConcurrencyGuard::tracked));
    // Key 9 finds its set full of holding keys: admitted untracked, counted.
    let g9 = l.acquire(9, 1, 2).unwrap();
    assert!(!g9.tracked());
    assert_eq!(
        (l.len(), l.untracked_total(), l.untracked_in_use()),
        (8, 1, 2)
    );
    assert_eq!((l.held(9), l.in_use_global(), l.in_use(0)), (0, 10, 10));
    // Its own max still bounds each request.
    assert_eq!(l.acquire(9, 1, 3).err().unwrap().limit, Limit::Key);
    // A reservation goes untracked too, and a release takes the shortfall from the
    // untracked count.
    assert_eq!(l.reserve(10, 0, 1, 1), Ok(1));
    assert_eq!((l.untracked_total(), l.untracked_in_use()), (2, 3));
    assert_eq!(
        l.release(10, 0, 4),
        Err(OverRelease {
            limit: Limit::Key,
            held: 0,
            released: 4
        })
    );
    l.release(10, 0, 1).unwrap();
    assert_eq!((l.untracked_in_use(), l.in_use_global()), (2, 10));
    drop(g9);
    assert_eq!(
        (l.untracked_in_use(), l.in_use_global(), l.in_use(0)),
        (0, 8, 8)
    );
    drop(guards);
    assert_eq!((l.len(), l.in_use_global(), l.in_use(0)), (0, 0, 0));
    // Freed slots are used again: tracked.
    assert!(l.acquire(9, 1, 1).unwrap().tracked());
    assert_eq!(l.untracked_total(), 2);
}

#[test]
fn threads_hammering_return_every_count_to_zero() {
    const THREADS: usize = 8;
    let l = ConcurrencyLimiter::new(
        ConcurrencyParams {
            max: 3,
            global: Some(12),
            groups: vec![5, 7, 9],
        },
        64,
    )
    .unwrap();
    let barrier = Barrier::new(THREADS + 1);
    std::thread::scope(|s| {
        for t in 0..THREADS as u64 {
            let (l, barrier) = (&l, &barrier);
            s.spawn(move || {
                let mut held = Vec::new();
                let mut reserved = Vec::new();
                for i in 0..3_000u64 {
                    let key = spread(i % 5 + t % 3);
                    let groups = (i ^ t) % 8;
                    if i % 3 == 0 {
                        if let Ok(n) = l.reserve(key, groups, 1 + i % 3, 1) {
                            reserved.push((key, groups, n));
                        }
                    } else if let Ok(g) = l.acquire(key, groups, 1 + i % 2) {
                        held.push(g);
                    }
                    // Every limit holds at every instant (no counter ever exceeds it).
                    assert!(l.in_use_global() <= 12);
                    assert!((0..3).all(|g| l.in_use(g) <= [5, 7, 9][g]));
                    if held.len() + reserved.len() > 2 {
                        held.clear();
                        for (key, groups, n) in reserved.drain(..) {
                            l.release(key, groups, n).unwrap();
                        }
                    }
                }
                barrier.wait();
                // Hold something at the rendezvous, then give it all back.
                drop(held);
                for (key, groups, n) in reserved {
                    l.release(key, groups, n).unwrap();
                }
            });
        }
        barrier.wait();
    });
    assert_eq!(l.in_use_global(), 0);
    assert_eq!((l.in_use(0), l.in_use(1), l.in_use(2)), (0, 0, 0));
    assert_eq!((l.len(), l.untracked_in_use()), (0, 0));
    assert!((0..10).all(|k| l.held(spread(k)) == 0));
}

#[test]
fn threads_contending_for_one_key_never_overshoot() {
    let l = limiter(50, Some(1_000), &[1_000]);
    let admitted: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    (0..100)
                        .filter_map(|_| l.reserve(9, 1, 1, 1).ok())
                        .sum::<u64>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
    });
    assert_eq!(admitted, 50);
    assert_eq!((l.held(9), l.in_use(0), l.in_use_global()), (50, 50, 50));
}

/// The semantics written literally: counts in maps, every limit checked before anything
/// changes. The oracle of the proptest.
#[derive(Debug, Default)]
struct Model {
    held: HashMap<u64, u64>,
    global: u64,
    groups: [u64; 3],
}

const MAX: u64 = 4;
const GLOBAL: u64 = 9;
const GROUPS: [u64; 3] = [3, 5, 6];

impl Model {
    /// Every limit that applies, in order (key, global, groups), as (limit, count, max).
    fn limits(&self, key: u64, groups: u64) -> Vec<(Limit, u64, u64)> {
        let held = self.held.get(&key).copied().unwrap_or(0);
        let mut all = vec![
            (Limit::Key, held, MAX),
            (Limit::Global, self.global, GLOBAL),
        ];
        for g in Bits(groups) {
            let i = usize::from(g);
            all.push((Limit::Group(g), self.groups[i], GROUPS[i]));
        }
        all
    }

    /// The room left everywhere, or the first limit without room for `min`.
    fn room(&self, key: u64, groups: u64, min: u64) -> Result<u64, Rejection> {
        let mut room = u64::MAX;
        for (limit, in_use, max) in self.limits(key, groups) {
            if max - in_use < min {
                return Err(reject(limit, in_use, max, min));
            }
            room = room.min(max - in_use);
        }
        Ok(room)
    }

    fn reserve(&mut self, key: u64, groups: u64, copies: u64, min: u64) -> Option<u64> {
        let min = min.min(copies);
        let n = self.room(key, groups, min).ok()?.min(copies);
        *self.held.entry(key).or_default() += n;
        self.global += n;
        for g in Bits(groups) {
            self.groups[usize::from(g)] += n;
        }
        Some(n)
    }

    fn release(&mut self, key: u64, groups: u64, copies: u64) -> bool {
        let held = self.held.get(&key).copied().unwrap_or(0);
        if held < copies || Bits(groups).any(|g| self.groups[usize::from(g)] < copies) {
            return false;
        }
        *self.held.entry(key).or_default() -= copies;
        self.global -= copies;
        for g in Bits(groups) {
            self.groups[usize::from(g)] -= copies;
        }
        true
    }
}

proptest! {
    #[test]
    fn matches_the_model(
        steps in prop::collection::vec((0u64..4, 0u64..8, 0u64..6, 0u64..6, any::<bool>()), 1..150)
    ) {
        let l = ConcurrencyLimiter::new(
            ConcurrencyParams { max: MAX, global: Some(GLOBAL), groups: GROUPS.to_vec() },
            1 << 12,
        )
        .unwrap();
        let mut m = Model::default();
        for (key, groups, copies, min, release) in steps {
            if release {
                let ok = m.release(key, groups, copies);
                prop_assert_eq!(l.release(spread(key), groups, copies).is_ok(), ok);
            } else {
                let got = l.reserve(spread(key), groups, copies, min);
                if let Err(r) = got {
                    // The first limit without room, with its count.
                    prop_assert_eq!(Err(r), m.room(key, groups, min.min(copies)));
                }
                prop_assert_eq!(got.ok(), m.reserve(key, groups, copies, min));
            }
            prop_assert_eq!(l.in_use_global(), m.global);
            for g in 0..3 {
                prop_assert_eq!(l.in_use(g), m.groups[g]);
            }
            for k in 0..4 {
                prop_assert_eq!(l.held(spread(k)), m.held.get(&k).copied().unwrap_or(0));
            }
        }
    }
}
