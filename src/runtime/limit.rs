//! One limit at runtime: its key, its variants (base and overrides) each with a
//! [`Limiter`](crate::runtime::limiter::Limiter), the conditions that pick an override, and
//! the identity ([`StateId`]) that carries state over a reload.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{HeadersMode, Kind, Limit, Mode};
use crate::limits::heavy::{self, HeavyHitters};
use crate::limits::{Fact, Facts, KeyPart, KeySpec, MatchValue, Matcher};
use crate::log_budget::LogBudget;
use crate::metrics::DecisionCounters;
use crate::runtime::learned::LearnCtx;
use crate::runtime::limiter::{BuildCtx, Limiter, LimiterError, SharedAt};
use crate::runtime::policy::Policy;
use crate::runtime::stores::Stores;
use crate::segments::Segment;
use crate::store::Variant as StoreVariant;

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

/// One condition of an override's `match:`, ready for the request path: a value compared
/// by [`Matcher::matches`], or membership of the part's value in a loaded segment.
pub enum Cond {
    /// `PART: VALUE`.
    Is(Matcher),
    /// `segment: NAME`: the segment's part holds an ID in the segment.
    InSegment {
        /// The condition as configured (its part is the segment's `of`).
        matcher: Matcher,
        /// The loaded segment.
        set: Arc<Segment>,
    },
}

impl Cond {
    fn of(m: &Matcher, segments: &HashMap<String, Arc<Segment>>) -> Result<Cond, LimiterError> {
        match &m.value {
            MatchValue::Segment(name) => match segments.get(name) {
                Some(set) => Ok(Cond::InSegment {
                    matcher: m.clone(),
                    set: set.clone(),
                }),
                None => Err(LimiterError(format!("segment `{name}` is not loaded"))),
            },
            _ => Ok(Cond::Is(m.clone())),
        }
    }

    /// Whether the request meets the condition. A missing part, or a value that is not an
    /// integer ID, never does.
    pub fn holds<F: Facts + ?Sized>(&self, facts: &F) -> bool {
        match self {
            Cond::Is(m) => m.matches(facts),
            Cond::InSegment { matcher, set } => {
                matches!(facts.fact(&matcher.part), Some(Fact::Bytes(v)) if set.contains_bytes(v))
            }
        }
    }

    fn matcher(&self) -> &Matcher {
        match self {
            Cond::Is(m) | Cond::InSegment { matcher: m, .. } => m,
        }
    }
}

/// The name a variant's keys carry in a shared store: `b` for the base, `o<i>` for an
/// override.
fn variant_of(index: usize) -> StoreVariant {
    match index.checked_sub(1) {
        None => StoreVariant::Base,
        Some(i) => StoreVariant::Override(i),
    }
}

/// One variant of a limit (base or override): mode, limiter and advertised policy.
pub struct Variant {
    /// Enforce or shadow.
    pub mode: Mode,
    /// Kind, parameters and state.
    pub limiter: Limiter,
    /// `RateLimit-Policy` members and text, precomputed.
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
    /// Conditions of overrides, aligned with `variants[1..]`.
    pub conds: Vec<Vec<Cond>>,
    /// Its own `match:`: the requests it applies to (empty: all).
    pub scope: Vec<Cond>,
    /// Decision counters.
    pub counters: DecisionCounters,
    /// Rejection log lines of this limit, rate-limited.
    pub log: LogBudget,
    /// Whether its state lives in a shared store (its key is then the portable hash).
    pub shared: bool,
    /// Its heaviest keys (`top_keys`), for the admin API; `None` (the default) keeps the
    /// decision path free of it. Carried over a reload while `top_keys` is unchanged.
    pub top: Option<Arc<HeavyHitters>>,
}

/// What building a limit needs from the runtime being built.
pub struct Building<'a, 'p> {
    /// The origin's name.
    pub origin: &'a str,
    /// The previous runtime's limiters, by identity.
    pub previous: &'a HashMap<StateId, &'p Limiter>,
    /// The loaded segments, by name.
    pub segments: &'a HashMap<String, Arc<Segment>>,
    /// The runtime's shared stores.
    pub stores: &'a Stores,
    /// The previous runtime's heavy-hitter lists, by origin and limit name.
    pub tops: &'a HashMap<(String, String), Arc<HeavyHitters>>,
    /// The origin's resolved upstream servers (for `max: auto`).
    pub servers: &'a [SocketAddr],
}

