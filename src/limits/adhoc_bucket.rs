//! Ad-hoc token buckets: per-key buckets whose parameters arrive with each call, after
//! Smyte's rate limiter (`RL.REDUCE key max refill_seconds ...` of the limiter API).
//!
//! A bucket is identified by its key **and** its parameters `(capacity, amount, every)`: two
//! callers that name the same key with different parameters never share a bucket. The
//! semantics are those of [`token_bucket`](crate::limits::token_bucket): a new bucket starts
//! full; at `now`, `n = ⌊(now - last) / every⌋` refills are due,
//! `tokens = min(capacity, tokens + n·amount)` and `last += n·every` (`last = now` once
//! full); a take of `cost` happens iff `tokens ≥ cost`; a strict rejection sets
//! `last = now`. Callers may bring their own clock (the API's `AT`), so time may arrive out
//! of order: a `now` older than a bucket's `last` is read as `last` (time never goes
//! backwards within a bucket, and an old timestamp neither refills nor rewinds it).
//!
//! A full bucket behaves exactly like an absent one, so full buckets are not stored.
//!
//! **Table.** The same fixed set-associative table as the token bucket's, for the same
//! reasons: `sets = ⌈max_keys / 8⌉` sets of 8 slots, each set behind its own
//! `parking_lot::Mutex`, the set picked by Lemire's multiply-high of the key hash. A slot
//! holds the key hash, the parameters and the bucket; a lookup matches the hash and the
//! parameters exactly, so the parameters are part of the identity even if two keys'
//! hashes met (the caller mixes the parameters into the hash too, so that one key's
//! several parameter sets spread over different sets). Two distinct keys with the same
//! parameters share a bucket only if their 64-bit hashes collide: odds `n² / 2⁶⁵` for `n`
//! live keys, about 3·10⁻⁸ for a million. A decision locks one set, scans 8 slots and
//! unlocks: no allocation, no other lock, no syscall.
//!
//! **Memory bound.** A slot is 48 bytes (hash, three parameters, tokens, last), a set 8
//! slots plus its lock padded to 8: 392 bytes, i.e. 49 bytes per key of `max_keys`, all
//! allocated by [`AdhocBuckets::new`] and never grown: 100 000 keys take 4.9 MB.
//!
//! **Eviction** is the token bucket's: an empty slot, else a bucket full by `now` (equal to
//! absent, nothing lost), else the bucket nearest to full at `now`, counted by
//! [`AdhocBuckets::evictions`]; the evicted key starts full again and fails open once by at
//! most the tokens it lacked. Since a key only uses its own set, size `max_keys` at twice
//! the keys expected to hold state at once (the share of keys beyond their set's 8 ways is
//! 0.8% at half load, 14% at full load).

use crate::limits::clock::Nanos;
use crate::limits::table::Table;
use crate::limits::token_bucket::{Bucket, Refill};
use crate::limits::verdict::Verdict;

/// The parameters of one ad-hoc bucket, part of its identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AdhocParams {
    /// Tokens a full bucket holds; a new bucket starts full.
    pub capacity: u64,
    /// Tokens added per refill.
    pub amount: u64,
    /// Nanoseconds between refills.
    pub every: Nanos,
}

impl AdhocParams {
    /// The parameters with `amount` and `every` raised to at least 1, so that a bad call
    /// degrades the limit instead of dividing by zero (the API refuses zeros anyway).
    pub fn normalized(self) -> Self {
        Self {
            capacity: self.capacity,
            amount: self.amount.max(1),
            every: self.every.max(1),
        }
    }
}

impl Refill for &AdhocParams {
    fn parts(self) -> (u64, u64, Nanos) {
        (self.capacity, self.amount, self.every)
    }
}

/// Token buckets created on first use, with per-call parameters, in a bounded table.
pub struct AdhocBuckets {
    table: Table<Held>,
}

/// A bucket's parameters (part of its identity) and its state: 40 bytes (a slot with its
/// key, 48).
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    params: AdhocParams,
    bucket: Bucket,
}

impl AdhocBuckets {
    /// A table holding state for at most `max_keys` buckets (0 is raised to 1), allocated
    /// once (49 bytes per key, see the module doc).
    pub fn new(max_keys: usize) -> Self {
        Self {
            table: Table::new(max_keys, ()),
        }
    }

