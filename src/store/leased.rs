//! The lease calls of the token bucket and the rate ([`LeaseKind`]): what
//! `crate::store::lease_table` needs of each kind's store side, and the context a limit's
//! leases are built with ([`LeaseCtx::new`]).

use std::future::Future;
use std::sync::Arc;

use crate::limits::clock::{MonotonicClock, Nanos, NANOS_PER_SEC};
use crate::limits::lease::LeaseParams;
use crate::limits::rate::RateParams;
use crate::limits::token_bucket::TokenBucketParams;
use crate::metrics::LeaseCalls;
use crate::store::key::KeyNames;
use crate::store::lease_table::{LeaseCtx, LeaseKind};
use crate::store::redis::{LeaseGrant, RedisStore};
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

/// A token bucket's lease calls: tokens out (`lease_bucket_take.lua`), tokens back (a
/// refund, capped at capacity).
pub(crate) struct BucketLease {
    pub(crate) store: RedisStore,
    pub(crate) names: Arc<KeyNames>,
    pub(crate) params: TokenBucketParams,
}

impl LeaseKind for BucketLease {
    fn up(&self) -> bool {
        self.store.is_up()
    }

    fn take(
        &self,
        key: u64,
        want: u64,
    ) -> impl Future<Output = Result<LeaseGrant, StoreError>> + Send + 'static {
        let (store, names, params) = (self.store.clone(), Arc::clone(&self.names), self.params);
        async move {
            store
                .lease_bucket_take(&names, key, &params, want, None)
                .await
        }
    }

    fn give_back(
        &self,
        key: u64,
        n: u64,
        _epoch: u64,
    ) -> impl Future<Output = bool> + Send + 'static {
        let (store, names, params) = (self.store.clone(), Arc::clone(&self.names), self.params);
        async move {
            store
                .lease_bucket_return(&names, key, &params, n, None)
                .await
                .is_ok()
        }
    }

    fn quiet(&self) -> Nanos {
        self.params.every
    }

    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.store.handle().spawn(work);
    }

    fn calls(&self) -> &LeaseCalls {
        &self.store.metrics().lease_calls
    }
}

/// A rate's lease calls: counts in the current period (`lease_rate_take.lua`), counts
/// back within the same period (`lease_rate_return.lua`).
pub(crate) struct RateLease {
    pub(crate) store: RedisStore,
    pub(crate) names: Arc<KeyNames>,
    pub(crate) params: RateParams,
}

impl LeaseKind for RateLease {
    fn up(&self) -> bool {
        self.store.is_up()
    }

    fn take(
        &self,
        key: u64,
        want: u64,
    ) -> impl Future<Output = Result<LeaseGrant, StoreError>> + Send + 'static {
        let (store, names, params) = (self.store.clone(), Arc::clone(&self.names), self.params);
        async move {
            store
                .lease_rate_take(&names, key, &params, want, None)
                .await
        }
    }

    fn give_back(
        &self,
        key: u64,
        n: u64,
        epoch: u64,
    ) -> impl Future<Output = bool> + Send + 'static {
        let (store, names, params) = (self.store.clone(), Arc::clone(&self.names), self.params);
        async move {
            store
                .lease_rate_return(&names, key, &params, n, epoch, None)
                .await
                .is_ok()
        }
    }

    fn quiet(&self) -> Nanos {
        self.params.per
    }

    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.store.handle().spawn(work);
    }

    fn calls(&self) -> &LeaseCalls {
        &self.store.metrics().lease_calls
    }
}
