//! One limiter's decision on one request, and its undo: [`Limiter::decide`] returns the
//! verdict and what the admission took ([`Hold`]), and [`Limiter::undo`] gives it back when
//! a later limit rejects the request.
//!
//! There is one hold per kind (a rate and a token bucket share one: both refund a cost),
//! and each says who took it: this process's limiter, or a shared store's limiter and
//! which of its sources decided ([`HoldIn`], [`Source`]), so that the undo goes back where
//! the admission came from. Every match over kinds and holds is exhaustive: a new kind, or
//! a hold that does not belong to its limiter, cannot go unnoticed ([`MismatchedHold`]).
//!
//! A local decision completes without waiting, allocating or locking more than its own
//! set; a shared one makes one store call within what is left of the phase's budget
//! (`crate::store::budget`), its fallback deciding past it (`crate::store::remote`).

use crate::config::Kind;
use crate::limits::concurrency::{ConcurrencyGuard, ConcurrencyParams, Rejection};
use crate::limits::sliding_log::never_fits;
use crate::limits::tiered::TieredDecision;
use crate::limits::{
    Facts, InflightGuard, Nanos, RateLimiter, TokenBucket, Verdict, NANOS_PER_SEC, NEVER,
};
use crate::runtime::learned;
use crate::runtime::limiter::{BadCost, Limiter, Place};
use crate::store::{
    LogAdmission, SharedConcurrencyGuard, SharedInflightGuard, SharedRate, SharedTokenBucket,
    Source, Sourced, TieredAdmission,
};

/// Who took a hold: this process's limiter (`L`: what its undo needs), or a shared store's
/// (`R`: the store's answer, with its source).
pub enum HoldIn<L, R> {
    /// The in-process limiter.
    Local(L),
    /// The shared store's limiter (the store, its deny cache or its fallback).
    Store(R),
}

/// What an admission took, to give back when a later limit rejects the request or, for
/// holding kinds, when the request ends.
pub enum Hold {
    /// Quota consumed at request time (rate, token bucket): refunded if a later limit
    /// rejects; nothing to do when the request ends.
    Refund {
        /// The key charged (its stable hash, in a store).
        key: u64,
        /// What it was charged.
        cost: u64,
        /// Who charged it: `None` in process, else the shared limiter's source (a store
        /// refund is sent in the background, never waited for).
        source: Option<Source>,
    },
    /// Entries a sliding log recorded: removed exactly if a later limit rejects.
    Log {
        /// The key charged.
        key: u64,
        /// In process: the entries and their time; in a store: the decision, with what its
        /// refund needs.
        taken: HoldIn<(u64, Nanos), Box<Sourced<LogAdmission>>>,
    },
    /// Hits a tiered limit recorded: taken back if a later limit rejects (tier entries
    /// stay, as the paper's structure has no undo for them).
    Tiered {
        /// The key charged.
        key: u64,
        /// The decision to take back.
        taken: HoldIn<TieredDecision, Box<Sourced<TieredAdmission>>>,
    },
    /// An inflight unit: given back when dropped (the upstream is done) or undone; a shared
    /// one locally at once and to the store in the background.
    Inflight(HoldIn<InflightGuard, SharedInflightGuard>),
    /// Concurrency copies: given back when dropped (the upstream is done) or undone; shared
    /// ones locally at once and to the store in the background.
    Concurrency(HoldIn<ConcurrencyGuard, SharedConcurrencyGuard>),
}

impl Hold {
    /// Whether the hold lasts while the upstream works on the request (it is given back
    /// when the request ends), rather than being done with once every limit passed.
    pub fn held_upstream(&self) -> bool {
        match self {
            Hold::Inflight(_) | Hold::Concurrency(_) => true,
            Hold::Refund { .. } | Hold::Log { .. } | Hold::Tiered { .. } => false,
        }
    }

    /// The kind of limiter that takes such a hold (a refund: rate or token bucket).
    fn kind(&self) -> &'static str {
        match self {
            Hold::Refund { .. } => "rate or token_bucket",
            Hold::Log { .. } => "sliding_log",
            Hold::Tiered { .. } => "tiered",
            Hold::Inflight(_) => "inflight",
            Hold::Concurrency(_) => "concurrency",
        }
    }
}

