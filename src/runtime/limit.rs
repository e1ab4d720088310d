//! One limit at runtime: its key, its variants (base and overrides), and for each variant a
//! [`Limiter`] that holds the kind's state *together with* its parameters.
//!
//! Holding both in one enum variant makes a mismatch (rate state with bucket parameters)
//! unrepresentable, and gives every kind one entry point, [`Limiter::decide`], and one way
//! back, [`Limiter::undo`]. A new kind is a new variant here and a new arm in each of
//! those; the proxy and the other front ends do not change.
//!
//! State is carried over a reload by [`Limiter::build`]: when the previous runtime had a
//! variant with the same identity (see [`StateId`]) and the state has the same shape, the
//! new limiter shares its `Arc`, so unchanged limits keep their counts and buckets.

use std::sync::Arc;

use crate::config::{Cost, HeadersMode, Kind, Limit, LimitParams, Mode};
use crate::limits::{
    Facts, InflightGuard, InflightLimiter, KeyPart, KeySpec, Matcher, Nanos, RateLimiter,
    RateParams, SketchSize, TokenBucket, Verdict, NANOS_PER_SEC, NEVER,
};
use crate::metrics::DecisionCounters;
use crate::ratelog::LogBudget;
use crate::runtime::policy::Policy;

/// A cost header that is not a positive integer: answered with 400, because a caller that
/// sends a broken cost must not be charged a guess.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header `{header}` must appear once, as a positive integer token cost")]
pub struct BadCost {
    /// The header's name.
    pub header: String,
}

/// What an admission took, to give back when a later limit rejects the request or, for
/// holding kinds, when the request ends.
pub enum Hold {
    /// Quota consumed at request time: refunded if a later limit rejects; nothing to do
    /// when the request ends.
    Refund {
        /// The key charged.
        key: u64,
        /// What it was charged.
        cost: u64,
    },
    /// An inflight unit: given back when dropped (the upstream is done) or undone.
    Inflight(InflightGuard),
}

/// The inflight kind, live: `max` with the count-min sketch it applies to.
pub struct InflightRt {
    /// Allowed in flight per key; 0 blocks.
    pub max: u64,
    /// The sketch's size, part of the state's shape.
    pub sketch: SketchSize,
    /// The sketch, shared with every live guard.
    pub state: Arc<InflightLimiter>,
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

/// A token-bucket request's cost, ready for the request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostRt {
    /// Every request costs this.
    Fixed(u64),
    /// Read from this header part, clamped to `[1, capacity]`; absent means 1.
    Header(KeyPart),
}

/// A limit variant's kind, parameters and state.
pub enum Limiter {
    /// `kind: inflight`.
    Inflight(InflightRt),
    /// `kind: rate`.
    Rate(RateRt),
    /// `kind: token_bucket`.
    TokenBucket(TokenBucketRt),
}