impl LimitRt {
    /// The limit `limit`, reusing state from the previous runtime where its identity and
    /// shape are unchanged. Counts each variant as kept or fresh in `carried`.
    pub fn build(
        at: &Building<'_, '_>,
        limit: &Limit,
        key_slot: usize,
        counters: DecisionCounters,
        carried: &mut super::Carried,
    ) -> Result<LimitRt, LimiterError> {
        let bases = std::iter::once((None, &limit.params, limit.mode));
        let overrides = limit
            .overrides
            .iter()
            .map(|o| (Some(o.matchers.clone()), &o.params, o.mode));
        let mut variants = Vec::with_capacity(limit.overrides.len() + 1);
        let store = match &limit.store {
            Some(name) => Some((
                name.as_str(),
                at.stores
                    .get(name)
                    .ok_or_else(|| LimiterError(format!("store `{name}` is not started")))?,
            )),
            None => None,
        };
        for (i, (matchers, params, mode)) in bases.chain(overrides).enumerate() {
            let id = StateId {
                origin: at.origin.to_string(),
                limit: limit.name.clone(),
                matchers,
                key: limit.key.clone(),
            };
            let previous = at.previous.get(&id).copied();
            let shared = store.map(|(name, store)| SharedAt {
                name,
                store,
                names: store.names(at.origin, &limit.name, variant_of(i)),
                deny_cache: at.stores.deny_cache(name),
                // Token buckets, rates, inflight, and concurrency without a global or
                // group counter lease (a block of slots spans one counter).
                lease: limit
                    .lease
                    .filter(|_| params.leases())
                    .map(|p| crate::store::LeaseCtx::new(p, store, at.origin, &limit.name)),
            });
            let ctx = BuildCtx {
                segments: at.segments,
                shared,
                learn: Some(LearnCtx {
                    servers: at.servers,
                    key: &limit.key,
                }),
            };
            let (limiter, kept) = Limiter::build(params, previous, ctx)?;
            if kept {
                carried.kept += 1;
            } else {
                carried.fresh += 1;
            }
            variants.push(Variant {
                mode,
                limiter,
                policy: Policy::of(&limit.name, params),
            });
        }
        let conds = limit
            .overrides
            .iter()
            .map(|o| {
                o.matchers
                    .iter()
                    .map(|m| Cond::of(m, at.segments))
                    .collect()
            })
            .collect::<Result<_, _>>()?;
        let scope = (limit.scope.iter())
            .map(|m| Cond::of(m, at.segments))
            .collect::<Result<_, _>>()?;
        Ok(LimitRt {
            name: limit.name.clone(),
            kind: limit.params.kind(),
            key: limit.key.clone(),
            key_slot,
            headers: limit.headers,
            variants,
            conds,
            scope,
            counters,
            log: LogBudget::new(),
            shared: store.is_some(),
            top: limit.top_keys.map(|k| {
                let id = (at.origin.to_string(), limit.name.clone());
                match at.tops.get(&id) {
                    Some(top) if top.k() == k => top.clone(),
                    _ => Arc::new(HeavyHitters::new(k, heavy::DEFAULT_EPOCH)),
                }
            }),
        })
    }

    /// Whether its key, its `match:` or an override's condition reads `part` (the origin
    /// then builds that fact for its requests: the normal path, `crate::limits::path`).
    pub fn reads(&self, part: &KeyPart) -> bool {
        self.key.parts().contains(part)
            || (self.conds.iter().flatten())
                .chain(&self.scope)
                .any(|c| c.matcher().part == *part)
    }

    /// Whether it applies to the request: every condition of its `match:` holds (a limit
    /// without one applies to all).
    #[inline]
    pub fn applies<F: Facts + ?Sized>(&self, facts: &F) -> bool {
        self.scope.iter().all(|c| c.holds(facts))
    }

    /// The variant that applies: the first override whose conditions all hold, else base.
    #[inline]
    pub fn select<F: Facts + ?Sized>(&self, facts: &F) -> usize {
        if self.conds.is_empty() {
            // No overrides (most limits): the base, without a call on the request path.
            return 0;
        }
        self.conds
            .iter()
            .position(|cs| cs.iter().all(|c| c.holds(facts)))
            .map_or(0, |i| i + 1)
    }

    /// Every variant's identity with its limiter, for the next reload to look up.
    pub fn states<'a>(
        &'a self,
        origin: &'a str,
    ) -> impl Iterator<Item = (StateId, &'a Limiter)> + 'a {
        let conds = self
            .conds
            .iter()
            .map(|cs| Some(cs.iter().map(|c| c.matcher().clone()).collect()));
        std::iter::once(None)
            .chain(conds)
            .zip(&self.variants)
            .map(move |(matchers, v)| {
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
