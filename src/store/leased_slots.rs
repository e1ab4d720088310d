//! The lease calls of the holding kinds (inflight, and concurrency without a global or
//! group counter): a hot key's block of slots taken from its counter in Redis
//! (`lease_slots_take.lua`) and its surplus given back (`counters_release.lua`), as a
//! [`LeaseKind`] for `crate::store::lease_table`.
//!
//! **One count per holder.** The slots of a block live in the same field of the key's
//! counter as the units this holder decided exactly, and in the same local truth
//! (`crate::store::held`): what the renewals write and keep alive is "in use here plus
//! free in the block". So a slot moves between the block and a request with no call and
//! no change to either count, a request's release puts its slot back into the block, and
//! only a take or a give-back changes what Redis counts. The fleet's in-use count is at
//! most the sum of the holders' fields, which the take script keeps within `max`: the
//! fleet never holds more than `max` slots in use (overshoot 0).
//!
//! **No end of its own.** A block lives as long as its holder's lease, which the renewal
//! loop extends while this limiter lives; a crashed instance's block is gone after one
//! lease, like its exact units. So a grant carries no validity here.

use std::future::Future;
use std::sync::Arc;

use crate::limits::clock::Nanos;
use crate::limits::lease::LeaseParams;
use crate::store::held::Held;
use crate::store::key::KeyNames;
use crate::store::lease_table::{FromSlice, LeaseCtx, LeaseKind, LeaseTable};
use crate::store::redis::{CounterKeys, LeaseGrant, RedisStore};
use crate::store::StoreError;

/// A full counter is asked again at most this often by a hot key (each request in
/// between decides exactly).
const QUIET: Nanos = 50_000_000;

/// A holding kind's counters in Redis, as a [`LeaseKind`] (module doc).
#[derive(Clone)]
pub(crate) struct Slots {
    pub(crate) store: RedisStore,
    pub(crate) names: Arc<KeyNames>,
    /// This limiter's field in the counters.
    pub(crate) holder: Arc<str>,
    /// The key's counter.
    pub(crate) counter: fn(&KeyNames, u64) -> CounterKeys,
    /// The fleet's max per key.
    pub(crate) max: u64,
    /// This limiter's local truth per key (what the renewals write).
    pub(crate) held: Arc<Held>,
}

impl LeaseKind for Slots {
    type Host = RedisStore;

    fn host(&self) -> &RedisStore {
        &self.store
    }

    async fn take(self, key: u64, want: u64) -> Result<LeaseGrant, StoreError> {
        let counter = (self.counter)(&self.names, key);
        let taken = (self.store)
            .lease_slots_take(&self.holder, &[&counter], &[self.max], want)
            .await;
        let g = taken.inspect_err(|_| {
            // It may still have run in Redis: the next renewal writes the truth.
            self.held.mark_dirty(key);
        })?;
        // Counted in Redis under this holder: the local truth follows.
        self.held.add(key, g.granted, false);
        Ok(LeaseGrant {
            valid_for: None,
            ..g
        })
    }

    fn give_back(
        self,
        key: u64,
        n: u64,
        _epoch: u64,
    ) -> impl Future<Output = bool> + Send + 'static {
        // Off the local truth at once; if the release is not sent or fails, the key is
        // dirty and the next renewal writes the count.
        let send = self.store.is_up();
        self.held.sub(key, n, !send);
        async move {
            if !send {
                return false;
            }
            let counter = (self.counter)(&self.names, key);
            let sent = (self.store)
                .counters_release(&self.holder, &[&counter], n)
                .await;
            if sent.is_err() {
                self.held.mark_dirty(key);
            }
            sent.is_ok()
        }
    }

    fn quiet(&self) -> Nanos {
        QUIET
    }
}

/// What a holding kind in a store holds per key on this instance: the local truth its
/// renewals write ([`Held`]: in use here plus the free slots of blocks) and, with
/// `lease:`, its hot keys' blocks. It reads as the [`Held`] it keeps.
pub struct Holdings {
    held: Arc<Held>,
    lease: Option<LeaseTable<Slots>>,
}

impl Holdings {
    /// The holdings of a limit of `max` per key whose key counters `counter` names, under
    /// `holder` in `store`, leasing as `lease` says (`None`: every acquisition and release
    /// is a call).
    pub(crate) fn new(
        store: &RedisStore,
        names: &Arc<KeyNames>,
        holder: &str,
        counter: fn(&KeyNames, u64) -> CounterKeys,
        max: u64,
        lease: Option<LeaseCtx>,
    ) -> Self {
        let held = Arc::new(Held::new());
        let lease = lease.map(|ctx| {
            let slots = Slots {
                store: store.clone(),
                names: Arc::clone(names),
                holder: Arc::from(holder),
                counter,
                max,
                held: Arc::clone(&held),
            };
            let instances = u64::from(store.config().tuning.instances);
            LeaseTable::started(slots, ctx, max, instances)
        });
        Self { held, lease }
    }

    /// Takes `n` slots of the key's block with no call (already counted here and in
    /// Redis): the room left as far as this instance knows (the block's free slots and the
    /// shared remainder Redis last reported), or `None` to decide exactly.
    pub(crate) fn take_slots(&self, key: u64, n: u64) -> Option<u64> {
        let table = self.lease.as_ref()?;
        match table.acquire(key, n, table.now()) {
            FromSlice::Admitted { held, remaining } => Some(held.saturating_add(remaining)),
            FromSlice::Exact => None,
        }
    }

    /// Puts back `n` slots the store counts for this instance (`from_block`: taken with
    /// [`Holdings::take_slots`]) into the key's block, with no call; false when the key has
    /// no block (the caller releases to the store).
    pub(crate) fn put_slots(&self, key: u64, n: u64, from_block: bool) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|table| table.release(key, n, from_block, table.now()))
    }

    /// Units of `key` in use here, whoever admitted them (not the free slots of its block).
    pub fn in_use(&self, key: u64) -> u64 {
        self.held.get(key).saturating_sub(self.free(key))
    }

    /// Free slots of `key`'s block held here: counted in Redis (they are leased to this
    /// instance), in use by no request.
    pub fn free(&self, key: u64) -> u64 {
        self.lease.as_ref().map_or(0, |t| t.available(key))
    }

    /// Units in use here across every key.
    pub fn in_use_total(&self) -> u64 {
        self.held.total().saturating_sub(self.leased())
    }

    /// The lease settings (`None`: not leased).
    pub fn lease_params(&self) -> Option<LeaseParams> {
        self.lease.as_ref().map(LeaseTable::params)
    }

    /// Free slots held in blocks (`tollgate_store_leased`).
    pub fn leased(&self) -> u64 {
        self.lease.as_ref().map_or(0, LeaseTable::held)
    }
}

impl std::ops::Deref for Holdings {
    type Target = Held;

    fn deref(&self) -> &Held {
        &self.held
    }
}
