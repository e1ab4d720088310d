//! Token buckets in Redis: one hash per key, refilled and taken from by one script
//! (`scripts/token_bucket.lua`), with its read and refund scripts.

use crate::limits::clock::Nanos;
use crate::limits::token_bucket::TokenBucketParams;
use crate::limits::verdict::Grant;
use crate::store::key::{KeyNames, StateKind};
use crate::store::redis::{
    grant, nanos, round_micros, scripts, Arg, Micros, RedisStore, SCRIPT_MAX,
};
use crate::store::StoreError;

impl RedisStore {
    /// One token-bucket decision for the key hashed to `hash`, at Redis's time or `at`, on
    /// a request for between `min` and `want` tokens (see token_bucket.lua): the largest
    /// count in `[min, want]` the bucket holds is taken, in the same script call, or
    /// nothing (`min == want`: one request of that cost). `min` above `want` is lowered to
    /// it.
    pub async fn token_bucket_many(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TokenBucketParams,
        min: u64,
        want: u64,
        at: Option<Micros>,
    ) -> Result<Grant, StoreError> {
        let key = names.key(hash, StateKind::TokenBucket);
        let min = min.min(want).min(SCRIPT_MAX);
        let [capacity, amount, every, want] = BucketArgs::new(params).and(want);
        let strict = u64::from(params.strict);
        let args = [capacity, amount, every, want, strict, min].map(Arg::U);
        let s = &self.inner.scripts.token_bucket;
        let v = self.eval(s, &[&key], &args, at, self.budget()).await?;
        grant(&v, min > params.capacity)
    }

    /// The tokens a bucket holds and the time until it is full, taking nothing (`RL.GET`).
    pub async fn token_bucket_get(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TokenBucketParams,
        at: Option<Micros>,
    ) -> Result<(u64, Nanos), StoreError> {
        let p = BucketArgs::new(params);
        let key = names.key(hash, StateKind::TokenBucket);
        let args = [Arg::U(p.capacity), Arg::U(p.amount), Arg::U(p.every)];
        let s = &self.inner.scripts.token_bucket_get;
        let v = self.eval(s, &[&key], &args, at, self.budget()).await?;
        let [tokens, reset] = scripts::ints::<2>(&v)?;
        Ok((scripts::count(tokens), nanos(reset)))
    }

    /// Gives back `cost` tokens taken by an admitted request; returns the tokens after.
    pub async fn token_bucket_refund(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TokenBucketParams,
        cost: u64,
        at: Option<Micros>,
    ) -> Result<u64, StoreError> {
        let key = names.key(hash, StateKind::TokenBucket);
        let args = BucketArgs::new(params).and(cost).map(Arg::U);
        let s = &self.inner.scripts.token_bucket_refund;
        let v = self.eval(s, &[&key], &args, at, self.background()).await?;
        Ok(scripts::count(scripts::int(&v)?))
    }
}

/// A token bucket's parameters in the scripts' units.
pub(super) struct BucketArgs {
    pub(super) capacity: u64,
    pub(super) amount: u64,
    pub(super) every: u64,
}

impl BucketArgs {
    pub(super) fn new(p: &TokenBucketParams) -> Self {
        Self {
            capacity: p.capacity.min(SCRIPT_MAX),
            amount: p.amount.clamp(1, SCRIPT_MAX),
            every: round_micros(p.every).clamp(1, SCRIPT_MAX),
        }
    }

    /// The arguments of a script that takes one count after the parameters (a refund's
    /// cost, a lease's want): capacity, amount, every, `n` (clamped to 2^52).
    pub(super) fn and(&self, n: u64) -> [u64; 4] {
        [self.capacity, self.amount, self.every, n.min(SCRIPT_MAX)]
    }
}
