//! The token bucket limiter: exact per-key buckets with discrete refills, after Smyte's
//! rate limiter, in a fixed-size set-associative table.
//!
//! A key's bucket holds `tokens ≤ capacity` and the instant `last` of its latest refill.
//! At `now`, `n = ⌊(now - last) / every⌋` refills are due:
//! `tokens = min(capacity, tokens + n·amount)` and `last += n·every`, or `last = now` once
//! the bucket is full. A request of cost `c` is admitted iff `tokens ≥ c`, then
//! `tokens -= c`. In strict mode a rejection also sets `last = now`, so a client hammering
//! an empty bucket stays blocked until it pauses for a whole `every`.
//!
//! A full bucket behaves exactly like a new key, so full buckets are not stored: only keys
//! that spent tokens recently hold state, and an operation that leaves a bucket full frees
//! its slot.
//!
//! **Table.** `sets = ⌈max_keys / 8⌉` sets of 8 slots, each set behind its own
//! `parking_lot::Mutex` (no global lock). Keys are already good 64-bit hashes, so Lemire's
//! multiply-high `⌊key · sets / 2⁶⁴⌋` picks the set, with no division and no rounding of
//! `sets` to a power of two. A slot is `(key, tokens, last)`, key 0 meaning empty, so a
//! real key 0 is stored as 1 (a hash collision of 2⁻⁶⁴ odds, harmless). A decision locks
//! one set, scans its 8 slots and unlocks: no allocation, no other set, no syscall.
//!
//! **Memory bound.** 24 bytes a slot, and a set is 8 slots plus its 1-byte lock padded to 8:
//! 200 bytes, i.e. 25 bytes per key of `max_keys` (plus under 200 bytes of rounding to
//! whole sets and a 256-byte header), all allocated once by [`TokenBucket::new`], never
//! grown: 100 000 keys take 2.5 MB (2.38 MiB), 1 M keys 25 MB. Sets are not padded to
//! cache lines, on purpose: two cores rarely want neighbouring sets, and padding would cost
//! 28% more memory.
//!
//! **Eviction.** A key that needs state takes an empty slot of its set, else a slot whose
//! bucket is full by `now` (that equals absent: nothing is lost). Failing both, it evicts
//! the bucket holding the most tokens at `now`, the earliest refilled among equals: the
//! nearest to full, whose key starts full again and so fails open once, by at most the
//! tokens it lacked. That is the price of bounded memory, counted by
//! [`TokenBucket::evictions`]. A key can only use its own set, so eviction starts before
//! `max_keys` keys hold state: with `a` of them hashed uniformly, a set gets about
//! Poisson(8a / max_keys), and the share of keys beyond their set's 8 ways is 0.01% at
//! `a = max_keys / 4`, 0.8% at `max_keys / 2`, 5% at `3/4` and 14% at `max_keys`. Size
//! `max_keys` at twice the keys expected to hold state at once.

use crate::limits::clock::Nanos;
use crate::limits::restore::Restored;
use crate::limits::table::{self, Table};
use crate::limits::verdict::{Grant, Verdict, NEVER};
use crate::limits::victim::Score;

/// Parameters of a token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketParams {
    /// Tokens a full bucket holds; a new key starts full.
    pub capacity: u64,
    /// Tokens added per refill.
    pub amount: u64,
    /// Nanoseconds between refills.
    pub every: Nanos,
    /// A rejection also resets the refill clock.
    pub strict: bool,
}

/// What a bucket holds and how it refills: the token bucket's parameters, or an ad-hoc
/// bucket's (which come with each call), so that both run the same [`Bucket`] arithmetic.
pub(crate) trait Refill: Copy {
    /// Tokens a full bucket holds.
    fn capacity(self) -> u64;
    /// Tokens added per refill, at least 1.
    fn amount(self) -> u64;
    /// Nanoseconds between refills, at least 1.
    fn every(self) -> Nanos;
}

impl Refill for &TokenBucketParams {
    fn capacity(self) -> u64 {
        self.capacity
    }
    fn amount(self) -> u64 {
        self.amount
    }
    fn every(self) -> Nanos {
        self.every
    }
}

/// Exact per-key token buckets.
///
/// Exact because a key's tokens are its own, unlike a sketch's shared counters: a bucket
/// is the limit customers are promised, so it must not overcount.
pub struct TokenBucket {
    /// The buckets, headed by the parameters.
    table: Table<Bucket, TokenBucketParams>,
}

/// One key's state: 16 bytes (a slot with its key, 24).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// Tokens held after the last refill applied.
    pub(crate) tokens: u64,
    /// The instant of the last refill applied.
    pub(crate) last: Nanos,
}

