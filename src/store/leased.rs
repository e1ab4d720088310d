//! The lease calls of the token bucket and the rate ([`InRedis`], a [`LeaseKind`]): what
//! `crate::store::lease_table` needs of each kind's store side, written once over the
//! kind's script calls (`crate::store::shared::CounterKind`), and the context a limit's
//! leases are built with ([`LeaseCtx::new`]); and a store as the [`LeaseHost`] of every
//! kind's lease calls.

use std::future::Future;
use std::sync::Arc;

use crate::limits::clock::{MonotonicClock, Nanos, NANOS_PER_SEC};
use crate::limits::lease::LeaseParams;
use crate::limits::token_bucket::TokenBucketParams;
use crate::metrics::LeaseCalls;
use crate::store::key::KeyNames;
use crate::store::lease_table::{LeaseCtx, LeaseHost, LeaseKind};
use crate::store::redis::{LeaseGrant, RedisStore};
use crate::store::shared::{CounterKind, CounterShape};
use crate::store::StoreError;

impl LeaseCtx {
    /// The leases of `origin`'s `limit` in `store`, with `params`: the gauge
    /// `tollgate_store_leased{store,origin,limit}` and the proxy's clock (Unix
    /// nanoseconds moving with the monotonic clock) for the idle sweep.
    pub fn new(params: LeaseParams, store: &RedisStore, origin: &str, limit: &str) -> Self {
        Self {
            params,
            gauge: store.metrics().leased.of(origin, limit),
            clock: Arc::new(MonotonicClock::from_unix_epoch()),
        }
    }
}

/// A token bucket's quota, for the sizer: the larger of its capacity and its refill per
/// second (`crate::limits::lease::size`).
pub(crate) fn bucket_quota(p: &TokenBucketParams) -> u64 {
    let per_sec = u128::from(p.amount) * u128::from(NANOS_PER_SEC) / u128::from(p.every.max(1));
    p.capacity.max(u64::try_from(per_sec).unwrap_or(u64::MAX))
}

/// A counter kind's state in Redis (the token bucket, the rate): the store, the key names
/// and the fleet's parameters, what its decisions and refunds are called with; and, as a
/// [`LeaseKind`], its lease calls: quota out (`RedisStore::lease_take`:
/// `lease_bucket_take.lua`, `lease_rate_take.lua`), quota back (a bucket's refund, capped
/// at capacity; `lease_rate_return.lua` within the same period).
pub struct InRedis<K: CounterKind> {
    pub(crate) store: RedisStore,
    pub(crate) names: Arc<KeyNames>,
    pub(crate) params: K::Params,
    pub(crate) shape: CounterShape,
}

impl<K: CounterKind> Clone for InRedis<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            names: Arc::clone(&self.names),
            params: self.params,
            shape: self.shape,
        }
    }
}

impl<K: CounterKind> LeaseKind for InRedis<K> {
    type Host = RedisStore;

    fn host(&self) -> &RedisStore {
        &self.store
    }

    async fn take(self, key: u64, want: u64) -> Result<LeaseGrant, StoreError> {
        K::take_call(&self, key, want).await
    }

    async fn give_back(self, key: u64, n: u64, epoch: u64) -> bool {
        K::give_back_call(&self, key, n, epoch).await.is_ok()
    }

    fn quiet(&self) -> Nanos {
        self.shape.quiet
    }
}

impl LeaseHost for RedisStore {
    fn up(&self) -> bool {
        self.is_up()
    }

    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.handle().spawn(work);
    }

    fn calls(&self) -> &LeaseCalls {
        &self.metrics().lease_calls
    }
}
