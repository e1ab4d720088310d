//! A limit variant's kind, parameters and state, as one value: [`Limiter`].
//!
//! Holding a kind's state *together with* its parameters in one enum variant makes a
//! mismatch (rate state with bucket parameters) unrepresentable, and gives every kind one
//! entry point, [`Limiter::decide`], and one way back, [`Limiter::undo`]. A new kind is a
//! new variant here with its arms in [`Limiter::build`], `decide` and `undo`; the decision
//! loop and the front ends do not change.
//!
//! State is carried over a reload by [`Limiter::build`]: when the previous runtime had a
//! variant with the same identity and the state has the same shape, the new limiter shares
//! its `Arc`, so unchanged limits keep their counts, buckets, logs and holds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::config::{Cost, Group, Kind, LimitParams, Members};
use crate::limits::concurrency::{
    ConcurrencyGuard, ConcurrencyLimiter, ConcurrencyParams, Rejection,
};
use crate::limits::tiered::{TieredDecision, TieredLimiter, TieredParams};
use crate::limits::{
    Fact, Facts, InflightGuard, InflightLimiter, KeyPart, LogWindow, Nanos, RateLimiter,
    RateParams, SketchSize, SlidingLog, TokenBucket, TokenBucketParams, Verdict, NANOS_PER_SEC,
    NEVER,
};
use crate::runtime::learned::{self, LearnCtx, Learned};
use crate::segments::Segment;
use crate::store::{
    KeyNames, LogAdmission, RedisStore, SharedConcurrency, SharedConcurrencyGuard, SharedInflight,
    SharedInflightGuard, SharedRate, SharedSlidingLog, SharedTiered, SharedTokenBucket, Source,
    Sourced, TieredAdmission,
};

/// A cost header that is not a positive integer: answered with 400, because a caller that
/// sends a broken cost must not be charged a guess.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header `{header}` must appear once, as a positive integer token cost")]
pub struct BadCost {
    /// The header's name.
    pub header: String,
}

/// Why a limiter could not be built from a valid config (its state cannot be allocated,
/// or a segment it names was not loaded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LimiterError(pub String);

/// What an admission took, to give back when a later limit rejects the request or, for
/// holding kinds, when the request ends.
pub enum Hold {
    /// Quota consumed at request time (rate, token bucket): refunded if a later limit
    /// rejects; nothing to do when the request ends.
    Refund {
        /// The key charged.
        key: u64,
        /// What it was charged.
        cost: u64,
    },
    /// Entries a sliding log recorded at `at`: removed exactly if a later limit rejects.
    Log {
        /// The key charged.
        key: u64,
        /// Entries recorded.
        cost: u64,
        /// Their time.
        at: Nanos,
    },
    /// Hits a tiered limit recorded (tier entries stay, as the paper's structure has no
    /// undo for them).
    Tiered {
        /// The key charged.
        key: u64,
        /// The decision to take back.
        decision: TieredDecision,
    },
    /// An inflight unit: given back when dropped (the upstream is done) or undone.
    Inflight(InflightGuard),
    /// Concurrency copies: given back when dropped (the upstream is done) or undone.
    Concurrency(ConcurrencyGuard),
    /// Quota taken in a shared store (or by its fallback, as `source` says): refunded in
    /// the background if a later limit rejects; a refund never waits.
    SharedRefund {
        /// The key charged (its stable hash).
        key: u64,
        /// What it was charged.
        cost: u64,
        /// Who admitted it.
        source: Source,
    },
    /// A fleet-wide inflight unit: given back when dropped, locally at once and to the
    /// store in the background.
    SharedInflight(SharedInflightGuard),
    /// Entries a shared sliding log recorded (in the store, or by its fallback): removed
    /// exactly, in the background, if a later limit rejects.
    SharedLog {
        /// The key charged (its stable hash).
        key: u64,
        /// The decision, with what its refund needs.
        decision: Box<Sourced<LogAdmission>>,
    },
    /// Hits a shared tiered limit recorded: taken back in the background if a later limit
    /// rejects (tier entries stay).
    SharedTiered {
        /// The key charged (its stable hash).
        key: u64,
        /// The decision, with what its refund needs.
        decision: Box<Sourced<TieredAdmission>>,
    },
    /// Fleet-wide concurrency copies: given back when dropped, locally at once and to the
    /// store in the background.
    SharedConcurrency(SharedConcurrencyGuard),
}