impl Limiter {
    /// The limiter for `params`, sharing `previous`'s state when `previous` is the same
    /// kind with the same state shape (then `true` is returned): an unchanged identity
    /// keeps its counts over a reload. `max` alone never shapes state, so raising a rate
    /// or inflight `max` keeps the counts too.
    pub fn build(params: &LimitParams, previous: Option<&Limiter>) -> (Limiter, bool) {
        match (params, previous) {
            (LimitParams::Inflight { max, sketch }, previous) => {
                let kept = match previous {
                    Some(Limiter::Inflight(p)) if p.sketch == *sketch => Some(p.state.clone()),
                    _ => None,
                };
                let reused = kept.is_some();
                let state = kept.unwrap_or_else(|| Arc::new(InflightLimiter::new(*sketch)));
                let rt = InflightRt {
                    max: *max,
                    sketch: *sketch,
                    state,
                };
                (Limiter::Inflight(rt), reused)
            }
            (LimitParams::Rate { rate, max_keys }, previous) => {
                let kept = match previous {
                    Some(Limiter::Rate(p)) if p.max_keys == *max_keys && p.rate.per == rate.per => {
                        Some(p.state.clone())
                    }
                    _ => None,
                };
                let reused = kept.is_some();
                let state = kept.unwrap_or_else(|| Arc::new(RateLimiter::new(rate.per, *max_keys)));
                let rt = RateRt {
                    rate: *rate,
                    max_keys: *max_keys,
                    state,
                };
                (Limiter::Rate(rt), reused)
            }
            (
                LimitParams::TokenBucket {
                    bucket,
                    cost,
                    max_keys,
                },
                previous,
            ) => {
                let kept = match previous {
                    Some(Limiter::TokenBucket(p))
                        if p.max_keys == *max_keys && p.state.params() == *bucket =>
                    {
                        Some(p.state.clone())
                    }
                    _ => None,
                };
                let reused = kept.is_some();
                let state = kept.unwrap_or_else(|| Arc::new(TokenBucket::new(*bucket, *max_keys)));
                let cost = match cost {
                    Cost::Fixed(c) => CostRt::Fixed(*c),
                    Cost::Header(name) => CostRt::Header(KeyPart::Header(name.clone())),
                };
                let rt = TokenBucketRt {
                    cost,
                    max_keys: *max_keys,
                    state,
                };
                (Limiter::TokenBucket(rt), reused)
            }
        }
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        match self {
            Limiter::Inflight(_) => Kind::Inflight,
            Limiter::Rate(_) => Kind::Rate,
            Limiter::TokenBucket(_) => Kind::TokenBucket,
        }
    }

    /// Decides one request for `key` at `now`. An admission returns what it took, to be
    /// undone if a later limit rejects. A rejection takes nothing (strict modes may still
    /// have counted it, as their semantics say).
    pub fn decide<F: Facts + ?Sized>(
        &self,
        key: u64,
        facts: &F,
        now: Nanos,
    ) -> Result<(Verdict, Option<Hold>), BadCost> {
        Ok(match self {
            Limiter::Inflight(l) => match l.state.acquire(key, l.max) {
                Ok((guard, estimate)) => (
                    Verdict::allow(l.max.saturating_sub(estimate), 0),
                    Some(Hold::Inflight(guard)),
                ),
                Err(estimate) => {
                    // Concurrency frees up as soon as any request ends: one second is the
                    // smallest honest Retry-After. `max: 0` is a block: no retry.
                    let retry = if l.max == 0 { NEVER } else { NANOS_PER_SEC };
                    let remaining = l.max.saturating_sub(estimate);
                    (Verdict::reject(remaining, 0, retry), None)
                }
            },
            Limiter::Rate(l) => {
                let v = l.state.acquire(key, l.rate.max, 1, l.rate.strict, now);
                let hold = v.allowed.then_some(Hold::Refund { key, cost: 1 });
                (v, hold)
            }
            Limiter::TokenBucket(l) => {
                let cost = l.cost_of(facts)?;
                let v = l.state.acquire(key, cost, now);
                (v, v.allowed.then_some(Hold::Refund { key, cost }))
            }
        })
    }

    /// Gives back what an admission took: a later limit rejected the request.
    pub fn undo(&self, hold: Hold, now: Nanos) {
        match (self, hold) {
            (Limiter::Rate(l), Hold::Refund { key, cost }) => l.state.refund(key, cost, now),
            (Limiter::TokenBucket(l), Hold::Refund { key, cost }) => l.state.refund(key, cost, now),
            // Dropping the guard gives the unit back; a refund has nothing to give back to
            // a holding kind.
            (_, Hold::Inflight(guard)) => drop(guard),
            (Limiter::Inflight(_), Hold::Refund { .. }) => {}
        }
    }
}

