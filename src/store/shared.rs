//! The shared token bucket, rate and inflight limits: each supplies its script calls and
//! its fallback to the seam (`crate::store::remote`: deny cache, store within its budget,
//! fallback), so that the runtime calls one async method and gets a decision and where it
//! came from ([`Sourced`]).
//!
//! **Local share.** With `n = instances`: a rate's and an inflight limit's `max` become
//! `⌈max / n⌉`; a bucket's capacity `⌈capacity / n⌉` and its refill `⌈amount / n⌉` tokens
//! every `every · n · ⌈amount / n⌉ / amount`, so the fleet's refill rate is kept exactly
//! while refills stay whole tokens (1 token a second across 3 instances becomes 1 token
//! every 3 s each). The local state is separate from Redis's: when the store comes back,
//! decisions continue from Redis's state, and local state is left to age out.
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
//! (`at`) and `acquire_many` always decide exactly.
//!
//! **Inflight** keeps, per key, the exact number of units this instance holds (whoever
//! admitted them: the store or the fallback). A background task on the store's runtime
//! renews this instance's lease every `lease / 3` for every key it holds, repairing Redis
//! from the local truth: a key Redis may disagree about (*dirty*: units admitted by the
//! fallback, a release lost while Redis was away) gets the local count written over
//! Redis's; a clean key keeps Redis's count, which may already include an acquire or a
//! release on its way back here (overwriting it would undo that one), and gets the local
//! count only if Redis lost it (a restart, an expired lease). A guard's drop gives
//! the unit back locally at once and sends the release in the background (only for units
//! the store admitted, and only while the store is up): it never waits for Redis and never
//! fails. A key whose units all went back with releases that landed costs no renewal. A
//! dirty key's overwrite can race an operation in flight; the key then stays dirty and is
//! written again at the next renewal: Redis is off by it for at most one interval.

use std::sync::Arc;

use crate::limits::clock::Nanos;
use crate::limits::inflight::{InflightGuard, InflightLimiter};
use crate::limits::lease::LeaseParams;
use crate::limits::rate::{RateLimiter, RateParams};
use crate::limits::sketch::SketchSize;
use crate::limits::token_bucket::{TokenBucket, TokenBucketParams};
use crate::limits::verdict::{Grant, Verdict};
use crate::store::held::Held;
use crate::store::key::KeyNames;
use crate::store::lease_table::{FromSlice, LeaseCtx, LeaseTable};
use crate::store::leased::{bucket_quota, BucketLease, RateLease};
use crate::store::redis::{Fallback, Micros, RateCounts, RedisStore};
use crate::store::remote::{renew_every_third, share, Leased, Remote, Source, Sourced};
use crate::store::StoreError;

/// The fallback's grant of between `min` and `want` when the store did not answer: the
/// local limiter's (`local`), the whole request (`allow`, reporting `limit` left), or
/// nothing (`deny`).
fn fallback_grant(
    remote: &Remote,
    fallback: Fallback,
    want: u64,
    limit: u64,
    local: impl FnOnce() -> Grant,
) -> Grant {
    match fallback {
        Fallback::Local => local(),
        Fallback::Allow => Grant {
            verdict: Verdict::allow(limit, 0),
            granted: want,
        },
        Fallback::Deny => Grant::rejected(remote.denied()),
    }
}

/// The fallback's verdict on a request of a fixed cost (as [`fallback_grant`]).
fn fallback_verdict(
    remote: &Remote,
    fallback: Fallback,
    limit: u64,
    local: impl FnOnce() -> Verdict,
) -> Verdict {
    match fallback {
        Fallback::Local => local(),
        Fallback::Allow => Verdict::allow(limit, 0),
        Fallback::Deny => remote.denied(),
    }
}

/// A bucket's local share (module doc): capacity and refill divided by `n`, rounded up,
/// the refill interval stretched so that the refill rate is exactly `1/n` of the fleet's.
pub fn local_bucket_share(p: TokenBucketParams, n: u32) -> TokenBucketParams {
    let n = n.max(1);
    let amount = p.amount.max(1);
    let local_amount = share(amount, n);
    let every =
        u128::from(p.every.max(1)) * u128::from(n) * u128::from(local_amount) / u128::from(amount);
    TokenBucketParams {
        capacity: share(p.capacity, n),
        amount: local_amount,
        every: u64::try_from(every).unwrap_or(u64::MAX).max(1),
        strict: p.strict,
    }
}

