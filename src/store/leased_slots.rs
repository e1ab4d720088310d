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
use crate::metrics::LeaseCalls;
use crate::store::held::Held;
use crate::store::key::KeyNames;
use crate::store::lease_table::LeaseKind;
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
    fn up(&self) -> bool {
        self.store.is_up()
    }

    fn take(
        &self,
        key: u64,
        want: u64,
    ) -> impl Future<Output = Result<LeaseGrant, StoreError>> + Send + 'static {
        let at = self.clone();
        async move {
            let counter = (at.counter)(&at.names, key);
            let taken = (at.store)
                .lease_slots_take(&at.holder, &[&counter], &[at.max], want)
                .await;
            let g = taken.inspect_err(|_| {
                // It may still have run in Redis: the next renewal writes the truth.
                at.held.mark_dirty(key);
            })?;
            // Counted in Redis under this holder: the local truth follows.
            at.held.add(key, g.granted, false);
            Ok(LeaseGrant {
                valid_for: None,
                ..g
            })
        }
    }

    fn give_back(
        &self,
        key: u64,
        n: u64,
        _epoch: u64,
    ) -> impl Future<Output = bool> + Send + 'static {
        let at = self.clone();
        // Off the local truth at once; if the release is not sent or fails, the key is
        // dirty and the next renewal writes the count.
        let send = at.store.is_up();
        at.held.sub(key, n, !send);
        async move {
            if !send {
                return false;
            }
            let counter = (at.counter)(&at.names, key);
            let sent = (at.store)
                .lease_slots_return(&at.holder, &[&counter], n)
                .await;
            if sent.is_err() {
                at.held.mark_dirty(key);
            }
            sent.is_ok()
        }
    }

    fn quiet(&self) -> Nanos {
        QUIET
    }

    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.store.handle().spawn(work);
    }

    fn calls(&self) -> &LeaseCalls {
        &self.store.metrics().lease_calls
    }
}
