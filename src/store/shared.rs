//! The shared token bucket and rate limits: each supplies its script calls and
//! its fallback to the seam (`crate::store::remote`: deny cache, store within its budget,
//! fallback), so that the runtime calls one async method and gets a decision and where it
//! came from ([`Sourced`]). The token bucket and the rate are one limiter,
//! [`SharedCounter`], over what each kind supplies ([`CounterKind`]).
//!
//! **Local share**: `crate::store::local_share`.
//!
//! **Refunds** (the no-burn rule) go back where the admission came from: to the store in
//! the background (never waited for), or to the local fallback. A store refund that cannot
//! be delivered (the breaker opened meanwhile, or it timed out) is dropped: those tokens
//! stay spent until they refill, the price of never waiting on Redis.
//!
//! **Strict limits** skip the deny cache: in strict mode every rejection moves the state
//! (a bucket's refill clock, a window's count), so every one must reach the store.
//!
//! **Leases** (`lease:`, token buckets and rates; `crate::store::lease_table`): a hot key's
//! decision is first offered to its slice; an admission from it is answered with no call,
//! as [`Source::Store`] (the store granted that quota beforehand), and only a request the
//! slice cannot pay takes the path above. A bucket's refund goes back into the key's
//! slice when it has one (no call); a rate's refund goes to the store as before. Replays
//! (`at`) always decide exactly, and so does a bucket's `acquire_many`; a rate's
//! all-or-nothing `acquire_many` is paid by the slice as an `acquire` is.

use std::future::Future;
use std::sync::Arc;

use crate::limits::clock::Nanos;
use crate::limits::lease::LeaseParams;
use crate::limits::rate::{RateLimiter, RateParams, RateWindow};
use crate::limits::token_bucket::{TokenBucket, TokenBucketParams};
use crate::limits::verdict::{Grant, Verdict};
use crate::store::key::KeyNames;
use crate::store::lease_table::{FromSlice, LeaseCtx, LeaseTable};
use crate::store::leased::{bucket_quota, InRedis};
use crate::store::local_share::local_bucket_share;
use crate::store::redis::{Fallback, LeaseGrant, LeaseQuota, Micros, RateCounts, RedisStore};
use crate::store::remote::{share, Remote, Source, Sourced};
use crate::store::StoreError;

/// What the seam reads of a counter kind's parameters, once.
#[derive(Debug, Clone, Copy)]
pub struct CounterShape {
    /// The most a key holds (capacity, max): the `remaining` reported at most.
    pub limit: u64,
    /// Every rejection moves the state: no deny cache.
    pub strict: bool,
    /// The quota the lease sizer divides (`None`: never leased).
    pub quota: Option<u64>,
    /// How long a key stays quiet after a take granted nothing (`LeaseKind::quiet`).
    pub quiet: Nanos,
}

/// A store call's answer, on its way.
pub trait Reply<T>: Future<Output = Result<T, StoreError>> + Send {}

impl<T, F: Future<Output = Result<T, StoreError>> + Send> Reply<T> for F {}

