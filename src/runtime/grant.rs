//! "How many of these may happen now?": a request for *between* `min` and `want` units of
//! a rate-like limit (the limiter API's `CH.REQUEST resource domain copies MIN n`),
//! answered by every kind that can answer it, with the largest count that fits.
//!
//! | variant | how | reply context |
//! |---|---|---|
//! | `TokenBucket` | [`TokenBucket::acquire_many`](crate::limits::TokenBucket::acquire_many): `min(tokens, want)` if `tokens ≥ min` | capacity |
//! | `Rate` | [`RateLimiter::acquire_many`](crate::limits::RateLimiter::acquire_many): the exact room of the sliding window | max |
//! | `SlidingLog` | [`SlidingLog::acquire_many`](crate::limits::SlidingLog::acquire_many): the smallest room over the windows | each window's max |
//! | `Tiered` | [`TieredLimiter::acquire_many`](crate::limits::TieredLimiter::acquire_many): copies fill the current tier, then burst | the decision: tier, which limit decided |
//! | `SharedTokenBucket`, `SharedRate` | one script call with a `min` (`token_bucket.lua`, `rate.lua`), the fallback's `acquire_many` past the budget | as local, plus where the answer came from |
//! | `SharedSlidingLog`, `SharedTiered` | one script call with `(min, want)` and the caller's time (`sliding_log.lua`, `tiered.lua`) | as local, plus where the answer came from |
//!
//! `Inflight` and `Concurrency` hold units for as long as their holder lives: they are
//! reserved and released (`CH.RESERVE`/`CH.RELEASE`, see [`ConcurrencyRt::groups_of`]),
//! never requested. A new variant gets its arm in [`Limiter::grant`]: the match is
//! exhaustive, so the compiler points here.

use crate::limits::{Facts, Grant, Nanos, TieredDecision, TieredParams, NEVER};
use crate::runtime::limiter::{ConcurrencyRt, Limiter};
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
        !matches!(
            self,
            Limiter::Inflight(_)
                | Limiter::Concurrency(_)
                | Limiter::SharedInflight(_)
                | Limiter::SharedConcurrency(_)
        )
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
            Limiter::TokenBucket(l) => Granted::local(l.state.acquire_many(key, min, want, now)),
            Limiter::Rate(l) => {
                Granted::local(
                    l.state
                        .acquire_many(key, l.rate.max, min, want, l.rate.strict, now),
                )
            }
            Limiter::SlidingLog(l) => {
                let mut g = l.state.acquire_many(key, min, want, now);
                if !g.verdict.allowed && l.windows.iter().any(|w| min > w.max) {
                    // A window below `min` never makes room: no retry is invited (the
                    // limiter's own retry is a hint, its window).
                    g.verdict.retry_after = NEVER;
                }
                Granted::local(g)
            }
            Limiter::Tiered(l) => {
                let d = l.state.acquire_many(key, min, want, now);
                Granted {
                    grant: Grant {
                        verdict: d.verdict,
                        granted: d.granted,
                    },
                    source: None,
                    tiered: Some(d),
                }
            }
            Limiter::SharedTokenBucket(l) => {
                Granted::shared(l.limiter.acquire_many(key, min, want, now, at).await)
            }
            Limiter::SharedRate(l) => {
                Granted::shared(l.limiter.acquire_many(key, min, want, now, at).await)
            }
            Limiter::SharedSlidingLog(l) => {
                let d = l.limiter.acquire_at(key, min, want, now, at).await;
                Granted {
                    grant: Grant {
                        verdict: d.verdict,
                        granted: d.granted,
                    },
                    source: Some(d.source),
                    tiered: None,
                }
            }
            Limiter::SharedTiered(l) => {
                let d = l.limiter.acquire_at(key, min, want, now, at).await;
                Granted {
                    grant: Grant {
                        verdict: d.decision.verdict,
                        granted: d.decision.granted,
                    },
                    source: Some(d.source),
                    tiered: Some(d.decision),
                }
            }
            Limiter::Inflight(_)
            | Limiter::Concurrency(_)
            | Limiter::SharedInflight(_)
            | Limiter::SharedConcurrency(_) => return Err(NotRequestable(self.kind())),
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
            Limiter::TokenBucket(l) => Some(l.state.params().capacity),
            Limiter::Rate(l) => Some(l.rate.max),
            Limiter::SlidingLog(l) => l.windows.iter().map(|w| w.max).min(),
            Limiter::Tiered(l) => l.params.tiers.first().map(|t| t.limit),
            Limiter::SharedTokenBucket(l) => Some(l.params.capacity),
            Limiter::SharedRate(l) => Some(l.rate.max),
            Limiter::SharedSlidingLog(l) => l.windows.iter().map(|w| w.max).min(),
            Limiter::SharedTiered(l) => l.params.tiers.first().map(|t| t.limit),
            Limiter::Inflight(_)
            | Limiter::Concurrency(_)
            | Limiter::SharedInflight(_)
            | Limiter::SharedConcurrency(_) => None,
        }
    }
}

impl Limiter {
    /// A tiered limit's parameters (tiers, hard and global limits), in-process or in a
    /// store alike, for a reply's context; `None` for the other kinds.
    pub fn tiered_params(&self) -> Option<&TieredParams> {
        match self {
            Limiter::Tiered(l) => Some(&l.params),
            Limiter::SharedTiered(l) => Some(&l.params),
            _ => None,
        }
    }
}

impl ConcurrencyRt {
    /// The groups `facts` belongs to, as the limiter's bitset (bit `i`: group `i`).
    pub fn groups_of<F: Facts + ?Sized>(&self, facts: &F) -> u64 {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.members.contains(facts))
            .fold(0u64, |m, (i, _)| m | 1 << i)
    }
}