    /// Takes `cost` tokens from the bucket `(key, params)` at `now` if it holds them.
    ///
    /// `remaining` is the tokens left after the decision (so the tokens held before it are
    /// `remaining + cost` when admitted, `remaining` when rejected), `reset_after` the time
    /// until the bucket is full, and a rejection's `retry_after` the time until the refill
    /// that brings `cost` tokens (for a `cost` above `capacity`, which never passes, the
    /// time to fill an empty bucket: a hint, not a promise). `strict` makes a rejection
    /// reset the refill clock.
    pub fn acquire(
        &self,
        key: u64,
        params: AdhocParams,
        cost: u64,
        strict: bool,
        now: Nanos,
    ) -> Verdict {
        let p = params.normalized();
        // Time never goes backwards within a bucket: a `now` older than its `last` is read
        // as `last` (see the module doc).
        let ((admitted, now), held) = self.table.update(
            key,
            |h| h.params == p,
            |held| {
                held.map_or_else(
                    || Held {
                        params: p,
                        bucket: Bucket::full(&p, now),
                    },
                    |h| Held {
                        bucket: h.bucket.refilled(&p, now.max(h.bucket.last)),
                        ..h
                    },
                )
            },
            |h| {
                let now = now.max(h.bucket.last);
                if h.bucket.tokens >= cost {
                    h.bucket.tokens -= cost;
                    return (true, now);
                }
                if strict {
                    h.bucket.last = now;
                }
                (false, now)
            },
            |h| h.bucket.tokens < p.capacity,
            |_, h| h.bucket.score(&h.params, now.max(h.bucket.last)),
            0,
        );
        let bucket = held.bucket;
        let reset = bucket.wait_for(&p, p.capacity, now);
        if admitted {
            return Verdict::allow(bucket.tokens, reset);
        }
        let retry = if cost > p.capacity {
            p.capacity.div_ceil(p.amount).saturating_mul(p.every)
        } else {
            bucket.wait_for(&p, cost, now)
        };
        Verdict::reject(bucket.tokens, reset, retry.max(1))
    }

    /// Tokens the bucket `(key, params)` holds at `now`, without taking any (capacity for a
    /// bucket without state). A read changes nothing, not even a bucket's clock.
    pub fn state(&self, key: u64, params: AdhocParams, now: Nanos) -> u64 {
        let p = params.normalized();
        let held = self.table.get(key, |h| h.params == p);
        held.map_or(p.capacity, |h| h.bucket.refilled(&p, now).tokens)
    }

    /// Buckets currently holding state (a bucket full by now counts until touched).
    ///
    /// Locks each set in turn: for metrics, `INFO` and tests, not the hot path.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no bucket holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots in the table: `max_keys` rounded up to whole sets of 8.
    pub fn slots(&self) -> usize {
        self.table.slots()
    }

