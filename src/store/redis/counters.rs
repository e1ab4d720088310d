//! Leased concurrency counters in Redis (Charon's copy-limited resources): each counter is
//! a hash of copies per holder and a sorted set of the holders' leases, so a holder that
//! dies loses its copies after one lease. One script takes from several counters at once,
//! all or nothing (`scripts/counters_acquire.lua`); release and renewal likewise.

use crate::store::key::{KeyNames, LimitState, StateKind};
use crate::store::redis::SCRIPT_MAX;
use crate::store::redis::{scripts, Arg, RedisStore};
use crate::store::StoreError;
use redis::Value;

/// The two keys of one counter: copies per holder, and the holders' leases.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKeys {
    /// Hash `{holder: copies}`.
    pub counts: String,
    /// Sorted set `{holder: lease end µs}`.
    pub leases: String,
}

impl CounterKeys {
    /// A key's own counter.
    pub fn of_key(names: &KeyNames, hash: u64) -> Self {
        Self {
            counts: names.key(hash, StateKind::ConcurrencyCounts),
            leases: names.key(hash, StateKind::ConcurrencyLeases),
        }
    }

    /// The variant's global counter (in the variant's own slot).
    pub fn global(names: &KeyNames) -> Self {
        Self {
            counts: names.limit_key(LimitState::ConcurrencyGlobal),
            leases: names.limit_key(LimitState::ConcurrencyGlobalLeases),
        }
    }

    /// Group `group`'s counter (in the variant's own slot).
    pub fn group(names: &KeyNames, group: &str) -> Self {
        Self {
            counts: names.limit_key(LimitState::GroupCounts(group)),
            leases: names.limit_key(LimitState::GroupLeases(group)),
        }
    }
}

/// What [`RedisStore::counters_acquire`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountersOutcome {
    /// Taken from every counter.
    Granted {
        /// Copies taken, in `[min, copies]`.
        granted: u64,
        /// The smallest room left across the counters.
        remaining: u64,
    },
    /// Nothing taken: counter `index` (0-based, in the order given) had fewer than `min`
    /// free.
    Full {
        /// Which counter.
        index: usize,
        /// Copies it held.
        in_use: u64,
    },
}

impl RedisStore {
    /// Takes the largest `n` in `[min, copies]` that every counter has room for (counter
    /// `i` holding at most `maxes[i]`), for `holder`, or nothing (see
    /// counters_acquire.lua). Time (the leases) is always Redis's. The counters must share
    /// a slot on Redis Cluster.
    pub async fn counters_acquire(
        &self,
        holder: &str,
        counters: &[&CounterKeys],
        maxes: &[u64],
        min: u64,
        copies: u64,
    ) -> Result<CountersOutcome, StoreError> {
        let keys = pairs(counters);
        let mut args = Vec::with_capacity(4 + maxes.len());
        args.extend([
            Arg::S(holder),
            Arg::U(self.lease_micros()),
            Arg::U(min.min(SCRIPT_MAX)),
            Arg::U(copies.min(SCRIPT_MAX)),
        ]);
        args.extend(maxes.iter().map(|&m| Arg::U(m.min(SCRIPT_MAX))));
        let s = &self.inner.scripts.counters_acquire;
        let v = self.eval(s, &keys, &args, None, self.budget()).await?;
        let [ok, a, b] = scripts::ints::<3>(&v)?;
        Ok(if ok == 1 {
            CountersOutcome::Granted {
                granted: scripts::count(a),
                remaining: scripts::count(b),
            }
        } else {
            CountersOutcome::Full {
                index: usize::try_from(a - 1).unwrap_or(0),
                in_use: scripts::count(b),
            }
        })
    }

    /// Gives `copies` back to every counter for `holder`, never below zero; returns what
    /// the holder still holds in the first.
    pub async fn counters_release(
        &self,
        holder: &str,
        counters: &[&CounterKeys],
        copies: u64,
    ) -> Result<u64, StoreError> {
        let keys = pairs(counters);
        let args = [Arg::S(holder), Arg::U(copies.min(SCRIPT_MAX))];
        let s = &self.inner.scripts.counters_release;
        let v = self.eval(s, &keys, &args, None, self.background()).await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// Renews `holder`'s lease on every counter and repairs its copies there from
    /// `counts`, (its own truth, whether Redis may disagree): a dirty count is written over
    /// Redis's, a clean one only where Redis lost it (see counters_renew.lua). Returns the
    /// counters' totals across the fleet.
    pub async fn counters_renew(
        &self,
        holder: &str,
        counters: &[&CounterKeys],
        counts: &[(u64, bool)],
    ) -> Result<Vec<u64>, StoreError> {
        let keys = pairs(counters);
        let mut args = Vec::with_capacity(2 + 2 * counts.len());
        args.extend([Arg::S(holder), Arg::U(self.lease_micros())]);
        for &(count, dirty) in counts {
            args.extend([Arg::U(count.min(SCRIPT_MAX)), Arg::U(u64::from(dirty))]);
        }
        let s = &self.inner.scripts.counters_renew;
        let v = self.eval(s, &keys, &args, None, self.background()).await?;
        match v {
            Value::Array(items) => items
                .iter()
                .map(|i| scripts::int(i).map(scripts::count))
                .collect(),
            other => Err(StoreError::Reply(format!(
                "expected an array, got {other:?}"
            ))),
        }
    }

    /// The copies every counter holds across the fleet now (holders with a live lease, as
    /// counters_acquire.lua counts them), at Redis's time, taking and dropping nothing (see
    /// counters_total.lua): one read-only call within the decision budget. The counters
    /// must share a slot on Redis Cluster.
    pub async fn counters_total(&self, counters: &[&CounterKeys]) -> Result<Vec<u64>, StoreError> {
        let keys = pairs(counters);
        let s = &self.inner.scripts.counters_total;
        let v = self.eval(s, &keys, &[], None, self.budget()).await?;
        scripts::counts(&v, counters.len())
    }
}

fn pairs<'a>(counters: &[&'a CounterKeys]) -> Vec<&'a str> {
    counters
        .iter()
        .flat_map(|c| [c.counts.as_str(), c.leases.as_str()])
        .collect()
}
