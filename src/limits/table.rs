//! The per-key table every kind that keeps per-key state stores it in: a fixed-size
//! set-associative table of [`WAYS`]-way sets, one lock per set.
//!
//! The token bucket, the ad-hoc bucket, the rate limiter, the sliding log, the tiered
//! limiter and the concurrency limiter each keep only their slot's value, its transition
//! and its maths; where a key lives, how a new key finds room, what is evicted and how the
//! table is counted is here, once.
//!
//! **Sets and index.** `S = ⌈max_keys / 8⌉` sets of 8 ways, each set behind its own
//! `parking_lot::Mutex` (no global lock), allocated once by [`Table::new`] and never grown.
//! Keys arrive as good 64-bit hashes, so Lemire's multiply-high `⌊key · S / 2⁶⁴⌋` picks the
//! set with no division and no rounding of `S` to a power of two; each set gets `⌊2⁶⁴ / S⌋`
//! or `⌈2⁶⁴ / S⌉` of the hash space, a bias below `S / 2⁶⁴` (under 10⁻¹² for any table
//! allowed). A slot is `(key, value)`, key 0 meaning empty, so a real key 0 is stored as 1
//! ([`stored`]): a collision of 2⁻⁶⁴ odds, harmless. A decision locks one set, scans its 8
//! slots ([`scan`]) and unlocks: no allocation, no other set, no syscall.
//!
//! **Collisions.** Two distinct keys share a slot only if their 64-bit hashes are equal:
//! with `n` live keys the odds are `n² / 2⁶⁵`, about 3·10⁻⁸ for a million. (The ad-hoc
//! bucket also compares its parameters, so a collision across parameters never shares.)
//!
//! **Eviction odds.** A key can only use its own set, so eviction starts before `max_keys`
//! keys hold state. With `a` keys holding state, hashed uniformly, a set receives about
//! Poisson(`λ = 8a / max_keys`) of them, and the share of keys beyond their set's 8 ways is
//! `E[max(X − 8, 0)] / λ`: 10⁻⁶ at `a = max_keys / 8`, 0.015% at `max_keys / 4`, 0.84% at
//! `max_keys / 2`, 5.2% at `3/4` and 14% at `max_keys`. Size `max_keys` at twice the keys
//! expected to hold state at once.
//!
//! **Victim.** A new key takes an empty way of its set; failing that, [`Table::victim`]
//! ranks each way with the kind's score ([`crate::limits::victim`]): a way whose state
//! equals a new key's by now is free (reused, not counted); otherwise the way of least
//! score is evicted and counted in [`Table::evictions`]. Ways are ranked in the order
//! `way ^ mix`, and the first of equals wins, so a kind can break ties by the newcomer's
//! hash (`mix`) or by way (`mix = 0`).
//!
//! **Memory.** `size_of::<Slot<V>>() · 8` plus the lock (1 byte, padded to 8) a set; see
//! [`Table::bytes_for`].

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::limits::restore::Restored;
use crate::limits::victim::{self, Rank};

