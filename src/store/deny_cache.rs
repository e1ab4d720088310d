//! The local deny cache: keys that the shared store said are over their limit, remembered
//! until their `retry_after`, so that a flood from one key costs one store call per
//! retry interval instead of one per request.
//!
//! An entry says: "for this key, a request of cost ≥ `cost` is rejected until `until`".
//! That stays true whatever else happens on this proxy (spending only makes a bucket
//! emptier and a window fuller); it can only turn false early if another proxy refunds
//! quota, in which case the key waits until its `retry_after` as if the refund had not
//! happened: a deliberate, bounded staleness. A request of a smaller cost than the cached
//! one is not answered from the cache (it may fit), and neither is any request of a
//! `strict` limit: there every rejection must reach the store, since it moves the state
//! (see `crate::store::shared`).
//!
//! **Table.** Like the token bucket's: `⌈max_keys / 8⌉` sets of 8 entries, each set behind
//! its own `parking_lot::Mutex`, the set picked by Lemire's multiply-high of the (already
//! hashed) key. An entry is 40 bytes, a set 328: 41 bytes per key of `max_keys`, allocated
//! once. A new entry takes an expired or empty way, else the way that expires first. A
//! lookup or insert locks one set: no allocation, no global lock, no syscall.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::limits::clock::Nanos;
use crate::limits::verdict::Verdict;

const WAYS: usize = 8;

/// One remembered rejection: 40 bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// The key, 0 for an empty way (a real key 0 is stored as 1).
    key: u64,
    /// The smallest cost this rejection covers.
    cost: u64,
    /// Local time until which it holds (`now + retry_after`).
    until: Nanos,
    /// Local time at which the quota is fully back (`now + reset_after`).
    reset_at: Nanos,
    /// The quota left when the store rejected.
    remaining: u64,
}

/// A fixed-size table of rejections to answer locally (module doc).
pub struct DenyCache {
    sets: Box<[Mutex<[Entry; WAYS]>]>,
    /// Store calls avoided: requests answered from the cache.
    hits: Counter,
}

/// A counter on its own cache lines, written by every core that hits.
#[repr(align(128))]
struct Counter(AtomicU64);

impl DenyCache {
    /// A cache of at most `max_keys` keys (raised to 8), allocated now and never grown.
    pub fn new(max_keys: usize) -> Self {
        let sets = max_keys.max(1).div_ceil(WAYS);
        Self {
            sets: (0..sets)
                .map(|_| Mutex::new([Entry::default(); WAYS]))
                .collect(),
            hits: Counter(AtomicU64::new(0)),
        }
    }

    /// The cached rejection of a request of `cost` for `key` at `now`, if one holds: its
    /// `retry_after` and `reset_after` count down from the store's answer.
    pub fn check(&self, key: u64, cost: u64, now: Nanos) -> Option<Verdict> {
        let key = key.max(1);
        let mut set = self.set(key).lock();
        let entry = set.iter_mut().find(|e| e.key == key)?;
        if entry.until <= now {
            // Expired: free the way.
            *entry = Entry::default();
            return None;
        }
        if cost < entry.cost {
            return None;
        }
        let e = *entry;
        drop(set);
        self.hits.0.fetch_add(1, Ordering::Relaxed);
        Some(Verdict::reject(
            e.remaining,
            e.reset_at.saturating_sub(now),
            e.until - now,
        ))
    }

    /// Remembers the store's rejection `verdict` of a request of `cost` for `key` at `now`.
    /// An admission or a zero `retry_after` is not cached.
    pub fn insert(&self, key: u64, cost: u64, verdict: &Verdict, now: Nanos) {
        if verdict.allowed || verdict.retry_after == 0 {
            return;
        }
        let key = key.max(1);
        let entry = Entry {
            key,
            cost,
            until: now.saturating_add(verdict.retry_after),
            reset_at: now.saturating_add(verdict.reset_after),
            remaining: verdict.remaining,
        };
        let mut set = self.set(key).lock();
        // The key's own way, else an empty or expired one, else the one expiring first.
        let mut way = 0;
        let mut best = u64::MAX;
        for (i, e) in set.iter().enumerate() {
            if e.key == key {
                way = i;
                break;
            }
            let score = if e.key == 0 || e.until <= now {
                0
            } else {
                e.until
            };
            if score < best {
                best = score;
                way = i;
            }
        }
        set[way] = entry;
    }

    /// Requests answered from the cache since construction: the store calls it saved.
    pub fn hits(&self) -> u64 {
        self.hits.0.load(Ordering::Relaxed)
    }

    fn set(&self, key: u64) -> &Mutex<[Entry; WAYS]> {
        let index = (u128::from(key) * self.sets.len() as u128) >> 64;
        &self.sets[index as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    #[test]
    fn answers_until_retry_after_for_costs_at_least_the_cached_one() {
        let c = DenyCache::new(64);
        let v = Verdict::reject(0, 900 * MS, 300 * MS);
        c.insert(5, 2, &v, 1_000 * MS);
        assert_eq!(
            c.check(5, 2, 1_100 * MS),
            Some(Verdict::reject(0, 800 * MS, 200 * MS))
        );
        assert!(c.check(5, 3, 1_299 * MS).is_some());
        assert_eq!(c.check(5, 1, 1_100 * MS), None, "a cheaper request may fit");
        assert_eq!(c.check(6, 2, 1_100 * MS), None);
        assert_eq!(c.check(5, 2, 1_300 * MS), None, "expired at retry_after");
        assert_eq!(c.check(5, 2, 1_200 * MS), None, "and freed");
        assert_eq!(c.hits(), 2);
        // Admissions and zero waits are not cached.
        c.insert(7, 1, &Verdict::allow(3, MS), 0);
        c.insert(8, 1, &Verdict::reject(0, 0, 0), 0);
        assert_eq!((c.check(7, 1, 0), c.check(8, 1, 0)), (None, None));
        // Key 0 is stored as 1.
        c.insert(0, 1, &v, 0);
        assert!(c.check(0, 1, 0).is_some() && c.check(1, 1, 0).is_some());
    }

    #[test]
    fn bounded_replacing_the_first_to_expire() {
        let c = DenyCache::new(8);
        assert_eq!(c.sets.len(), 1);
        for key in 1..=8u64 {
            c.insert(key, 1, &Verdict::reject(0, 0, key * MS), 0);
        }
        c.insert(100, 1, &Verdict::reject(0, 0, 50 * MS), 0);
        assert_eq!(c.check(1, 1, 0), None, "key 1 expired first: replaced");
        assert!((2..=8).all(|k| c.check(k, 1, 0).is_some()));
        assert!(c.check(100, 1, 0).is_some());
        // Re-inserting a key reuses its way.
        c.insert(100, 1, &Verdict::reject(0, 0, 60 * MS), 0);
        assert!((2..=8).all(|k| c.check(k, 1, 0).is_some()));
        assert_eq!(
            c.check(100, 1, 55 * MS).map(|v| v.retry_after),
            Some(5 * MS)
        );
        assert_eq!(size_of::<Entry>(), 40);
    }
}
