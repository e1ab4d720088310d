//! The limiters: pure Rust, no Pingora types, time passed in by the caller.
//!
//! Every limiter answers one question for one key at one instant: may this event happen?
//! Keys arrive already hashed to a `u64` (see [`key`]), time arrives as [`clock::Nanos`]
//! from a [`clock::Clock`], so every algorithm is tested against a manual clock with no
//! sleeping. Each kind lives in its own file:
//!
//! - [`inflight`]: count-min estimate of concurrent events, decremented by a guard's drop.
//! - [`adaptive`]: not a limiter: the learned concurrency of one upstream server (`max:
//!   auto`), from a gradient of its short- against its long-term latency.
//! - [`rate`]: sliding-window estimate of events per period, exact per key, in a fixed-size
//!   set-associative table (as the token bucket's), whose evictions only ever make it more
//!   lenient: a flood of other keys can never get a key rejected.
//! - [`adhoc_bucket`]: token buckets whose parameters come with each call (the limiter
//!   API's `RL.REDUCE`), in the same kind of bounded table.
//! - [`token_bucket`]: exact per-key token bucket with discrete refills, in a fixed-size
//!   set-associative table (one lock per set of 8 keys, memory fixed by `max_keys`).
//! - [`concurrency`]: exact copies held per key, globally and per group (Charon's
//!   copy-limited resources), released exactly once by a guard or by an explicit release.
//! - [`sliding_log`]: exact sliding logs of timestamps per key against several windows at
//!   once (Grab's frequency caps), in a fixed arena.
//! - [`tiered`]: Charon's burst tiers, exact per-key sliding logs stacked in tiers with
//!   active periods and cooldowns, plus per-key hard and limit-wide global per-second limits,
//!   in the same kind of fixed table with preallocated log arenas.
//!
//! - [`table`]: the one set-associative per-key table every kind above but inflight keeps
//!   its state in (sets of 8 ways, Lemire's index, scan, victim, length, evictions); each
//!   kind supplies only its slot's value, its transition and its victim score.
//! - [`lease`]: hot keys, slice sizes and held slices of a shared limit's quota (leases):
//!   the parts of a lease that need no store.
//!
//! - [`victim`]: which key a full set of a per-key table forgets for a new one: the one
//!   whose forgetting would wrongly admit least (each kind scores its keys).
//!
//! - [`path`]: not a limiter: the one spelling of a request path that `path` key parts and
//!   conditions see (escapes of unreserved bytes decoded, dot segments removed, slashes
//!   merged), so another spelling of a path cannot step around its limit.
//!
//! - [`heavy`]: not a limiter: a windowed count-min sketch with two top-k lists, the
//!   heaviest keys of a limit for the admin API (`top_keys`).
//!
//! The kinds whose state outlives a request (token bucket, rate, sliding log, tiered) can
//! export their live keys and import saved ones ([`restore`]), for snapshots that survive
//! a restart.
//!
//! A request-time limiter consumes on admission and can [`refund`](rate::RateLimiter::refund),
//! so that a later limit's rejection never burns an earlier limit's quota. Decisions are
//! returned as a [`verdict::Verdict`], a small `Copy` type that a remote (Redis) backend can
//! produce as well, so the proxy does not change shape when state moves off-box.

pub mod adaptive;
pub mod adhoc_bucket;
pub mod clock;
pub mod concurrency;
pub mod heavy;
pub mod inflight;
pub mod key;
pub mod lease;
pub mod path;
pub mod rate;
pub mod restore;
pub mod sketch;
pub mod sliding_log;
pub mod table;
#[cfg(test)]
pub(crate) mod testing;
pub mod tiered;
pub mod token_bucket;
pub mod verdict;
pub mod victim;

pub use adaptive::{Adaptive, AdaptiveBounds, AdaptiveState, Sample};
pub use adhoc_bucket::{AdhocBuckets, AdhocParams};
pub use clock::{Clock, ManualClock, MonotonicClock, Nanos, NANOS_PER_SEC};
pub use concurrency::{ConcurrencyGuard, ConcurrencyLimiter, ConcurrencyParams, Copies};
pub use heavy::{HeavyHitters, Ranking, TopKey};
pub use inflight::{InflightGuard, InflightLimiter};
pub use key::{Fact, Facts, KeyPart, KeySpec, MatchValue, Matcher};
pub use rate::{RateLimiter, RateParams, RateWindow, RateWindowEntry};
pub use restore::Restored;
pub use sketch::SketchSize;
pub use sliding_log::{LogWindow, SlidingLog};
pub use tiered::{
    DecidedBy, Normalized, Tier, TierChange, TieredDecision, TieredEntry, TieredError,
    TieredLimiter, TieredParams,
};
pub use token_bucket::{BucketEntry, TokenBucket, TokenBucketParams};
pub use verdict::{Grant, Verdict, NEVER};