impl Hold {
    /// Whether the hold lasts while the upstream works on the request (it is given back
    /// when the request ends), rather than being done with once every limit passed.
    pub fn held_upstream(&self) -> bool {
        matches!(
            self,
            Hold::Inflight(_)
                | Hold::Concurrency(_)
                | Hold::SharedInflight(_)
                | Hold::SharedConcurrency(_)
        )
    }
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

impl Decision {
    fn of(verdict: Verdict, hold: Option<Hold>) -> Self {
        Self {
            verdict,
            hold,
            policy: 0,
        }
    }
}

/// A request's cost, ready for the request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostRt {
    /// Every request costs this.
    Fixed(u64),
    /// Read from this header part, clamped to `[1, cap]`; absent means 1.
    Header(KeyPart),
}

impl CostRt {
    fn of(cost: &Cost) -> Self {
        match cost {
            Cost::Fixed(c) => CostRt::Fixed(*c),
            Cost::Header(name) => CostRt::Header(KeyPart::Header(name.clone())),
        }
    }

    /// The request's cost: the fixed cost, or the header's value clamped to `[1, cap]` (1
    /// when the header is absent). A header that is not a positive decimal integer (`0`,
    /// `-1`, `1.5`, `abc`), or that appears twice, is a [`BadCost`], answered with 400.
    fn resolve<F: Facts + ?Sized>(&self, facts: &F, cap: u64) -> Result<u64, BadCost> {
        let part = match self {
            CostRt::Fixed(c) => return Ok(*c),
            CostRt::Header(part) => part,
        };
        let bad = || BadCost {
            header: part.to_string().trim_start_matches("header:").to_string(),
        };
        let Some(fact) = facts.fact(part) else {
            return Ok(1);
        };
        if facts.repeated(part) {
            return Err(bad());
        }
        let Fact::Bytes(bytes) = fact else {
            return Err(bad());
        };
        let digits = bytes.trim_ascii();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        // Any positive integer is accepted and clamped, however long: 2^64 costs the same
        // as 2^64 - 1, a full bucket.
        let value = digits.iter().fold(0u64, |v, d| {
            v.saturating_mul(10).saturating_add(u64::from(d - b'0'))
        });
        if value == 0 {
            return Err(bad());
        }
        Ok(value.min(cap.max(1)))
    }
}

/// The inflight kind, live: `max` with the count-min sketch it applies to.
pub struct InflightRt {
    /// Allowed in flight per key; 0 blocks.
    pub max: u64,
    /// The sketch's size, part of the state's shape.
    pub sketch: SketchSize,
    /// The sketch, shared with every live guard.
    pub state: Arc<InflightLimiter>,
    /// `max: auto`: what each upstream server takes (`crate::runtime::learned`).
    pub learned: Option<Arc<Learned>>,
}

/// The rate kind, live.
pub struct RateRt {
    /// `max`, `per` and `strict`; only `per` shapes the state, with `max_keys`.
    pub rate: RateParams,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// The bounded table of per-key windows.
    pub state: Arc<RateLimiter>,
}

/// The token-bucket kind, live. The bucket parameters live in the state itself (they all
/// shape it).
pub struct TokenBucketRt {
    /// A fixed cost, or the header to read it from.
    pub cost: CostRt,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// The bounded table of buckets.
    pub state: Arc<TokenBucket>,
}

/// The tiered kind, live (Charon's burst tiers).
pub struct TieredRt {
    /// The normalized tiers, hard and global limits: all shape the state.
    pub params: TieredParams,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// The per-key tier logs.
    pub state: Arc<TieredLimiter>,
}

/// The concurrency kind, live (Charon's copy-limited resources).
pub struct ConcurrencyRt {
    /// Copies one key may hold; 0 blocks.
    pub max: u64,
    /// The groups, in bit order: group `i` is bit `i` of the request's mask.
    pub groups: Vec<GroupRt>,
    /// The limiter's parameters (max, global, group maxes): they shape the state.
    pub params: ConcurrencyParams,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// Exact counts, shared with every live guard.
    pub state: Arc<ConcurrencyLimiter>,
}

/// One concurrency group, live.
pub struct GroupRt {
    /// Its name: the `group` label of `tollgate_concurrency_in_use`.
    pub name: String,
    /// Who belongs to it.
    pub members: MembersRt,
}

/// A group's members, ready for the request path.
pub enum MembersRt {
    /// The part's value is one of these.
    Values {
        /// The key part compared.
        part: KeyPart,
        /// The values.
        values: HashSet<Box<[u8]>>,
    },
    /// The part's value (an integer ID) is in the segment.
    Segment {
        /// The segment's key part.
        part: KeyPart,
        /// The loaded segment.
        set: Arc<Segment>,
    },
}

impl MembersRt {
    /// Whether the request belongs: its value of the part is listed, or is an ID in the
    /// segment (a value that is not an integer is not a member).
    pub(crate) fn contains<F: Facts + ?Sized>(&self, facts: &F) -> bool {
        match self {
            MembersRt::Values { part, values } => {
                matches!(facts.fact(part), Some(Fact::Bytes(v)) if values.contains(v))
            }
            MembersRt::Segment { part, set } => {
                matches!(facts.fact(part), Some(Fact::Bytes(v)) if set.contains_bytes(v))
            }
        }
    }
}

