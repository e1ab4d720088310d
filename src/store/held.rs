//! What this instance holds in leased counts (inflight units, concurrency copies), per
//! key: the local truth that each lease renewal writes to the shared store.
//!
//! An entry is `dirty` when Redis may disagree with it: units the fallback admitted, or a
//! release that was not sent or failed. A renewal writes every held or dirty key and
//! cleans it; a key back to 0 units and clean (its releases all landed) is forgotten at the
//! next renewal without a store call, so keys that come and go cost nothing extra.

use std::collections::HashMap;

use parking_lot::Mutex;

/// Units this instance holds per key: 16 shards of maps behind their own locks, so that
/// concurrent requests rarely share a lock (module doc).
pub struct Held {
    shards: Box<[Mutex<HashMap<u64, Units, ahash::RandomState>>]>,
}

/// One key's units and whether Redis may disagree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Units {
    count: u64,
    dirty: bool,
}

impl Held {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..16)
                .map(|_| Mutex::new(HashMap::with_hasher(ahash::RandomState::new())))
                .collect(),
        }
    }

    fn shard(&self, key: u64) -> &Mutex<HashMap<u64, Units, ahash::RandomState>> {
        &self.shards[(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize]
    }

    /// `n` more units; `dirty` when Redis did not count them.
    pub(crate) fn add(&self, key: u64, n: u64, dirty: bool) {
        let mut shard = self.shard(key).lock();
        let units = shard.entry(key).or_default();
        units.count = units.count.saturating_add(n);
        units.dirty |= dirty;
    }

    /// `n` units fewer; `dirty` when Redis will not hear of it.
    pub(crate) fn sub(&self, key: u64, n: u64, dirty: bool) {
        let mut shard = self.shard(key).lock();
        let units = shard.entry(key).or_default();
        units.count = units.count.saturating_sub(n);
        units.dirty |= dirty;
    }

    /// Redis may disagree about `key` (a release that failed).
    pub(crate) fn mark_dirty(&self, key: u64) {
        self.shard(key).lock().entry(key).or_default().dirty = true;
    }

    pub(crate) fn get(&self, key: u64) -> u64 {
        self.shard(key).lock().get(&key).map_or(0, |u| u.count)
    }

    /// The keys to renew (held or dirty) with their counts and whether Redis may disagree
    /// (then the renewal overwrites Redis's count; otherwise it only restores a count Redis
    /// lost, since one in Redis may include operations still on their way here); forgets
    /// clean zeros.
    pub(crate) fn to_renew(&self) -> Vec<(u64, u64, bool)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|_, u| u.count > 0 || u.dirty);
            out.extend(shard.iter().map(|(&k, u)| (k, u.count, u.dirty)));
        }
        out
    }

    /// A renewal wrote `count` for `key`: clean if it still holds that count.
    pub(crate) fn renewed(&self, key: u64, count: u64) {
        let mut shard = self.shard(key).lock();
        if let Some(units) = shard.get_mut(&key) {
            if units.count == count {
                units.dirty = false;
            }
        }
    }
}

impl Held {
    /// Units held across every key.
    pub(crate) fn total(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().values().map(|u| u.count).sum::<u64>())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_counts_exactly_and_renews_only_what_redis_may_not_know() {
        let h = Held::new();
        h.add(1, 1, false);
        h.add(1, 1, false);
        h.add(2, 1, true);
        h.sub(1, 1, false);
        h.sub(3, 1, false);
        assert_eq!((h.get(1), h.get(2), h.get(3)), (1, 1, 0));
        let sorted = |mut v: Vec<(u64, u64, bool)>| {
            v.sort();
            v
        };
        // Held keys are renewed; a clean zero (key 3) is forgotten without a call.
        assert_eq!(sorted(h.to_renew()), [(1, 1, false), (2, 1, true)]);
        h.renewed(2, 1);
        h.sub(1, 1, false);
        h.sub(2, 1, true);
        // Key 1's release landed: forgotten. Key 2's did not: renewed with 0, then clean.
        assert_eq!(h.to_renew(), [(2, 0, true)]);
        h.renewed(2, 0);
        assert_eq!(h.to_renew(), []);
        // A failed release makes a key dirty again, even after it was forgotten.
        h.mark_dirty(5);
        assert_eq!(h.to_renew(), [(5, 0, true)]);
        // A renewal that raced a change leaves the key dirty.
        h.add(6, 1, true);
        h.renewed(6, 0);
        assert_eq!(sorted(h.to_renew()), [(5, 0, true), (6, 1, true)]);
    }
}