/// A token bucket whose state is shared through a store.
pub struct SharedTokenBucket {
    remote: Remote,
    names: Arc<KeyNames>,
    params: TokenBucketParams,
    local: TokenBucket,
    lease: Option<LeaseTable<BucketLease>>,
}

impl SharedTokenBucket {
    /// The store this limiter decides in: a reload keeps the limiter only while the
    /// runtime keeps this very store (same connection), not just one of the same name.
    pub fn store(&self) -> &RedisStore {
        self.remote.store()
    }

    /// A bucket of `params` in `store`, under `names`; the local fallback holds at most
    /// `max_keys` keys (as the in-process limiter would), the deny cache `deny_cache_keys`
    /// (0: none; strict buckets have none).
    pub fn new(
        store: &RedisStore,
        names: KeyNames,
        params: TokenBucketParams,
        max_keys: usize,
        deny_cache_keys: usize,
    ) -> Self {
        let remote = Remote::new(store, if params.strict { 0 } else { deny_cache_keys });
        Self {
            local: TokenBucket::new(
                local_bucket_share(params, store.config().instances),
                remote.local_keys(max_keys, 0),
            ),
            remote,
            names: Arc::new(names),
            params,
            lease: None,
        }
    }

    /// This bucket with its hot keys leased as `lease` says (`None`: one call per
    /// decision, today's exact path). Starts the idle sweep on the store's runtime.
    pub fn with_lease(mut self, lease: Option<LeaseCtx>) -> Self {
        self.lease = lease.map(|ctx| {
            let kind = BucketLease {
                store: self.store().clone(),
                names: Arc::clone(&self.names),
                params: self.params,
            };
            let instances = u64::from(self.store().config().instances);
            LeaseTable::started(kind, ctx, bucket_quota(&self.params), instances)
        });
        self
    }

    /// The lease settings (`None`: not leased).
    pub fn lease_params(&self) -> Option<LeaseParams> {
        self.lease.as_ref().map(LeaseTable::params)
    }

    /// Tokens this instance holds in slices, unspent.
    pub fn leased(&self) -> u64 {
        self.lease.as_ref().map_or(0, LeaseTable::held)
    }

    /// The bucket of the key hashed to `key` as the store holds it now: its tokens and the
    /// time until it is full. One read-only script call within the store's budget; it
    /// writes nothing (the admin API's `/state`).
    pub async fn peek(&self, key: u64) -> Result<(u64, Nanos), StoreError> {
        self.store()
            .token_bucket_get(&self.names, key, &self.params, None)
            .await
    }

    /// Decides a request of `cost` tokens for the key hashed to `key` (the stable hash), at
    /// Redis's time. `now` is the local clock, for the deny cache and the fallback.
    pub async fn acquire(&self, key: u64, cost: u64, now: Nanos) -> Sourced<Verdict> {
        self.acquire_at(key, cost, now, None).await
    }

    /// [`SharedTokenBucket::acquire`] at a time the caller supplies (a replay), in Redis's
    /// clock.
    pub async fn acquire_at(
        &self,
        key: u64,
        cost: u64,
        now: Nanos,
        at: Option<Micros>,
    ) -> Sourced<Verdict> {
        if let (Some(lease), None) = (&self.lease, at) {
            if let FromSlice::Admitted { held, remaining } = lease.admit(key, cost, now) {
                let left = held.saturating_add(remaining).min(self.params.capacity);
                return Sourced::new(Verdict::allow(left, 0), Source::Store);
            }
        }
        let call = self
            .store()
            .token_bucket(&self.names, key, &self.params, cost, at);
        let fallback = |f| {
            fallback_verdict(&self.remote, f, self.params.capacity, || {
                self.local.acquire(key, cost, now)
            })
        };
        let same = |v| v;
        self.remote
            .decide((key, cost, now), call, same, same, fallback)
            .await
    }

    /// Decides a request for between `min` and `want` tokens (a `min` above `want` is
    /// lowered to it) for the key hashed to `key`, in one store call at Redis's time or
    /// `at`: the largest count in `[min, want]` the bucket holds is taken (the limiter
    /// API's `CH.REQUEST ... MIN n`). The deny cache answers a `min` it knows is refused;
    /// the fallback decides as [`acquire_at`](Self::acquire_at) does.
    pub async fn acquire_many(
        &self,
        key: u64,
        min: u64,
        want: u64,
        now: Nanos,
        at: Option<Micros>,
    ) -> Sourced<Grant> {
        let min = min.min(want);
        let call = self
            .store()
            .token_bucket_many(&self.names, key, &self.params, min, want, at);
        let fallback = |f| {
            fallback_grant(&self.remote, f, want, self.params.capacity, || {
                self.local.acquire_many(key, min, want, now)
            })
        };
        self.remote
            .decide((key, min, now), call, |g| g, Grant::rejected, fallback)
            .await
    }

