//! A limit variant's kind, parameters and state, as one value: [`Limiter`].
//!
//! Holding a kind's state *together with* its parameters in one enum variant makes a
//! mismatch (rate state with bucket parameters) unrepresentable, and gives every kind one
//! entry point, [`Limiter::decide`], and one way back, [`Limiter::undo`]
//! (`crate::runtime::admission`). Each of the six kinds is one variant, whose state lives
//! in this process or in a shared store ([`Place`]): the kind's parameters, cost and groups
//! are read the same either way, and only the state answers differently. A new kind is a
//! new variant here with its arms in [`Limiter::build`], `decide`, `undo` and `grant`:
//! every match over kinds is exhaustive, so the compiler lists them.
//!
//! State is carried over a reload by [`Limiter::build`]: when the previous runtime had a
//! variant with the same identity, in the same place (the very same store, for a shared
//! one), and the state has the same shape, the new limiter shares its `Arc`, so unchanged
//! limits keep their counts, buckets, logs and holds. A shared limiter's shape is every
//! parameter (its script takes them all, and its fallback is sized by them), so changing
//! a shared rate's or inflight's `max` starts it afresh, fallback state included; in
//! process, `max` and `strict` are passed per call and changing them keeps the counts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::config::{Cost, Group, Kind, LimitParams, Members};
use crate::limits::concurrency::{ConcurrencyLimiter, ConcurrencyParams};
use crate::limits::tiered::{TieredLimiter, TieredParams};
use crate::limits::{
    Fact, Facts, InflightLimiter, KeyPart, LogWindow, RateLimiter, RateParams, SketchSize,
    SlidingLog, TokenBucket, TokenBucketParams,
};
use crate::runtime::learned::{LearnCtx, Learned};
use crate::segments::Segment;
use crate::store::{
    KeyNames, RedisStore, SharedConcurrency, SharedInflight, SharedRate, SharedSlidingLog,
    SharedTiered, SharedTokenBucket,
};

pub use crate::runtime::admission::{Decision, Hold, HoldIn, MismatchedHold};
pub use crate::runtime::place::{InStore, InStoreLimiter, Place};