impl TokenBucketRt {
    /// The request's token cost: the fixed cost, or the cost header's value clamped to
    /// `[1, capacity]` (1 when the header is absent). A header that is not a positive
    /// decimal integer (`0`, `-1`, `1.5`, `abc`), or that appears twice, is a [`BadCost`],
    /// answered with 400.
    fn cost_of<F: Facts + ?Sized>(&self, facts: &F) -> Result<u64, BadCost> {
        let part = match &self.cost {
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
        let crate::limits::Fact::Bytes(bytes) = fact else {
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
        Ok(value.min(self.state.params().capacity.max(1)))
    }
}

/// What makes two limit variants the same state across a reload: origin, limit name,
/// override match (`None` for the base variant) and key parts. The state's shape (window,
/// sketch, bucket parameters) is compared by [`Limiter::build`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateId {
    /// The origin's name.
    pub origin: String,
    /// The limit's name.
    pub limit: String,
    /// The override's match, or `None` for the base variant.
    pub matchers: Option<Vec<Matcher>>,
    /// The key parts.
    pub key: KeySpec,
}

/// One variant of a limit (base or override): mode, limiter and advertised policy.
pub struct Variant {
    /// Enforce or shadow.
    pub mode: Mode,
    /// Kind, parameters and state.
    pub limiter: Limiter,
    /// `RateLimit-Policy` member and text, precomputed.
    pub policy: Policy,
}

/// One limit of one origin.
pub struct LimitRt {
    /// Name (metrics label, policy name).
    pub name: String,
    /// The kind, for metrics and logs.
    pub kind: Kind,
    /// Key parts.
    pub key: KeySpec,
    /// The key's index among its origin's distinct keys: limits of one origin that share
    /// a key (say two limits on `[client_ip]`) hash it once per request.
    pub key_slot: usize,
    /// When to add RateLimit headers.
    pub headers: HeadersMode,
    /// `[base, override 0, override 1, ...]`.
    pub variants: Vec<Variant>,
    /// Matchers of overrides, aligned with `variants[1..]`.
    pub matchers: Vec<Vec<Matcher>>,
    /// Decision counters.
    pub counters: DecisionCounters,
    /// Rejection log lines of this limit, rate-limited.
    pub log: LogBudget,
}

impl LimitRt {
    /// The limit `limit` of `origin`, reusing state from `previous` (looked up by
    /// [`StateId`]). Counts each variant as kept or fresh in `carried`.
    pub fn build<'p>(
        origin: &str,
        limit: &Limit,
        key_slot: usize,
        counters: DecisionCounters,
        previous: impl Fn(&StateId) -> Option<&'p Limiter>,
        carried: &mut super::Carried,
    ) -> LimitRt {
        let bases = std::iter::once((None, &limit.params, limit.mode));
        let overrides = limit
            .overrides
            .iter()
            .map(|o| (Some(o.matchers.clone()), &o.params, o.mode));
        let variants = bases
            .chain(overrides)
            .map(|(matchers, params, mode)| {
                let id = StateId {
                    origin: origin.to_string(),
                    limit: limit.name.clone(),
                    matchers,
                    key: limit.key.clone(),
                };
                let (limiter, kept) = Limiter::build(params, previous(&id));
                if kept {
                    carried.kept += 1;
                } else {
                    carried.fresh += 1;
                }
                Variant {
                    mode,
                    limiter,
                    policy: Policy::of(&limit.name, params),
                }
            })
            .collect();
        LimitRt {
            name: limit.name.clone(),
            kind: limit.params.kind(),
            key: limit.key.clone(),
            key_slot,
            headers: limit.headers,
            variants,
            matchers: limit.overrides.iter().map(|o| o.matchers.clone()).collect(),
            counters,
            log: LogBudget::new(),
        }
    }

    /// The variant that applies: the first override whose matchers all match, else base.
    pub fn select<F: Facts + ?Sized>(&self, facts: &F) -> usize {
        self.matchers
            .iter()
            .position(|ms| ms.iter().all(|m| m.matches(facts)))
            .map_or(0, |i| i + 1)
    }

    /// Every variant's identity with its limiter, for the next reload to look up.
    pub fn states<'a>(
        &'a self,
        origin: &'a str,
    ) -> impl Iterator<Item = (StateId, &'a Limiter)> + 'a {
        let matchers = std::iter::once(None).chain(self.matchers.iter().cloned().map(Some));
        matchers.zip(&self.variants).map(move |(matchers, v)| {
            let id = StateId {
                origin: origin.to_string(),
                limit: self.name.clone(),
                matchers,
                key: self.key.clone(),
            };
            (id, &v.limiter)
        })
    }
}