/// A kind whose shared state is one count per key, taken by a cost (the token bucket, the
/// rate): what [`SharedCounter`] needs of it. It is the kind's local fallback limiter, at
/// this instance's share (module doc), and it names the kind's script calls.
pub trait CounterKind: Send + Sync + Sized + 'static {
    /// The kind's parameters (the fleet's).
    type Params: LeaseQuota + Copy + Send + Sync + 'static;
    /// Whether a store refund goes back into the key's slice when it has one (a bucket's
    /// tokens do; a rate's count goes to the store, whose period may have turned).
    const REFUND_TO_SLICE: bool;
    /// Whether an all-or-nothing `acquire_many` is offered to the key's slice.
    const MANY_FROM_SLICE: bool;

    /// What the seam reads of `params`.
    fn shape(params: &Self::Params) -> CounterShape;
    /// The fallback limiter of `params` at this instance's share of `instances`, for
    /// `keys` keys.
    fn local(params: &Self::Params, instances: u32, keys: usize) -> Self;
    /// The fallback's grant of between `min` and `want` (of `c` and `c`: its `acquire`).
    fn local_acquire_many(&self, key: u64, min: u64, want: u64, now: Nanos) -> Grant;
    /// Gives `cost` back to the fallback.
    fn local_refund(&self, key: u64, cost: u64, now: Nanos);

    /// The store's grant of between `min` and `want`, at Redis's time or `at`.
    fn call(s: &InRedis<Self>, key: u64, n: [u64; 2], at: Option<Micros>) -> impl Reply<Grant>;
    /// Gives `cost` back to the store.
    fn refund_call(s: &InRedis<Self>, key: u64, cost: u64) -> impl Reply<u64>;
    /// Takes up to `want` of the key's quota for a slice.
    fn take_call(s: &InRedis<Self>, key: u64, want: u64) -> impl Reply<LeaseGrant> {
        (s.store).lease_take(&s.names, key, &s.params, want, None)
    }
    /// Gives `n` unspent units of a slice of `epoch` back: a refund by default.
    fn give_back_call(s: &InRedis<Self>, key: u64, n: u64, epoch: u64) -> impl Reply<u64> {
        let _ = epoch;
        Self::refund_call(s, key, n)
    }
}

/// A counter kind whose state is shared through a store: [`SharedTokenBucket`],
/// [`SharedRate`].
pub struct SharedCounter<K: CounterKind> {
    remote: Remote,
    at: InRedis<K>,
    local: K,
    lease: Option<LeaseTable<InRedis<K>>>,
}

/// A token bucket whose state is shared through a store.
pub type SharedTokenBucket = SharedCounter<TokenBucket>;

/// A sliding-window (or fixed-window) rate whose counts are shared through a store (exact
/// per key there).
pub type SharedRate = SharedCounter<LocalRate>;

impl<K: CounterKind> SharedCounter<K> {
    /// The store this limiter decides in: a reload keeps the limiter only while the
    /// runtime keeps this very store (same connection), not just one of the same name.
    pub fn store(&self) -> &RedisStore {
        self.remote.store()
    }

    /// A limiter of `params` in `store`, under `names`; the local fallback holds at most
    /// `max_keys` keys (as the in-process limiter would), the deny cache `deny_cache_keys`
    /// (0: none; strict limits have none).
    pub fn new(
        store: &RedisStore,
        names: KeyNames,
        params: K::Params,
        max_keys: usize,
        deny_cache_keys: usize,
    ) -> Self {
        let shape = K::shape(&params);
        let remote = Remote::new(store, if shape.strict { 0 } else { deny_cache_keys });
        Self {
            local: K::local(
                &params,
                store.config().tuning.instances,
                remote.local_keys(max_keys),
            ),
            remote,
            at: InRedis {
                store: store.clone(),
                names: Arc::new(names),
                params,
                shape,
            },
            lease: None,
        }
    }

    /// This limiter with its hot keys leased as `lease` says (`None`: one call per
    /// decision, today's exact path). Starts the idle sweep on the store's runtime. A
    /// fixed window (the rate limit service's `window: fixed`) is never leased: the lease
    /// scripts count a sliding window, which would admit less than the fixed one promises
    /// at a boundary.
    pub fn with_lease(mut self, lease: Option<LeaseCtx>) -> Self {
        self.lease = lease.zip(self.at.shape.quota).map(|(ctx, quota)| {
            let instances = u64::from(self.store().config().tuning.instances);
            LeaseTable::started(self.at.clone(), ctx, quota, instances)
        });
        self
    }

    /// The lease settings (`None`: not leased).
    pub fn lease_params(&self) -> Option<LeaseParams> {
        self.lease.as_ref().map(LeaseTable::params)
    }

    /// Units (tokens, counts) this instance holds in slices, unspent.
    pub fn leased(&self) -> u64 {
        self.lease.as_ref().map_or(0, LeaseTable::held)
    }