    /// Gives back `cost` tokens of an admission that came from `from` (a later limit
    /// rejected the request). A store refund is sent in the background: this never waits.
    pub fn refund(&self, key: u64, cost: u64, from: Source, now: Nanos) {
        match from {
            Source::Store => {
                if self.lease.as_ref().is_some_and(|l| l.refund(key, cost)) {
                    return;
                }
                let (store, names, params) =
                    (self.store().clone(), Arc::clone(&self.names), self.params);
                self.remote.spawn(async move {
                    let _ = store
                        .token_bucket_refund(&names, key, &params, cost, None)
                        .await;
                });
            }
            Source::Fallback => self.local.refund(key, cost, now),
            Source::DenyCache => {}
        }
    }

    /// The tokens the key's bucket holds, taking nothing, and where the answer came from.
    pub async fn tokens(&self, key: u64, now: Nanos, at: Option<Micros>) -> (u64, Source) {
        match self
            .store()
            .token_bucket_get(&self.names, key, &self.params, at)
            .await
        {
            Ok((tokens, _)) => (tokens, Source::Store),
            Err(_) => (self.local.state(key, now).0, Source::Fallback),
        }
    }

    /// The parameters (the fleet's, not the local share).
    pub fn params(&self) -> TokenBucketParams {
        self.params
    }

    /// Store calls the deny cache saved.
    pub fn deny_cache_hits(&self) -> u64 {
        self.remote.deny_cache_hits()
    }
}

/// A sliding-window (or fixed-window) rate whose counts are shared through a store (exact
/// per key there).
pub struct SharedRate {
    remote: Remote,
    names: Arc<KeyNames>,
    params: RateParams,
    local_max: u64,
    local: RateLimiter,
    lease: Option<LeaseTable<RateLease>>,
}

impl SharedRate {
    /// The store this limiter decides in: a reload keeps the limiter only while the
    /// runtime keeps this very store (same connection), not just one of the same name.
    pub fn store(&self) -> &RedisStore {
        self.remote.store()
    }

    /// The fleet's window for the key in the store now, counting nothing: the admin API's
    /// `/state`.
    pub async fn peek(&self, key: u64) -> Result<RateCounts, StoreError> {
        self.store().rate_get(&self.names, key, &self.params).await
    }

    /// A rate of `params` in `store`, under `names`; the local fallback's table holds
    /// `max_keys` keys, the deny cache `deny_cache_keys` (0: none; strict rates have none).
    pub fn new(
        store: &RedisStore,
        names: KeyNames,
        params: RateParams,
        max_keys: usize,
        deny_cache_keys: usize,
    ) -> Self {
        let remote = Remote::new(store, if params.strict { 0 } else { deny_cache_keys });
        Self {
            local_max: remote.share(params.max),
            local: RateLimiter::with_window(
                params.per,
                params.window,
                remote.local_keys(max_keys, 1),
            ),
            remote,
            names: Arc::new(names),
            params,
            lease: None,
        }
    }

    /// This rate with its hot keys leased as `lease` says (`None`: one call per decision,
    /// today's exact path). Starts the idle sweep on the store's runtime. A fixed window
    /// (the rate limit service's `window: fixed`) is never leased: the lease scripts count
    /// a sliding window, which would admit less than the fixed one promises at a boundary.
    pub fn with_lease(mut self, lease: Option<LeaseCtx>) -> Self {
        let sliding = self.params.window == crate::limits::rate::RateWindow::Sliding;
        self.lease = lease.filter(|_| sliding).map(|ctx| {
            let kind = RateLease {
                store: self.store().clone(),
                names: Arc::clone(&self.names),
                params: self.params,
            };
            let instances = u64::from(self.store().config().instances);
            LeaseTable::started(kind, ctx, self.params.max, instances)
        });
        self
    }

    /// The lease settings (`None`: not leased).
    pub fn lease_params(&self) -> Option<LeaseParams> {
        self.lease.as_ref().map(LeaseTable::params)
    }