/// A hold given to a limiter that did not take it: a bug, reported rather than ignored. A
/// guard in it has been dropped, so its units are back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a {hold} hold ({held}) cannot be undone by a `{kind}` limiter ({here})")]
pub struct MismatchedHold {
    /// The limiter's kind.
    pub kind: Kind,
    /// Where the limiter's state lives.
    pub here: &'static str,
    /// The kind the hold belongs to.
    pub hold: &'static str,
    /// Who took the hold.
    pub held: &'static str,
}

/// One decision: the verdict, what was taken, and which of the variant's advertised
/// policies describes it (the current tier for a tiered limit, else 0).
pub struct Decision {
    /// Admitted or rejected, with what the headers need.
    pub verdict: Verdict,
    /// What an admission took.
    pub hold: Option<Hold>,
    /// Index into the variant's `RateLimit-Policy` items.
    pub policy: u8,
}

/// A local decision whose hold went where [`Limiter::decide_into`] was told to put it.
#[derive(Debug, Clone, Copy)]
pub struct Judged {
    /// Admitted or rejected, with what the headers need.
    pub verdict: Verdict,
    /// As [`Decision::policy`].
    pub policy: u8,
    /// Whether the admission took a hold (handed to `put`).
    pub held: bool,
}

impl Decision {
    fn of(verdict: Verdict, hold: Option<Hold>) -> Self {
        Self {
            verdict,
            hold,
            policy: 0,
        }
    }

    /// A tiered decision: the headers describe the current tier (tier 1 while none is
    /// active).
    fn tiered(verdict: Verdict, hold: Option<Hold>, tier: usize) -> Self {
        Self {
            verdict,
            hold,
            policy: tier_policy(tier),
        }
    }
}

/// The `RateLimit-Policy` member of a tiered decision in `tier` (tier 1 while none is
/// active).
fn tier_policy(tier: usize) -> u8 {
    u8::try_from(tier.saturating_sub(1)).unwrap_or(0)
}

/// An inflight rejection: concurrency frees up as soon as any request ends, so one second
/// is the smallest honest Retry-After; `max: 0` is a block, with no retry.
fn inflight_refused(max: u64, estimate: u64) -> Decision {
    let retry = if max == 0 { NEVER } else { NANOS_PER_SEC };
    Decision::of(
        Verdict::reject(max.saturating_sub(estimate), 0, retry),
        None,
    )
}

/// A concurrency rejection as a decision: the limit's room, and a retry in a second unless
/// the request can never fit ([`ConcurrencyParams::refusal`]), which invites none.
fn concurrency_refused(rejection: &Rejection, params: &ConcurrencyParams, mask: u64) -> Decision {
    Decision::of(params.refusal(rejection, mask), None)
}

impl Limiter {
    /// Decides one request for `key` at `now`. An admission returns what it took, to be
    /// undone if a later limit rejects. A rejection takes nothing (strict modes may still
    /// have counted it, as their semantics say; a tiered burst keeps the tiers it entered).
    ///
    /// A local decision completes without waiting ([`decide_here`](Self::decide_here)); a
    /// shared one makes one store call, bounded by what is left of the phase's store budget
    /// (`crate::store::budget`; its fallback decides past it).
    pub async fn decide<F: Facts + Sync + ?Sized>(
        &self,
        key: u64,
        facts: &F,
        now: Nanos,
    ) -> Result<Decision, BadCost> {
        match self.decide_here(key, facts, now) {
            Some(decided) => decided,
            None => self.decide_in_store(key, facts, now).await,
        }
    }

    /// Decides one request as [`decide`](Self::decide) does when the state lives in this
    /// process, synchronously: no future, no store budget. `None` when the state lives in
    /// a store.
    #[inline]
    pub fn decide_here<F: Facts + ?Sized>(
        &self,
        key: u64,
        facts: &F,
        now: Nanos,
    ) -> Option<Result<Decision, BadCost>> {
        let mut taken = None;
        let judged = self.decide_into(key, facts, now, |hold| taken = Some(hold))?;
        Some(judged.map(|j| Decision {
            verdict: j.verdict,
            hold: taken,
            policy: j.policy,
        }))
    }