/// The sliding-log kind, live (Grab's frequency caps).
pub struct SlidingLogRt {
    /// The windows: with `max_keys` they shape the state.
    pub windows: Vec<LogWindow>,
    /// A fixed cost, or the header to read it from (clamped to the smallest window's max).
    pub cost: CostRt,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// The per-key logs.
    pub state: Arc<SlidingLog>,
}

/// A token bucket shared through a store.
pub struct SharedTokenBucketRt {
    /// The store's name.
    pub store: String,
    /// The bucket's parameters (all shape the state).
    pub params: TokenBucketParams,
    /// A fixed cost, or the header to read it from.
    pub cost: CostRt,
    /// `max_keys` of the local fallback.
    pub max_keys: usize,
    /// The store's limiter, with its fallback and deny cache.
    pub limiter: Arc<SharedTokenBucket>,
}

/// A rate shared through a store.
pub struct SharedRateRt {
    /// The store's name.
    pub store: String,
    /// `max`, `per`, `strict` (the store's script takes them all).
    pub rate: RateParams,
    /// `max_keys` of the local fallback.
    pub max_keys: usize,
    /// The store's limiter, with its fallback and deny cache.
    pub limiter: Arc<SharedRate>,
}

/// An inflight limit shared through a store: per-instance counts under leases.
pub struct SharedInflightRt {
    /// The store's name.
    pub store: String,
    /// Allowed in flight per key across the fleet.
    pub max: u64,
    /// The local fallback's sketch.
    pub sketch: SketchSize,
    /// The store's limiter, with its fallback and lease renewals.
    pub limiter: Arc<SharedInflight>,
}

/// A tiered limit shared through a store.
pub struct SharedTieredRt {
    /// The store's name.
    pub store: String,
    /// The normalized tiers, hard and global limits (the script takes them all).
    pub params: TieredParams,
    /// `max_keys` of the local fallback.
    pub max_keys: usize,
    /// The store's limiter, with its fallback (and, on a Cluster, its global share).
    pub limiter: Arc<SharedTiered>,
}

/// A concurrency limit shared through a store: per-holder counts under leases.
pub struct SharedConcurrencyRt {
    /// The store's name.
    pub store: String,
    /// Copies one key may hold across the fleet; 0 blocks.
    pub max: u64,
    /// The groups, in bit order (their names name their counters in the store).
    pub groups: Vec<GroupRt>,
    /// Max, global and group maxes.
    pub params: ConcurrencyParams,
    /// `max_keys` of the local fallback.
    pub max_keys: usize,
    /// The store's limiter, with its fallback and lease renewals.
    pub limiter: Arc<SharedConcurrency>,
}

/// A sliding log shared through a store.
pub struct SharedSlidingLogRt {
    /// The store's name.
    pub store: String,
    /// The windows.
    pub windows: Vec<LogWindow>,
    /// A fixed cost, or the header to read it from (clamped to the largest window's max).
    pub cost: CostRt,
    /// `max_keys` of the local fallback.
    pub max_keys: usize,
    /// The store's limiter, with its fallback and deny cache.
    pub limiter: Arc<SharedSlidingLog>,
}

/// A limit variant's kind, parameters and state.
pub enum Limiter {
    /// `kind: inflight`.
    Inflight(InflightRt),
    /// `kind: rate`.
    Rate(RateRt),
    /// `kind: token_bucket`.
    TokenBucket(TokenBucketRt),
    /// `kind: tiered`.
    Tiered(TieredRt),
    /// `kind: concurrency`.
    Concurrency(ConcurrencyRt),
    /// `kind: sliding_log`.
    SlidingLog(SlidingLogRt),
    /// `kind: token_bucket` with `store:` a shared store.
    SharedTokenBucket(SharedTokenBucketRt),
    /// `kind: rate` with `store:` a shared store.
    SharedRate(SharedRateRt),
    /// `kind: inflight` with `store:` a shared store.
    SharedInflight(SharedInflightRt),
    /// `kind: tiered` with `store:` a shared store.
    SharedTiered(SharedTieredRt),
    /// `kind: concurrency` with `store:` a shared store.
    SharedConcurrency(SharedConcurrencyRt),
    /// `kind: sliding_log` with `store:` a shared store.
    SharedSlidingLog(SharedSlidingLogRt),
}