    /// Decides a request of `cost` for the key hashed to `key` (the stable hash), at
    /// Redis's time. `now` is the local clock, for the deny cache and the fallback.
    pub async fn acquire(&self, key: u64, cost: u64, now: Nanos) -> Sourced<Verdict> {
        self.acquire_at(key, cost, now, None).await
    }

    /// [`SharedCounter::acquire`] at a time the caller supplies (a replay), in Redis's
    /// clock: [`acquire_many`](Self::acquire_many) of `cost` and `cost`, a hot key's slice
    /// paying it.
    pub async fn acquire_at(
        &self,
        key: u64,
        cost: u64,
        now: Nanos,
        at: Option<Micros>,
    ) -> Sourced<Verdict> {
        let grant = self.decide(key, [cost, cost], now, at, true).await;
        grant.map(|g| g.verdict)
    }

    /// Decides a request for between `min` and `want` (a `min` above `want` is lowered to
    /// it) for the key hashed to `key`, in one store call at Redis's time or `at`: the
    /// largest count in `[min, want]` that fits is taken (the limiter API's
    /// `CH.REQUEST ... MIN n`). The deny cache answers a `min` it knows is refused.
    pub async fn acquire_many(
        &self,
        key: u64,
        min: u64,
        want: u64,
        now: Nanos,
        at: Option<Micros>,
    ) -> Sourced<Grant> {
        let min = min.min(want);
        // All or nothing (`min == want`, the rate limit service's `hits_addend`) is an
        // acquire of `want`: a rate's slice pays it as it pays one.
        let sliced = K::MANY_FROM_SLICE && min == want;
        self.decide(key, [min, want], now, at, sliced).await
    }

    /// One decision: by the key's slice when `sliced` and it can pay with no call (never
    /// for a replay, `at`), else by the seam (deny cache, store, fallback).
    async fn decide(
        &self,
        key: u64,
        [min, want]: [u64; 2],
        now: Nanos,
        at: Option<Micros>,
        sliced: bool,
    ) -> Sourced<Grant> {
        let limit = self.at.shape.limit;
        if let (Some(lease), None, true) = (&self.lease, at, sliced) {
            if let FromSlice::Admitted { held, remaining } = lease.admit(key, want, now) {
                let verdict = Verdict::allow(held.saturating_add(remaining).min(limit), 0);
                let grant = Grant {
                    verdict,
                    granted: want,
                };
                return Sourced::new(grant, Source::Store);
            }
        }
        let call = K::call(&self.at, key, [min, want], at);
        let fallback = |f| match f {
            Fallback::Local => self.local.local_acquire_many(key, min, want, now),
            Fallback::Allow => Grant {
                verdict: Verdict::allow(limit, 0),
                granted: want,
            },
            Fallback::Deny => Grant::rejected(self.remote.denied()),
        };
        self.remote
            .decide((key, min, now), call, |g| g, Grant::rejected, fallback)
            .await
    }

    /// Gives back `cost` of an admission that came from `from` (a later limit rejected
    /// the request). A store refund is sent in the background: this never waits.
    pub fn refund(&self, key: u64, cost: u64, from: Source, now: Nanos) {
        match from {
            Source::Store => {
                let slice = self.lease.as_ref().filter(|_| K::REFUND_TO_SLICE);
                if slice.is_some_and(|l| l.refund(key, cost)) {
                    return;
                }
                let at = self.at.clone();
                self.remote.spawn(async move {
                    let _ = K::refund_call(&at, key, cost).await;
                });
            }
            Source::Fallback => self.local.local_refund(key, cost, now),
            Source::DenyCache => {}
        }
    }

    /// The parameters (the fleet's, not the local share).
    pub fn params(&self) -> K::Params {
        self.at.params
    }

    /// Store calls the deny cache saved.
    pub fn deny_cache_hits(&self) -> u64 {
        self.remote.deny_cache_hits()
    }
}

