//! A sliding log (Grab's frequency caps) whose entries live in a shared store, with the
//! store's fallback and a deny cache (the seam, `crate::store::remote`: deny cache, store
//! within its budget, fallback).
//!
//! **Exactness.** In Redis each entry is a sorted-set member at its instant in Redis's
//! microseconds: a window counts exactly the entries of its last `per` (the in-process log
//! counts to its own time unit, erring strict by less than one unit; both are exact for
//! windows up to 2 s at whole microseconds, and agree otherwise except within one unit of
//! an entry's expiry).
//!
//! **Partial grants.** [`SharedSlidingLog::acquire_at`] grants the largest `n` in
//! `[min, cost]` that every window has room for (the proxy passes `min = cost`; the
//! limiter API a smaller `min`), at Redis's time or a caller's (`at`, a replay).
//!
//! **Refunds** remove exactly the entries the admission recorded: in Redis the members
//! named after its [`EntryId`], locally the entries of its instant.
//!
//! **Deny cache.** Sound here: a rejection records nothing, and spending only fills a log,
//! so a key rejected for `min` stays rejected for `min` or more until its `retry_after`
//! (unless another instance refunds, the bounded staleness the cache accepts).
//!
//! **Local share.** The fallback is an in-process log whose every window's `max` is
//! `⌈max / instances⌉`.

use std::sync::Arc;

use crate::limits::clock::Nanos;
use crate::limits::sliding_log::{never_fits, LogWindow, SlidingLog, SlidingLogError};
use crate::limits::verdict::{Verdict, NEVER};
use crate::store::key::KeyNames;
use crate::store::redis::{EntryId, Fallback, LogGrant, Micros, RedisStore, SLIDING_LOG_MAX};
use crate::store::remote::{Remote, Source, Sourced};
use crate::store::StoreError;

/// A sliding log shared through a store.
pub struct SharedSlidingLog {
    remote: Remote,
    names: Arc<KeyNames>,
    windows: Arc<[LogWindow]>,
    local: SlidingLog,
}

/// What a refund of a [`LogAdmission`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTicket {
    /// Entries in the store, named after `id`, decided at Redis's time or `at`.
    Store {
        /// The decision's id.
        id: EntryId,
        /// The caller's time, if it gave one (a refund of a replay uses it too).
        at: Option<Micros>,
    },
    /// Entries in the local fallback, recorded at this local instant.
    Local(Nanos),
    /// Nothing recorded (a rejection, a cached rejection, `fallback: allow` or `deny`).
    None,
}

/// A sliding-log decision through a store (who made it: the [`Sourced`] around it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogAdmission {
    /// Admitted or rejected (see [`crate::store::LogGrant`] for the fields).
    pub verdict: Verdict,
    /// Entries recorded: in `[min, cost]` when admitted, 0 when rejected.
    pub granted: u64,
    /// What [`SharedSlidingLog::refund`] needs.
    pub ticket: LogTicket,
}

impl LogAdmission {
    fn rejected(verdict: Verdict) -> Self {
        Self {
            verdict,
            granted: 0,
            ticket: LogTicket::None,
        }
    }
}

impl SharedSlidingLog {
    /// A log of `windows` in `store`, under `names`; the local fallback holds at most
    /// `max_keys` keys (as the in-process limiter would), the deny cache `deny_cache_keys`
    /// (0: none).
    pub fn new(
        store: &RedisStore,
        names: KeyNames,
        windows: &[LogWindow],
        max_keys: usize,
        deny_cache_keys: usize,
    ) -> Result<Self, SlidingLogError> {
        let remote = Remote::new(store, deny_cache_keys);
        let shares: Vec<LogWindow> = windows
            .iter()
            .map(|w| LogWindow {
                max: remote.share(w.max),
                per: w.per,
            })
            .collect();
        Ok(Self {
            local: SlidingLog::new(&shares, remote.local_keys(max_keys))?,
            remote,
            names: Arc::new(names),
            windows: windows.into(),
        })
    }

    /// The store this limiter decides in (a reload keeps the limiter only while the
    /// runtime keeps this very store).
    pub fn store(&self) -> &RedisStore {
        self.remote.store()
    }