    /// Buckets evicted before they were full, since construction: each one's key starts
    /// full again, so a rising count means `max_keys` is too small.
    pub fn evictions(&self) -> u64 {
        self.table.evictions()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::testing::spread;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const SEC: Nanos = 1_000_000_000;

    fn params(capacity: u64, amount: u64, every: Nanos) -> AdhocParams {
        AdhocParams {
            capacity,
            amount,
            every,
        }
    }

    impl AdhocBuckets {
        /// [`AdhocBuckets::state`]: the tests' shorthand.
        fn tokens(&self, key: u64, params: AdhocParams, now: Nanos) -> u64 {
            self.state(key, params, now)
        }
    }

    /// The tokens held before a take, as `RL.REDUCE` replies them.
    fn before(v: Verdict, cost: u64) -> u64 {
        if v.allowed {
            v.remaining + cost
        } else {
            v.remaining
        }
    }

    #[test]
    fn two_per_minute_replies_two_one_zero() {
        let b = AdhocBuckets::new(100);
        let p = params(2, 2, 60 * SEC);
        let got: Vec<_> = (0..3)
            .map(|i| before(b.acquire(7, p, 1, false, i * SEC), 1))
            .collect();
        assert_eq!(got, [2, 1, 0]);
        let v = b.acquire(7, p, 1, false, 2 * SEC);
        assert_eq!(v, Verdict::reject(0, 58 * SEC, 58 * SEC));
        // The whole bucket refills a minute after the first take.
        assert_eq!(b.tokens(7, p, 60 * SEC - 1), 0);
        assert_eq!(b.tokens(7, p, 60 * SEC), 2);
        assert_eq!(b.len(), 1, "a read leaves the state as it was");
    }

    #[test]
    fn parameters_are_part_of_the_identity() {
        let b = AdhocBuckets::new(100);
        let (p, q) = (params(2, 2, 60 * SEC), params(3, 3, 60 * SEC));
        assert!(b.acquire(7, p, 2, false, 0).allowed);
        assert_eq!(b.tokens(7, p, 0), 0);
        assert_eq!(
            b.tokens(7, q, 0),
            3,
            "same key, other params: another bucket"
        );
        assert_eq!(b.tokens(7, params(2, 1, 60 * SEC), 0), 2);
        assert_eq!(b.tokens(7, params(2, 2, 59 * SEC), 0), 2);
        assert!(b.acquire(7, q, 3, false, 0).allowed);
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn time_never_goes_backwards_within_a_bucket() {
        let b = AdhocBuckets::new(100);
        let p = params(3, 1, 10 * SEC);
        assert!(b.acquire(1, p, 3, false, 100 * SEC).allowed);
        // An older timestamp is the bucket's last time: no refill, no rewind.
        assert_eq!(before(b.acquire(1, p, 1, true, 50 * SEC), 1), 0);
        assert_eq!(
            b.tokens(1, p, 110 * SEC),
            1,
            "strict reset at 100 s, not 50 s"
        );
        assert_eq!(b.acquire(1, p, 1, false, 0).remaining, 0, "still at 100 s");
        assert_eq!(b.tokens(1, p, 110 * SEC), 1);
    }

    #[test]
    fn strict_keeps_a_hammering_client_out() {
        let b = AdhocBuckets::new(100);
        let p = params(1, 1, SEC);
        assert!(b.acquire(1, p, 1, true, 0).allowed);
        for i in 1..6 {
            assert!(!b.acquire(1, p, 1, true, i * SEC / 2).allowed);
        }
        assert!(!b.acquire(1, p, 1, true, 5 * SEC / 2 + SEC - 1).allowed);
        assert!(
            b.acquire(1, p, 1, true, 5 * SEC / 2 + SEC - 1 + SEC)
                .allowed
        );
    }

    #[test]
    fn bounded_and_counts_evictions() {
        let b = AdhocBuckets::new(1_000);
        for i in 0..50_000 {
            assert!(b.acquire(spread(i), params(5, 1, SEC), 1, false, 0).allowed);
        }
        assert_eq!((b.len(), b.slots(), b.evictions()), (1_000, 1_000, 49_000));
        assert_eq!(size_of::<crate::limits::table::Set<Held>>(), 392);
        // Zero parameters never panic.
        let z = b.acquire(3, params(0, 0, 0), 1, true, 5);
        assert!(!z.allowed);
        assert_eq!(b.tokens(3, params(0, 0, 0), 9), 0);
        assert_eq!(AdhocBuckets::new(0).slots(), 8);
    }

    #[test]
    fn eviction_prefers_full_then_nearest_to_full_by_each_slots_own_params() {
        let b = AdhocBuckets::new(8);
        // Keys 1..=8 in the one set; key k misses k tokens of 100, refills of 1 per second,
        // except key 8 whose bucket refills fully every second.
        for k in 1..=7 {
            assert!(b.acquire(k, params(100, 1, SEC), k, false, 0).allowed);
        }
        assert!(b.acquire(8, params(100, 100, SEC), 50, false, 0).allowed);
        // At 1 s keys 1 (1 missing, 1 refilled) and 8 (refilled whole) are full again:
        // both slots are reused without an eviction.
        assert!(b.acquire(9, params(100, 1, SEC), 50, false, SEC).allowed);
        assert!(b.acquire(10, params(100, 1, SEC), 50, false, SEC).allowed);
        assert_eq!(b.evictions(), 0);
        // Nothing is full now: key 2, missing the fewest tokens (1), is evicted.
        assert!(b.acquire(11, params(100, 1, SEC), 50, false, SEC).allowed);
        assert_eq!(b.evictions(), 1);
        assert_eq!(b.tokens(2, params(100, 1, SEC), SEC), 100, "key 2 evicted");
        assert_eq!(b.tokens(3, params(100, 1, SEC), SEC), 98);
    }

    /// The semantics written literally: the oracle of the proptest.
    #[derive(Debug, Clone)]
    struct Model {
        p: AdhocParams,
        tokens: u64,
        last: Nanos,
    }

    impl Model {
        fn acquire(&mut self, cost: u64, strict: bool, now: Nanos) -> (bool, u64) {
            let now = now.max(self.last);
            let n = (now - self.last) / self.p.every;
            self.tokens = (self.tokens + n * self.p.amount).min(self.p.capacity);
            self.last += n * self.p.every;
            if self.tokens == self.p.capacity {
                self.last = now;
            }
            let admitted = self.tokens >= cost;
            if admitted {
                self.tokens -= cost;
            } else if strict {
                self.last = now;
            }
            if self.tokens == self.p.capacity {
                // Full is absent: a forgotten bucket has no clock to hold time back.
                self.last = 0;
            }
            (admitted, self.tokens)
        }
    }

    proptest! {
        #[test]
        fn matches_the_model(
            steps in prop::collection::vec(
                (0u64..3, 0u64..3, 0u64..3_000, 0u64..8, any::<bool>(), any::<bool>()),
                1..150,
            )
        ) {
            let table = [params(3, 1, 1_000), params(5, 2, 700), params(4, 4, 1_000)];
            let b = AdhocBuckets::new(1 << 12);
            let mut models: HashMap<(u64, usize), Model> = HashMap::new();
            let mut now: Nanos = 10_000;
            for (key, which, step, cost, strict, back) in steps {
                // Now and then a caller's clock runs behind.
                let at = if back { now.saturating_sub(step) } else { now += step; now };
                let p = table[which as usize];
                let model = models.entry((key, which as usize)).or_insert(Model {
                    p,
                    tokens: p.capacity,
                    last: 0,
                });
                let v = b.acquire(spread(key), p, cost, strict, at);
                prop_assert_eq!((v.allowed, v.remaining), model.acquire(cost, strict, at));
            }
        }
    }
}