use crate::runtime::place::place;

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
    pub(crate) fn resolve<F: Facts + ?Sized>(&self, facts: &F, cap: u64) -> Result<u64, BadCost> {
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

/// The inflight kind, live: `max` with the count-min sketch (in process) or the leased
/// counts (in a store) it applies to.
pub struct InflightRt {
    /// Allowed in flight per key; 0 blocks.
    pub max: u64,
    /// The sketch's size (the local fallback's, in a store), part of the state's shape.
    pub sketch: SketchSize,
    /// The sketch, shared with every live guard, or the store's limiter.
    pub state: Place<InflightLimiter, SharedInflight>,
    /// `max: auto`: what each upstream server takes (`crate::runtime::learned`); in
    /// process only (the config refuses `max: auto` with `store:`).
    pub learned: Option<Arc<Learned>>,
}

/// The rate kind, live.
pub struct RateRt {
    /// `max`, `per` and `strict`; in process only `per` shapes the state, with `max_keys`.
    pub rate: RateParams,
    /// `max_keys` (of the local fallback, in a store), part of the state's shape.
    pub max_keys: usize,
    /// The bounded table of per-key windows, or the store's limiter.
    pub state: Place<RateLimiter, SharedRate>,
}

/// The token-bucket kind, live.
pub struct TokenBucketRt {
    /// The bucket's parameters: all shape the state.
    pub params: TokenBucketParams,
    /// A fixed cost, or the header to read it from.
    pub cost: CostRt,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// The bounded table of buckets, or the store's limiter.
    pub state: Place<TokenBucket, SharedTokenBucket>,
}

/// The tiered kind, live (Charon's burst tiers).
pub struct TieredRt {
    /// The normalized tiers, hard and global limits: all shape the state.
    pub params: TieredParams,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// The per-key tier logs, or the store's limiter (with, on a Cluster, its global
    /// share).
    pub state: Place<TieredLimiter, SharedTiered>,
}

/// The concurrency kind, live (Charon's copy-limited resources).
pub struct ConcurrencyRt {
    /// Copies one key may hold; 0 blocks.
    pub max: u64,
    /// The groups, in bit order: group `i` is bit `i` of the request's mask (in a store,
    /// their names name their counters).
    pub groups: Vec<GroupRt>,
    /// The limiter's parameters (max, global, group maxes): they shape the state.
    pub params: ConcurrencyParams,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// Exact counts, shared with every live guard, or the store's limiter.
    pub state: Place<ConcurrencyLimiter, SharedConcurrency>,
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
    /// A fixed cost, or the header to read it from (clamped to the largest window's max).
    pub cost: CostRt,
    /// `max_keys`, part of the state's shape.
    pub max_keys: usize,
    /// The per-key logs, or the store's limiter.
    pub state: Place<SlidingLog, SharedSlidingLog>,
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
    /// How hot keys are leased (`None`: one call per decision).
    pub lease: Option<crate::store::LeaseCtx>,
}

/// The previous limiter's kind parameters and state when it was of kind `$kind`.
macro_rules! previous_of {
    ($previous:expr, $kind:ident) => {
        if let Some(Limiter::$kind(p)) = $previous {
            Some(p)
        } else {
            None
        }
    };
}

impl Limiter {
    /// The limiter for `params`, in process or in `ctx`'s shared store, sharing
    /// `previous`'s state when `previous` is the same kind in the same place with the same
    /// state shape (then `true` is returned): an unchanged identity keeps its counts over a
    /// reload (module doc). `ctx.segments` are the loaded segments that concurrency groups
    /// may name.
    pub fn build(
        params: &LimitParams,
        previous: Option<&Limiter>,
        ctx: BuildCtx<'_>,
    ) -> Result<(Limiter, bool), LimiterError> {
        let at = ctx.shared;
        // A shared limit's lease (token bucket, rate, inflight, concurrency).
        let lease = at.as_ref().and_then(|a| a.lease.clone());
        let leased = lease.as_ref().map(|l| l.params);
        Ok(match params {
            LimitParams::Inflight { max, sketch, auto } => {
                let prev = previous_of!(previous, Inflight);
                let (state, kept) = place(
                    prev.map(|p| &p.state),
                    // In process `max` is passed per call; the store's limiter holds it.
                    |shared| {
                        prev.is_some_and(|p| {
                            p.sketch == *sketch
                                && (!shared || p.max == *max && p.state.leased_as(leased))
                        })
                    },
                    at,
                    || Ok(InflightLimiter::new(*sketch)),
                    |store, names, _| {
                        let lease = lease.clone();
                        Ok(SharedInflight::new_leased(
                            store, names, *max, *sketch, lease,
                        ))
                    },
                )?;
                let learned = match (auto, ctx.learn) {
                    (Some(auto), Some(learn)) => {
                        let before = prev.and_then(|p| p.learned.as_deref());
                        Some(Arc::new(Learned::new(*auto, learn, before)))
                    }
                    (Some(_) | None, _) => None,
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
                let prev = previous_of!(previous, Rate);
                let (state, kept) = place(
                    prev.map(|p| &p.state),
                    // In process only the window shapes the state; the store's limiter
                    // holds every parameter, its lease settings too.
                    |shared| {
                        prev.is_some_and(|p| {
                            p.max_keys == *max_keys
                                && if shared {
                                    p.rate == *rate && p.state.leased_as(leased)
                                } else {
                                    p.rate.per == rate.per && p.rate.window == rate.window
                                }
                        })
                    },
                    at,
                    || Ok(RateLimiter::with_window(rate.per, rate.window, *max_keys)),
                    |store, names, deny| {
                        Ok(SharedRate::new(store, names, *rate, *max_keys, deny).with_lease(lease))
                    },
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
                let prev = previous_of!(previous, TokenBucket);
                let (state, kept) = place(
                    prev.map(|p| &p.state),
                    // A shared bucket keeps its lease settings too.
                    |shared| {
                        prev.is_some_and(|p| {
                            p.max_keys == *max_keys
                                && p.params == *bucket
                                && (!shared || p.state.leased_as(leased))
                        })
                    },
                    at,
                    || Ok(TokenBucket::new(*bucket, *max_keys)),
                    |store, names, deny| {
                        Ok(
                            SharedTokenBucket::new(store, names, *bucket, *max_keys, deny)
                                .with_lease(lease),
                        )
                    },
                )?;
                let rt = TokenBucketRt {
                    params: *bucket,
                    cost: CostRt::of(cost),
                    max_keys: *max_keys,
                    state,
                };
                (Limiter::TokenBucket(rt), kept)
            }
            LimitParams::Tiered { tiered, max_keys } => {
                let prev = previous_of!(previous, Tiered);
                let (state, kept) = place(
                    prev.map(|p| &p.state),
                    |_| prev.is_some_and(|p| p.max_keys == *max_keys && p.params == *tiered),
                    at,
                    || TieredLimiter::new(tiered, *max_keys).map_err(|e| e.to_string()),
                    |store, names, _| {
                        SharedTiered::new(store, names, tiered, *max_keys)
                            .map_err(|e| e.to_string())
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
                    .map(|g| group_rt(g, ctx.segments))
                    .collect::<Result<Vec<_>, _>>()?;
                let prev = previous_of!(previous, Concurrency);
                let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
                // In a store the counters are named after the groups: the state is kept
                // while they, the maxes and the store are unchanged (members may change: a
                // guard releases to the groups it took from).
                let (state, kept) = place(
                    prev.map(|p| &p.state),
                    |shared| {
                        prev.is_some_and(|p| {
                            p.max_keys == *max_keys
                                && p.params == params
                                && (!shared || p.state.leased_as(leased))
                                && p.groups
                                    .iter()
                                    .map(|g| g.name.as_str())
                                    .eq(names.iter().copied())
                        })
                    },
                    at,
                    || {
                        ConcurrencyLimiter::new(params.clone(), *max_keys)
                            .map_err(|e| e.to_string())
                    },
                    |store, key_names, _| {
                        let p = params.clone();
                        SharedConcurrency::new_leased(store, key_names, p, &names, *max_keys, lease)
                            .map_err(|e| e.to_string())
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
                let prev = previous_of!(previous, SlidingLog);
                let (state, kept) = place(
                    prev.map(|p| &p.state),
                    |_| prev.is_some_and(|p| p.max_keys == *max_keys && p.windows == *windows),
                    at,
                    || SlidingLog::new(windows, *max_keys).map_err(|e| e.to_string()),
                    |store, names, deny| {
                        SharedSlidingLog::new(store, names, windows, *max_keys, deny)
                            .map_err(|e| e.to_string())
                    },
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

    /// Whether the variant's state lives in a shared store: its key must then be hashed
    /// with the portable hash every instance computes alike.
    pub fn is_shared(&self) -> bool {
        match self {
            Limiter::Inflight(l) => l.state.is_shared(),
            Limiter::Rate(l) => l.state.is_shared(),
            Limiter::TokenBucket(l) => l.state.is_shared(),
            Limiter::Tiered(l) => l.state.is_shared(),
            Limiter::Concurrency(l) => l.state.is_shared(),
            Limiter::SlidingLog(l) => l.state.is_shared(),
        }
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
        }
    }
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
