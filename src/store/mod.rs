//! Where limit state lives when it is shared by a fleet of proxies: Redis (or Valkey),
//! standalone or Cluster, with fail-open.
//!
//! - [`redis`]: the store itself: one pipelined connection on its own runtime thread, a
//!   budget per call, a breaker with a background probe, one Lua script per decision.
//! - [`remote`]: the seam, what every kind whose state lives in the store shares, written
//!   once: the deny cache, the store call within its budget, the fallback, lease renewal,
//!   and answers that say who gave them ([`Sourced`], [`Source`]).
//! - [`shared`], [`shared_log`], [`shared_tiered`], [`shared_concurrency`]: the limiters the
//!   runtime calls, one per kind ([`SharedTokenBucket`], [`SharedRate`], [`SharedInflight`],
//!   [`SharedSlidingLog`], [`SharedTiered`], [`SharedConcurrency`]): each supplies only its
//!   script calls, how to read their replies and its fallback limiter. The token bucket
//!   and the rate are one limiter over their differences ([`shared::SharedCounter`]).
//! - [`deny_cache`]: rejections remembered locally until their `retry_after`, so that a
//!   flood from one key does not become a flood of store calls.
//! - [`key`]: the stable hash of key parts and the readable key names in Redis.
//! - [`breaker`]: the circuit breaker.
//! - [`budget`]: one budget for every store call of one request phase.
//! - [`lease_table`]: the slices a leased limit holds for its hot keys, their renewals
//!   and give-backs; `leased`: the token bucket's and the rate's lease calls, written once
//!   over each kind's script calls ([`shared::CounterKind`]); `leased_slots`: the holding
//!   kinds' (inflight, concurrency) blocks of slots.
//! - `held`: what this instance holds in leased counts, the truth each renewal writes.
//! - `global_share`: a tiered limit's global limit counted per instance on a Cluster.
//! - `releases`: a concurrency limiter's releases on their way to the store.
//!
//! The semantics are exactly the in-process limiters' (`crate::limits`): the scripts are
//! the same algorithms over state in Redis, and a shared test table checks both against
//! the same cases. How the pieces fit is described in `docs/architecture.md`.

pub mod breaker;
pub mod budget;
pub mod deny_cache;
mod global_share;
mod held;
pub mod key;
pub mod lease_close;
pub mod lease_table;
mod leased;
mod leased_slots;
mod local_holds;
pub mod local_share;
pub mod redis;
mod releases;
pub mod remote;
pub mod shared;
pub mod shared_concurrency;
pub mod shared_inflight;
pub mod shared_log;
pub mod shared_tiered;
mod variant_counts;

pub use self::redis::{
    default_instance, CounterKeys, CountersOutcome, Endpoint, EntryId, Fallback, GlobalArg,
    LeaseGrant, LogGrant, Micros, RateCounts, RedisStore, RedisStoreConfig, TieredGrant,
};
pub use deny_cache::DenyCache;
pub use key::{stable_key_hash, KeyNames, LimitState, StateKind, Variant};
pub use lease_table::LeaseCtx;
pub use leased_slots::Holdings;
pub use remote::{Source, Sourced};
pub use shared::{SharedRate, SharedTokenBucket};
pub use shared_concurrency::{SharedConcurrency, SharedConcurrencyGuard};
pub use shared_inflight::{SharedInflight, SharedInflightGuard};
pub use shared_log::{LogAdmission, LogTicket, SharedSlidingLog};
pub use shared_tiered::{SharedTiered, TieredAdmission, TieredTicket};

/// Why a store call did not produce an answer. Only construction errors (`BadUrl`,
/// `Runtime`) reach the config; the others make the caller fall back.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store's URL does not parse.
    #[error("store `{store}`: bad Redis URL `{url}`: {reason}")]
    BadUrl {
        /// The store's name.
        store: String,
        /// The URL as written, its password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store's runtime thread could not start.
    #[error("store `{store}`: cannot start its runtime: {reason}")]
    Runtime {
        /// The store's name.
        store: String,
        /// The system's reason.
        reason: String,
    },
    /// No answer within the budget.
    #[error("no answer within the budget")]
    Timeout,
    /// The breaker is open: the call was not sent.
    #[error("breaker open")]
    BreakerOpen,
    /// Redis answered an error, or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// Redis answered an error about the data of a key the call named (another type
    /// written over it, data no script wrote): that key's failure, not the store's. The
    /// caller falls back; the key is repaired in the background (`crate::store::redis`).
    #[error("key error: {0}")]
    Key(::redis::RedisError),
    /// A reply of an unexpected shape (a script from another version?).
    #[error("unexpected reply: {0}")]
    Reply(String),
    /// A probe step that did not finish in time.
    #[error("{0} timed out")]
    Probe(&'static str),
}