/// The accessors a kind keeping per-key state in a [`Table`] (its field `table`) forwards:
/// `len`, `is_empty` and `evictions`, under the kind's own docs for `len` and `evictions`
/// (what holding state and an eviction mean for that kind).
macro_rules! table_accessors {
    (len: $(#[$len:meta])* evictions: $(#[$evictions:meta])*) => {
        $(#[$len])*
        ///
        /// Locks each set in turn, so it is for metrics and tests, not the hot path.
        pub fn len(&self) -> usize {
            self.table.len()
        }

        /// Whether no key holds state.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }

        $(#[$evictions])*
        pub fn evictions(&self) -> u64 {
            self.table.evictions()
        }
    };
}
pub(crate) use table_accessors;

/// Ways per set: enough that a set rarely overflows at half load (see the module doc), few
/// enough that a scan reads a few cache lines.
pub const WAYS: usize = 8;

/// The most keys a table of a kind without an arena may hold (the config refuses more): 2²⁴.
pub const MAX_KEYS: usize = 1 << 24;

/// One way: a key (0 = empty) and the kind's value.
#[derive(Debug, Clone, Copy, Default)]
pub struct Slot<V> {
    /// The key's hash, never 0 for a live slot.
    pub key: u64,
    /// The kind's state for the key.
    pub value: V,
}

/// The ways of one set.
pub type Ways<V> = [Slot<V>; WAYS];

/// One set: its lock and its ways.
pub type Set<V> = Mutex<Ways<V>>;

/// A fixed-size set-associative table of per-key values `V`, with the kind's head `H`.
///
/// The head is what every decision of the kind reads besides the sets (its parameters, its
/// arena's geometry): it shares the table's first cache-line pair with the set pointer,
/// while the eviction count, which any core may write, has a pair of its own. A kind is
/// then a `Table` and little else (a 256-byte header for the token bucket, the rate
/// limiter and the sliding log).
pub struct Table<V, H = ()> {
    head: H,
    sets: Box<[Set<V>]>,
    evictions: Evictions,
}

/// The eviction count, on its own cache-line pair: written by any core that evicts, it
/// must not false-share with what every decision reads.
#[repr(align(128))]
struct Evictions(AtomicU64);

/// The key a table stores for `key`: 0 marks an empty slot, so 0 is stored as 1.
pub fn stored(key: u64) -> u64 {
    key.max(1)
}

/// The way holding a key (`is` true on its slot) and an empty way, [`WAYS`] for none.
/// Conditional moves, not an early exit: a hit's way is random, so a branch on it would
/// mispredict.
#[inline(always)]
pub fn scan<V>(ways: &Ways<V>, is: impl Fn(&Slot<V>) -> bool) -> (usize, usize) {
    let (mut hit, mut empty) = (WAYS, WAYS);
    for (way, slot) in ways.iter().enumerate() {
        hit = if is(slot) { way } else { hit };
        empty = if slot.key == 0 { way } else { empty };
    }
    (hit, empty)
}

/// The way a restored key takes in `ways` without evicting: `hit` if it is a way, else the
/// first that is empty or whose value `free` says equals a new key's by now.
pub fn room<V>(ways: &Ways<V>, hit: usize, free: impl Fn(&V) -> bool) -> Option<usize> {
    if hit < WAYS {
        return Some(hit);
    }
    ways.iter().position(|s| s.key == 0 || free(&s.value))
}

impl<V: Copy + Default, H> Table<V, H> {
    /// The sets for `max_keys` keys: whole sets of 8, at least one.
    pub fn sets_for(max_keys: usize) -> usize {
        max_keys.max(1).div_ceil(WAYS)
    }

    /// The bytes [`Table::new`] allocates for `max_keys`.
    pub fn bytes_for(max_keys: usize) -> usize {
        Self::sets_for(max_keys) * size_of::<Set<V>>()
    }

    /// A table for `max_keys` keys (0 is raised to 1), all empty, in one allocation, with
    /// the kind's `head`.
    pub fn new(max_keys: usize, head: H) -> Self {
        Self {
            head,
            // An exact-size iterator: one allocation, of exactly the sets asked for.
            sets: (0..Self::sets_for(max_keys))
                .map(|_| Mutex::new([Slot::default(); WAYS]))
                .collect(),
            evictions: Evictions(AtomicU64::new(0)),
        }
    }

    /// The kind's head, as given to [`Table::new`].
    #[inline(always)]
    pub fn head(&self) -> &H {
        &self.head
    }

    /// The number of sets.
    pub fn sets(&self) -> usize {
        self.sets.len()
    }

    /// The number of slots: the sets times 8.
    pub fn slots(&self) -> usize {
        self.sets.len() * WAYS
    }

    /// The set of `key` (already [`stored`]), by Lemire's multiply-high reduction.
    #[inline(always)]
    pub fn index(&self, key: u64) -> usize {
        ((u128::from(key) * self.sets.len() as u128) >> 64) as usize
    }

    /// Locks set `set` (an index below [`Table::sets`]).
    #[inline(always)]
    pub fn lock(&self, set: usize) -> MutexGuard<'_, Ways<V>> {
        self.sets[set].lock()
    }

    /// A copy of `key`'s value, if it holds one (`is` compares anything beyond the key).
    pub fn get(&self, key: u64, is: impl Fn(&V) -> bool) -> Option<V> {
        let key = stored(key);
        let ways = self.lock(self.index(key));
        let (hit, _) = scan(&ways, |s| s.key == key && is(&s.value));
        ways.get(hit).map(|s| s.value)
    }

    /// Runs `step` on `key`'s value at now, then stores it if `live`, else frees the slot.
    ///
    /// `load` brings the stored value to now (`Some`), or makes a new key's (`None`); `is`
    /// compares anything beyond the key. A new key whose value is not `live` after `step`
    /// takes no slot; one that is takes an empty way, else the [`victim`](Table::victim) of
    /// `rank` (of each way and its value; ways ranked in the order `way ^ mix`). Returns `step`'s result and the value
    /// after it, so that a verdict's divisions happen after the set is unlocked.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn update<R, K: Rank>(
        &self,
        key: u64,
        is: impl Fn(&V) -> bool,
        load: impl FnOnce(Option<V>) -> V,
        step: impl FnOnce(&mut V) -> R,
        live: impl Fn(&V) -> bool,
        rank: impl FnMut(usize, &V) -> K,
        mix: usize,
    ) -> (R, V) {
        let key = stored(key);
        let mut ways = self.lock(self.index(key));
        let (hit, empty) = scan(&ways, |s| s.key == key && is(&s.value));
        if let Some(slot) = ways.get_mut(hit) {
            let mut value = load(Some(slot.value));
            let out = step(&mut value);
            *slot = if live(&value) {
                Slot { key, value }
            } else {
                Slot::default()
            };
            return (out, value);
        }
        let mut value = load(None);
        let out = step(&mut value);
        if live(&value) {
            let way = self.victim(&ways, empty, mix, rank);
            ways[way] = Slot { key, value };
        }
        (out, value)
    }

    /// The way a new key takes in `ways`: `empty` if it is a way, else the first free way
    /// or the way of least rank, ways ranked in the order `way ^ mix` (`mix` below 8; the
    /// first of equals wins). Taking a way that is not free is an eviction, and counted.
    ///
    /// Ranks each way once, only when a new key finds its set full: a decision for a key
    /// already in the table never ranks anything.
    #[inline]
    pub fn victim<K: Rank>(
        &self,
        ways: &Ways<V>,
        empty: usize,
        mix: usize,
        mut rank: impl FnMut(usize, &V) -> K,
    ) -> usize {
        if empty < WAYS {
            return empty;
        }
        let mix = mix & (WAYS - 1);
        let (i, evicts) = victim::choose((0..WAYS).map(|i| rank(i ^ mix, &ways[i ^ mix].value)));
        if evicts {
            self.evictions.0.fetch_add(1, Ordering::Relaxed);
        }
        i ^ mix
    }

    /// Puts a restored value back for `key` (`None`: it equals a new key's, so any state
    /// the key holds is dropped): it replaces the key's value, else takes a way [`room`]
    /// finds; it never evicts (see [`crate::limits::restore`]).
    pub fn put(&self, key: u64, value: Option<V>, free: impl Fn(&V) -> bool) -> Restored {
        let key = stored(key);
        let mut ways = self.lock(self.index(key));
        let (hit, _) = scan(&ways, |s| s.key == key);
        let Some(value) = value else {
            if let Some(slot) = ways.get_mut(hit) {
                *slot = Slot::default();
            }
            return Restored::Empty;
        };
        match room(&ways, hit, free) {
            Some(way) => {
                ways[way] = Slot { key, value };
                Restored::Stored
            }
            None => Restored::NoRoom,
        }
    }

    /// Calls `f` for every live slot. Each set is locked only while its 8 slots are copied,
    /// and `f` runs with no lock held.
    pub fn each(&self, mut f: impl FnMut(Slot<V>)) {
        for set in self.sets.iter() {
            let ways = *set.lock();
            for slot in ways.iter().filter(|s| s.key != 0) {
                f(*slot);
            }
        }
    }

    /// Keys holding a slot, `live` ones only (`|_| true` for all). Locks each set in turn,
    /// so it is for metrics and tests, not the hot path.
    pub fn count(&self, live: impl Fn(&V) -> bool) -> usize {
        let held = |set: &Set<V>| {
            let ways = set.lock();
            ways.iter().filter(|s| s.key != 0 && live(&s.value)).count()
        };
        self.sets.iter().map(held).sum()
    }

    /// Keys holding a slot (a value that has emptied by now still counts until touched).
    pub fn len(&self) -> usize {
        self.count(|_| true)
    }

    /// Whether no key holds a slot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ways taken from keys whose state was live, since construction: each such key starts
    /// again as new, so a rising count means `max_keys` is too small.
    pub fn evictions(&self) -> u64 {
        self.evictions.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::clock::{Clock, ManualClock, Nanos};
    use crate::limits::testing::mixed;
    use crate::limits::victim::Score;

    /// A toy kind: a key holds `hits` until `until`; it equals a new key from then on.
    #[derive(Debug, Clone, Copy, Default, PartialEq)]
    struct Hold {
        hits: u64,
        until: Nanos,
    }

    fn hit(t: &Table<Hold>, key: u64, now: Nanos) -> u64 {
        let (hits, _) = t.update(
            key,
            |_| true,
            |v| v.filter(|v| v.until > now).unwrap_or_default(),
            |v| {
                v.hits += 1;
                v.until = now + 100;
                v.hits
            },
            |v| v.hits > 0,
            |_, v| Score::new(v.hits, v.until, now),
            0,
        );
        hits
    }

    #[test]
    fn sets_slots_and_bytes() {
        assert_eq!(Table::<Hold>::sets_for(0), 1);
        assert_eq!(Table::<Hold>::sets_for(9), 2);
        let t = Table::<Hold>::new(100_000, ());
        assert_eq!((t.sets(), t.slots()), (12_500, 100_000));
        // A 24-byte slot: 8 · 24 + 8 bytes a set.
        assert_eq!(Table::<Hold>::bytes_for(8), 200);
        // The head shares the set pointer's line pair; the eviction count has its own.
        assert_eq!(size_of::<Table<Hold, [u64; 4]>>(), 256);
        assert_eq!(stored(0), 1);
    }

    #[test]
    fn the_index_spreads_keys_evenly_over_the_sets() {
        let t = Table::<Hold>::new(8 * 10, ());
        let mut per = [0u32; 10];
        for i in 0..100_000 {
            per[t.index(stored(mixed(i)))] += 1;
        }
        assert!(per.iter().all(|&n| (9_000..11_000).contains(&n)), "{per:?}");
        assert_eq!(t.index(u64::MAX), 9);
        assert_eq!(t.index(1), 0);
    }

    #[test]
    fn a_new_key_takes_empty_then_free_ways_then_the_least_score() {
        let clock = ManualClock::new(1_000);
        // One set, shared by every key.
        let t = Table::<Hold>::new(8, ());
        for key in 1..=8 {
            hit(&t, key, clock.now());
        }
        // Keys 1..=7 twice: key 8 has the least score.
        for key in 1..=7 {
            assert_eq!(hit(&t, key, clock.now()), 2);
        }
        assert_eq!((t.len(), t.evictions()), (8, 0));
        assert_eq!(hit(&t, 9, clock.now()), 1);
        assert_eq!((t.len(), t.evictions()), (8, 1));
        assert!(t.get(8, |_| true).is_none(), "key 8 was evicted");
        // Past every key's `until`: each way is free, reused without an eviction.
        clock.advance(std::time::Duration::from_nanos(100));
        for key in 10..=17 {
            hit(&t, key, clock.now());
        }
        assert_eq!((t.len(), t.evictions()), (8, 1));
        assert_eq!(t.count(|v| v.until > clock.now()), 8);
    }

    #[test]
    fn ties_go_to_the_first_way_in_mixed_order() {
        let t = Table::<Hold>::new(8, ());
        let ways: Ways<Hold> = [Slot {
            key: 5,
            value: Hold { hits: 1, until: 50 },
        }; WAYS];
        let rank = |_, v: &Hold| Score::new(v.hits, v.until, 0);
        assert_eq!(t.victim(&ways, WAYS, 0, rank), 0);
        assert_eq!(t.victim(&ways, WAYS, 5, rank), 5);
        assert_eq!(t.victim(&ways, 3, 5, rank), 3, "an empty way first");
        assert_eq!(t.evictions(), 2);
    }

    #[test]
    fn a_value_that_is_not_live_frees_its_slot() {
        let t = Table::<Hold>::new(8, ());
        hit(&t, 3, 0);
        assert_eq!(t.len(), 1);
        t.update(
            3,
            |_| true,
            |v| v.unwrap_or_default(),
            |v| v.hits = 0,
            |v| v.hits > 0,
            |_, _| Score::FREE,
            0,
        );
        assert!(t.is_empty());
        let mut seen = Vec::new();
        hit(&t, 4, 0);
        t.each(|s| seen.push(s.key));
        assert_eq!(seen, [4]);
    }

    #[test]
    fn the_overflow_share_matches_the_poisson_odds() {
        // Half load: about 0.84% of keys find their set's 8 ways full (the module doc's
        // Poisson odds), 14% at full load.
        let max_keys = 80_000;
        let t = Table::<Hold>::new(max_keys, ());
        let mut per = vec![0u64; t.sets()];
        for i in 0..(max_keys as u64 / 2) {
            per[t.index(stored(mixed(i)))] += 1;
        }
        let beyond = |per: &[u64]| -> u64 { per.iter().map(|&n| n.saturating_sub(8)).sum() };
        let share = beyond(&per) as f64 / (max_keys / 2) as f64;
        assert!((0.006..0.011).contains(&share), "{share}");
        for i in (max_keys as u64 / 2)..max_keys as u64 {
            per[t.index(stored(mixed(i)))] += 1;
        }
        let share = beyond(&per) as f64 / max_keys as f64;
        assert!((0.13..0.15).contains(&share), "{share}");
    }
}
