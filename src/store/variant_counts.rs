//! What one shared concurrency limiter holds on this instance in its variant-wide
//! counters, the global one and each group's: the local truth each lease renewal writes
//! to Redis, as `crate::store::held` is for the keys' counters (`docs/architecture.md`,
//! "Cross-slot state").
//!
//! A count is *dirty* when Redis may disagree with it (copies the fallback admitted, a
//! release that was not sent or failed, a decision that timed out but may have run): the
//! next renewal writes it over Redis's; a clean one is only restored where Redis lost it.
//!
//! **Takes and releases span slots.** On one Redis one script takes from the key's, the
//! global and the request's groups' counters at once, all or nothing; on a Cluster the
//! key's and the variant's counters are two scripts sent together, the grant the smaller,
//! the excess given back by the caller (a transient wrong denial for that round trip at
//! most).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use smallvec::SmallVec;

use crate::limits::concurrency::{ConcurrencyParams, Limit, Rejection};
use crate::store::key::KeyNames;
use crate::store::redis::{CounterKeys, CountersOutcome, RedisStore};
use crate::store::StoreError;

/// The counters of one request (its key's, the global, a few groups): on the stack, as a
/// store decision of an inflight or plain concurrency limit takes from one counter.
pub(crate) type Counters<T> = SmallVec<[T; 4]>;

/// What a take from a key's counter and its variant's gave ([`VariantCounts::take`]).
pub(crate) struct Taken {
    /// The grant and the room left, or the first limit that did not fit; or the store's
    /// error.
    pub(crate) outcome: Result<Result<(u64, u64), Rejection>, StoreError>,
    /// What the key's side and the variant's side of a Cluster's split took beyond the
    /// grant, for the caller to give back.
    pub(crate) over: [u64; 2],
}

/// The variant-wide counters of one limit and the copies this instance holds in each.
pub(crate) struct VariantCounts {
    /// The global counter (with its max), if the limit has one.
    global: Option<(CounterKeys, u64)>,
    /// Each group's counter and max, by index.
    groups: Vec<(CounterKeys, u64)>,
    /// Copies held in the global counter (index 0) and each group's (1 + i).
    counts: Box<[Count]>,
}

/// Copies held in one counter, and whether Redis may disagree.
#[derive(Default)]
struct Count {
    copies: AtomicU64,
    dirty: AtomicBool,
}

impl VariantCounts {
    /// The counters of `params` under `names`, group `i` named `group_names[i]`.
    pub(crate) fn new(names: &KeyNames, params: &ConcurrencyParams, group_names: &[&str]) -> Self {
        let groups = (params.groups.iter().enumerate())
            .map(|(i, &max)| {
                let name = group_names.get(i).copied().unwrap_or("");
                (CounterKeys::group(names, name), max)
            })
            .collect::<Vec<_>>();
        Self {
            global: params.global.map(|max| (CounterKeys::global(names), max)),
            counts: (0..=groups.len()).map(|_| Count::default()).collect(),
            groups,
        }
    }

    /// Whether the limit has no global or group counter.
    pub(crate) fn is_empty(&self) -> bool {
        self.global.is_none() && self.groups.is_empty()
    }

