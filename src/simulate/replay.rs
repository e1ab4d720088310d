//! The replay engine: one config made live ([`Runtime`]) and fed log lines in virtual
//! time. Each line is routed as the proxy routes a request, then meets its origin's limits
//! through the proxy's own decision loop ([`decide::run`]), both phases, with `now` the
//! line's time; nothing reads the real clock and nothing touches the network.
//!
//! Before the runtime is built the config is made local ([`localize`]): limits on a shared
//! (Redis) store become in-process limits (one instance's view, said in the report's
//! notes), upstream names are not resolved (each stands for `240.0.0.N:port` in
//! `server_ip` / `server_addr` keys), and the limiter API's resources and the local store's
//! snapshot are dropped. Holding kinds (inflight, concurrency) keep what a request took
//! until its `request_time` has passed in virtual time, or release it at once when the line
//! has none.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::config::{Config, Upstream};
use crate::limits::{path, Clock, Fact, Facts, ManualClock, Nanos, Verdict, NANOS_PER_SEC, NEVER};
use crate::metrics::Metrics;
use crate::proxy::route::HostBuf;
use crate::runtime::decide::{self, Decided, Holds, Notes, Phase};
use crate::runtime::{OriginRt, Runtime};
use crate::simulate::line::{Line, LineFacts};
use crate::simulate::SimError;

/// Distinct rejected keys remembered per limit; rejections of further keys are counted as
/// `other_keys`.
pub const MAX_KEYS: usize = 65_536;

/// The `Retry-After` buckets, in whole seconds (upper bounds); beyond the last is `>3600`.
pub const RETRY_BOUNDS: [u64; 10] = [1, 2, 3, 4, 5, 10, 30, 60, 300, 3600];

/// The most requests in one second of virtual time (seconds aligned to the epoch).
#[derive(Debug, Default, Clone, Copy)]
pub struct Peak {
    second: u64,
    count: u64,
    /// The highest count.
    pub max: u64,
    /// The second (Unix time) it was reached first.
    pub at: u64,
}

impl Peak {
    fn hit(&mut self, now: Nanos) {
        let s = now / NANOS_PER_SEC;
        if s != self.second {
            self.second = s;
            self.count = 0;
        }
        self.count += 1;
        if self.count > self.max {
            self.max = self.count;
            self.at = s;
        }
    }
}

/// What the engine records of one limit's enforced rejections (its allowed, rejected,
/// shadow and skipped counts are the runtime's own decision counters).
#[derive(Debug, Default)]
pub struct LimitStats {
    /// Rejections per second of virtual time.
    pub peak: Peak,
    /// Rejections by key hash: count and the key written out.
    pub keys: HashMap<u64, (u64, String), ahash::RandomState>,
    /// Rejections of keys past [`MAX_KEYS`].
    pub other_keys: u64,
    /// Rejections by `Retry-After`: one count per [`RETRY_BOUNDS`] entry, then `>3600`,
    /// then none (a block: no retry can pass).
    pub retry_after: [u64; RETRY_BOUNDS.len() + 2],
}

/// What the engine records of one origin.
#[derive(Debug, Default)]
pub struct OriginStats {
    /// Lines routed to it.
    pub requests: u64,
    /// Requests per second of virtual time.
    pub peak: Peak,
    /// Requests refused for a bad cost header (400).
    pub bad_cost: u64,
    /// Per limit: request-phase limits, then upstream-phase ones (the runtime's order).
    pub limits: Vec<LimitStats>,
}

/// A request that still holds units of a holding kind until `end`.
struct Pending {
    end: Nanos,
    /// Never read: dropping it releases the units.
    _holds: Holds,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.end == other.end
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    /// Reversed: the heap's top is the earliest end.
    fn cmp(&self, other: &Self) -> Ordering {
        other.end.cmp(&self.end)
    }
}

/// Makes `config` runnable without a network; returns what the report should say about it.
pub fn localize(config: &mut Config) -> Vec<String> {
    let mut notes = Vec::new();
    for origin in config.origins.iter_mut().chain(config.unmatched.iter_mut()) {
        for limit in &mut origin.limits {
            if let Some(store) = limit.store.take() {
                notes.push(format!(
                    "origin `{}`, limit `{}`: on store `{store}`, simulated as a local limit \
                     (one instance's view, not the fleet's)",
                    origin.name, limit.name
                ));
            }
        }
        for (i, upstream) in origin.upstreams.iter_mut().enumerate() {
            if let Upstream::Name { port, .. } = upstream {
                let n = u8::try_from(i % 254 + 1).unwrap_or(1);
                *upstream = Upstream::Addr(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(240, 0, 0, n)),
                    *port,
                ));
            }
        }
    }
    config.resources.clear();
    config.api.store = None;
    config.stores.clear();
    config.local_store.snapshot = None;
    notes
}

