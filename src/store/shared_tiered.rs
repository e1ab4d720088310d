//! Charon's burst tiers whose per-key state lives in a shared store, with the store's
//! fallback (the seam, `crate::store::remote`: store within its budget, then fallback;
//! there is no deny cache yet: until a refusal changed nothing, a burst that
//! found no room still entered the tiers it reached, so every rejection had to reach the
//! store).
//!
//! **The global limit** (`G` per aligned second across every key of the limit) spans keys,
//! which Redis Cluster keeps in different slots, out of reach of one key's script:
//! - on a standalone Redis the script counts it in a key of its own, in the same call: one
//!   count for the fleet, exact, at no extra round trip ([`GlobalArg::InStore`]);
//! - on a Cluster each instance counts its share, `⌈G / instances⌉`, locally, and passes
//!   the room it reserved to the script, which applies it at its place in the order (hard,
//!   tiers, global), so the tier semantics are unchanged ([`GlobalArg::Reserved`]). The
//!   fleet then admits at most `instances · ⌈G / instances⌉` a second, and less when
//!   traffic is unevenly spread over the instances (`docs/architecture.md`).
//!
//! **Entries metric.** The script reports the tiers each decision entered; this limiter
//! counts them (and its fallback's), so `tollgate_tier_entries_total` counts the entries
//! this instance caused; summed over the fleet, every entry once.
//!
//! **Refunds** take back exactly the admission's hits (named after its [`EntryId`]) and, in
//! Redis's count, its global admissions within their second; the local share gives its
//! reservation back at once.
//!
//! **Local share.** The fallback is an in-process tiered limiter whose tier limits, hard
//! limit and global limit are each `⌈x / instances⌉`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::limits::clock::Nanos;
use crate::limits::tiered::{
    normalize, DecidedBy, TieredDecision, TieredError, TieredKeyState, TieredLimiter, TieredParams,
};
use crate::limits::verdict::Verdict;
use crate::store::global_share::GlobalShare;
use crate::store::key::KeyNames;
use crate::store::redis::{EntryId, Fallback, GlobalArg, Micros, RedisStore, TieredGrant};
use crate::store::remote::{Remote, Sourced};
use crate::store::StoreError;

/// A tiered limit shared through a store.
pub struct SharedTiered {
    remote: Remote,
    names: Arc<KeyNames>,
    params: Arc<TieredParams>,
    local: TieredLimiter,
    /// This instance's share of the global limit, on a Cluster.
    global: Option<Arc<GlobalShare>>,
    /// Tiers entered by store decisions, per tier.
    entries: Box<[AtomicU64]>,
}

/// What a refund of a [`TieredAdmission`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TieredTicket {
    /// Hits in the store, named after `id`.
    Store {
        /// The decision's id.
        id: EntryId,
        /// The store's decision.
        grant: TieredGrant,
        /// Where its global limit was counted.
        global: GlobalArg,
        /// The caller's time, if it gave one.
        at: Option<Micros>,
    },
    /// Hits in the local fallback.
    Local,
    /// Nothing recorded.
    None,
}

/// A tiered decision through a store (who made it: the [`Sourced`] around it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TieredAdmission {
    /// The decision, as the in-process limiter describes it (`tier` for the headers).
    pub decision: TieredDecision,
    /// What [`SharedTiered::refund`] needs.
    pub ticket: TieredTicket,
}

impl SharedTiered {
    /// A tiered limit of `params` in `store`, under `names`; the local fallback holds at
    /// most `max_keys` keys. `params` are normalized here, with the errors of
    /// [`normalize`].
    pub fn new(
        store: &RedisStore,
        names: KeyNames,
        params: &TieredParams,
        max_keys: usize,
    ) -> Result<Self, TieredError> {
        let params = normalize(params)?.params;
        let remote = Remote::new(store, 0);
        let mut local_params = params.clone();
        for t in &mut local_params.tiers {
            t.limit = remote.share(t.limit);
        }
        local_params.hard_limit = params.hard_limit.map(|h| remote.share(h));
        local_params.global_limit = params.global_limit.map(|g| remote.share(g));
        let global = match params.global_limit {
            Some(g) if store.is_cluster() => Some(Arc::new(GlobalShare::new(remote.share(g)))),
            _ => None,
        };
        Ok(Self {
            names: Arc::new(names),
            entries: params.tiers.iter().map(|_| AtomicU64::new(0)).collect(),
            local: TieredLimiter::new(&local_params, remote.local_keys(max_keys))?,
            remote,
            params: Arc::new(params),
            global,
        })
    }

    /// The store this limiter decides in.
    pub fn store(&self) -> &RedisStore {
        self.remote.store()
    }

    /// The normalized parameters (the fleet's).
    pub fn params(&self) -> &TieredParams {
        &self.params
    }