/// What building a variant's limiter needs besides its parameters.
pub struct BuildCtx<'a> {
    /// The loaded segments concurrency groups may name.
    pub segments: &'a HashMap<String, Arc<Segment>>,
    /// The shared store the limit's state lives in, if not in-process.
    pub shared: Option<SharedAt<'a>>,
    /// The origin's servers and the limit's key, for `max: auto`.
    pub learn: Option<LearnCtx<'a>>,
}

impl<'a> BuildCtx<'a> {
    /// An in-process limiter's context: only segments.
    pub fn local(segments: &'a HashMap<String, Arc<Segment>>) -> Self {
        Self {
            segments,
            shared: None,
            learn: None,
        }
    }
}

/// A limit variant's place in a shared store.
pub struct SharedAt<'a> {
    /// The store's name.
    pub name: &'a str,
    /// The store.
    pub store: &'a RedisStore,
    /// The variant's key names in it.
    pub names: KeyNames,
    /// Keys remembered as rejected (0: none).
    pub deny_cache: usize,
}

/// Reuses `previous`'s state when `same` says its shape is unchanged, else builds one.
fn carry<S, P>(
    previous: Option<&P>,
    same: impl FnOnce(&P) -> Option<Arc<S>>,
    fresh: impl FnOnce() -> Result<S, LimiterError>,
) -> Result<(Arc<S>, bool), LimiterError> {
    match previous.and_then(same) {
        Some(state) => Ok((state, true)),
        None => Ok((Arc::new(fresh()?), false)),
    }
}

impl Limiter {
    /// The limiter for `params`, sharing `previous`'s state when `previous` is the same
    /// kind with the same state shape (then `true` is returned): an unchanged identity
    /// keeps its counts over a reload. `max` alone never shapes a rate's or inflight's
    /// state, so raising it keeps the counts too. `segments` are the loaded segments that
    /// concurrency groups may name.
    pub fn build(
        params: &LimitParams,
        previous: Option<&Limiter>,
        ctx: BuildCtx<'_>,
    ) -> Result<(Limiter, bool), LimiterError> {
        if let Some(at) = ctx.shared {
            return Self::build_shared(params, previous, at, ctx.segments);
        }
        let segments = ctx.segments;
        Ok(match params {
            LimitParams::Inflight { max, sketch, auto } => {
                let prev = match previous {
                    Some(Limiter::Inflight(p)) => Some(p),
                    _ => None,
                };
                let (state, kept) = carry(
                    prev,
                    |p| (p.sketch == *sketch).then(|| p.state.clone()),
                    || Ok(InflightLimiter::new(*sketch)),
                )?;
                let learned = match (auto, ctx.learn) {
                    (Some(auto), Some(learn)) => {
                        let before = prev.and_then(|p| p.learned.as_deref());
                        Some(Arc::new(Learned::new(*auto, learn, before)))
                    }
                    _ => None,
                };
                let rt = InflightRt {
                    max: *max,
                    sketch: *sketch,
                    state,
                    learned,
                };
                (Limiter::Inflight(rt), kept)
            }
            LimitParams::Rate { rate, max_keys } => {
                let prev = match previous {
                    Some(Limiter::Rate(p)) => Some(p),
                    _ => None,
                };
                let (state, kept) = carry(
                    prev,
                    |p| {
                        (p.max_keys == *max_keys
                            && p.state.per() == rate.per
                            && p.state.window() == rate.window)
                            .then(|| p.state.clone())
                    },
                    || Ok(RateLimiter::with_window(rate.per, rate.window, *max_keys)),
                )?;
                let rt = RateRt {
                    rate: *rate,
                    max_keys: *max_keys,
                    state,
                };
                (Limiter::Rate(rt), kept)
            }
            LimitParams::TokenBucket {
                bucket,
                cost,
                max_keys,
            } => {
                let prev = match previous {
                    Some(Limiter::TokenBucket(p)) => Some(p),
                    _ => None,
                };
                let (state, kept) = carry(
                    prev,
                    |p| {
                        (p.max_keys == *max_keys && p.state.params() == *bucket)
                            .then(|| p.state.clone())
                    },
                    || Ok(TokenBucket::new(*bucket, *max_keys)),
                )?;
                let rt = TokenBucketRt {
                    cost: CostRt::of(cost),
                    max_keys: *max_keys,
                    state,
                };
                (Limiter::TokenBucket(rt), kept)
            }
            LimitParams::Tiered { tiered, max_keys } => {
                let prev = match previous {
                    Some(Limiter::Tiered(p)) => Some(p),
                    _ => None,
                };
                let (state, kept) = carry(
                    prev,
                    |p| (p.max_keys == *max_keys && p.params == *tiered).then(|| p.state.clone()),
                    || {
                        TieredLimiter::new(tiered, *max_keys)
                            .map_err(|e| LimiterError(e.to_string()))
                    },
                )?;
                let rt = TieredRt {
                    params: tiered.clone(),
                    max_keys: *max_keys,
                    state,
                };
                (Limiter::Tiered(rt), kept)
            }
            LimitParams::Concurrency {
                max,
                global,
                groups,
                max_keys,
            } => {
                let params = ConcurrencyParams {
                    max: *max,
                    global: *global,
                    groups: groups.iter().map(|g| g.max).collect(),
                };
                let live = groups
                    .iter()
                    .map(|g| group_rt(g, segments))
                    .collect::<Result<Vec<_>, _>>()?;
                let prev = match previous {
                    Some(Limiter::Concurrency(p)) => Some(p),
                    _ => None,
                };
                let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
                let (state, kept) = carry(
                    prev,
                    |p| {
                        let same_groups = p
                            .groups
                            .iter()
                            .map(|g| g.name.as_str())
                            .eq(names.iter().copied());
                        (p.max_keys == *max_keys && p.params == params && same_groups)
                            .then(|| p.state.clone())
                    },
                    || {
                        ConcurrencyLimiter::new(params.clone(), *max_keys)
                            .map_err(|e| LimiterError(e.to_string()))
                    },
                )?;
                let rt = ConcurrencyRt {
                    max: *max,
                    groups: live,
                    params,
                    max_keys: *max_keys,
                    state,
                };
                (Limiter::Concurrency(rt), kept)
            }
            LimitParams::SlidingLog {
                windows,
                cost,
                max_keys,
            } => {
                let prev = match previous {
                    Some(Limiter::SlidingLog(p)) => Some(p),
                    _ => None,
                };
                let (state, kept) = carry(
                    prev,
                    |p| (p.max_keys == *max_keys && p.windows == *windows).then(|| p.state.clone()),
                    || SlidingLog::new(windows, *max_keys).map_err(|e| LimiterError(e.to_string())),
                )?;
                let rt = SlidingLogRt {
                    windows: windows.clone(),
                    cost: CostRt::of(cost),
                    max_keys: *max_keys,
                    state,
                };
                (Limiter::SlidingLog(rt), kept)
            }
        })
    }

