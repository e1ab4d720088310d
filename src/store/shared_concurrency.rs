//! The holding kinds counted across a fleet: Charon's copy-limited resources (exact
//! copies per key, an optional global limit, groups) and, as a limit of `max` with
//! neither, inflight (`crate::store::shared_inflight`), in per-holder counters in Redis
//! (`crate::store::redis::CounterKeys`), with the store's fallback.
//!
//! - **Per-holder counts under a lease.** Each counter holds copies per *holder* (the
//!   instance and the limiter's incarnation, so that two limiters of one process never
//!   overwrite each other's share). This limiter keeps the exact copies it
//!   holds, per key (`crate::store::held`) and per global and group counter
//!   (`crate::store::variant_counts`), whoever admitted them: the local truth each lease
//!   renewal (every `lease / 3`) writes where Redis may disagree. A crashed instance's
//!   copies are gone after one lease. A guard's drop gives its copies back locally at
//!   once and to Redis in the background, never waiting.
//! - **A release is seen by the next reserve** (Charon's rule: never deny wrongly): a
//!   reserve Redis refuses while releases sent before it were still on their way waits
//!   for them (within its budget) and asks once more (`crate::store::releases`).
//! - **Reloads.** A guard keeps its limiter's state alive and gives its copies back to
//!   the counters it took them from, with the group mask it was admitted with.
//! - **Leases** (`lease:`, only without a global or group counter): a hot key leases a
//!   block of slots of its counter (`crate::store::leased_slots`); a reserve of exactly
//!   `copies` and a release of copies the store counts here cost no call.
//! - `tollgate_concurrency_in_use` reports the copies this instance holds: summed over
//!   the fleet, the copies in use. How it fits: `docs/architecture.md`, "Leases".

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::limits::concurrency::{
    ConcurrencyError, ConcurrencyLimiter, ConcurrencyParams, Copies, Limit, Rejection, MAX_GROUPS,
};
use crate::store::held::Held;
use crate::store::key::KeyNames;
use crate::store::lease_table::LeaseCtx;
use crate::store::leased_slots::Holdings;
use crate::store::local_holds::LocalHolds;
use crate::store::redis::{CounterKeys, Fallback, RedisStore};
use crate::store::releases::Releases;
use crate::store::remote::{renew_every_third, Leased, Remote, Source, Sourced};
use crate::store::variant_counts::VariantCounts;
use crate::store::StoreError;

/// How a holding limit is counted ([`SharedConcurrency::counted`]): its fallback and
/// where a key's counter lives. Its field in the counters is its own ([`holder_for`]).
pub(crate) struct Counting {
    /// The fallback, at this instance's share.
    pub(crate) local: LocalHolds,
    /// The key's counter.
    pub(crate) counter: fn(&KeyNames, u64) -> CounterKeys,
}

/// Incarnations of shared holding limiters in this process.
static INCARNATIONS: AtomicU64 = AtomicU64::new(0);

/// A new holding limiter's field in every counter: `instance#incarnation`, so that two
/// limiters of one process on the same names (a reload's old one, whose guards are still
/// out, and its new one) never write over each other's share (`docs/architecture.md`,
/// "Leases").
fn holder_for(store: &RedisStore) -> String {
    let incarnation = INCARNATIONS.fetch_add(1, Ordering::Relaxed);
    format!("{}#{incarnation}", store.config().instance)
}

/// A concurrency limit counted across the fleet (module doc).
pub struct SharedConcurrency {
    shared: Arc<ConcShared>,
}

struct ConcShared {
    remote: Remote,
    names: Arc<KeyNames>,
    /// This limiter's field in every counter ([`holder_for`]).
    holder: String,
    /// The key's counter.
    counter: fn(&KeyNames, u64) -> CounterKeys,
    params: ConcurrencyParams,
    /// Bits of the configured groups.
    valid: u64,
    /// Copies held in the global and group counters.
    variant: VariantCounts,
    local: LocalHolds,
    /// Copies held per key, and hot keys' blocks of slots (`lease:`, only without a global
    /// or group counter: `crate::store::leased_slots`).
    held: Holdings,
    /// Releases sent to the store and not answered yet.
    releases: Releases,
}

