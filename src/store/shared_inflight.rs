//! An inflight limit counted across a fleet: a holding limit of `max` units per key with
//! no global or group counter, counted by the concurrency limiter's machinery
//! (`crate::store::shared_concurrency`: per-holder counters under a lease, the local truth
//! the renewals write, blocks of slots for hot keys, releases seen by the next
//! acquisition, a field per limiter incarnation), one unit a request. What is its own: its
//! keys in Redis (`ic`/`il`) and its fallback, the count-min sketch a local inflight limit
//! uses, at this instance's share of `max` (`crate::store::local_holds`).

use crate::limits::concurrency::ConcurrencyParams;
use crate::limits::inflight::InflightLimiter;
use crate::limits::sketch::SketchSize;
use crate::store::key::KeyNames;
use crate::store::lease_table::LeaseCtx;
use crate::store::leased_slots::Holdings;
use crate::store::local_holds::LocalHolds;
use crate::store::redis::{Fallback, RedisStore};
use crate::store::remote::{share, Source, Sourced};
use crate::store::shared_concurrency::{Counting, SharedConcurrency, SharedConcurrencyGuard};
use crate::store::StoreError;

/// An inflight limit counted across the fleet, per instance with a lease (module doc).
pub struct SharedInflight(SharedConcurrency);

/// Holds one unit of a key's fleet-wide inflight count. Dropping it gives the unit back
/// locally at once and to the store in the background.
pub struct SharedInflightGuard(SharedConcurrencyGuard);

impl SharedInflight {
    /// An inflight limit of `max` units per key across the fleet, in `store`, under
    /// `names`; the local fallback uses a sketch of `sketch`. Starts the renewal task on
    /// the store's runtime (it ends when this limiter and its last guard are gone).
    pub fn new(store: &RedisStore, names: KeyNames, max: u64, sketch: SketchSize) -> Self {
        Self::new_leased(store, names, max, sketch, None)
    }

    /// [`SharedInflight::new`] with hot keys leasing blocks of slots as `lease` says
    /// (`None`: one call per acquisition and per release).
    pub fn new_leased(
        store: &RedisStore,
        names: KeyNames,
        max: u64,
        sketch: SketchSize,
        lease: Option<LeaseCtx>,
    ) -> Self {
        // Only a local fallback counts: the others keep a sketch of one counter.
        let sketch = match store.config().tuning.fallback {
            Fallback::Local => sketch,
            Fallback::Allow | Fallback::Deny => SketchSize {
                hashes: 1,
                slots: 1,
            },
        };
        let local_max = share(max, store.config().tuning.instances);
        let counting = Counting {
            local: LocalHolds::Sketch(InflightLimiter::new(sketch), local_max),
            counter: RedisStore::inflight_counter,
        };
        let params = ConcurrencyParams {
            max,
            global: None,
            groups: Vec::new(),
        };
        Self(SharedConcurrency::counted(
            store,
            names,
            params,
            &[],
            counting,
            lease,
        ))
    }

    /// The store this limiter decides in: a reload keeps the limiter only while the
    /// runtime keeps this very store (same connection), not just one of the same name.
    pub fn store(&self) -> &RedisStore {
        self.0.store()
    }

    /// The fleet's units in flight for the key hashed to `key`, counting instances with a
    /// live lease only: one read-only script call, bounded by the store's budget (the
    /// admin API's `/state`).
    pub async fn peek(&self, key: u64) -> Result<u64, StoreError> {
        self.0.peek(key).await
    }

    /// Takes one unit for the key hashed to `key` if the fleet's total stays within `max`
    /// (the fallback's share while the store cannot answer): the guard holding it, or the
    /// estimate that was over `max`.
    pub async fn acquire(&self, key: u64) -> Sourced<Result<SharedInflightGuard, u64>> {
        let taken = self.0.acquire(key, 0, 1).await;
        taken.map(|t| {
            t.map(SharedInflightGuard)
                .map_err(|r| r.in_use.saturating_add(1))
        })
    }

    /// What this instance holds per key, whoever admitted it, and its blocks.
    pub fn holdings(&self) -> &Holdings {
        self.0.holdings()
    }

    /// The fleet's limit.
    pub fn max(&self) -> u64 {
        self.0.params().max
    }
}

impl SharedInflightGuard {
    /// The key whose unit this guard holds.
    pub fn key(&self) -> u64 {
        self.0.key
    }

    /// Who admitted the unit.
    pub fn source(&self) -> Source {
        self.0.source()
    }
}