    /// The limiter of a variant whose state lives in a shared store, carried over when
    /// the store (the very same one: a store whose settings changed is a new one, and
    /// the limiter must not keep deciding in the old) and every parameter are unchanged (its fallback state and, for inflight,
    /// its held units and lease renewals live in the carried value).
    fn build_shared(
        params: &LimitParams,
        previous: Option<&Limiter>,
        at: SharedAt<'_>,
        segments: &HashMap<String, Arc<Segment>>,
    ) -> Result<(Limiter, bool), LimiterError> {
        let store = at.name.to_string();
        Ok(match params {
            LimitParams::TokenBucket {
                bucket,
                cost,
                max_keys,
            } => {
                let kept = match previous {
                    Some(Limiter::SharedTokenBucket(p))
                        if p.store == store
                            && p.limiter.store().same_as(at.store)
                            && p.params == *bucket
                            && p.max_keys == *max_keys =>
                    {
                        Some(p.limiter.clone())
                    }
                    _ => None,
                };
                let reused = kept.is_some();
                let limiter = kept.unwrap_or_else(|| {
                    Arc::new(SharedTokenBucket::new(
                        at.store,
                        at.names,
                        *bucket,
                        *max_keys,
                        at.deny_cache,
                    ))
                });
                let rt = SharedTokenBucketRt {
                    store,
                    params: *bucket,
                    cost: CostRt::of(cost),
                    max_keys: *max_keys,
                    limiter,
                };
                (Limiter::SharedTokenBucket(rt), reused)
            }
            LimitParams::Rate { rate, max_keys } => {
                let kept = match previous {
                    Some(Limiter::SharedRate(p))
                        if p.store == store
                            && p.limiter.store().same_as(at.store)
                            && p.rate == *rate
                            && p.max_keys == *max_keys =>
                    {
                        Some(p.limiter.clone())
                    }
                    _ => None,
                };
                let reused = kept.is_some();
                let limiter = kept.unwrap_or_else(|| {
                    Arc::new(SharedRate::new(
                        at.store,
                        at.names,
                        *rate,
                        *max_keys,
                        at.deny_cache,
                    ))
                });
                let rt = SharedRateRt {
                    store,
                    rate: *rate,
                    max_keys: *max_keys,
                    limiter,
                };
                (Limiter::SharedRate(rt), reused)
            }
            LimitParams::Inflight { max, sketch, .. } => {
                let kept = match previous {
                    Some(Limiter::SharedInflight(p))
                        if p.store == store
                            && p.limiter.store().same_as(at.store)
                            && p.max == *max
                            && p.sketch == *sketch =>
                    {
                        Some(p.limiter.clone())
                    }
                    _ => None,
                };
                let reused = kept.is_some();
                let limiter = kept.unwrap_or_else(|| {
                    Arc::new(SharedInflight::new(at.store, at.names, *max, *sketch))
                });
                let rt = SharedInflightRt {
                    store,
                    max: *max,
                    sketch: *sketch,
                    limiter,
                };
                (Limiter::SharedInflight(rt), reused)
            }
            LimitParams::Tiered { tiered, max_keys } => {
                let kept = match previous {
                    Some(Limiter::SharedTiered(p))
                        if p.store == store
                            && p.limiter.store().same_as(at.store)
                            && p.params == *tiered
                            && p.max_keys == *max_keys =>
                    {
                        Some(p.limiter.clone())
                    }
                    _ => None,
                };
                let reused = kept.is_some();
                let limiter = match kept {
                    Some(l) => l,
                    None => Arc::new(
                        SharedTiered::new(at.store, at.names, tiered, *max_keys)
                            .map_err(|e| LimiterError(e.to_string()))?,
                    ),
                };
                let rt = SharedTieredRt {
                    store,
                    params: tiered.clone(),
                    max_keys: *max_keys,
                    limiter,
                };
                (Limiter::SharedTiered(rt), reused)
            }
            LimitParams::Concurrency {
                max,
                global,
                groups,
                max_keys,
            } => {
                let params = ConcurrencyParams {
                    max: *max,
                    global: *global,
                    groups: groups.iter().map(|g| g.max).collect(),
                };
                let live = groups
                    .iter()
                    .map(|g| group_rt(g, segments))
                    .collect::<Result<Vec<_>, _>>()?;
                let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
                // The counters are named after the groups: the state is kept while they,
                // the maxes and the store are unchanged (members may change: a guard
                // releases to the groups it took from).
                let kept = match previous {
                    Some(Limiter::SharedConcurrency(p))
                        if p.store == store
                            && p.limiter.store().same_as(at.store)
                            && p.params == params
                            && p.max_keys == *max_keys
                            && p.groups
                                .iter()
                                .map(|g| g.name.as_str())
                                .eq(names.iter().copied()) =>
                    {
                        Some(p.limiter.clone())
                    }
                    _ => None,
                };
                let reused = kept.is_some();
                let limiter = match kept {
                    Some(l) => l,
                    None => Arc::new(
                        SharedConcurrency::new(
                            at.store,
                            at.names,
                            params.clone(),
                            &names,
                            *max_keys,
                        )
                        .map_err(|e| LimiterError(e.to_string()))?,
                    ),
                };
                let rt = SharedConcurrencyRt {
                    store,
                    max: *max,
                    groups: live,
                    params,
                    max_keys: *max_keys,
                    limiter,
                };
                (Limiter::SharedConcurrency(rt), reused)
            }
            LimitParams::SlidingLog {
                windows,
                cost,
                max_keys,
            } => {
                let kept = match previous {
                    Some(Limiter::SharedSlidingLog(p))
                        if p.store == store
                            && p.limiter.store().same_as(at.store)
                            && p.windows == *windows
                            && p.max_keys == *max_keys =>
                    {
                        Some(p.limiter.clone())
                    }
                    _ => None,
                };
                let reused = kept.is_some();
                let limiter = match kept {
                    Some(l) => l,
                    None => Arc::new(
                        SharedSlidingLog::new(
                            at.store,
                            at.names,
                            windows,
                            *max_keys,
                            at.deny_cache,
                        )
                        .map_err(|e| LimiterError(e.to_string()))?,
                    ),
                };
                let rt = SharedSlidingLogRt {
                    store,
                    windows: windows.clone(),
                    cost: CostRt::of(cost),
                    max_keys: *max_keys,
                    limiter,
                };
                (Limiter::SharedSlidingLog(rt), reused)
            }
        })
    }

