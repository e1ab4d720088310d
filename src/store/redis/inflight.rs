//! Inflight counts in Redis: per key, each instance's units under a lease, in a counter of
//! the same shape as a concurrency limit's (`counters.rs`: a hash of counts per holder and
//! a sorted set of lease ends), so one set of scripts takes, gives back, renews and reads
//! both kinds. The holder is the instance's name; the keys are the inflight limit's own.

use crate::store::key::{KeyNames, StateKind};
use crate::store::redis::{CounterKeys, CountersOutcome, RedisStore};
use crate::store::StoreError;

impl RedisStore {
    /// Takes one inflight unit for this instance if the fleet's total stays within `max`:
    /// `Ok(Ok(total))` when taken, `Ok(Err(total + 1))` when not (the estimate that was
    /// over, as the in-process limiter reports it).
    pub async fn inflight_acquire(
        &self,
        names: &KeyNames,
        hash: u64,
        max: u64,
    ) -> Result<Result<u64, u64>, StoreError> {
        let counter = Self::inflight_counter(names, hash);
        let me = &self.inner.config.instance;
        Ok(
            match self.counters_acquire(me, &[&counter], &[max], 1, 1).await? {
                CountersOutcome::Granted { remaining, .. } => Ok(max.saturating_sub(remaining)),
                CountersOutcome::Full { in_use, .. } => Err(in_use.saturating_add(1)),
            },
        )
    }

    /// Gives back one unit this instance holds; returns the units it still holds.
    pub async fn inflight_release(&self, names: &KeyNames, hash: u64) -> Result<u64, StoreError> {
        let counter = Self::inflight_counter(names, hash);
        let me = &self.inner.config.instance;
        self.counters_release(me, &[&counter], 1).await
    }

    /// Renews this instance's lease on the key and repairs its count from `count` (the
    /// local truth): written over Redis's when `dirty` (Redis may disagree), else only if
    /// Redis lost it (see counters_renew.lua). Returns the fleet's total.
    pub async fn inflight_renew(
        &self,
        names: &KeyNames,
        hash: u64,
        count: u64,
        dirty: bool,
    ) -> Result<u64, StoreError> {
        let counter = Self::inflight_counter(names, hash);
        let me = &self.inner.config.instance;
        let totals = self
            .counters_renew(me, &[&counter], &[(count, dirty)])
            .await?;
        Ok(totals.first().copied().unwrap_or(0))
    }

    /// The fleet's units in flight for the key (instances with a live lease only).
    pub async fn inflight_total(&self, names: &KeyNames, hash: u64) -> Result<u64, StoreError> {
        let counter = Self::inflight_counter(names, hash);
        let totals = self.counters_total(&[&counter]).await?;
        Ok(totals.first().copied().unwrap_or(0))
    }

    /// The counter of an inflight limit's key: the keys its units are counted under.
    pub fn inflight_counter(names: &KeyNames, hash: u64) -> CounterKeys {
        CounterKeys {
            counts: names.key(hash, StateKind::InflightCounts),
            leases: names.key(hash, StateKind::InflightLeases),
        }
    }
}