impl TokenBucket {
    /// The most keys one table may hold: 2²⁴, 16 777 216 keys in 400 MiB.
    pub const MAX_KEYS: usize = table::MAX_KEYS;

    /// The bytes [`TokenBucket::new`] allocates for `max_keys` (after the same clamping):
    /// whole sets of 8 slots, 25 bytes a key.
    pub fn table_bytes(max_keys: usize) -> usize {
        Table::<Bucket>::bytes_for(max_keys.min(Self::MAX_KEYS))
    }

    /// The sets [`TokenBucket::new`] allocates for `max_keys`.
    #[cfg(test)]
    fn sets_for(max_keys: usize) -> usize {
        Table::<Bucket>::sets_for(max_keys.min(Self::MAX_KEYS))
    }

    /// Buckets with `params`, holding state for at most `max_keys` keys (see the module doc
    /// for the memory this allocates up front and for how eviction starts).
    ///
    /// `amount`, `every` and `max_keys` of 0 are raised to 1, so bad parameters degrade the
    /// limit instead of panicking on the hot path (the config rejects them anyway).
    /// `max_keys` above [`Self::MAX_KEYS`] is cut to it, so no value can make the table
    /// allocate more than 400 MiB (the config refuses such values too).
    pub fn new(params: TokenBucketParams, max_keys: usize) -> Self {
        let params = TokenBucketParams {
            amount: params.amount.max(1),
            every: params.every.max(1),
            ..params
        };
        Self {
            table: Table::new(max_keys.min(Self::MAX_KEYS), params),
        }
    }

    /// Decides a request of `cost` tokens for `key` at `now`.
    ///
    /// `remaining` is the tokens left, `reset_after` the time until the bucket is full
    /// again, and a rejection's `retry_after` the time until the refill that brings
    /// `cost` tokens. A `cost` above `capacity` can never pass (with `capacity: 0` that is
    /// a deliberate block): its `retry_after` is [`NEVER`], so no client is invited back.
    pub fn acquire(&self, key: u64, cost: u64, now: Nanos) -> Verdict {
        let p = self.table.head();
        let (admitted, bucket) = self.with_bucket(key, now, |bucket| {
            if bucket.tokens >= cost {
                bucket.tokens -= cost;
                return true;
            }
            if p.strict {
                bucket.last = now;
            }
            false
        });
        // The verdict's divisions are done after the set is unlocked.
        let reset = bucket.wait_for(p, p.capacity, now);
        if admitted {
            return Verdict::allow(bucket.tokens, reset);
        }
        let retry = if cost > p.capacity {
            // Never: `capacity: 0` is a deliberate block, and no refill makes room for more
            // than a full bucket.
            NEVER
        } else {
            bucket.wait_for(p, cost, now).max(1)
        };
        Verdict::reject(bucket.tokens, reset, retry)
    }

    /// Decides a request for between `min` and `want` tokens for `key` at `now`: takes the
    /// largest `n` in `[min, want]` that the bucket holds, i.e. `n = min(tokens, want)` if
    /// `tokens ≥ min`, or nothing (a `min` above `want` is lowered to `want`).
    ///
    /// The verdict is that of [`acquire`](Self::acquire) for a request of `n` tokens when
    /// admitted; a rejection is that of a request of `min` tokens (a strict bucket resets
    /// its refill clock; `retry_after` is the time until `min` tokens are back, [`NEVER`]
    /// when `min` is above `capacity`). `acquire_many(key, c, c, now)` decides exactly as
    /// `acquire(key, c, now)`.
    pub fn acquire_many(&self, key: u64, min: u64, want: u64, now: Nanos) -> Grant {
        let p = self.table.head();
        let min = min.min(want);
        let (granted, bucket) = self.with_bucket(key, now, |bucket| {
            if bucket.tokens >= min {
                let n = bucket.tokens.min(want);
                bucket.tokens -= n;
                return Some(n);
            }
            if p.strict {
                bucket.last = now;
            }
            None
        });
        let reset = bucket.wait_for(p, p.capacity, now);
        if let Some(granted) = granted {
            return Grant {
                verdict: Verdict::allow(bucket.tokens, reset),
                granted,
            };
        }
        let retry = if min > p.capacity {
            NEVER
        } else {
            bucket.wait_for(p, min, now).max(1)
        };
        Grant::rejected(Verdict::reject(bucket.tokens, reset, retry))
    }