    /// Counts this instance holds in slices, unspent.
    pub fn leased(&self) -> u64 {
        self.lease.as_ref().map_or(0, LeaseTable::held)
    }

    /// Decides one event of weight `cost` for the key hashed to `key`, at Redis's time.
    pub async fn acquire(&self, key: u64, cost: u64, now: Nanos) -> Sourced<Verdict> {
        self.acquire_at(key, cost, now, None).await
    }

    /// [`SharedRate::acquire`] at a time the caller supplies, in Redis's clock.
    pub async fn acquire_at(
        &self,
        key: u64,
        cost: u64,
        now: Nanos,
        at: Option<Micros>,
    ) -> Sourced<Verdict> {
        if let (Some(lease), None) = (&self.lease, at) {
            if let FromSlice::Admitted { held, remaining } = lease.admit(key, cost, now) {
                let left = held.saturating_add(remaining).min(self.params.max);
                return Sourced::new(Verdict::allow(left, 0), Source::Store);
            }
        }
        let call = self.store().rate(&self.names, key, &self.params, cost, at);
        let fallback = |f| {
            fallback_verdict(&self.remote, f, self.params.max, || {
                self.local
                    .acquire(key, self.local_max, cost, self.params.strict, now)
            })
        };
        let same = |v| v;
        self.remote
            .decide((key, cost, now), call, same, same, fallback)
            .await
    }

    /// Decides a request for between `min` and `want` events (a `min` above `want` is
    /// lowered to it) for the key hashed to `key`, in one store call at Redis's time or
    /// `at`: the largest count in `[min, want]` that fits is counted (the limiter API's
    /// `CH.REQUEST ... MIN n`). Deny cache and fallback as in
    /// [`acquire_at`](Self::acquire_at).
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
        // acquire of `want`: a hot key's slice pays it as it pays one.
        if let (Some(lease), None, true) = (&self.lease, at, min == want) {
            if let FromSlice::Admitted { held, remaining } = lease.admit(key, want, now) {
                let left = held.saturating_add(remaining).min(self.params.max);
                let grant = Grant {
                    verdict: Verdict::allow(left, 0),
                    granted: want,
                };
                return Sourced::new(grant, Source::Store);
            }
        }
        let call = self
            .store()
            .rate_many(&self.names, key, &self.params, min, want, at);
        let fallback = |f| {
            fallback_grant(&self.remote, f, want, self.params.max, || {
                self.local
                    .acquire_many(key, self.local_max, min, want, self.params.strict, now)
            })
        };
        self.remote
            .decide((key, min, now), call, |g| g, Grant::rejected, fallback)
            .await
    }

    /// Takes back an admission that came from `from`; a store refund is sent in the
    /// background.
    pub fn refund(&self, key: u64, cost: u64, from: Source, now: Nanos) {
        match from {
            Source::Store => {
                let (store, names, params) =
                    (self.store().clone(), Arc::clone(&self.names), self.params);
                self.remote.spawn(async move {
                    let _ = store.rate_refund(&names, key, &params, cost, None).await;
                });
            }
            Source::Fallback => self.local.refund(key, cost, now),
            Source::DenyCache => {}
        }
    }

    /// The parameters (the fleet's).
    pub fn params(&self) -> RateParams {
        self.params
    }

    /// Store calls the deny cache saved.
    pub fn deny_cache_hits(&self) -> u64 {
        self.remote.deny_cache_hits()
    }
}

/// An inflight limit counted across the fleet, per instance with a lease (module doc).
pub struct SharedInflight {
    shared: Arc<InflightShared>,
}

struct InflightShared {
    remote: Remote,
    names: KeyNames,
    max: u64,
    local_max: u64,
    local: InflightLimiter,
    held: Held,
}

impl Leased for InflightShared {
    fn renewing(&self) -> bool {
        self.remote.store().is_up()
    }

    fn held(&self) -> &Held {
        &self.held
    }

    async fn renew_key(self: Arc<Self>, key: u64, count: u64, dirty: bool) -> bool {
        self.remote
            .store()
            .inflight_renew(&self.names, key, count, dirty)
            .await
            .is_ok()
    }
}

/// Holds one unit of a key's fleet-wide inflight count. Dropping it gives the unit back
/// locally at once and to the store in the background (module doc).
pub struct SharedInflightGuard {
    shared: Arc<InflightShared>,
    key: u64,
    source: Source,
    /// The fallback's unit, when the local limiter admitted it.
    _local: Option<InflightGuard>,
}