    /// Whether the variant's state lives in a shared store: its key must then be hashed
    /// with the portable hash every instance computes alike.
    pub fn is_shared(&self) -> bool {
        matches!(
            self,
            Limiter::SharedTokenBucket(_)
                | Limiter::SharedRate(_)
                | Limiter::SharedInflight(_)
                | Limiter::SharedTiered(_)
                | Limiter::SharedConcurrency(_)
                | Limiter::SharedSlidingLog(_)
        )
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        match self {
            Limiter::Inflight(_) => Kind::Inflight,
            Limiter::Rate(_) => Kind::Rate,
            Limiter::TokenBucket(_) => Kind::TokenBucket,
            Limiter::Tiered(_) => Kind::Tiered,
            Limiter::Concurrency(_) => Kind::Concurrency,
            Limiter::SlidingLog(_) => Kind::SlidingLog,
            Limiter::SharedTokenBucket(_) => Kind::TokenBucket,
            Limiter::SharedRate(_) => Kind::Rate,
            Limiter::SharedInflight(_) => Kind::Inflight,
            Limiter::SharedTiered(_) => Kind::Tiered,
            Limiter::SharedConcurrency(_) => Kind::Concurrency,
            Limiter::SharedSlidingLog(_) => Kind::SlidingLog,
        }
    }