    /// Gives back `cost` tokens taken by an admitted request (a later limit rejected it).
    ///
    /// Due refills apply first and the bucket never exceeds `capacity`; a key without state
    /// is full, so refunding it changes nothing.
    pub fn refund(&self, key: u64, cost: u64, now: Nanos) {
        let capacity = self.table.head().capacity;
        self.with_bucket(key, now, |bucket| {
            bucket.tokens = bucket.tokens.saturating_add(cost).min(capacity);
        });
    }

    /// Tokens `key` holds at `now` and the instant of the last refill applied, taking
    /// nothing and changing nothing (the admin API's `/state`, snapshots' tests); `None` for
    /// the instant when the key holds no state (its bucket is full).
    pub fn state(&self, key: u64, now: Nanos) -> (u64, Option<Nanos>) {
        let held = self.table.get(key, |_| true);
        held.map_or((self.table.head().capacity, None), |b| {
            let b = b.refilled(self.table.head(), now);
            (b.tokens, Some(b.last))
        })
    }

    /// The parameters (`amount` and `every` at least 1).
    pub fn params(&self) -> TokenBucketParams {
        *self.table.head()
    }

    /// Keys currently holding state (a bucket full by now still counts until touched).
    ///
    /// Locks each set in turn, so it is for metrics and tests, not the hot path.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Buckets evicted before they were full, since construction.
    ///
    /// Each is a key that starts full again and fails open once: a rising count means
    /// `max_keys` is too small for the keys holding state. Reusing the slot of a bucket
    /// that is full by now loses nothing and is not counted.
    pub fn evictions(&self) -> u64 {
        self.table.evictions()
    }

    /// Runs `f` on `key`'s bucket refilled to `now`, then stores it, or frees its slot if
    /// full (a new key's bucket starts full and takes a slot only if `f` leaves it below
    /// capacity). Returns `f`'s result and the bucket after it.
    #[inline(always)]
    fn with_bucket<R>(
        &self,
        key: u64,
        now: Nanos,
        f: impl FnOnce(&mut Bucket) -> R,
    ) -> (R, Bucket) {
        let p = self.table.head();
        self.table.update(
            key,
            |_| true,
            |held| held.map_or_else(|| Bucket::full(p, now), |b| b.refilled(p, now)),
            f,
            |b| b.tokens < p.capacity,
            |_, b| b.score(p, now),
            0,
        )
    }
}

impl Bucket {
    /// A new key's bucket.
    pub(crate) fn full(p: impl Refill, now: Nanos) -> Self {
        Self {
            tokens: p.capacity(),
            last: now,
        }
    }

    /// The bucket after the refills due at `now` (`now ≥ last`, or no refill is due); `self`
    /// is a stored bucket, so not full.
    #[inline(always)]
    pub(crate) fn refilled(self, p: impl Refill, now: Nanos) -> Self {
        if now.saturating_sub(self.last) < p.every() {
            // No refill due: the common case, without a division.
            return self;
        }
        self.refill(p, now)
    }

    /// [`Bucket::refilled`] once a refill is due, kept out of line so that the scan of a
    /// set stays small.
    #[inline(never)]
    fn refill(self, p: impl Refill, now: Nanos) -> Self {
        let due = now.saturating_sub(self.last) / p.every();
        let tokens = self
            .tokens
            .saturating_add(due.saturating_mul(p.amount()))
            .min(p.capacity());
        if tokens >= p.capacity() {
            return Self::full(p, now);
        }
        Self {
            tokens,
            // due · every ≤ now - last: no overflow.
            last: self.last + due * p.every(),
        }
    }

    /// Nanoseconds from `now` until the refill that brings the bucket to `want` tokens.
    pub(crate) fn wait_for(&self, p: impl Refill, want: u64, now: Nanos) -> Nanos {
        let refills = want.saturating_sub(self.tokens).div_ceil(p.amount());
        refills
            .saturating_mul(p.every())
            .saturating_sub(now.saturating_sub(self.last))
    }

    /// What forgetting this stored bucket would wrongly admit at `now`
    /// ([`crate::limits::victim`]): a new key starts full, so the loss is the tokens it
    /// lacks, and it empties (equals a new key) when it is full again. A bucket full by
    /// `now` is free.
    pub(crate) fn score(self, p: impl Refill, now: Nanos) -> Score {
        let b = self.refilled(p, now);
        let missing = p.capacity().saturating_sub(b.tokens);
        if missing == 0 {
            return Score::FREE;
        }
        Score::new(
            missing,
            now.saturating_add(b.wait_for(p, p.capacity(), now)),
            now,
        )
    }
}

