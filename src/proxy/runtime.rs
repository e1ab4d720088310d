//! The live form of a config: routing table, upstream pickers, limiter state and metric
//! handles, built once per load and swapped atomically on reload.
//!
//! Limiter state is keyed by an identity: origin, limit name, override match (or the base
//! variant), kind, key parts, and the parameters that shape the state (window and sketch
//! size for rate, sketch size for inflight, every bucket parameter for token buckets). A
//! reload looks each identity up in the previous runtime and reuses its `Arc` state, so an
//! unchanged limit keeps its counters and buckets; `max` alone never shapes state, so
//! raising a rate or inflight `max` keeps the counts too. New identities start fresh;
//! identities absent from the new config are dropped with the old runtime once the last
//! in-flight request holding it finishes.

use std::collections::HashMap;
use std::sync::Arc;

use pingora::lb::selection::RoundRobin;
use pingora::lb::LoadBalancer;

use crate::config::{Config, HeadersMode, LimitParams, Mode};
use crate::limits::{
    InflightLimiter, KeySpec, Matcher, RateLimiter, SketchSize, TokenBucket, TokenBucketParams,
};
use crate::metrics::{CodeCounters, DecisionCounters, Metrics, UNMATCHED_ORIGIN};
use crate::proxy::problem::{ceil_secs, policy_item};
use crate::proxy::route::Router;

/// The state of one limit variant (base or override).
pub enum State {
    /// Count-min inflight counts.
    Inflight(InflightLimiter),
    /// Sliding-window sketches.
    Rate(RateLimiter),
    /// Exact buckets.
    TokenBucket(TokenBucket),
}

/// What makes two limit variants share state across a reload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateId {
    origin: String,
    limit: String,
    matchers: Option<Vec<Matcher>>,
    key: KeySpec,
    shape: Shape,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Shape {
    Inflight(SketchSize),
    Rate(u64, SketchSize),
    TokenBucket(TokenBucketParams, usize),
}

fn shape(params: &LimitParams) -> Shape {
    match params {
        LimitParams::Inflight { sketch, .. } => Shape::Inflight(*sketch),
        LimitParams::Rate { rate, sketch } => Shape::Rate(rate.per, *sketch),
        LimitParams::TokenBucket {
            bucket, max_keys, ..
        } => Shape::TokenBucket(*bucket, *max_keys),
    }
}

fn new_state(params: &LimitParams) -> State {
    match params {
        LimitParams::Inflight { sketch, .. } => State::Inflight(InflightLimiter::new(*sketch)),
        LimitParams::Rate { rate, sketch } => State::Rate(RateLimiter::new(*rate, *sketch)),
        LimitParams::TokenBucket {
            bucket, max_keys, ..
        } => State::TokenBucket(TokenBucket::new(*bucket, *max_keys)),
    }
}

/// One variant of a limit: its parameters, mode, state and the policy it advertises.
pub struct Variant {
    /// Resolved parameters.
    pub params: LimitParams,
    /// Enforce or shadow.
    pub mode: Mode,
    /// Shared, possibly inherited from the previous runtime.
    pub state: Arc<State>,
    /// `RateLimit-Policy` member, precomputed.
    pub policy_item: String,
    /// Human-readable policy for problem bodies.
    pub policy_text: String,
}

/// One limit of one origin.
pub struct LimitRt {
    /// Name (metrics label, policy name).
    pub name: String,
    /// Key parts.
    pub key: KeySpec,
    /// When to add RateLimit headers.
    pub headers: HeadersMode,
    /// `[base, override 0, override 1, ...]`.
    pub variants: Vec<Variant>,
    /// Matchers of overrides, aligned with `variants[1..]`.
    pub matchers: Vec<Vec<Matcher>>,
    /// Decision counters.
    pub counters: DecisionCounters,
}

impl LimitRt {
    /// The variant that applies: the first override whose matchers all match, else base.
    pub fn select<F: crate::limits::Facts + ?Sized>(&self, facts: &F) -> usize {
        self.matchers
            .iter()
            .position(|ms| ms.iter().all(|m| m.matches(facts)))
            .map_or(0, |i| i + 1)
    }
}

/// One origin, live.
pub struct OriginRt {
    /// Name (metrics label).
    pub name: String,
    /// Default customer.
    pub customer: Option<Box<[u8]>>,
    /// Round-robin picker over the upstreams.
    pub upstreams: LoadBalancer<RoundRobin>,
    /// TLS to upstreams.
    pub tls: bool,
    /// SNI for TLS upstreams.
    pub sni: String,
    /// Verify upstream certificates.
    pub tls_verify: bool,
    /// Upstream connect timeout.
    pub connect_timeout: std::time::Duration,
    /// Upstream read timeout: how long a response may stall.
    pub read_timeout: std::time::Duration,
    /// Rate and token-bucket limits, config order (run in `request_filter`).
    pub request_limits: Vec<LimitRt>,
    /// Inflight limits, config order (run in `upstream_peer`).
    pub inflight_limits: Vec<LimitRt>,
    /// `tollgate_inflight_requests{origin}`.
    pub inflight_gauge: prometheus::IntGauge,
    /// `tollgate_request_duration_seconds{origin}`.
    pub duration: prometheus::Histogram,
    /// `tollgate_requests_total{origin,code}`.
    pub requests: CodeCounters,
}

