//! Envoy's rate limit service, live: the domains of `rls.config_dir` as match trees whose
//! rules are [`LimitRt`]s, built like the limiter API's resources (same
//! [`LimitRt::build`], stores, reload identity under the origin
//! [`RLS_ORIGIN`](crate::config::rls::RLS_ORIGIN)), and the decision for one request.
//!
//! **Matching** follows envoyproxy/ratelimit: a descriptor's entries are walked down the
//! domain's tree one level each; at each level the entry matches the child with its key
//! and exact value first, then the first wildcard value (`*` matches any run of bytes) of
//! its key in file order, then the child with its key and no value; nothing matching ends
//! the walk without a rule. A rule applies only when it sits at the level of the
//! descriptor's last entry (a descriptor with more entries than the tree is deep matches
//! nothing). Then every rule named in a matched rule's `replaces` is dropped from the
//! request, and `unlimited` rules answer OK without counting.
//!
//! **Keys.** A rule counts per distinct descriptor: the key is the hash of every entry's
//! key and value (length-prefixed), a `share_threshold` wildcard entry contributing its
//! pattern instead of its value, so that all values it matches share one count.
//!
//! **Decisions** are [`Limiter::grant`] of exactly `hits_addend` units (a request's own,
//! a descriptor's own if it sets one, 1 when 0): local limits decide in place, limits in a
//! shared store make one script call within the store's budget and fall back past it.

use std::collections::HashMap;

use prometheus::IntCounter;

use crate::config::rls::RLS_ORIGIN;
use crate::config::{Config, RlsDescriptor};
use crate::limits::{Fact, Facts, KeyPart, Nanos};
use crate::metrics::Metrics;
use crate::runtime::limit::{Building, LimitRt, StateId};
use crate::runtime::limiter::{Limiter, LimiterError};
use crate::runtime::stores::Stores;
use crate::runtime::Carried;
use crate::store::{stable_key_hash, Source};

/// The domain label of requests for a domain no file defines.
pub const UNKNOWN_DOMAIN: &str = "_unknown";

/// Share of a limit past which an admitted hit counts as `near_limit` (envoyproxy/
/// ratelimit's default `NEAR_LIMIT_RATIO`), in percent.
const NEAR_LIMIT_PERCENT: u64 = 80;

/// A descriptor's key bytes, as the facts a rule's limit reads (its `customer` part).
struct Descriptor<'a>(&'a [u8]);

impl Facts for Descriptor<'_> {
    fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
        match part {
            KeyPart::Customer => Some(Fact::Bytes(self.0)),
            _ => None,
        }
    }
}

/// `tollgate_rls_hits_total`'s counters of one rule.
struct Hits {
    within: IntCounter,
    near: IntCounter,
    over: IntCounter,
    shadow: IntCounter,
}

impl Hits {
    fn new(metrics: &Metrics, domain: &str, path: &str) -> Self {
        let c = |result: &str| {
            metrics
                .rls_hits_total
                .with_label_values(&[domain, path, result])
        };
        Self {
            within: c("within_limit"),
            near: c("near_limit"),
            over: c("over_limit"),
            shadow: c("shadow_mode"),
        }
    }
}

/// A rule, live.
pub struct RuleRt {
    /// `DOMAIN.KEY_VALUE...`.
    pub path: String,
    /// `rate_limit.name`.
    pub name: Option<String>,
    /// `rate_limit.replaces`.
    pub replaces: Vec<String>,
    /// The limit and Envoy's view of it; `None` for `unlimited`.
    pub limit: Option<RuleLimit>,
    /// `shadow_mode`.
    pub shadow: bool,
    hits: Hits,
}

/// A limited rule's limit.
pub struct RuleLimit {
    /// The tollgate limit enforcing it.
    pub rt: LimitRt,
    /// Envoy's unit enum value (1 second .. 4 day).
    pub unit: i32,
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
}

/// One level of a domain's tree.
#[derive(Default)]
struct Level {
    /// key → value → node.
    exact: HashMap<String, HashMap<String, usize>>,
    /// `(key, pattern parts split at '*', pattern, share_threshold, node)`, file order.
    wild: Vec<(String, Vec<String>, String, bool, usize)>,
    /// key → node (no value).
    any: HashMap<String, usize>,
}

struct Node {
    rule: Option<RuleRt>,
    children: Level,
}

/// One domain, live.
pub struct DomainRt {
    nodes: Vec<Node>,
    root: Level,
    /// `tollgate_rls_requests_total{domain, code="ok"}`.
    pub ok: IntCounter,
    /// `tollgate_rls_requests_total{domain, code="over_limit"}`.
    pub over: IntCounter,
}