    /// Decides one request for `key` at `now`. An admission returns what it took, to be
    /// undone if a later limit rejects. A rejection takes nothing (strict modes may still
    /// have counted it, as their semantics say; a tiered burst keeps the tiers it entered).
    ///
    /// A local decision completes without waiting; a shared one makes one store call,
    /// bounded by what is left of the phase's store budget (`crate::store::budget`; its
    /// fallback decides past it).
    pub async fn decide<F: Facts + Sync + ?Sized>(
        &self,
        key: u64,
        facts: &F,
        now: Nanos,
    ) -> Result<Decision, BadCost> {
        Ok(match self {
            Limiter::SharedTokenBucket(l) => {
                let cost = l.cost.resolve(facts, l.params.capacity)?;
                let Sourced {
                    value: verdict,
                    source,
                } = Box::pin(l.limiter.acquire(key, cost, now)).await;
                let hold = verdict
                    .allowed
                    .then_some(Hold::SharedRefund { key, cost, source });
                Decision::of(verdict, hold)
            }
            Limiter::SharedRate(l) => {
                let Sourced {
                    value: verdict,
                    source,
                } = Box::pin(l.limiter.acquire(key, 1, now)).await;
                let hold = verdict.allowed.then_some(Hold::SharedRefund {
                    key,
                    cost: 1,
                    source,
                });
                Decision::of(verdict, hold)
            }
            Limiter::SharedInflight(l) => match Box::pin(l.limiter.acquire(key)).await.value {
                Ok(guard) => Decision::of(
                    Verdict::allow(l.max.saturating_sub(l.limiter.held(key)), 0),
                    Some(Hold::SharedInflight(guard)),
                ),
                Err(estimate) => {
                    let retry = if l.max == 0 { NEVER } else { NANOS_PER_SEC };
                    Decision::of(
                        Verdict::reject(l.max.saturating_sub(estimate), 0, retry),
                        None,
                    )
                }
            },
            Limiter::SharedTiered(l) => {
                let d = Box::pin(l.limiter.acquire(key, now)).await;
                let verdict = d.decision.verdict;
                let policy = u8::try_from(d.decision.tier.saturating_sub(1)).unwrap_or(0);
                let hold = verdict.allowed.then(|| Hold::SharedTiered {
                    key,
                    decision: Box::new(d),
                });
                Decision {
                    verdict,
                    hold,
                    policy,
                }
            }
            Limiter::SharedConcurrency(l) => {
                let mask = group_mask(&l.groups, facts);
                match Box::pin(l.limiter.acquire(key, mask, 1)).await.value {
                    Ok(guard) => Decision::of(
                        Verdict::allow(guard.remaining(), 0),
                        Some(Hold::SharedConcurrency(guard)),
                    ),
                    Err(rejection) => concurrency_refused(&rejection, &l.params, mask),
                }
            }
            Limiter::SharedSlidingLog(l) => {
                let cap = l.windows.iter().map(|w| w.max).max().unwrap_or(0);
                let cost = l.cost.resolve(facts, cap)?;
                let d = Box::pin(l.limiter.acquire(key, cost, now)).await;
                let verdict = d.verdict;
                let hold = verdict.allowed.then(|| Hold::SharedLog {
                    key,
                    decision: Box::new(d),
                });
                Decision::of(verdict, hold)
            }
            Limiter::Inflight(l) => {
                let max = learned::max_of(l.max, l.learned.as_deref(), facts);
                match l.state.acquire(key, max) {
                    Ok((guard, estimate)) => Decision::of(
                        Verdict::allow(max.saturating_sub(estimate), 0),
                        Some(Hold::Inflight(guard)),
                    ),
                    Err(estimate) => {
                        // Concurrency frees up as soon as any request ends: one second is
                        // the smallest honest Retry-After. `max: 0` is a block: no retry.
                        let retry = if max == 0 { NEVER } else { NANOS_PER_SEC };
                        let remaining = max.saturating_sub(estimate);
                        Decision::of(Verdict::reject(remaining, 0, retry), None)
                    }
                }
            }
            Limiter::Rate(l) => {
                let v = l.state.acquire(key, l.rate.max, 1, l.rate.strict, now);
                Decision::of(v, v.allowed.then_some(Hold::Refund { key, cost: 1 }))
            }
            Limiter::TokenBucket(l) => {
                let cost = l.cost.resolve(facts, l.state.params().capacity)?;
                let v = l.state.acquire(key, cost, now);
                Decision::of(v, v.allowed.then_some(Hold::Refund { key, cost }))
            }
            Limiter::Tiered(l) => {
                let decision = l.state.acquire(key, now);
                let hold = decision
                    .verdict
                    .allowed
                    .then_some(Hold::Tiered { key, decision });
                Decision {
                    verdict: decision.verdict,
                    hold,
                    // The headers describe the current tier (tier 1 while none is active).
                    policy: u8::try_from(decision.tier.saturating_sub(1)).unwrap_or(0),
                }
            }
            Limiter::Concurrency(l) => {
                let mask = group_mask(&l.groups, facts);
                match l.state.acquire(key, mask, 1) {
                    Ok(guard) => Decision::of(guard.verdict(), Some(Hold::Concurrency(guard))),
                    Err(rejection) => concurrency_refused(&rejection, &l.params, mask),
                }
            }
            Limiter::SlidingLog(l) => {
                let cap = l.windows.iter().map(|w| w.max).max().unwrap_or(0);
                let cost = l.cost.resolve(facts, cap)?;
                let mut v = l.state.acquire(key, cost, now);
                if !v.allowed && l.windows.iter().any(|w| cost > w.max) {
                    // A window smaller than the cost (a `max: 0` block among them) never
                    // makes room: no retry is invited.
                    v.retry_after = NEVER;
                }
                let hold = v.allowed.then_some(Hold::Log { key, cost, at: now });
                Decision::of(v, hold)
            }
        })
    }