    /// [`decide_here`](Self::decide_here) handing an admission's hold to `put` where it is
    /// made (the request path pushes it straight into the request's holds, rather than
    /// moving it through a [`Decision`]): `held` says whether `put` was called.
    #[inline(always)]
    pub fn decide_into<F: Facts + ?Sized>(
        &self,
        key: u64,
        facts: &F,
        now: Nanos,
        put: impl FnOnce(Hold),
    ) -> Option<Result<Judged, BadCost>> {
        let judged = |verdict: Verdict, held: bool| Judged {
            verdict,
            policy: 0,
            held,
        };
        Some(Ok(match self {
            Limiter::Inflight(l) => {
                let Place::Local(s) = &l.state else {
                    return None;
                };
                let max = learned::max_of(l.max, l.learned.as_deref(), facts);
                match s.acquire(key, max) {
                    Ok((guard, estimate)) => {
                        put(Hold::Inflight(HoldIn::Local(guard)));
                        judged(Verdict::allow(max.saturating_sub(estimate), 0), true)
                    }
                    Err(estimate) => judged(inflight_refused(max, estimate).verdict, false),
                }
            }
            Limiter::Rate(l) => {
                let Place::Local(s) = &l.state else {
                    return None;
                };
                let v = s.acquire(key, l.rate.max, 1, l.rate.strict, now);
                if v.allowed {
                    put(Hold::Refund {
                        key,
                        cost: 1,
                        source: None,
                    });
                }
                judged(v, v.allowed)
            }
            Limiter::TokenBucket(l) => {
                let Place::Local(s) = &l.state else {
                    return None;
                };
                let cost = match l.cost.resolve(facts, l.params.capacity) {
                    Ok(cost) => cost,
                    Err(e) => return Some(Err(e)),
                };
                let v = s.acquire(key, cost, now);
                if v.allowed {
                    put(Hold::Refund {
                        key,
                        cost,
                        source: None,
                    });
                }
                judged(v, v.allowed)
            }
            Limiter::Tiered(l) => {
                let Place::Local(s) = &l.state else {
                    return None;
                };
                let d = s.acquire(key, now);
                let allowed = d.verdict.allowed;
                let policy = tier_policy(d.tier);
                if allowed {
                    put(Hold::Tiered {
                        key,
                        taken: HoldIn::Local(d),
                    });
                }
                Judged {
                    verdict: d.verdict,
                    policy,
                    held: allowed,
                }
            }
            Limiter::Concurrency(l) => {
                let Place::Local(s) = &l.state else {
                    return None;
                };
                let mask = l.groups_of(facts);
                match s.acquire(key, mask, 1) {
                    Ok(guard) => {
                        let verdict = guard.verdict();
                        put(Hold::Concurrency(HoldIn::Local(guard)));
                        judged(verdict, true)
                    }
                    Err(rejection) => judged(
                        concurrency_refused(&rejection, &l.params, mask).verdict,
                        false,
                    ),
                }
            }
            Limiter::SlidingLog(l) => {
                let Place::Local(s) = &l.state else {
                    return None;
                };
                let cap = l.windows.iter().map(|w| w.max).max().unwrap_or(0);
                let cost = match l.cost.resolve(facts, cap) {
                    Ok(cost) => cost,
                    Err(e) => return Some(Err(e)),
                };
                // A window smaller than the cost (a `max: 0` block among them) never makes
                // room: no retry is invited.
                let v = s
                    .acquire(key, cost, now)
                    .never_if(never_fits(&l.windows, cost));
                if v.allowed {
                    put(Hold::Log {
                        key,
                        taken: HoldIn::Local((cost, now)),
                    });
                }
                judged(v, v.allowed)
            }
        }))
    }