    /// The windows (the fleet's, not the local share).
    pub fn windows(&self) -> &[LogWindow] {
        &self.windows
    }

    /// Each window's count of the key's log in the store now (the fleet's, in window
    /// order), recording nothing: the admin API's `/state`.
    pub async fn peek(&self, key: u64) -> Result<Vec<u64>, StoreError> {
        self.store()
            .sliding_log_get(&self.names, key, &self.windows)
            .await
    }

    /// Decides a request of `cost` entries for the key hashed to `key`, at Redis's time.
    /// `now` is the local clock (deny cache, fallback).
    pub async fn acquire(&self, key: u64, cost: u64, now: Nanos) -> Sourced<LogAdmission> {
        self.acquire_at(key, cost, cost, now, None).await
    }

    /// Grants the largest `n` in `[min, cost]` that every window has room for, or nothing,
    /// at Redis's time or `at` (a replay, in Redis's clock). A `min` above `cost` is
    /// lowered to it. A rejection's `retry_after` is the time until `min` fits, or
    /// [`NEVER`] if some window's `max` is below `min`.
    pub async fn acquire_at(
        &self,
        key: u64,
        min: u64,
        cost: u64,
        now: Nanos,
        at: Option<Micros>,
    ) -> Sourced<LogAdmission> {
        let min = min.min(cost);
        if min > SLIDING_LOG_MAX {
            // More entries than one script may write: it can never be recorded.
            let never = LogAdmission::rejected(Verdict::reject(0, 0, NEVER));
            return Sourced::new(never, Source::Store);
        }
        let call = async {
            let id = self.store().entry_id();
            let (names, windows) = (&self.names, &self.windows);
            let grant = self
                .store()
                .sliding_log(names, key, windows, &id, (min, cost), at);
            Ok((grant.await?, id))
        };
        let stored = |(grant, id): (LogGrant, EntryId)| LogAdmission {
            verdict: grant.verdict,
            granted: grant.granted,
            ticket: if grant.granted > 0 {
                LogTicket::Store { id, at }
            } else {
                LogTicket::None
            },
        };
        let fallback = |f| match f {
            // The in-process log at this instance's share, as the local kind grants.
            Fallback::Local => {
                let g = self.local.acquire_many(key, min, cost, now);
                let recorded = g.granted > 0;
                let ticket = recorded.then_some(LogTicket::Local(now));
                LogAdmission {
                    verdict: g.verdict,
                    granted: g.granted,
                    ticket: ticket.unwrap_or(LogTicket::None),
                }
            }
            Fallback::Allow => LogAdmission {
                verdict: Verdict::allow(self.windows.iter().map(|w| w.max).min().unwrap_or(0), 0),
                granted: cost,
                ticket: LogTicket::None,
            },
            Fallback::Deny => LogAdmission::rejected(self.remote.denied()),
        };
        let never = never_fits(&self.windows, min);
        let cached = LogAdmission::rejected;
        let d = self
            .remote
            .decide((key, min, now), call, stored, cached, fallback);
        d.await.map(|d| LogAdmission {
            verdict: d.verdict.never_if(never),
            ..d
        })
    }

    /// Removes exactly the entries `decision` recorded for the key hashed to `key` (a
    /// later limit rejected the request). A store refund is sent in the background.
    pub fn refund(&self, key: u64, decision: &LogAdmission) {
        match &decision.ticket {
            LogTicket::Store { id, at } => {
                let (store, names, windows, id, at) = (
                    self.store().clone(),
                    Arc::clone(&self.names),
                    Arc::clone(&self.windows),
                    id.clone(),
                    *at,
                );
                let granted = decision.granted;
                self.remote.spawn(async move {
                    let _ = store
                        .sliding_log_refund(&names, key, &windows, &id, granted, at)
                        .await;
                });
            }
            LogTicket::Local(at) => {
                self.local.refund(key, decision.granted, *at);
            }
            LogTicket::None => {}
        }
    }

    /// Keys the local fallback evicted (a full table).
    pub fn evictions(&self) -> u64 {
        self.local.evictions()
    }

    /// Store calls the deny cache saved.
    pub fn deny_cache_hits(&self) -> u64 {
        self.remote.deny_cache_hits()
    }
}
