//! Inflight counts in Redis: per key, each instance's units under a lease (a hash of
//! counts and a sorted set of lease ends), taken, given back, renewed and read by one
//! script each (`scripts/inflight_*.lua`).

use crate::store::key::{KeyNames, StateKind};
use crate::store::redis::{scripts, Arg, RedisStore, SCRIPT_MAX};
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
        let (counts, leases) = inflight_keys(names, hash);
        let args = [
            Arg::S(&self.inner.config.instance),
            Arg::U(max.min(SCRIPT_MAX)),
            Arg::U(self.lease_micros()),
        ];
        let s = &self.inner.scripts.inflight_acquire;
        let v = self
            .eval(s, &[&counts, &leases], &args, None, self.budget())
            .await?;
        let [admitted, total] = scripts::ints::<2>(&v)?;
        let total = scripts::count(total);
        Ok(if admitted == 1 { Ok(total) } else { Err(total) })
    }

    /// Gives back one unit this instance holds; returns the units it still holds.
    pub async fn inflight_release(&self, names: &KeyNames, hash: u64) -> Result<u64, StoreError> {
        let (counts, leases) = inflight_keys(names, hash);
        let args = [Arg::S(&self.inner.config.instance)];
        let s = &self.inner.scripts.inflight_release;
        let v = self
            .eval(s, &[&counts, &leases], &args, None, self.background())
            .await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// Renews this instance's lease on the key and repairs its count from `count` (the
    /// local truth): written over Redis's when `dirty` (Redis may disagree), else only if
    /// Redis lost it (see inflight_renew.lua). Returns the fleet's total.
    pub async fn inflight_renew(
        &self,
        names: &KeyNames,
        hash: u64,
        count: u64,
        dirty: bool,
    ) -> Result<u64, StoreError> {
        let (counts, leases) = inflight_keys(names, hash);
        let args = [
            Arg::S(&self.inner.config.instance),
            Arg::U(count.min(SCRIPT_MAX)),
            Arg::U(self.lease_micros()),
            Arg::U(u64::from(dirty)),
        ];
        let s = &self.inner.scripts.inflight_renew;
        let v = self
            .eval(s, &[&counts, &leases], &args, None, self.background())
            .await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// The fleet's units in flight for the key (instances with a live lease only).
    pub async fn inflight_total(&self, names: &KeyNames, hash: u64) -> Result<u64, StoreError> {
        let (counts, leases) = inflight_keys(names, hash);
        let s = &self.inner.scripts.inflight_total;
        let v = self
            .eval(s, &[&counts, &leases], &[], None, self.background())
            .await?;
        Ok(scripts::count(scripts::int(&v)?))
    }
}

pub(super) fn inflight_keys(names: &KeyNames, hash: u64) -> (String, String) {
    (
        names.key(hash, StateKind::InflightCounts),
        names.key(hash, StateKind::InflightLeases),
    )
}