    /// Gives back what an admission took: a later limit rejected the request.
    pub fn undo(&self, hold: Hold, now: Nanos) {
        match (self, hold) {
            (Limiter::Rate(l), Hold::Refund { key, cost }) => l.state.refund(key, cost, now),
            (Limiter::TokenBucket(l), Hold::Refund { key, cost }) => l.state.refund(key, cost, now),
            (Limiter::SlidingLog(l), Hold::Log { key, cost, at }) => {
                l.state.refund(key, cost, at);
            }
            (Limiter::Tiered(l), Hold::Tiered { key, decision }) => {
                l.state.refund(key, &decision, now)
            }
            (Limiter::SharedTokenBucket(l), Hold::SharedRefund { key, cost, source }) => {
                l.limiter.refund(key, cost, source, now)
            }
            (Limiter::SharedRate(l), Hold::SharedRefund { key, cost, source }) => {
                l.limiter.refund(key, cost, source, now)
            }
            (Limiter::SharedTiered(l), Hold::SharedTiered { key, decision }) => {
                l.limiter.refund(key, &decision, now)
            }
            (Limiter::SharedSlidingLog(l), Hold::SharedLog { key, decision }) => {
                l.limiter.refund(key, &decision)
            }
            (_, Hold::SharedInflight(guard)) => drop(guard),
            (_, Hold::SharedConcurrency(guard)) => drop(guard),
            // Dropping a guard gives its units back.
            (_, Hold::Inflight(guard)) => drop(guard),
            (_, Hold::Concurrency(guard)) => drop(guard),
            // A hold of another kind cannot come from this limiter; nothing to give back.
            _ => {}
        }
    }
}

/// The groups `facts` belong to, as a bitset (bit `i`: group `i`).
pub(crate) fn group_mask<F: Facts + ?Sized>(groups: &[GroupRt], facts: &F) -> u64 {
    groups
        .iter()
        .enumerate()
        .filter(|(_, g)| g.members.contains(facts))
        .fold(0u64, |m, (i, _)| m | 1 << i)
}

/// A concurrency rejection as a decision: the limit's room, and a retry in a second unless
/// the request can never fit ([`ConcurrencyParams::refusal`]), which invites none.
fn concurrency_refused(rejection: &Rejection, params: &ConcurrencyParams, mask: u64) -> Decision {
    Decision::of(params.refusal(rejection, mask), None)
}

/// A group, live: its members' values gathered in a set, or its segment looked up.
fn group_rt(g: &Group, segments: &HashMap<String, Arc<Segment>>) -> Result<GroupRt, LimiterError> {
    let members = match &g.members {
        Members::Values { part, values } => MembersRt::Values {
            part: part.clone(),
            values: values.iter().cloned().collect(),
        },
        Members::Segment { part, name } => MembersRt::Segment {
            part: part.clone(),
            set: segments
                .get(name)
                .cloned()
                .ok_or_else(|| LimiterError(format!("segment `{name}` is not loaded")))?,
        },
    };
    Ok(GroupRt {
        name: g.name.clone(),
        members,
    })
}