    /// The indexes (in `counts`) a request in `groups` touches: global, then groups.
    fn indexes(&self, groups: u64) -> impl Iterator<Item = usize> + '_ {
        let global = self.global.as_ref().map(|_| 0);
        let in_groups = (0..self.groups.len()).filter(move |i| groups & (1 << i) != 0);
        global.into_iter().chain(in_groups.map(|i| i + 1))
    }

    /// The counters a request in `groups` touches, with their maxes and the limits they
    /// are: global, then groups by index (on the stack for up to four).
    pub(crate) fn of(&self, groups: u64) -> Counters<(&CounterKeys, u64, Limit)> {
        self.indexes(groups)
            .filter_map(|i| match i.checked_sub(1) {
                None => self
                    .global
                    .as_ref()
                    .map(|(c, max)| (c, *max, Limit::Global)),
                Some(g) => self
                    .groups
                    .get(g)
                    .map(|(c, max)| (c, *max, Limit::Group(g as u8))),
            })
            .collect()
    }

    /// Takes between `min` and `copies` for `holder` from the key's counter `own` (of its
    /// max) and the counters of `groups` (module doc: one script, or a Cluster's two).
    pub(crate) async fn take(
        &self,
        store: &RedisStore,
        holder: &str,
        (own, max): (&CounterKeys, u64),
        groups: u64,
        [min, copies]: [u64; 2],
    ) -> Taken {
        let variant = self.of(groups);
        // Every counter the request takes from, the key's first.
        let mut counters: Counters<&CounterKeys> = SmallVec::from_elem(own, 1);
        counters.extend(variant.iter().map(|c| c.0));
        let mut maxes: Counters<u64> = SmallVec::from_elem(max, 1);
        maxes.extend(variant.iter().map(|c| c.1));
        let full = |index: usize, in_use| {
            let of_variant = index.checked_sub(1).and_then(|i| variant.get(i));
            let (limit, max) = of_variant.map_or((Limit::Key, max), |c| (c.2, c.1));
            Rejection {
                limit,
                in_use,
                max,
                wanted: min,
            }
        };
        let read = |outcome| match outcome {
            CountersOutcome::Granted { granted, remaining } => Ok((granted, remaining)),
            CountersOutcome::Full { index, in_use } => Err(full(index, in_use)),
        };
        if variant.is_empty() || !store.is_cluster() {
            let outcome = store.counters_acquire(holder, &counters, &maxes, min, copies);
            return Taken {
                outcome: outcome.await.map(read),
                over: [0, 0],
            };
        }
        let (mine, theirs) = tokio::join!(
            store.counters_acquire(holder, &counters[..1], &maxes[..1], min, copies),
            store.counters_acquire(holder, &counters[1..], &maxes[1..], min, copies),
        );
        let taken = |r: &Result<CountersOutcome, StoreError>| match r {
            Ok(CountersOutcome::Granted { granted, .. }) => Some(*granted),
            _ => None,
        };
        let (k, v) = (taken(&mine), taken(&theirs));
        let grant = k.zip(v).map_or(0, |(k, v)| k.min(v));
        let over = [k.unwrap_or(0) - grant, v.unwrap_or(0) - grant];
        let outcome = match (mine, theirs) {
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(CountersOutcome::Full { in_use, .. }), _) => Ok(Err(full(0, in_use))),
            (_, Ok(CountersOutcome::Full { index, in_use })) => Ok(Err(full(index + 1, in_use))),
            (
                Ok(CountersOutcome::Granted { remaining: a, .. }),
                Ok(CountersOutcome::Granted { remaining: b, .. }),
            ) => {
                // Remaining as if only `grant` had been taken on each side.
                Ok(Ok((grant, (a + over[0]).min(b + over[1]))))
            }
        };
        Taken { outcome, over }
    }

    /// Gives `copies` back for `holder` to the key's counter `own` and the counters of
    /// `groups` (on a Cluster, the two slots' scripts together): whether all landed.
    pub(crate) async fn release(
        &self,
        store: &RedisStore,
        holder: &str,
        own: &CounterKeys,
        groups: u64,
        copies: u64,
    ) -> bool {
        let mut all: Counters<&CounterKeys> = SmallVec::from_elem(own, 1);
        all.extend(self.of(groups).iter().map(|c| c.0));
        if all.len() == 1 || !store.is_cluster() {
            return store.counters_release(holder, &all, copies).await.is_ok();
        }
        let (a, b) = tokio::join!(
            store.counters_release(holder, &all[..1], copies),
            store.counters_release(holder, &all[1..], copies),
        );
        a.is_ok() && b.is_ok()
    }

    /// `copies` more held in the counters of `groups` (`dirty`: Redis did not count them).
    pub(crate) fn add(&self, groups: u64, copies: u64, dirty: bool) {
        for i in self.indexes(groups) {
            self.counts[i].copies.fetch_add(copies, Ordering::Relaxed);
            if dirty {
                self.counts[i].dirty.store(true, Ordering::Relaxed);
            }
        }
    }

    /// `copies` fewer held in the counters of `groups` (`dirty`: Redis will not hear of it).
    pub(crate) fn sub(&self, groups: u64, copies: u64, dirty: bool) {
        for i in self.indexes(groups) {
            let c = &self.counts[i];
            let less = |n: u64| Some(n.saturating_sub(copies));
            let _ = c
                .copies
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, less);
            if dirty {
                c.dirty.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Redis may disagree about the counters of `groups`.
    pub(crate) fn mark_dirty(&self, groups: u64) {
        self.sub(groups, 0, true);
    }

    /// Copies held in group `group` (0 for one that does not exist).
    pub(crate) fn group(&self, group: usize) -> u64 {
        (self.counts.get(group + 1)).map_or(0, |c| c.copies.load(Ordering::Relaxed))
    }

    /// Whether a renewal has something to write: copies held, or a count Redis may have
    /// wrong.
    pub(crate) fn active(&self) -> bool {
        !self.is_empty()
            && (self.counts.iter())
                .any(|c| c.copies.load(Ordering::Relaxed) > 0 || c.dirty.load(Ordering::Relaxed))
    }

    /// The counters in Redis order (global, then groups) and the counts written for them.
    fn written(&self, take_dirty: bool) -> (Vec<&CounterKeys>, Vec<(u64, bool)>) {
        let counters = (self.global.iter().chain(&self.groups)).map(|(c, _)| c);
        let first = usize::from(self.global.is_none());
        let counts = self.counts.iter().skip(first).map(|c| {
            let dirty = take_dirty && c.dirty.swap(false, Ordering::Relaxed);
            (c.copies.load(Ordering::Relaxed), dirty)
        });
        (counters.collect(), counts.collect())
    }

    /// Renews `holder`'s lease on every counter where it holds copies or Redis may
    /// disagree, each repaired from the local truth (module doc); a count not written, or
    /// written while it moved, stays dirty for the next renewal. Nothing when idle.
    pub(crate) async fn renew(&self, store: &RedisStore, holder: &str) {
        if !self.active() {
            return;
        }
        let (counters, counts) = self.written(true);
        let written = store
            .counters_renew(holder, &counters, &counts)
            .await
            .is_ok();
        let first = usize::from(self.global.is_none());
        for (c, (count, dirty)) in self.counts.iter().skip(first).zip(&counts) {
            let moved = c.copies.load(Ordering::Relaxed) != *count;
            if *dirty && (!written || moved) {
                c.dirty.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The copies of every counter across the fleet (instances with a live lease), global
    /// then groups: a renewal that changes no count Redis holds.
    pub(crate) async fn totals(
        &self,
        store: &RedisStore,
        holder: &str,
    ) -> Result<Vec<u64>, StoreError> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        let (counters, counts) = self.written(false);
        store.counters_renew(holder, &counters, &counts).await
    }
}