    /// The key's tiered state in the store now, deciding and entering nothing: the admin
    /// API's `/state`. On a Cluster the global limit is this instance's share, counted
    /// locally, so `available` leaves it out (its `global_room` is `None`).
    pub async fn peek(&self, key: u64) -> Result<TieredKeyState, StoreError> {
        self.store()
            .tiered_get(&self.names, key, &self.params, self.global.is_none())
            .await
    }

    /// Decides one request for the key hashed to `key`, at Redis's time; `now` is the local
    /// clock (fallback, the Cluster's global share).
    pub async fn acquire(&self, key: u64, now: Nanos) -> Sourced<TieredAdmission> {
        self.acquire_at(key, 1, 1, now, None).await
    }

    /// Grants the largest count in `[min, max]` that fits (`min` raised to 1, `max` to
    /// `min`), as [`TieredLimiter::acquire_many`] does, at Redis's time or `at` (a replay,
    /// in Redis's clock).
    pub async fn acquire_at(
        &self,
        key: u64,
        min: u64,
        max: u64,
        now: Nanos,
        at: Option<Micros>,
    ) -> Sourced<TieredAdmission> {
        let min = min.max(1);
        let max = max.max(min);
        let (global, reserved) = match (&self.global, self.params.global_limit) {
            (Some(share), _) => {
                let (room, turns_in) = share.reserve(max, now);
                let arg = GlobalArg::Reserved {
                    limit: share.limit,
                    room,
                    turns_in,
                };
                (arg, room)
            }
            (None, Some(limit)) => (GlobalArg::InStore { limit }, 0),
            (None, None) => (GlobalArg::None, 0),
        };
        let call = async {
            let id = self.store().entry_id();
            let result = self
                .store()
                .tiered(
                    &self.names,
                    key,
                    &self.params,
                    &id,
                    (min, max),
                    global,
                    now,
                    at,
                )
                .await;
            let used = result.as_ref().map_or(0, |g| g.decision.granted);
            if let Some(share) = &self.global {
                share.give_back(reserved - used.min(reserved), now, now);
            }
            result.map(|grant| (grant, id))
        };
        let stored = |(grant, id): (TieredGrant, EntryId)| {
            self.count_entries(grant.entered);
            let ticket = if grant.decision.granted > 0 {
                TieredTicket::Store {
                    id,
                    grant,
                    global,
                    at,
                }
            } else {
                TieredTicket::None
            };
            TieredAdmission {
                decision: grant.decision,
                ticket,
            }
        };
        // `allow` and `deny` decide in no tier.
        let untiered = |verdict, granted| TieredDecision {
            verdict,
            granted,
            tier: 0,
            decided_by: DecidedBy::TierWindow,
            first_tier: 0,
            at: now,
        };
        let fallback = |f| {
            let decision = match f {
                Fallback::Local => self.local.acquire_many(key, min, max, now),
                Fallback::Allow => untiered(Verdict::allow(0, 0), max),
                Fallback::Deny => untiered(self.remote.denied(), 0),
            };
            TieredAdmission {
                ticket: if f == Fallback::Local && decision.granted > 0 {
                    TieredTicket::Local
                } else {
                    TieredTicket::None
                },
                decision,
            }
        };
        self.remote.call(call, stored, fallback).await
    }

    /// Takes back the hits `d` recorded for the key hashed to `key` (a later limit rejected
    /// the request); the tiers it entered stay entered. A store refund is sent in the
    /// background, a global share's admissions are given back at once.
    pub fn refund(&self, key: u64, d: &TieredAdmission, now: Nanos) {
        match &d.ticket {
            TieredTicket::Store {
                id,
                grant,
                global,
                at,
            } => {
                if let Some(share) = &self.global {
                    share.give_back(grant.decision.granted, grant.decision.at, now);
                }
                let (store, names, params) = (
                    self.store().clone(),
                    Arc::clone(&self.names),
                    Arc::clone(&self.params),
                );
                let (id, grant, global, at) = (id.clone(), *grant, *global, *at);
                self.remote.spawn(async move {
                    let _ = store
                        .tiered_refund(&names, key, &params, &id, &grant, global, at)
                        .await;
                });
            }
            TieredTicket::Local => self.local.refund(key, &d.decision, now),
            TieredTicket::None => {}
        }
    }

    /// Entries into `tier` (1-based) this instance caused: its store decisions' and its
    /// fallback's.
    pub fn entries(&self, tier: usize) -> u64 {
        let store = tier
            .checked_sub(1)
            .and_then(|i| self.entries.get(i))
            .map_or(0, |e| e.load(Ordering::Relaxed));
        store + self.local.entries(tier)
    }

    /// Keys the local fallback evicted (a full table).
    pub fn evictions(&self) -> u64 {
        self.local.evictions()
    }

    fn count_entries(&self, mask: u32) {
        for (i, e) in self.entries.iter().enumerate() {
            if mask & (1 << i) != 0 {
                e.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
