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
    /// Capacity, amount and every, as below.
    fn parts(self) -> (u64, u64, Nanos);
    /// Tokens a full bucket holds.
    fn capacity(self) -> u64 {
        self.parts().0
    }
    /// Tokens added per refill, at least 1.
    fn amount(self) -> u64 {
        self.parts().1
    }
    /// Nanoseconds between refills, at least 1.
    fn every(self) -> Nanos {
        self.parts().2
    }
}

impl Refill for &TokenBucketParams {
    fn parts(self) -> (u64, u64, Nanos) {
        (self.capacity, self.amount, self.every)
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

    table::table_accessors! {
        len:
        /// Keys currently holding state (a bucket full by now still counts until touched).
        evictions:
        /// Buckets evicted before they were full, since construction.
        ///
        /// Each is a key that starts full again and fails open once: a rising count means
        /// `max_keys` is too small for the keys holding state. Reusing the slot of a bucket
        /// that is full by now loses nothing and is not counted.
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
mod tests;