/// One config, live, replaying lines.
pub struct Engine {
    /// The live config.
    pub rt: Runtime,
    /// The registry the runtime's counters live in (kept alive with them).
    _metrics: Metrics,
    /// The virtual clock: each line's time.
    clock: ManualClock,
    /// The origin of lines without a host: `--origin`, else the only origin.
    fallback: Option<usize>,
    /// Each origin's first host, the `host` of lines without one.
    first_hosts: Vec<Vec<u8>>,
    /// `server.customer_header`.
    customer_header: Option<String>,
    /// Per origin, runtime order.
    pub origins: Vec<OriginStats>,
    /// Lines whose host no origin serves (the proxy answers 404).
    pub unrouted: u64,
    /// Lines without a host and no origin to send them to.
    pub hostless: u64,
    /// What the report should say about the config (shared stores made local).
    pub notes: Vec<String>,
    /// Requests still holding units, earliest end on top.
    pending: BinaryHeap<Pending>,
    /// The previous line's raw host and where it routed (`None`: nowhere).
    last_raw: Vec<u8>,
    last_route: Option<(usize, HostBuf)>,
    /// For a decision that does not complete at once (none does on local state).
    tokio: tokio::runtime::Runtime,
}

impl Engine {
    /// Builds the engine for `config`. `origin` names the origin of lines without a host.
    pub fn new(mut config: Config, origin: Option<&str>) -> Result<Engine, SimError> {
        let notes = localize(&mut config);
        let metrics = Metrics::new().map_err(|e| SimError::Build(e.to_string()))?;
        let (rt, _) = Runtime::build(Arc::new(config), None, &metrics)
            .map_err(|e| SimError::Build(e.to_string()))?;
        let fallback = match origin {
            Some(name) => Some(rt.origins.iter().position(|o| o.name == name).ok_or_else(
                || SimError::NoSuchOrigin {
                    name: name.to_string(),
                    known: rt.origins.iter().map(|o| o.name.clone()).collect(),
                },
            )?),
            None => (rt.config.origins.len() == 1).then_some(0),
        };
        let first_hosts = rt
            .config
            .origins
            .iter()
            .chain(&rt.config.unmatched)
            .map(|o| {
                o.hosts
                    .first()
                    .map(|h| h.as_bytes().to_vec())
                    .unwrap_or_default()
            })
            .collect();
        let origins = rt
            .origins
            .iter()
            .map(|o| OriginStats {
                limits: o.all_limits().map(|_| LimitStats::default()).collect(),
                ..OriginStats::default()
            })
            .collect();
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| SimError::Build(e.to_string()))?;
        Ok(Engine {
            customer_header: rt.config.server.customer_header.clone(),
            rt,
            _metrics: metrics,
            clock: ManualClock::new(0),
            fallback,
            first_hosts,
            origins,
            unrouted: 0,
            hostless: 0,
            notes,
            pending: BinaryHeap::new(),
            last_raw: Vec::new(),
            last_route: None,
            tokio,
        })
    }

    /// Replays one line at `now` (its time, clamped so that time never goes backwards).
    pub fn feed(&mut self, line: &Line<'_>, host: Option<&[u8]>, now: Nanos) {
        self.clock.set(now);
        let now = self.clock.now();
        while self.pending.peek().is_some_and(|p| p.end <= now) {
            // Dropping the holds releases the units, as a finished request does.
            self.pending.pop();
        }
        let (index, host) = match host {
            Some(raw) => {
                // Logs repeat a few hosts: parse and route a host only when it changes.
                if raw != self.last_raw.as_slice() {
                    self.last_raw.clear();
                    self.last_raw.extend_from_slice(raw);
                    self.last_route = HostBuf::parse(raw)
                        .ok()
                        .and_then(|h| self.rt.route(h.as_str()).map(|i| (i, h)));
                }
                match &self.last_route {
                    Some((i, h)) => (*i, h.as_bytes()),
                    None => {
                        self.unrouted += 1;
                        return;
                    }
                }
            }
            None => match self.fallback {
                Some(i) => (i, self.first_hosts.get(i).map_or(&[][..], Vec::as_slice)),
                None => {
                    self.hostless += 1;
                    return;
                }
            },
        };
        let (Some(origin), Some(stats)) = (self.rt.origins.get(index), self.origins.get_mut(index))
        else {
            return;
        };
        stats.requests += 1;
        stats.peak.hit(now);
        let customer = line
            .customer
            .or_else(|| {
                self.customer_header
                    .as_deref()
                    .and_then(|name| line.header(name.as_bytes()))
            })
            .unwrap_or(&origin.customer);
        let server = if origin.upstream_limits.is_empty() {
            None
        } else {
            line.upstream.or_else(|| origin.upstreams.pick())
        };
        let facts = LineFacts {
            line,
            host,
            origin: &origin.name,
            customer,
            server,
            path: line.path.map(|p| {
                // One set of facts serves both phases.
                if origin.reads_path(Phase::Request) || origin.reads_path(Phase::Upstream) {
                    path::normalize(p)
                } else {
                    Cow::Borrowed(p)
                }
            }),
        };
        let mut holds = Holds::new();
        let mut notes = Notes::new();
        for phase in [Phase::Request, Phase::Upstream] {
            let decided = poll_now(
                &self.tokio,
                decide::run(origin, phase, &facts, now, &mut holds, &mut notes),
            );
            match decided {
                Ok(None) => {}
                Ok(Some(rejected)) => {
                    record(origin, stats, &rejected, &facts, now);
                    return;
                }
                Err(_) => {
                    stats.bad_cost += 1;
                    return;
                }
            }
        }
        decide::settle(origin, &mut holds);
        if !holds.is_empty() {
            if let Some(took) = line.duration.filter(|d| *d > 0) {
                self.pending.push(Pending {
                    end: now.saturating_add(took),
                    _holds: holds,
                });
            }
        }
    }
}