impl SharedInflight {
    /// The store this limiter decides in: a reload keeps the limiter only while the
    /// runtime keeps this very store (same connection), not just one of the same name.
    pub fn store(&self) -> &RedisStore {
        self.shared.remote.store()
    }

    /// The fleet's units in flight for the key hashed to `key`, counting instances with a
    /// live lease only: one read-only script call, bounded by the store's budget (the
    /// admin API's `/state`).
    pub async fn peek(&self, key: u64) -> Result<u64, StoreError> {
        self.store().inflight_total(&self.shared.names, key).await
    }

    /// An inflight limit of `max` units per key across the fleet, in `store`, under
    /// `names`; the local fallback uses a sketch of `sketch`. Starts the renewal task on
    /// the store's runtime (it ends when this limiter and its last guard are gone).
    pub fn new(store: &RedisStore, names: KeyNames, max: u64, sketch: SketchSize) -> Self {
        let remote = Remote::new(store, 0);
        let sketch = match store.config().fallback {
            Fallback::Local => sketch,
            Fallback::Allow | Fallback::Deny => SketchSize {
                hashes: 1,
                slots: 1,
            },
        };
        let shared = Arc::new(InflightShared {
            local_max: remote.share(max),
            remote,
            names,
            max,
            local: InflightLimiter::new(sketch),
            held: Held::new(),
        });
        renew_every_third(store, &shared);
        Self { shared }
    }

    /// Takes one unit for the key hashed to `key` if the fleet's total stays within `max`
    /// (the fallback's share while the store cannot answer): the guard holding it, or the
    /// estimate that was over `max`.
    pub async fn acquire(&self, key: u64) -> Sourced<Result<SharedInflightGuard, u64>> {
        let s = &self.shared;
        let guard = |source, local| {
            s.held.add(key, 1, source != Source::Store);
            SharedInflightGuard {
                shared: Arc::clone(s),
                key,
                source,
                _local: local,
            }
        };
        let call = s.remote.store().inflight_acquire(&s.names, key, s.max);
        let stored = |admitted: Result<u64, u64>| admitted.map(|_| guard(Source::Store, None));
        let fallback = |f| match f {
            Fallback::Local => s
                .local
                .acquire(key, s.local_max)
                .map(|(g, _)| guard(Source::Fallback, Some(g))),
            Fallback::Allow => Ok(guard(Source::Fallback, None)),
            Fallback::Deny => Err(s.max.saturating_add(1)),
        };
        s.remote.call(call, stored, fallback).await
    }

    /// Units this instance holds for the key, whoever admitted them.
    pub fn held(&self, key: u64) -> u64 {
        self.shared.held.get(key)
    }

    /// The fleet's limit.
    pub fn max(&self) -> u64 {
        self.shared.max
    }
}

impl SharedInflightGuard {
    /// The key whose unit this guard holds.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Who admitted the unit.
    pub fn source(&self) -> Source {
        self.source
    }
}

impl Drop for SharedInflightGuard {
    fn drop(&mut self) {
        let s = &self.shared;
        let send = self.source == Source::Store && s.remote.store().is_up();
        s.held.sub(self.key, 1, !send);
        if send {
            let (shared, key) = (Arc::clone(s), self.key);
            s.remote.spawn(async move {
                if shared
                    .remote
                    .store()
                    .inflight_release(&shared.names, key)
                    .await
                    .is_err()
                {
                    shared.held.mark_dirty(key);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn local_share_keeps_the_fleet_rate() {
        let p = |capacity, amount, every| TokenBucketParams {
            capacity,
            amount,
            every,
            strict: false,
        };
        assert_eq!(local_bucket_share(p(60, 1, SEC), 1), p(60, 1, SEC));
        assert_eq!(local_bucket_share(p(60, 1, SEC), 3), p(20, 1, 3 * SEC));
        assert_eq!(local_bucket_share(p(60, 60, SEC), 3), p(20, 20, SEC));
        // 10 every second over 3: 4 every 1.2 s, 3.33 a second each.
        assert_eq!(
            local_bucket_share(p(10, 10, SEC), 3),
            p(4, 4, 1_200_000_000)
        );
        assert_eq!(local_bucket_share(p(1, 1, SEC), 5), p(1, 1, 5 * SEC));
        assert_eq!(local_bucket_share(p(0, 0, 0), 0), p(0, 1, 1));
        assert_eq!((share(100, 3), share(0, 3), share(7, 0)), (34, 0, 7));
    }
}
