//! Lease calls: a hot key's slice of quota taken from Redis in one script call, and what
//! was not spent given back (the pure side of leases is `crate::limits::lease`).
//!
//! | kind                  | take                    | give back                          |
//! |-----------------------|-------------------------|------------------------------------|
//! | token bucket          | `lease_bucket_take.lua` | `token_bucket_refund.lua`          |
//! | rate                  | `lease_rate_take.lua`   | `lease_rate_return.lua`            |
//! | concurrency, inflight | `lease_slots_take.lua`  | `counters_release.lua` (+ `_renew`) |
//!
//! Giving tokens back is exactly a refund (capped at capacity), and giving slots back
//! exactly a release of copies, so those calls are the exact path's
//! ([`RedisStore::token_bucket_refund`], [`RedisStore::counters_release`]). Every
//! take answers the same shape, [`LeaseGrant`]: what was granted, the shared remainder
//! (which shrinks the next slice, `crate::limits::lease::size`), the epoch (a rate's
//! period) and how long the slice may be spent.

use crate::limits::clock::Nanos;
use crate::limits::rate::RateParams;
use crate::limits::token_bucket::TokenBucketParams;
use crate::store::key::{KeyNames, StateKind};
use crate::store::redis::rate::RateArgs;
use crate::store::redis::token_bucket::BucketArgs;
use crate::store::redis::{
    nanos, scripts, Arg, CounterKeys, LuaScript, Micros, RedisStore, Scripts, SCRIPT_MAX,
};
use crate::store::StoreError;

/// What a lease take granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// Units taken for the holder (0: none left; decide exactly).
    pub granted: u64,
    /// What is left for the fleet after the take: tokens in the bucket, room in the rate's
    /// window, the smallest room of the counters.
    pub remaining: u64,
    /// The rate period the counts belong to (0 for the other kinds): a slice of another
    /// epoch replaces the one held.
    pub epoch: u64,
    /// How long the slice may be spent from when Redis ran the script: until the period's
    /// end (rate), the holder's lease (slots); `None`: no end (tokens).
    pub valid_for: Option<Nanos>,
}

impl LeaseGrant {
    fn from_reply(v: &redis::Value) -> Result<Self, StoreError> {
        let [granted, remaining, epoch, valid] = scripts::ints::<4>(v)?;
        Ok(Self {
            granted: scripts::count(granted),
            remaining: scripts::count(remaining),
            epoch: scripts::count(epoch),
            valid_for: (valid >= 0).then(|| nanos(valid)),
        })
    }
}

/// A kind whose quota is leased as units of one key's state (a bucket's tokens, a rate's
/// counts): what [`RedisStore::lease_take`] needs of its parameters. Slots are leased from
/// several counters at once ([`RedisStore::lease_slots_take`]).
pub trait LeaseQuota {
    /// Where the key's state lives.
    const STATE: StateKind;

    /// The take script's arguments for `want` units: the parameters in the script's units,
    /// then `want`, each clamped as the script's arithmetic needs.
    fn take_args(&self, want: u64) -> [u64; 4];

    /// The take script.
    fn take_script(scripts: &Scripts) -> &LuaScript;
}

impl LeaseQuota for TokenBucketParams {
    const STATE: StateKind = StateKind::TokenBucket;

    fn take_args(&self, want: u64) -> [u64; 4] {
        BucketArgs::new(self).and(want)
    }

    fn take_script(scripts: &Scripts) -> &LuaScript {
        &scripts.lease_bucket_take
    }
}

impl LeaseQuota for RateParams {
    const STATE: StateKind = StateKind::Rate;

    fn take_args(&self, want: u64) -> [u64; 4] {
        RateArgs::new(self).and(want)
    }

    fn take_script(scripts: &Scripts) -> &LuaScript {
        &scripts.lease_rate_take
    }
}

impl RedisStore {
    /// Takes up to `want` units of the key hashed to `hash`'s quota (a bucket's tokens,
    /// see lease_bucket_take.lua; a rate's counts in its current period, as far as they
    /// fit, see lease_rate_take.lua), within the decision budget.
    pub async fn lease_take<P: LeaseQuota>(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &P,
        want: u64,
        at: Option<Micros>,
    ) -> Result<LeaseGrant, StoreError> {
        let key = names.key(hash, P::STATE);
        let args = params.take_args(want).map(Arg::U);
        let s = P::take_script(&self.inner.scripts);
        let v = self.eval(s, &[&key], &args, at, self.budget()).await?;
        LeaseGrant::from_reply(&v)
    }

    /// Gives back `n` unspent counts taken in period `epoch`, if that period (or the one
    /// after it) is still the current one (see lease_rate_return.lua); returns the current
    /// period's count after. A background call.
    pub async fn lease_rate_return(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &RateParams,
        n: u64,
        epoch: u64,
        at: Option<Micros>,
    ) -> Result<u64, StoreError> {
        let key = names.key(hash, StateKind::Rate);
        let [per, tick, n] = RateArgs::new(params).window_and(n);
        let args = [per, tick, n, epoch.min(SCRIPT_MAX)].map(Arg::U);
        let s = &self.inner.scripts.lease_rate_return;
        let v = self.eval(s, &[&key], &args, at, self.background()).await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// Takes a block of up to `want` slots for `holder` from every counter (counter `i`
    /// holding at most `maxes[i]`), the largest every one has room for (see
    /// lease_slots_take.lua), within the decision budget. The holder's slots live as long
    /// as the store's `lease`, renewed by [`RedisStore::counters_renew`].
    pub async fn lease_slots_take(
        &self,
        holder: &str,
        counters: &[&CounterKeys],
        maxes: &[u64],
        want: u64,
    ) -> Result<LeaseGrant, StoreError> {
        let keys: Vec<&str> = counters
            .iter()
            .flat_map(|c| [c.counts.as_str(), c.leases.as_str()])
            .collect();
        let mut args = Vec::with_capacity(3 + maxes.len());
        args.extend([
            Arg::S(holder),
            Arg::U(self.lease_micros()),
            Arg::U(want.min(SCRIPT_MAX)),
        ]);
        args.extend(maxes.iter().map(|&m| Arg::U(m.min(SCRIPT_MAX))));
        let s = &self.inner.scripts.lease_slots_take;
        let v = self.eval(s, &keys, &args, None, self.budget()).await?;
        LeaseGrant::from_reply(&v)
    }
}