    /// The store half of [`decide`](Self::decide): one store call within the phase's
    /// budget. A variant whose state lives in this process is decided here as well.
    async fn decide_in_store<F: Facts + Sync + ?Sized>(
        &self,
        key: u64,
        facts: &F,
        now: Nanos,
    ) -> Result<Decision, BadCost> {
        Ok(match self {
            Limiter::Inflight(l) => {
                let Place::Store(s) = &l.state else {
                    return self.local_anyway(key, facts, now);
                };
                match Box::pin(s.limiter.acquire(key)).await.value {
                    Ok(guard) => Decision::of(
                        Verdict::allow(l.max.saturating_sub(s.limiter.holdings().in_use(key)), 0),
                        Some(Hold::Inflight(HoldIn::Store(guard))),
                    ),
                    Err(estimate) => inflight_refused(l.max, estimate),
                }
            }
            Limiter::Rate(l) => {
                let Place::Store(s) = &l.state else {
                    return self.local_anyway(key, facts, now);
                };
                let d = Box::pin(s.limiter.acquire(key, 1, now)).await;
                let v = d.value;
                let hold = Hold::Refund {
                    key,
                    cost: 1,
                    source: Some(d.source),
                };
                Decision::of(v, v.allowed.then_some(hold))
            }
            Limiter::TokenBucket(l) => {
                let Place::Store(s) = &l.state else {
                    return self.local_anyway(key, facts, now);
                };
                let cost = l.cost.resolve(facts, l.params.capacity)?;
                let d = Box::pin(s.limiter.acquire(key, cost, now)).await;
                let v = d.value;
                let hold = Hold::Refund {
                    key,
                    cost,
                    source: Some(d.source),
                };
                Decision::of(v, v.allowed.then_some(hold))
            }
            Limiter::Tiered(l) => {
                let Place::Store(s) = &l.state else {
                    return self.local_anyway(key, facts, now);
                };
                let d = Box::pin(s.limiter.acquire(key, now)).await;
                let (verdict, tier) = (d.decision.verdict, d.decision.tier);
                let hold = verdict.allowed.then(|| Hold::Tiered {
                    key,
                    taken: HoldIn::Store(Box::new(d)),
                });
                Decision::tiered(verdict, hold, tier)
            }
            Limiter::Concurrency(l) => {
                let Place::Store(s) = &l.state else {
                    return self.local_anyway(key, facts, now);
                };
                let mask = l.groups_of(facts);
                match Box::pin(s.limiter.acquire(key, mask, 1)).await.value {
                    Ok(guard) => Decision::of(
                        Verdict::allow(guard.remaining(), 0),
                        Some(Hold::Concurrency(HoldIn::Store(guard))),
                    ),
                    Err(rejection) => concurrency_refused(&rejection, &l.params, mask),
                }
            }
            Limiter::SlidingLog(l) => {
                let Place::Store(s) = &l.state else {
                    return self.local_anyway(key, facts, now);
                };
                let cap = l.windows.iter().map(|w| w.max).max().unwrap_or(0);
                let cost = l.cost.resolve(facts, cap)?;
                let d = Box::pin(s.limiter.acquire(key, cost, now)).await;
                let v = d.verdict;
                let hold = v.allowed.then(|| Hold::Log {
                    key,
                    taken: HoldIn::Store(Box::new(d)),
                });
                Decision::of(v, hold)
            }
        })
    }

    /// A variant in this process reached [`decide_in_store`](Self::decide_in_store)
    /// (`decide` never sends one there): decided where its state lives.
    fn local_anyway<F: Facts + ?Sized>(
        &self,
        key: u64,
        facts: &F,
        now: Nanos,
    ) -> Result<Decision, BadCost> {
        self.decide_here(key, facts, now).unwrap_or_else(|| {
            // Both halves refused it: impossible, since a place is local or in a store.
            Ok(Decision::of(Verdict::allow(0, 0), None))
        })
    }