/// A release on its way: counted as landed when dropped, however its task ends.
struct InFlight {
    shared: Arc<ConcShared>,
    n: u64,
}

impl InFlight {
    fn new(shared: &Arc<ConcShared>) -> Self {
        Self {
            shared: Arc::clone(shared),
            n: shared.releases.sent(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.releases.landed(self.n);
    }
}

/// Copies of a key (and of its global and group counters) held across the fleet. Dropping
/// it gives them back, exactly once: locally at once, to the store in the background.
/// It reads as what it holds ([`Copies`]).
pub struct SharedConcurrencyGuard {
    shared: Arc<ConcShared>,
    held: Copies,
    source: Source,
    /// Whether the copies are slots of the key's block (leases).
    from_block: bool,
}

impl std::ops::Deref for SharedConcurrencyGuard {
    type Target = Copies;

    fn deref(&self) -> &Copies {
        &self.held
    }
}

impl SharedConcurrency {
    /// A concurrency limit of `params` in `store`, under `names`; `group_names[i]` names
    /// group `i` (its counter in Redis). The local fallback holds at most `max_keys` keys.
    /// Starts the renewal task on the store's runtime (it ends when this limiter and its
    /// last guard are gone).
    pub fn new(
        store: &RedisStore,
        names: KeyNames,
        params: ConcurrencyParams,
        group_names: &[&str],
        max_keys: usize,
    ) -> Result<Self, ConcurrencyError> {
        Self::new_leased(store, names, params, group_names, max_keys, None)
    }

    /// [`SharedConcurrency::new`] with hot keys leasing blocks of slots as `lease` says,
    /// when the limit has no global or group counter (a block spans one counter); `None`,
    /// or a limit with those counters: one call per reserve and per release.
    pub fn new_leased(
        store: &RedisStore,
        names: KeyNames,
        params: ConcurrencyParams,
        group_names: &[&str],
        max_keys: usize,
        lease: Option<LeaseCtx>,
    ) -> Result<Self, ConcurrencyError> {
        let n = params.groups.len();
        if n > MAX_GROUPS {
            return Err(ConcurrencyError::TooManyGroups(n));
        }
        let remote = Remote::new(store, 0);
        let local_params = ConcurrencyParams {
            max: remote.share(params.max),
            global: params.global.map(|g| remote.share(g)),
            groups: params.groups.iter().map(|&g| remote.share(g)).collect(),
        };
        let local_keys = remote.local_keys(max_keys);
        let local = LocalHolds::Table(ConcurrencyLimiter::new(local_params, local_keys)?);
        let counting = Counting {
            local,
            counter: CounterKeys::of_key,
        };
        Ok(Self::counted(
            store,
            names,
            params,
            group_names,
            counting,
            lease,
        ))
    }

    /// A holding limit of `params` counted as `counting` says: a concurrency limit
    /// ([`Self::new_leased`]) or an inflight one (`crate::store::shared_inflight`). A
    /// lease is taken only when the limit has no global or group counter.
    pub(crate) fn counted(
        store: &RedisStore,
        names: KeyNames,
        params: ConcurrencyParams,
        group_names: &[&str],
        counting: Counting,
        lease: Option<LeaseCtx>,
    ) -> Self {
        let Counting { local, counter } = counting;
        let holder = holder_for(store);
        let variant = VariantCounts::new(&names, &params, group_names);
        let names = Arc::new(names);
        let lease = lease.filter(|_| variant.is_empty());
        let held = Holdings::new(store, &names, &holder, counter, params.max, lease);
        let groups = params.groups.len().min(MAX_GROUPS) as u32;
        let shared = Arc::new(ConcShared {
            remote: Remote::new(store, 0),
            holder,
            counter,
            variant,
            names,
            valid: u64::MAX.checked_shr(64 - groups).unwrap_or(0),
            local,
            held,
            releases: Releases::default(),
            params,
        });
        renew_every_third(store, &shared);
        Self { shared }
    }

    /// The store this limiter decides in.
    pub fn store(&self) -> &RedisStore {
        self.shared.remote.store()
    }

    /// The parameters (the fleet's).
    pub fn params(&self) -> &ConcurrencyParams {
        &self.shared.params
    }

    /// Takes `copies` for the key hashed to `key` in `groups` (bit `i`: group `i`), or
    /// nothing: [`SharedConcurrency::acquire_range`] with `min = copies`.
    pub async fn acquire(
        &self,
        key: u64,
        groups: u64,
        copies: u64,
    ) -> Sourced<Result<SharedConcurrencyGuard, Rejection>> {
        self.acquire_range(key, groups, copies, copies).await
    }

    /// Takes the largest `n` in `[min, copies]` that fits the key's `max`, the global
    /// limit and each of the request's groups across the fleet (the fallback's share while
    /// the store cannot answer), or nothing, naming the first limit (key, global, groups
    /// by index) that did not fit. A `min` above `copies` is lowered to it; `copies` of 0
    /// holds nothing. Leases run on Redis's clock: there is no caller time here.
    pub async fn acquire_range(
        &self,
        key: u64,
        groups: u64,
        min: u64,
        copies: u64,
    ) -> Sourced<Result<SharedConcurrencyGuard, Rejection>> {
        let s = &self.shared;
        let groups = groups & s.valid;
        let min = min.min(copies);
        if copies == 0 {
            return Sourced::new(
                Ok(s.guard(key, groups, 0, s.params.max, Source::Store)),
                Source::Store,
            );
        }
        if let Some(remaining) = (min == copies)
            .then(|| s.held.take_slots(key, copies))
            .flatten()
        {
            let held = Copies {
                key,
                groups,
                copies,
                remaining,
            };
            let guard = SharedConcurrencyGuard {
                shared: Arc::clone(s),
                held,
                source: Source::Store,
                from_block: true,
            };
            return Sourced::new(Ok(guard), Source::Store);
        }
        let call = async {
            // Releases sent before this request that had not landed when it was sent:
            // Redis may see the request first.
            let mark = s.releases.mark();
            let racing = s.releases.pending_before(mark);
            let decided = s.store_acquire(key, groups, min, copies).await;
            if !(racing && matches!(decided, Ok(Err(_)))) {
                return decided;
            }
            // Refused while releases sent before this request were on their way: once they
            // have landed, ask again (module doc). Past the budget, the refusal stands.
            let budget = s.remote.store().decision_budget();
            if s.remote
                .store()
                .within(budget, s.releases.all_landed_before(mark))
                .await
                .is_none()
            {
                return decided;
            }
            match s.store_acquire(key, groups, min, copies).await {
                Ok(again) => Ok(again),
                Err(_) => {
                    // The retry may still run in Redis: the next renewal writes the truth.
                    s.held.mark_dirty(key);
                    s.variant.mark_dirty(groups);
                    decided
                }
            }
        };
        let stored = |decided: Result<(u64, u64), Rejection>| {
            decided
                .map(|(granted, remaining)| s.guard(key, groups, granted, remaining, Source::Store))
        };
        let fallback = |f| {
            // The call may still run in Redis: the next renewal writes the truth.
            s.held.mark_dirty(key);
            s.variant.mark_dirty(groups);
            match f {
                Fallback::Local => s
                    .local
                    .reserve(key, groups, copies, min)
                    .map(|n| s.guard(key, groups, n, 0, Source::Fallback)),
                Fallback::Allow => Ok(s.guard(key, groups, copies, 0, Source::Fallback)),
                Fallback::Deny => Err(Rejection {
                    limit: Limit::Key,
                    in_use: s.params.max,
                    max: s.params.max,
                    wanted: min,
                }),
            }
        };
        s.remote.call(call, stored, fallback).await
    }

    /// What this instance holds per key, whoever admitted it, and its blocks.
    pub fn holdings(&self) -> &Holdings {
        &self.shared.held
    }

    /// Copies of the key held across the fleet now (holders with a live lease), read from
    /// the key's counter without renewing or dropping anything: the admin API's `/state`.
    pub async fn peek(&self, key: u64) -> Result<u64, StoreError> {
        let s = &self.shared;
        let counter = (s.counter)(&s.names, key);
        let totals = s.remote.store().counters_total(&[&counter]).await?;
        Ok(totals.first().copied().unwrap_or(0))
    }

    /// Copies this instance holds across every key of the limit.
    pub fn in_use_here(&self) -> u64 {
        self.shared.held.in_use_total()
    }

    /// Copies this instance holds in group `group` (0 for one that does not exist).
    pub fn group_in_use_here(&self, group: usize) -> u64 {
        self.shared.variant.group(group)
    }

    /// Copies of the global counter and every group's, across the fleet (instances with a
    /// live lease), in that order: a store call (a renewal that changes no count Redis
    /// holds), for tests and tools.
    pub async fn fleet_totals(&self) -> Result<Vec<u64>, StoreError> {
        let s = &self.shared;
        s.variant.totals(s.remote.store(), &s.holder).await
    }

    /// Keys the local fallback admitted untracked (its table was full).
    pub fn untracked_total(&self) -> u64 {
        self.shared.local.untracked_total()
    }
}

impl ConcShared {
    /// One decision in the store: `Ok(Ok((granted, remaining)))`, `Ok(Err(rejection))`,
    /// or the store's error (the caller falls back). What a Cluster's split took beyond
    /// the grant goes back in the background.
    async fn store_acquire(
        self: &Arc<Self>,
        key: u64,
        groups: u64,
        min: u64,
        copies: u64,
    ) -> Result<Result<(u64, u64), Rejection>, StoreError> {
        let own = (self.counter)(&self.names, key);
        let (store, max) = (self.remote.store(), self.params.max);
        let taken = (self.variant)
            .take(store, &self.holder, (&own, max), groups, [min, copies])
            .await;
        let [k, v] = taken.over;
        if k > 0 {
            self.give_back_later(vec![own], k, Some(key), 0);
        }
        if v > 0 {
            let variant = self
                .variant
                .of(groups)
                .iter()
                .map(|c| c.0.clone())
                .collect();
            self.give_back_later(variant, v, None, groups);
        }
        taken.outcome
    }

    /// Sends a release of `copies` to `counters` in the background; if it fails, the key
    /// (`Some`) or the variant's counters of `groups` are rewritten at the next renewal.
    fn give_back_later(
        self: &Arc<Self>,
        counters: Vec<CounterKeys>,
        copies: u64,
        key: Option<u64>,
        groups: u64,
    ) {
        if copies == 0 {
            return;
        }
        let flight = InFlight::new(self);
        self.remote.store().handle().spawn(async move {
            let s = &flight.shared;
            let refs: Vec<&CounterKeys> = counters.iter().collect();
            if s.remote
                .store()
                .counters_release(&s.holder, &refs, copies)
                .await
                .is_err()
            {
                match key {
                    Some(key) => s.held.mark_dirty(key),
                    None => s.variant.mark_dirty(groups),
                }
            }
        });
    }

    /// A guard for `copies` now held (counted locally at once).
    fn guard(
        self: &Arc<Self>,
        key: u64,
        groups: u64,
        copies: u64,
        remaining: u64,
        source: Source,
    ) -> SharedConcurrencyGuard {
        if copies > 0 {
            let dirty = source != Source::Store;
            self.held.add(key, copies, dirty);
            self.variant.add(groups, copies, dirty);
        }
        let held = Copies {
            key,
            groups,
            copies,
            remaining,
        };
        SharedConcurrencyGuard {
            shared: Arc::clone(self),
            held,
            source,
            from_block: false,
        }
    }

    /// Gives back `copies` a guard of `source` held: locally at once, to the store in the
    /// background (only for copies the store admitted, and only while it is up).
    fn put_back(self: &Arc<Self>, g: &SharedConcurrencyGuard, copies: u64) {
        let (key, groups, source) = (g.held.key, g.held.groups, g.source);
        if copies == 0 {
            return;
        }
        // Into the key's block, if it has one: no call.
        if source == Source::Store && self.held.put_slots(key, copies, g.from_block) {
            return;
        }
        if source == Source::Fallback
            && self.remote.store().config().tuning.fallback == Fallback::Local
        {
            self.local.release(key, groups, copies);
        }
        let send = self.give_back(key, copies, source);
        self.variant.sub(groups, copies, !send);
        if !send {
            return;
        }
        let flight = InFlight::new(self);
        self.remote.store().handle().spawn(async move {
            let s = &flight.shared;
            let own = (s.counter)(&s.names, key);
            let store = s.remote.store();
            if !s
                .variant
                .release(store, &s.holder, &own, groups, copies)
                .await
            {
                s.held.mark_dirty(key);
                s.variant.mark_dirty(groups);
            }
        });
    }
}

impl SharedConcurrencyGuard {
    /// Who admitted the copies.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Gives back `n` of its copies now (all if `n` is more), keeping the rest; returns
    /// how many were given back. For callers that release in parts (the limiter API).
    pub fn release(&mut self, n: u64) -> u64 {
        let h = &mut self.held;
        let n = n.min(h.copies);
        h.copies -= n;
        self.shared.put_back(self, n);
        n
    }

    /// Moves `n` of its copies (all if it holds fewer) into a new guard of the same
    /// limiter, key, groups and source, which then gives them back: for holders that hand
    /// part of a hold to someone else (the limiter API's `CH.TRANSFER`). The counts do not
    /// change: the copies stay held, by another guard.
    pub fn split(&mut self, n: u64) -> Self {
        let n = n.min(self.held.copies);
        self.held.copies -= n;
        Self {
            shared: Arc::clone(&self.shared),
            held: Copies {
                copies: n,
                ..self.held
            },
            source: self.source,
            from_block: self.from_block,
        }
    }

    /// Whether `other` holds copies of the same limiter, key and groups, admitted by the
    /// same source: then the two give back alike and can be one guard.
    pub fn same_place(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
            && (self.key, self.groups, self.source, self.from_block)
                == (other.key, other.groups, other.source, other.from_block)
    }

    /// Takes `other`'s copies into this guard (see [`Self::same_place`]; a guard of
    /// another place keeps its copies), leaving `other` empty.
    pub fn absorb(&mut self, other: &mut Self) {
        if self.same_place(other) {
            self.held.copies = self.copies.saturating_add(other.copies);
            other.held.copies = 0;
        }
    }
}

impl Drop for SharedConcurrencyGuard {
    fn drop(&mut self) {
        self.shared.put_back(self, self.held.copies);
    }
}

impl Leased for ConcShared {
    fn lessee(&self) -> (&Remote, &Held) {
        (&self.remote, &self.held)
    }

    async fn renew_key(self: Arc<Self>, key: u64, count: u64, dirty: bool) -> bool {
        let own = (self.counter)(&self.names, key);
        self.remote
            .store()
            .counters_renew(&self.holder, &[&own], &[(count, dirty)])
            .await
            .is_ok()
    }

    /// The global and group counters, when this limiter holds copies there or Redis may
    /// disagree about them, each repaired from the local truth (module doc).
    fn renew_more(self: &Arc<Self>, calls: &mut tokio::task::JoinSet<()>) {
        if self.variant.active() {
            let s = Arc::clone(self);
            calls.spawn(async move { s.variant.renew(s.remote.store(), &s.holder).await });
        }
    }
}
