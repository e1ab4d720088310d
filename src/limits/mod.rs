//! The limiters: pure Rust, no Pingora types, time passed in by the caller.
//!
//! Every limiter answers one question for one key at one instant: may this event happen?
//! Keys arrive already hashed to a `u64` (see [`key`]), time arrives as [`clock::Nanos`]
//! from a [`clock::Clock`], so every algorithm is tested against a manual clock with no
//! sleeping. Each kind lives in its own file:
//!
//! - [`inflight`]: count-min estimate of concurrent events, decremented by a guard's drop.
//! - [`rate`]: sliding-window estimate of events per period, exact per key, in a fixed-size
//!   set-associative table (as the token bucket's), whose evictions only ever make it more
//!   lenient: a flood of other keys can never get a key rejected.
//! - [`token_bucket`]: exact per-key token bucket with discrete refills, in a fixed-size
//!   set-associative table (one lock per set of 8 keys, memory fixed by `max_keys`).
//!
//! A request-time limiter consumes on admission and can [`refund`](rate::RateLimiter::refund),
//! so that a later limit's rejection never burns an earlier limit's quota. Decisions are
//! returned as a [`verdict::Verdict`], a small `Copy` type that a remote (Redis) backend can
//! produce as well, so the proxy does not change shape when state moves off-box.

pub mod clock;
pub mod inflight;
pub mod key;
pub mod rate;
pub mod sketch;
pub mod token_bucket;
pub mod verdict;

pub use clock::{Clock, ManualClock, MonotonicClock, Nanos, NANOS_PER_SEC};
pub use inflight::{InflightGuard, InflightLimiter};
pub use key::{Fact, Facts, KeyPart, KeySpec, MatchValue, Matcher};
pub use rate::{RateLimiter, RateParams};
pub use sketch::SketchSize;
pub use token_bucket::{TokenBucket, TokenBucketParams};
pub use verdict::{Verdict, NEVER};