    /// Gives back what an admission took: a later limit rejected the request. A hold this
    /// limiter did not take is not given back here (a guard in it is dropped, which gives
    /// its units back): the error says so, for the caller to report.
    pub fn undo(&self, hold: Hold, now: Nanos) -> Result<(), MismatchedHold> {
        let mismatch = |hold: &Hold, held: &'static str| MismatchedHold {
            kind: self.kind(),
            here: if self.is_shared() {
                "shared"
            } else {
                "in process"
            },
            hold: hold.kind(),
            held,
        };
        match (self, hold) {
            (Limiter::Rate(l), Hold::Refund { key, cost, source }) => {
                refund_in(&l.state, key, cost, source, now)
                    .map_err(|held| mismatch(&Hold::Refund { key, cost, source }, held))?;
            }
            (Limiter::TokenBucket(l), Hold::Refund { key, cost, source }) => {
                refund_in(&l.state, key, cost, source, now)
                    .map_err(|held| mismatch(&Hold::Refund { key, cost, source }, held))?;
            }
            (Limiter::SlidingLog(l), Hold::Log { key, taken }) => match (&l.state, taken) {
                (Place::Local(s), HoldIn::Local((cost, at))) => {
                    s.refund(key, cost, at);
                }
                (Place::Store(s), HoldIn::Store(d)) => s.limiter.refund(key, &d),
                (Place::Local(_), taken @ HoldIn::Store(_))
                | (Place::Store(_), taken @ HoldIn::Local(_)) => {
                    let held = taken.who();
                    return Err(mismatch(&Hold::Log { key, taken }, held));
                }
            },
            (Limiter::Tiered(l), Hold::Tiered { key, taken }) => match (&l.state, taken) {
                (Place::Local(s), HoldIn::Local(d)) => s.refund(key, &d, now),
                (Place::Store(s), HoldIn::Store(d)) => s.limiter.refund(key, &d, now),
                (Place::Local(_), taken @ HoldIn::Store(_))
                | (Place::Store(_), taken @ HoldIn::Local(_)) => {
                    let held = taken.who();
                    return Err(mismatch(&Hold::Tiered { key, taken }, held));
                }
            },
            // Dropping a guard gives its units back, to wherever they were taken.
            (Limiter::Inflight(_), Hold::Inflight(guard)) => drop(guard),
            (Limiter::Concurrency(_), Hold::Concurrency(guard)) => drop(guard),
            (
                Limiter::Inflight(_)
                | Limiter::Rate(_)
                | Limiter::TokenBucket(_)
                | Limiter::Tiered(_)
                | Limiter::Concurrency(_)
                | Limiter::SlidingLog(_),
                hold @ (Hold::Refund { .. }
                | Hold::Log { .. }
                | Hold::Tiered { .. }
                | Hold::Inflight(_)
                | Hold::Concurrency(_)),
            ) => return Err(mismatch(&hold, "another kind")),
        }
        Ok(())
    }
}

/// A limiter whose admission is a cost, given back as such: rate and token bucket, in
/// process (`Source` is `None`) or in a store (with the source that decided).
trait RefundCost<From> {
    fn refund_cost(&self, key: u64, cost: u64, from: From, now: Nanos);
}

impl RefundCost<()> for RateLimiter {
    fn refund_cost(&self, key: u64, cost: u64, (): (), now: Nanos) {
        self.refund(key, cost, now);
    }
}

impl RefundCost<()> for TokenBucket {
    fn refund_cost(&self, key: u64, cost: u64, (): (), now: Nanos) {
        self.refund(key, cost, now);
    }
}

impl RefundCost<Source> for SharedRate {
    fn refund_cost(&self, key: u64, cost: u64, from: Source, now: Nanos) {
        self.refund(key, cost, from, now);
    }
}

impl RefundCost<Source> for SharedTokenBucket {
    fn refund_cost(&self, key: u64, cost: u64, from: Source, now: Nanos) {
        self.refund(key, cost, from, now);
    }
}

/// Gives a refund back where it was taken: to the in-process state (`source` is `None`)
/// or to the store's limiter (with the source that decided). A refund taken in the other
/// place is not given; the error says who took it.
fn refund_in<L: RefundCost<()>, R: RefundCost<Source>>(
    place: &Place<L, R>,
    key: u64,
    cost: u64,
    source: Option<Source>,
    now: Nanos,
) -> Result<(), &'static str> {
    match (place, source) {
        (Place::Local(s), None) => s.refund_cost(key, cost, (), now),
        (Place::Store(s), Some(from)) => s.limiter.refund_cost(key, cost, from, now),
        (Place::Local(_), Some(_)) => return Err("shared"),
        (Place::Store(_), None) => return Err("in process"),
    }
    Ok(())
}

impl<L, R> HoldIn<L, R> {
    fn who(&self) -> &'static str {
        match self {
            HoldIn::Local(_) => "in process",
            HoldIn::Store(_) => "shared",
        }
    }
}