/// A counter kind's script calls ([`CounterKind::call`], `refund_call`): the
/// `RedisStore` methods of each, named, all taking the same arguments.
macro_rules! script_calls {
    ($many:ident, $refund:ident) => {
        fn call(s: &InRedis<Self>, k: u64, n: [u64; 2], at: Option<Micros>) -> impl Reply<Grant> {
            (s.store).$many(&s.names, k, &s.params, n[0], n[1], at)
        }

        fn refund_call(s: &InRedis<Self>, key: u64, cost: u64) -> impl Reply<u64> {
            (s.store).$refund(&s.names, key, &s.params, cost, None)
        }
    };
}

impl CounterKind for TokenBucket {
    type Params = TokenBucketParams;
    const REFUND_TO_SLICE: bool = true;
    const MANY_FROM_SLICE: bool = false;

    fn shape(p: &TokenBucketParams) -> CounterShape {
        let (limit, quota) = (p.capacity, Some(bucket_quota(p)));
        let (strict, quiet) = (p.strict, p.every);
        CounterShape {
            limit,
            strict,
            quota,
            quiet,
        }
    }

    fn local(params: &TokenBucketParams, instances: u32, keys: usize) -> Self {
        TokenBucket::new(local_bucket_share(*params, instances), keys)
    }

    fn local_acquire_many(&self, key: u64, min: u64, want: u64, now: Nanos) -> Grant {
        self.acquire_many(key, min, want, now)
    }

    fn local_refund(&self, key: u64, cost: u64, now: Nanos) {
        self.refund(key, cost, now);
    }

    script_calls!(token_bucket_many, token_bucket_refund);
}

impl SharedTokenBucket {
    /// The bucket of the key hashed to `key` as the store holds it now: its tokens and the
    /// time until it is full. One read-only script call within the store's budget; it
    /// writes nothing (the admin API's `/state`).
    pub async fn peek(&self, key: u64) -> Result<(u64, Nanos), StoreError> {
        let s = &self.at;
        s.store
            .token_bucket_get(&s.names, key, &s.params, None)
            .await
    }
}

/// A rate's local fallback: the in-process rate at this instance's share of `max`.
pub struct LocalRate {
    rate: RateLimiter,
    max: u64,
    strict: bool,
}

impl CounterKind for LocalRate {
    type Params = RateParams;
    const REFUND_TO_SLICE: bool = false;
    const MANY_FROM_SLICE: bool = true;

    fn shape(p: &RateParams) -> CounterShape {
        // A fixed window is never leased (`SharedCounter::with_lease`).
        let sliding = p.window == RateWindow::Sliding;
        CounterShape {
            quota: sliding.then_some(p.max),
            quiet: p.per,
            limit: p.max,
            strict: p.strict,
        }
    }

    fn local(params: &RateParams, instances: u32, keys: usize) -> Self {
        Self {
            rate: RateLimiter::with_window(params.per, params.window, keys),
            max: share(params.max, instances),
            strict: params.strict,
        }
    }

    fn local_acquire_many(&self, key: u64, min: u64, want: u64, now: Nanos) -> Grant {
        (self.rate).acquire_many(key, self.max, min, want, self.strict, now)
    }

    fn local_refund(&self, key: u64, cost: u64, now: Nanos) {
        self.rate.refund(key, cost, now);
    }

    script_calls!(rate_many, rate_refund);

    fn give_back_call(s: &InRedis<Self>, key: u64, n: u64, epoch: u64) -> impl Reply<u64> {
        (s.store).lease_rate_return(&s.names, key, &s.params, n, epoch, None)
    }
}

impl SharedRate {
    /// The fleet's window for the key in the store now, counting nothing: the admin API's
    /// `/state`.
    pub async fn peek(&self, key: u64) -> Result<RateCounts, StoreError> {
        let s = &self.at;
        s.store.rate_get(&s.names, key, &s.params).await
    }
}