/// One key's stored bucket, as [`TokenBucket::export`] reads it and [`TokenBucket::import`]
/// takes it back: the tokens after the last refill applied, and that refill's instant. The
/// refills due since then are not applied (they are a function of `last`), so a bucket
/// restored with its `last` mapped into the new process keeps refilling over the downtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketEntry {
    /// The key's hash (never 0: key 0 is stored as 1).
    pub key: u64,
    /// Tokens held, below `capacity` (a full bucket is not stored).
    pub tokens: u64,
    /// The instant of the last refill applied.
    pub last: Nanos,
}

impl TokenBucket {
    /// Calls `f` for every key holding state (a bucket full by now is included until
    /// touched; [`TokenBucket::import`] drops it). Each set is locked only while its 8
    /// slots are copied: decisions wait at most that long, and `f` runs with no lock held.
    pub fn export(&self, mut f: impl FnMut(BucketEntry)) {
        self.table.each(|slot| {
            f(BucketEntry {
                key: slot.key,
                tokens: slot.value.tokens,
                last: slot.value.last,
            })
        });
    }

    /// Puts a saved bucket back at `now`: refilled as the semantics say (a `last` after
    /// `now` is taken as `now`), it is stored unless it is full by now. It replaces the
    /// key's state if the key has some, else takes an empty slot or one whose bucket is
    /// full by now; it never evicts (see [`crate::limits::restore`]).
    pub fn import(&self, entry: BucketEntry, now: Nanos) -> Restored {
        let p = self.table.head();
        let saved = Bucket {
            tokens: entry.tokens.min(p.capacity),
            last: entry.last.min(now),
        };
        let bucket = if saved.tokens >= p.capacity {
            Bucket::full(p, now)
        } else {
            saved.refilled(p, now)
        };
        let kept = (bucket.tokens < p.capacity).then_some(bucket);
        self.table
            .put(entry.key, kept, |b| b.refilled(p, now).tokens >= p.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::table::WAYS;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const SEC: Nanos = 1_000_000_000;
    const MS: Nanos = 1_000_000;

    fn params(capacity: u64, amount: u64, every: Nanos, strict: bool) -> TokenBucketParams {
        TokenBucketParams {
            capacity,
            amount,
            every,
            strict,
        }
    }

    impl TokenBucket {
        /// The tokens of [`TokenBucket::state`]: the tests' shorthand.
        pub(crate) fn tokens(&self, key: u64, now: Nanos) -> u64 {
            self.state(key, now).0
        }
    }

    /// Spreads small test keys over the sets, as real (hashed) keys are.
    fn spread(i: u64) -> u64 {
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    #[test]
    fn the_table_never_exceeds_max_keys() {
        let p = params(5, 1, SEC, false);
        // Valid sizes are kept exactly: whole sets of 8, 25 bytes a key.
        assert_eq!(TokenBucket::new(p, 1000).table.sets(), 125);
        assert_eq!(TokenBucket::new(p, 1001).table.sets(), 126);
        assert_eq!(TokenBucket::table_bytes(100_000), 2_500_000);
        assert_eq!(
            TokenBucket::table_bytes(TokenBucket::MAX_KEYS),
            400 << 20,
            "the largest table is 400 MiB"
        );
        // Anything larger is cut to the bound instead of overflowing or allocating
        // terabytes (building that table here would touch 400 MiB, so the size it would
        // take is checked through the same function `new` uses).
        for huge in [TokenBucket::MAX_KEYS + 1, 1_000_000_000_000, usize::MAX] {
            assert_eq!(TokenBucket::sets_for(huge), TokenBucket::MAX_KEYS / WAYS);
            assert_eq!(TokenBucket::table_bytes(huge), 400 << 20);
        }
        assert_eq!(TokenBucket::new(p, 0).table.sets(), 1);
    }

    #[test]
    fn new_key_is_full_and_full_keys_hold_no_state() {
        let b = TokenBucket::new(params(5, 1, SEC, false), 100);
        assert_eq!(b.tokens(1, 0), 5);
        assert!(b.is_empty());
        assert_eq!(b.acquire(1, 0, 0), Verdict::allow(5, 0));
        assert!(b.is_empty(), "cost 0 leaves the bucket full");
        assert_eq!(b.acquire(1, 2, 0), Verdict::allow(3, 2 * SEC));
        assert!(b.acquire(2, 5, 0).allowed);
        assert_eq!(b.len(), 2);
        assert_eq!(b.acquire(1, 0, 2 * SEC), Verdict::allow(5, 0));
        assert_eq!(b.len(), 1, "key 1 refilled to full: its slot is freed");
        assert_eq!(b.params(), params(5, 1, SEC, false));
        // Key 0 marks empty slots, so it is stored as key 1: a harmless hash collision.
        assert!(b.acquire(0, 1, 2 * SEC).allowed);
        assert_eq!((b.tokens(1, 2 * SEC), b.len()), (4, 2));
    }

    #[test]
    fn refills_are_discrete() {
        let b = TokenBucket::new(params(5, 2, SEC, false), 100);
        assert_eq!(b.acquire(1, 5, 0), Verdict::allow(0, 3 * SEC));
        assert_eq!(b.tokens(1, SEC - 1), 0);
        assert_eq!(b.tokens(1, SEC), 2);
        assert_eq!(b.tokens(1, 2 * SEC - 1), 2);
        assert_eq!(b.tokens(1, 2 * SEC), 4);
        assert_eq!(b.tokens(1, 3 * SEC), 5);
        // A refill clock that keeps its phase: last moves by whole intervals.
        assert_eq!(
            b.acquire(1, 1, SEC + SEC / 2),
            Verdict::allow(1, SEC / 2 + SEC)
        );
        assert_eq!(b.tokens(1, 2 * SEC), 3);
        assert_eq!(b.acquire(1, 3, 2 * SEC), Verdict::allow(0, 3 * SEC));
    }

    #[test]
    fn strict_blocks_a_hammering_client_until_it_pauses() {
        let lax = TokenBucket::new(params(2, 1, SEC, false), 100);
        let strict = TokenBucket::new(params(2, 1, SEC, true), 100);
        for b in [&lax, &strict] {
            assert!(b.acquire(1, 2, 0).allowed);
        }
        let hammer = |b: &TokenBucket| -> Vec<bool> {
            (1..=6)
                .map(|i| b.acquire(1, 1, i * SEC / 2).allowed)
                .collect()
        };
        assert_eq!(hammer(&lax), [false, true, false, true, false, true]);
        assert_eq!(hammer(&strict), [false; 6]);
        let v = strict.acquire(1, 1, 3 * SEC + SEC / 2);
        assert_eq!(v, Verdict::reject(0, 2 * SEC, SEC));
        // A pause of a whole interval gets a token.
        assert!(!strict.acquire(1, 1, 4 * SEC + SEC / 2 - 1).allowed);
        assert!(strict.acquire(1, 1, 5 * SEC + SEC / 2 - 1).allowed);
    }

    #[test]
    fn cost_above_tokens_and_above_capacity() {
        let b = TokenBucket::new(params(10, 2, SEC, false), 100);
        assert!(b.acquire(1, 7, 0).allowed);
        // 3 tokens, cost 8: ceil(5 / 2) = 3 refills, the first 0.4 s away; full after 4.
        let v = b.acquire(1, 8, 600 * MS);
        assert_eq!(
            v,
            Verdict::reject(3, 4 * SEC - 600 * MS, 3 * SEC - 600 * MS)
        );
        assert_eq!(b.tokens(1, 600 * MS), 3, "a rejection takes nothing");
        // Capacity 10, cost 11: never, so no retry is invited.
        let v = b.acquire(2, 11, 0);
        assert_eq!(v, Verdict::reject(10, 0, NEVER));
        assert!(v.is_block());
        assert_eq!(b.len(), 1, "the full key 2 holds no state");
    }

    #[test]
    fn refund_gives_back_up_to_capacity() {
        let b = TokenBucket::new(params(4, 1, SEC, false), 100);
        assert!(b.acquire(1, 3, 0).allowed);
        b.refund(1, 2, 0);
        assert_eq!(b.tokens(1, 0), 3);
        // Refills first (one due at 1 s), then the refund, capped: full, so dropped.
        b.refund(1, 5, SEC);
        assert_eq!(b.tokens(1, SEC), 4);
        assert!(b.is_empty());
        b.refund(2, 3, SEC);
        assert!(b.is_empty(), "refunding a full key is a no-op");
        assert_eq!(b.tokens(2, SEC), 4);
    }

    #[test]
    fn the_table_never_holds_more_than_its_slots() {
        // max_keys 1 000: 125 sets of 8 ways.
        let b = TokenBucket::new(params(10, 1, SEC, false), 1_000);
        for i in 0..200_000 {
            assert!(b.acquire(spread(i), 1, 0).allowed);
            if i % 997 == 0 {
                assert!(b.len() <= 1_000, "len {}", b.len());
            }
        }
        // Every set filled up, then each newcomer evicted exactly one bucket.
        assert_eq!((b.len(), b.evictions()), (1_000, 199_000));
        // 25 bytes per key and a 256-byte header, as documented.
        assert_eq!(
            [size_of::<table::Set<Bucket>>(), size_of::<TokenBucket>()],
            [200, 256]
        );
        let sets = |n| TokenBucket::new(params(10, 1, SEC, false), n).table.sets();
        assert_eq!([sets(100_000), sets(9), sets(1)], [12_500, 2, 1]);
        // max_keys 0 is 1: one set of 8 ways.
        let b = TokenBucket::new(params(10, 1, SEC, false), 0);
        for key in 1..=9 {
            assert!(b.acquire(key, 10, 0).allowed);
        }
        assert_eq!((b.len(), b.evictions()), (8, 1));
    }

    #[test]
    fn buckets_full_by_now_are_reused_before_any_eviction() {
        // max_keys 8: one set, shared by every key.
        let b = TokenBucket::new(params(10, 1, SEC, false), 8);
        for key in 1..=8 {
            let cost = if key <= 4 { 10 } else { 1 };
            assert!(b.acquire(key, cost, 0).allowed);
        }
        // Keys 5..=8 are full again at 1 s: four newcomers take their slots, exactly.
        for key in 9..=12 {
            assert!(b.acquire(key, 10, SEC).allowed);
        }
        assert_eq!((b.len(), b.evictions()), (8, 0));
        assert!((1..=4).all(|key| b.tokens(key, SEC) == 1));
        assert!((9..=12).all(|key| b.tokens(key, SEC) == 0));
        // Nothing is full now: the next newcomer evicts.
        assert!(b.acquire(13, 1, SEC).allowed);
        assert_eq!((b.len(), b.evictions()), (8, 1));
    }

    #[test]
    fn eviction_takes_the_nearest_to_full_which_starts_full_again() {
        let b = TokenBucket::new(params(10, 1, SEC, false), 8);
        // Key k keeps 10 - k tokens.
        for key in 1..=8 {
            assert!(b.acquire(key, key, 0).allowed);
        }
        assert!(b.acquire(9, 10, 0).allowed);
        assert_eq!(b.evictions(), 1);
        assert_eq!(b.tokens(1, 0), 10, "key 1 (9 tokens) evicted: full again");
        assert!((2..=8).all(|key| b.tokens(key, 0) == 10 - key));
        assert_eq!(b.tokens(9, 0), 0);
        // Key 1 fails open once, and its new state evicts key 2 (8 tokens).
        assert!(b.acquire(1, 10, 0).allowed);
        assert_eq!((b.tokens(2, 0), b.tokens(1, 0), b.evictions()), (10, 0, 2));

        // Among equal tokens, the earliest refilled is the nearest to full, whatever its way.
        let b = TokenBucket::new(params(10, 1, SEC, false), 8);
        for key in 10..=17 {
            assert!(b.acquire(key, if key <= 11 { 1 } else { 5 }, 0).allowed);
        }
        b.refund(10, 1, 500 * MS);
        assert_eq!(b.len(), 7, "key 10 refunded to full: way 0 freed");
        assert!(b.acquire(20, 1, 500 * MS).allowed);
        // Key 20 (way 0) and key 11 hold 9 tokens; key 11 is full at 1 s, key 20 at 1.5 s.
        assert!(b.acquire(21, 1, 900 * MS).allowed);
        assert_eq!((b.tokens(11, 900 * MS), b.tokens(20, 900 * MS)), (10, 9));
        assert_eq!(b.evictions(), 1);
    }

    #[test]
    fn retry_after_is_exact() {
        // (params, script of (now, cost), probe (now, cost))
        type Case = (TokenBucketParams, &'static [(Nanos, u64)], (Nanos, u64));
        let cases: [Case; 5] = [
            (params(5, 1, SEC, false), &[(0, 5)], (300 * MS, 1)),
            (
                params(5, 2, SEC, false),
                &[(0, 4), (1500 * MS, 3)],
                (1700 * MS, 4),
            ),
            (
                params(8, 3, 100 * MS, true),
                &[(0, 8), (50 * MS, 1)],
                (70 * MS, 7),
            ),
            (params(3, 1, 86_400 * SEC, false), &[(5, 3)], (10 * SEC, 3)),
            (
                params(10, 10, SEC, true),
                &[(0, 10), (999 * MS, 1)],
                (999 * MS, 10),
            ),
        ];
        for (p, script, (at, cost)) in cases {
            let replay = || {
                let b = TokenBucket::new(p, 100);
                for &(now, c) in script {
                    b.acquire(1, c, now);
                }
                let v = b.acquire(1, cost, at);
                assert!(!v.allowed, "{p:?}");
                (b, v.retry_after)
            };
            let (early, retry) = replay();
            assert!(!early.acquire(1, cost, at + retry - 1).allowed, "{p:?}");
            let (on_time, _) = replay();
            assert!(on_time.acquire(1, cost, at + retry).allowed, "{p:?}");
        }
    }

    #[test]
    fn threads_share_one_bucket_exactly() {
        let b = TokenBucket::new(params(1_000, 1, Nanos::MAX / 2, false), 100);
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..500).filter(|_| b.acquire(9, 1, 0).allowed).count()))
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        assert_eq!(admitted, 1_000);
        assert_eq!(b.tokens(9, 0), 0);
    }

    #[test]
    fn threads_on_many_keys_keep_the_bound() {
        let b = TokenBucket::new(params(10, 1, SEC, false), 64);
        std::thread::scope(|s| {
            for t in 0..4 {
                let b = &b;
                s.spawn(move || {
                    assert!((0..20_000).all(|i| b.acquire(spread(t << 20 | i), 1, i).allowed))
                });
            }
        });
        assert!(b.len() <= 64 && b.evictions() > 0, "len {}", b.len());
    }

    /// The semantics written literally, with no eviction: the oracle of the proptests.
    #[derive(Debug, Clone)]
    struct Model {
        p: TokenBucketParams,
        tokens: u64,
        last: Nanos,
    }

    impl Model {
        fn new(p: TokenBucketParams) -> Self {
            Self {
                p,
                tokens: p.capacity,
                last: 0,
            }
        }

        fn refill(&mut self, now: Nanos) {
            let n = (now - self.last) / self.p.every;
            self.tokens = (self.tokens + n * self.p.amount).min(self.p.capacity);
            self.last += n * self.p.every;
            if self.tokens == self.p.capacity {
                self.last = now;
            }
        }

        fn acquire(&mut self, cost: u64, now: Nanos) -> (bool, u64) {
            self.refill(now);
            if self.tokens >= cost {
                self.tokens -= cost;
                return (true, self.tokens);
            }
            if self.p.strict {
                self.last = now;
            }
            (false, self.tokens)
        }

        /// The largest `n` in `[min, want]` that the bucket holds, taken; or `None`.
        fn acquire_many(&mut self, min: u64, want: u64, now: Nanos) -> (Option<u64>, u64) {
            self.refill(now);
            let n = (min..=want).rev().find(|&n| n <= self.tokens);
            match n {
                Some(n) => self.tokens -= n,
                None if self.p.strict => self.last = now,
                None => {}
            }
            (n, self.tokens)
        }

        fn refund(&mut self, cost: u64, now: Nanos) {
            self.refill(now);
            self.tokens = (self.tokens + cost).min(self.p.capacity);
            if self.tokens == self.p.capacity {
                self.last = now;
            }
        }
    }

    fn arb_params() -> impl Strategy<Value = TokenBucketParams> {
        (1u64..12, 1u64..5, 1u64..1_000, any::<bool>()).prop_map(|(c, a, e, s)| params(c, a, e, s))
    }

    /// Steps of (key, advance in thousandths of `every`, cost, refund instead of acquire).
    fn arb_steps(keys: u64) -> impl Strategy<Value = Vec<(u64, u64, u64, bool)>> {
        prop::collection::vec((0..keys, 0u64..3_000, 0u64..14, any::<bool>()), 1..120)
    }

    fn check_against_model(
        p: TokenBucketParams,
        steps: &[(u64, u64, u64, bool)],
    ) -> Result<(), TestCaseError> {
        let b = TokenBucket::new(p, 1 << 16);
        let mut models: HashMap<u64, Model> = HashMap::new();
        let mut now = 0;
        for &(key, advance, cost, refund) in steps {
            now += advance * p.every / 1_000;
            let cost = cost % (p.capacity + 2);
            let model = models.entry(key).or_insert_with(|| Model::new(p));
            if refund {
                b.refund(spread(key), cost, now);
                model.refund(cost, now);
                prop_assert_eq!(b.tokens(spread(key), now), model.tokens);
                continue;
            }
            let before = model.clone();
            let v = b.acquire(spread(key), cost, now);
            prop_assert_eq!((v.allowed, v.remaining), model.acquire(cost, now));
            if !v.allowed && cost <= p.capacity {
                // retry_after against the oracle: a retry one nanosecond early fails.
                let (mut early, mut on_time) = (before.clone(), before);
                early.acquire(cost, now);
                on_time.acquire(cost, now);
                prop_assert!(!early.acquire(cost, now + v.retry_after - 1).0);
                prop_assert!(on_time.acquire(cost, now + v.retry_after).0);
            }
        }
        Ok(())
    }

    #[test]
    fn acquire_many_grants_the_largest_count_that_fits() {
        let b = TokenBucket::new(params(10, 2, SEC, false), 100);
        // 10 tokens: a request for 4 to 6 gets 6.
        assert_eq!(
            b.acquire_many(1, 4, 6, 0),
            Grant {
                verdict: Verdict::allow(4, 3 * SEC),
                granted: 6
            }
        );
        // 4 left: a request for 3 to 8 gets the 4.
        assert_eq!(b.acquire_many(1, 3, 8, 0).granted, 4);
        // Empty: a request for at least 3 is refused until two refills (2 s) bring 4.
        let g = b.acquire_many(1, 3, 8, 0);
        assert_eq!(g, Grant::rejected(Verdict::reject(0, 5 * SEC, 2 * SEC)));
        assert!(!b.acquire_many(1, 3, 8, 2 * SEC - 1).verdict.allowed);
        assert_eq!(b.acquire_many(1, 3, 8, 2 * SEC).granted, 4);
        // min above capacity never fits; a min above want is lowered to want.
        let never = b.acquire_many(2, 11, 20, 0);
        assert_eq!((never.granted, never.verdict.retry_after), (0, NEVER));
        assert_eq!(b.acquire_many(2, 7, 5, 0).granted, 5);
        // A fixed cost decides exactly as `acquire`.
        let (x, y) = (
            TokenBucket::new(params(3, 1, SEC, true), 100),
            TokenBucket::new(params(3, 1, SEC, true), 100),
        );
        for (i, cost) in [2u64, 2, 1, 3, 1].into_iter().enumerate() {
            let now = i as u64 * SEC / 3;
            assert_eq!(
                x.acquire_many(5, cost, cost, now).verdict,
                y.acquire(5, cost, now)
            );
        }
    }

    #[test]
    fn a_strict_bucket_refusing_min_resets_its_clock() {
        let b = TokenBucket::new(params(4, 1, SEC, true), 100);
        assert_eq!(b.acquire_many(1, 1, 4, 0).granted, 4);
        assert!(!b.acquire_many(1, 2, 2, SEC + SEC / 2).verdict.allowed);
        // The refill due at 1 s was applied, then the rejection moved the clock to 1.5 s:
        // the next refill is at 2.5 s.
        assert_eq!(b.tokens(1, 2 * SEC + SEC / 2 - 1), 1);
        assert_eq!(b.tokens(1, 2 * SEC + SEC / 2), 2);
    }

    /// Steps of (key, advance in thousandths of `every`, min, want).
    fn arb_many_steps() -> impl Strategy<Value = Vec<(u64, u64, u64, u64)>> {
        prop::collection::vec((0u64..3, 0u64..3_000, 0u64..14, 0u64..14), 1..120)
    }

    proptest! {
        #[test]
        fn acquire_many_matches_the_model(p in arb_params(), steps in arb_many_steps()) {
            let b = TokenBucket::new(p, 1 << 16);
            let mut models: HashMap<u64, Model> = HashMap::new();
            let mut now = 0;
            for &(key, advance, min, want) in &steps {
                now += advance * p.every / 1_000;
                let min = min.min(want);
                let model = models.entry(key).or_insert_with(|| Model::new(p));
                let before = model.clone();
                let g = b.acquire_many(spread(key), min, want, now);
                let (n, left) = model.acquire_many(min, want, now);
                prop_assert_eq!((g.verdict.allowed, g.granted, g.verdict.remaining),
                    (n.is_some(), n.unwrap_or(0), left));
                if n.is_none() && min <= p.capacity {
                    // retry_after: `min` fits at it and not a nanosecond before.
                    let (mut early, mut on_time) = (before.clone(), before);
                    early.acquire_many(min, want, now);
                    on_time.acquire_many(min, want, now);
                    let at = now + g.verdict.retry_after;
                    prop_assert!(early.acquire_many(min, min, at - 1).0.is_none());
                    prop_assert!(on_time.acquire_many(min, min, at).0.is_some());
                }
            }
        }

        #[test]
        fn matches_the_model_for_one_key(p in arb_params(), steps in arb_steps(1)) {
            check_against_model(p, &steps)?;
        }

        #[test]
        fn matches_the_model_for_several_keys(p in arb_params(), steps in arb_steps(4)) {
            check_against_model(p, &steps)?;
        }
    }
}