/// A descriptor's match: the rule and the key bytes it counts under.
pub struct Matched<'a> {
    /// The rule.
    pub rule: &'a RuleRt,
    /// The key's bytes (entries length-prefixed; shared wildcards as their pattern).
    pub key: Vec<u8>,
}

impl DomainRt {
    /// The rule `entries` (key, value pairs) match, if any (module doc).
    pub fn find<'a>(&'a self, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
        let mut level = &self.root;
        let mut key = Vec::new();
        let last = entries.len().checked_sub(1)?;
        for (i, (k, v)) in entries.iter().enumerate() {
            let exact = level.exact.get(*k).and_then(|m| m.get(*v)).copied();
            let (node, shared) = match exact {
                Some(n) => (Some(n), None),
                None => match level
                    .wild
                    .iter()
                    .find(|(wk, parts, ..)| wk == k && wildcard_match(parts, v))
                {
                    Some((_, _, pattern, share, n)) => {
                        (Some(*n), share.then_some(pattern.as_str()))
                    }
                    None => (level.any.get(*k).copied(), None),
                },
            };
            let node = self.nodes.get(node?)?;
            push_part(&mut key, k.as_bytes());
            push_part(&mut key, shared.unwrap_or(v).as_bytes());
            if i == last {
                return node.rule.as_ref().map(|rule| Matched { rule, key });
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

impl Level {
    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wild.is_empty() && self.any.is_empty()
    }
}

fn push_part(key: &mut Vec<u8>, part: &[u8]) {
    key.extend_from_slice(&(part.len() as u32).to_le_bytes());
    key.extend_from_slice(part);
}

/// Whether `value` matches the pattern split at each `*` into `parts`: it starts with the
/// first part, ends with the last, and holds the middle ones in order between them.
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return value == first;
    }
    if value.len() < first.len() + last.len()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid.as_str()) {
            Some(at) => rest = &rest[at + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Every domain of the config, live.
#[derive(Default)]
pub struct RlsRt {
    domains: HashMap<String, DomainRt>,
    /// `tollgate_rls_requests_total{domain="_unknown"}` by code.
    pub unknown: Option<DomainCounters>,
    /// `tollgate_rls_requests_total{domain="_unknown", code="invalid"}`.
    pub invalid: Option<IntCounter>,
}

/// The request counters of requests for unknown domains.
pub struct DomainCounters {
    /// `code="ok"`.
    pub ok: IntCounter,
}

impl RlsRt {
    /// The domain called `name`.
    pub fn domain(&self, name: &str) -> Option<&DomainRt> {
        self.domains.get(name)
    }

    /// Every rule's limit identity with its limiter, for the next reload to look up.
    pub fn states(&self) -> impl Iterator<Item = (StateId, &Limiter)> {
        self.domains
            .values()
            .flat_map(|d| d.nodes.iter())
            .filter_map(|n| n.rule.as_ref()?.limit.as_ref())
            .flat_map(|l| l.rt.states(RLS_ORIGIN))
    }

    /// Builds `config`'s domains, reusing `previous` states of the same identity and shape.
    pub(crate) fn build(
        config: &Config,
        previous: &HashMap<StateId, &Limiter>,
        stores: &Stores,
        metrics: &Metrics,
        carried: &mut Carried,
    ) -> Result<Self, (String, LimiterError)> {
        let segments = HashMap::new();
        let tops = HashMap::new();
        let at = Building {
            origin: RLS_ORIGIN,
            previous,
            segments: &segments,
            stores,
            tops: &tops,
            servers: &[],
        };
        let mut out = RlsRt::default();
        for domain in &config.rls.domains {
            let mut nodes = Vec::new();
            let root = level(
                &at,
                &domain.name,
                &domain.descriptors,
                &mut nodes,
                metrics,
                carried,
            )?;
            let c = |code: &str| {
                metrics
                    .rls_requests_total
                    .with_label_values(&[domain.name.as_str(), code])
            };
            out.domains.insert(
                domain.name.clone(),
                DomainRt {
                    nodes,
                    root,
                    ok: c("ok"),
                    over: c("over_limit"),
                },
            );
        }
        if config.server.rls.is_some() {
            let c = |code: &str| {
                metrics
                    .rls_requests_total
                    .with_label_values(&[UNKNOWN_DOMAIN, code])
            };
            out.unknown = Some(DomainCounters { ok: c("ok") });
            out.invalid = Some(c("invalid"));
        }
        Ok(out)
    }
}

fn level(
    at: &Building<'_, '_>,
    domain: &str,
    descriptors: &[RlsDescriptor],
    nodes: &mut Vec<Node>,
    metrics: &Metrics,
    carried: &mut Carried,
) -> Result<Level, (String, LimiterError)> {
    let mut out = Level::default();
    for d in descriptors {
        let rule = match &d.rule {
            Some(rule) => {
                let limit = match &rule.limit {
                    Some(l) => {
                        let counters = metrics.decisions(RLS_ORIGIN, &d.path, "rate");
                        let rt = LimitRt::build(at, &l.limit, 0, counters, carried)
                            .map_err(|e| (d.path.clone(), e))?;
                        Some(RuleLimit {
                            rt,
                            unit: l.unit as i32 + 1,
                            requests_per_unit: l.requests_per_unit,
                        })
                    }
                    None => None,
                };
                Some(RuleRt {
                    path: d.path.clone(),
                    name: rule.name.clone(),
                    replaces: rule.replaces.clone(),
                    limit,
                    shadow: d.shadow_mode,
                    hits: Hits::new(metrics, domain, &d.path),
                })
            }
            None => None,
        };
        let children = level(at, domain, &d.descriptors, nodes, metrics, carried)?;
        let index = nodes.len();
        nodes.push(Node { rule, children });
        match &d.value {
            Some(v) if v.contains('*') => {
                let parts = v.split('*').map(str::to_string).collect();
                out.wild
                    .push((d.key.clone(), parts, v.clone(), d.share_threshold, index));
            }
            Some(v) => {
                out.exact
                    .entry(d.key.clone())
                    .or_default()
                    .insert(v.clone(), index);
            }
            None => {
                out.any.insert(d.key.clone(), index);
            }
        }
    }
    Ok(out)
}

/// One descriptor's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// No rule matched (or it was replaced): OK, no limit.
    NoRule,
    /// An `unlimited` rule: OK, `limit_remaining` is `u32::MAX`.
    Unlimited,
    /// A limited rule decided.
    Limited {
        /// Over the limit and enforced.
        over: bool,
        /// Units left.
        remaining: u64,
        /// Nanoseconds until the window is empty again.
        reset_after: Nanos,
        /// Envoy's unit.
        unit: i32,
        /// `requests_per_unit`.
        requests_per_unit: u32,
    },
}

impl RuleRt {
    /// Decides `hits` units for `key` at `now`. `kill`: the kill switch is on (an
    /// over-limit answer becomes OK and is counted as shadow).
    pub async fn decide(&self, key: &[u8], hits: u64, now: Nanos, kill: bool) -> Status {
        let Some(limit) = &self.limit else {
            return Status::Unlimited;
        };
        let rt = &limit.rt;
        let facts = Descriptor(key);
        let hashed = if rt.shared {
            stable_key_hash(&rt.key, &facts)
        } else {
            rt.key.hash(&facts)
        };
        let Some(hashed) = hashed else {
            return Status::NoRule;
        };
        let limiter = &rt.variants[0].limiter;
        let granted = match limiter.grant(hashed, hits, hits, now, None).await {
            Ok(g) => g,
            // Never: a rule is a `rate` limit.
            Err(_) => return Status::NoRule,
        };
        if granted.source == Some(Source::Fallback) {
            log::debug!("rls rule `{}` decided by its store's fallback", self.path);
        }
        let verdict = granted.grant.verdict;
        if let Some(top) = &rt.top {
            top.record(hashed, !verdict.allowed, now, || {
                String::from_utf8_lossy(key).into_owned()
            });
        }
        let max = u64::from(limit.requests_per_unit);
        let over = !verdict.allowed;
        let shadowed = over && (self.shadow || kill);
        if !over {
            rt.counters.allowed.inc();
            let used = max.saturating_sub(verdict.remaining);
            if used.saturating_mul(100) > max.saturating_mul(NEAR_LIMIT_PERCENT) {
                self.hits.near.inc_by(hits);
            } else {
                self.hits.within.inc_by(hits);
            }
        } else if shadowed {
            rt.counters.shadow_rejected.inc();
            self.hits.shadow.inc_by(hits);
        } else {
            rt.counters.rejected.inc();
            self.hits.over.inc_by(hits);
        }
        Status::Limited {
            over: over && !shadowed,
            remaining: verdict.remaining,
            reset_after: verdict.reset_after,
            unit: limit.unit,
            requests_per_unit: limit.requests_per_unit,
        }
    }
}
