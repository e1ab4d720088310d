//! "How many of these may happen now?": a request for *between* `min` and `want` units of
//! a rate-like limit (the limiter API's `CH.REQUEST resource domain copies MIN n`),
//! answered by every kind that can answer it, with the largest count that fits.
//!
//! | kind | in process | in a store | reply context |
//! |---|---|---|---|
//! | `TokenBucket` | [`TokenBucket::acquire_many`](crate::limits::TokenBucket::acquire_many): `min(tokens, want)` if `tokens ≥ min` | one script call with a `min` (`token_bucket.lua`) | capacity |
//! | `Rate` | [`RateLimiter::acquire_many`](crate::limits::RateLimiter::acquire_many): the exact room of the sliding window | one script call with a `min` (`rate.lua`) | max |
//! | `SlidingLog` | [`SlidingLog::acquire_many`](crate::limits::SlidingLog::acquire_many): the smallest room over the windows | one script call with `(min, want)` and the caller's time (`sliding_log.lua`) | each window's max |
//! | `Tiered` | [`TieredLimiter::acquire_many`](crate::limits::TieredLimiter::acquire_many): copies fill the current tier, then burst | one script call with `(min, want)` and the caller's time (`tiered.lua`) | the decision: tier, which limit decided |
//!
//! In a store the fallback's `acquire_many` decides past the budget, and the reply also
//! says where the answer came from.
//!
//! `Inflight` and `Concurrency` hold units for as long as their holder lives: they are
//! reserved and released (`CH.RESERVE`/`CH.RELEASE`, see
//! [`ConcurrencyRt::groups_of`](crate::runtime::limiter::ConcurrencyRt::groups_of)),
//! never requested. A new kind gets its arm in [`Limiter::grant`]: the match is
//! exhaustive, so the compiler points here.

use crate::limits::sliding_log::never_fits;
use crate::limits::{Grant, Nanos, TieredDecision, TieredParams};
use crate::runtime::limiter::{Limiter, Place};
use crate::store::{Micros, Source, Sourced};

/// A request's answer with its context: the grant, where it came from and, for a tiered
/// limit, the decision (tier, which limit decided).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// The largest count in `[min, want]` that fitted (then taken), or a rejection.
    pub grant: Grant,
    /// Who decided, for a limit in a shared store; `None` in-process.
    pub source: Option<Source>,
    /// A tiered limit's decision.
    pub tiered: Option<TieredDecision>,
}

impl Granted {
    fn local(grant: Grant) -> Self {
        Self {
            grant,
            source: None,
            tiered: None,
        }
    }

    fn shared(g: Sourced<Grant>) -> Self {
        Self {
            grant: g.value,
            source: Some(g.source),
            tiered: None,
        }
    }
}

/// A request for units of a limit that is reserved and released instead (inflight,
/// concurrency).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a `{0}` limit holds units until they are released: reserve them, do not request them")]
pub struct NotRequestable(pub crate::config::Kind);

impl Limiter {
    /// Whether [`grant`](Self::grant) answers this variant (the rate-like kinds).
    pub fn requestable(&self) -> bool {
        match self {
            Limiter::TokenBucket(_)
            | Limiter::Rate(_)
            | Limiter::SlidingLog(_)
            | Limiter::Tiered(_) => true,
            Limiter::Inflight(_) | Limiter::Concurrency(_) => false,
        }
    }

    /// Decides a request for between `min` and `want` units for `key` at `now` (a `min`
    /// above `want` is lowered to it): takes the largest count in `[min, want]` that fits,
    /// or nothing (module doc). `at` is the caller's clock for a shared limit (Redis's
    /// own clock when `None`). A local decision completes without waiting; a shared one
    /// makes one store call within its budget, its fallback deciding past it.
    pub async fn grant(
        &self,
        key: u64,
        min: u64,
        want: u64,
        now: Nanos,
        at: Option<Micros>,
    ) -> Result<Granted, NotRequestable> {
        let min = min.min(want);
        Ok(match self {
            Limiter::TokenBucket(l) => match &l.state {
                Place::Local(s) => Granted::local(s.acquire_many(key, min, want, now)),
                Place::Store(s) => {
                    Granted::shared(s.limiter.acquire_many(key, min, want, now, at).await)
                }
            },
            Limiter::Rate(l) => match &l.state {
                Place::Local(s) => {
                    Granted::local(s.acquire_many(key, l.rate.max, min, want, l.rate.strict, now))
                }
                Place::Store(s) => {
                    Granted::shared(s.limiter.acquire_many(key, min, want, now, at).await)
                }
            },
            Limiter::SlidingLog(l) => match &l.state {
                Place::Local(s) => {
                    let mut g = s.acquire_many(key, min, want, now);
                    // A window below `min` never makes room: no retry is invited (the
                    // limiter's own retry is a hint, its window).
                    g.verdict = g.verdict.never_if(never_fits(&l.windows, min));
                    Granted::local(g)
                }
                Place::Store(s) => {
                    let d = s.limiter.acquire_at(key, min, want, now, at).await;
                    Granted {
                        grant: Grant {
                            verdict: d.verdict,
                            granted: d.granted,
                        },
                        source: Some(d.source),
                        tiered: None,
                    }
                }
            },
            Limiter::Tiered(l) => {
                let (d, source) = match &l.state {
                    Place::Local(s) => (s.acquire_many(key, min, want, now), None),
                    Place::Store(s) => {
                        let d = s.limiter.acquire_at(key, min, want, now, at).await;
                        (d.decision, Some(d.source))
                    }
                };
                Granted {
                    grant: Grant {
                        verdict: d.verdict,
                        granted: d.granted,
                    },
                    source,
                    tiered: Some(d),
                }
            }
            Limiter::Inflight(_) | Limiter::Concurrency(_) => {
                return Err(NotRequestable(self.kind()))
            }
        })
    }
}

impl Limiter {
    /// The limit a request is measured against, for a reply's context: a bucket's
    /// capacity, a rate's `max`, the smallest window `max` of a sliding log, a tiered
    /// limit's first tier (the current tier comes with each decision); `None` for the kinds
    /// that are not requested.
    pub fn request_limit(&self) -> Option<u64> {
        match self {
            Limiter::TokenBucket(l) => Some(l.params.capacity),
            Limiter::Rate(l) => Some(l.rate.max),
            Limiter::SlidingLog(l) => l.windows.iter().map(|w| w.max).min(),
            Limiter::Tiered(l) => l.params.tiers.first().map(|t| t.limit),
            Limiter::Inflight(_) | Limiter::Concurrency(_) => None,
        }
    }

    /// A tiered limit's parameters (tiers, hard and global limits), in-process or in a
    /// store alike, for a reply's context; `None` for the other kinds.
    pub fn tiered_params(&self) -> Option<&TieredParams> {
        match self {
            Limiter::Tiered(l) => Some(&l.params),
            Limiter::Inflight(_)
            | Limiter::Rate(_)
            | Limiter::TokenBucket(_)
            | Limiter::Concurrency(_)
            | Limiter::SlidingLog(_) => None,
        }
    }
}