/// Runs a decision: local ones complete at the first poll; anything else is driven by a
/// current-thread runtime.
fn poll_now<F: Future>(tokio: &tokio::runtime::Runtime, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => tokio.block_on(fut),
    }
}

/// The `Retry-After` bucket of a rejection.
pub fn retry_bucket(verdict: &Verdict) -> usize {
    if verdict.retry_after == NEVER {
        return RETRY_BOUNDS.len() + 1;
    }
    let secs = verdict.retry_after.div_ceil(NANOS_PER_SEC).max(1);
    RETRY_BOUNDS
        .iter()
        .position(|&b| secs <= b)
        .unwrap_or(RETRY_BOUNDS.len())
}

/// Records an enforced rejection: its second, its key, its `Retry-After`.
fn record(
    origin: &OriginRt,
    stats: &mut OriginStats,
    rejected: &Decided,
    facts: &LineFacts<'_, '_>,
    now: Nanos,
) {
    let index = match rejected.phase {
        Phase::Request => usize::from(rejected.limit),
        Phase::Upstream => origin.request_limits.len() + usize::from(rejected.limit),
    };
    let (Some(limit), Some(ls)) = (
        decide::limit_of(origin, rejected.phase, rejected.limit),
        stats.limits.get_mut(index),
    ) else {
        return;
    };
    ls.peak.hit(now);
    if let Some(slot) = ls.retry_after.get_mut(retry_bucket(&rejected.verdict)) {
        *slot += 1;
    }
    let hash = limit.key.hash(facts).unwrap_or(0);
    let len = ls.keys.len();
    match ls.keys.get_mut(&hash) {
        Some((count, _)) => *count += 1,
        None if len < MAX_KEYS => {
            ls.keys.insert(hash, (1, key_text(&limit.key, facts)));
        }
        None => ls.other_keys += 1,
    }
}

/// A key written out for people: `client_ip=203.0.113.7 path=/api`, each value cut at 120
/// bytes.
pub fn key_text<F: Facts + ?Sized>(key: &crate::limits::KeySpec, facts: &F) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for part in key.parts() {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{part}=");
        match facts.fact(part) {
            Some(Fact::Bytes(b)) => {
                out.push_str(&String::from_utf8_lossy(&b[..b.len().min(120)]));
            }
            Some(Fact::Ip(ip)) => {
                let _ = write!(out, "{ip}");
            }
            Some(Fact::Addr(addr)) => {
                let _ = write!(out, "{addr}");
            }
            None => out.push('-'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_buckets() {
        let v = |ns: u64| Verdict {
            allowed: false,
            remaining: 0,
            reset_after: 0,
            retry_after: ns,
        };
        assert_eq!(retry_bucket(&v(1)), 0);
        assert_eq!(retry_bucket(&v(NANOS_PER_SEC)), 0);
        assert_eq!(retry_bucket(&v(NANOS_PER_SEC + 1)), 1);
        assert_eq!(retry_bucket(&v(7 * NANOS_PER_SEC)), 5);
        assert_eq!(retry_bucket(&v(7200 * NANOS_PER_SEC)), 10);
        assert_eq!(retry_bucket(&v(NEVER)), 11);
    }

    #[test]
    fn peaks_count_per_second() {
        let mut p = Peak::default();
        for t in [
            0,
            1,
            2,
            NANOS_PER_SEC,
            3 * NANOS_PER_SEC,
            3 * NANOS_PER_SEC + 5,
        ] {
            p.hit(t);
        }
        assert_eq!((p.max, p.at), (3, 0));
    }
}