/// A whole live config.
pub struct Runtime {
    /// The config it was built from.
    pub config: Arc<Config>,
    /// Host → origin.
    pub router: Router,
    /// Origins, config order.
    pub origins: Vec<OriginRt>,
    /// `tollgate_requests_total` for hosts no origin serves.
    pub unmatched: CodeCounters,
    states: HashMap<StateId, Arc<State>>,
}

/// How a reload treated limiter state, for the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Carried {
    /// States reused from the previous runtime.
    pub kept: usize,
    /// States created fresh.
    pub fresh: usize,
    /// Previous states no longer used.
    pub dropped: usize,
}

/// Why a runtime could not be built from a valid config.
#[derive(Debug, thiserror::Error)]
#[error("origin `{origin}`: cannot set up upstreams: {source}")]
pub struct BuildError {
    origin: String,
    source: std::io::Error,
}

impl Runtime {
    /// Builds the runtime for `config`, reusing state from `previous` where the identity
    /// is unchanged.
    pub fn build(
        config: Arc<Config>,
        previous: Option<&Runtime>,
        metrics: &Metrics,
    ) -> Result<(Runtime, Carried), BuildError> {
        let mut states = HashMap::new();
        let mut carried = Carried::default();
        let mut origins = Vec::with_capacity(config.origins.len());
        for origin in &config.origins {
            let upstreams = LoadBalancer::try_from_iter(origin.upstreams.iter().copied()).map_err(
                |source| BuildError {
                    origin: origin.name.clone(),
                    source,
                },
            )?;
            let mut request_limits = Vec::new();
            let mut inflight_limits = Vec::new();
            for limit in &origin.limits {
                let mut variants = Vec::with_capacity(limit.overrides.len() + 1);
                let bases = std::iter::once((None, &limit.params, limit.mode));
                let overrides = limit
                    .overrides
                    .iter()
                    .map(|o| (Some(o.matchers.clone()), &o.params, o.mode));
                for (matchers, params, mode) in bases.chain(overrides) {
                    let id = StateId {
                        origin: origin.name.clone(),
                        limit: limit.name.clone(),
                        matchers,
                        key: limit.key.clone(),
                        shape: shape(params),
                    };
                    let state = match previous.and_then(|p| p.states.get(&id)) {
                        Some(state) => {
                            carried.kept += 1;
                            state.clone()
                        }
                        None => {
                            carried.fresh += 1;
                            Arc::new(new_state(params))
                        }
                    };
                    states.insert(id, state.clone());
                    let (policy_item, policy_text) = policy(&limit.name, params);
                    variants.push(Variant {
                        params: params.clone(),
                        mode,
                        state,
                        policy_item,
                        policy_text,
                    });
                }
                let rt = LimitRt {
                    name: limit.name.clone(),
                    key: limit.key.clone(),
                    headers: limit.headers,
                    variants,
                    matchers: limit.overrides.iter().map(|o| o.matchers.clone()).collect(),
                    counters: metrics.decisions(&origin.name, &limit.name, limit.params.kind()),
                };
                match limit.params {
                    LimitParams::Inflight { .. } => inflight_limits.push(rt),
                    _ => request_limits.push(rt),
                }
            }
            origins.push(OriginRt {
                name: origin.name.clone(),
                customer: origin.customer.as_ref().map(|c| c.as_bytes().into()),
                upstreams,
                tls: origin.tls,
                sni: origin
                    .sni
                    .clone()
                    .or_else(|| {
                        origin
                            .hosts
                            .first()
                            .map(|h| h.trim_start_matches("*.").to_string())
                    })
                    .unwrap_or_default(),
                tls_verify: origin.tls_verify,
                connect_timeout: origin.connect_timeout,
                read_timeout: origin.read_timeout,
                request_limits,
                inflight_limits,
                inflight_gauge: metrics.inflight(&origin.name),
                duration: metrics
                    .request_duration_seconds
                    .with_label_values(&[origin.name.as_str()]),
                requests: CodeCounters::new(metrics, &origin.name),
            });
        }
        if let Some(p) = previous {
            carried.dropped = p.states.keys().filter(|k| !states.contains_key(*k)).count();
        }
        let router = Router::new(
            config
                .origins
                .iter()
                .enumerate()
                .map(|(i, o)| (i, o.hosts.as_slice())),
        );
        Ok((
            Runtime {
                config,
                router,
                origins,
                unmatched: CodeCounters::new(metrics, UNMATCHED_ORIGIN),
                states,
            },
            carried,
        ))
    }
}

/// The `RateLimit-Policy` member and a sentence for problem bodies.
fn policy(name: &str, params: &LimitParams) -> (String, String) {
    match params {
        LimitParams::Inflight { max, .. } => (
            policy_item(name, *max, None),
            format!("{max} requests in flight"),
        ),
        LimitParams::Rate { rate, .. } => (
            policy_item(name, rate.max, Some(ceil_secs(rate.per))),
            format!(
                "{} requests per {}",
                rate.max,
                humantime::format_duration(std::time::Duration::from_nanos(rate.per))
            ),
        ),
        LimitParams::TokenBucket { bucket, .. } => {
            let refills = bucket.capacity.div_ceil(bucket.amount.max(1));
            let window = refills.saturating_mul(bucket.every);
            (
                policy_item(name, bucket.capacity, Some(ceil_secs(window))),
                format!(
                    "a burst of {} tokens, refilled by {} every {}",
                    bucket.capacity,
                    bucket.amount,
                    humantime::format_duration(std::time::Duration::from_nanos(bucket.every))
                ),
            )
        }
    }
}
