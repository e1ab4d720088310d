//! What `max: auto` inflight limits learned about each upstream server, and the proxy's
//! hook that feeds it.
//!
//! Each `max: auto` limit (each of its variants) holds one [`Learned`]: one
//! [`Adaptive`] estimator per upstream server IP of its origin, fixed when the runtime is
//! built, so the state is bounded by the upstream list. A reload carries each server's
//! estimator over when the server is still listed; servers that left the list are
//! forgotten with the old runtime. Servers listed on several ports of one IP are one
//! server, as the `server_ip` key part sees them.
//!
//! **What counts** (see `docs/adaptive.md`). The proxy records one [`Sample`] per upstream
//! attempt: the time from picking the server to the end of the upstream response's
//! headers (not the body, so a slow client never reads as a slow server); a connection
//! that fails or times out, a 5xx, and an attempt that is retried count as congestion.
//! Requests that tollgate rejects never reach a server and count not at all; an attempt
//! that ends for a downstream reason (the client left) is dropped without a sample.
//!
//! **A key's max** is the learned limit of the server the request goes to times `share`
//! when the key names the server (`server_ip` or `server_addr`), else the origin's learned
//! total (the sum over its servers) times `share`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGaugeVec, Opts};

use crate::config::model::AutoMax;
use crate::limits::{Adaptive, AdaptiveState, Fact, Facts, KeyPart, KeySpec, Nanos, Sample};
use crate::runtime::limit::LimitRt;
use crate::runtime::limiter::Limiter;
use crate::runtime::{OriginRt, Runtime};

/// One `max: auto` limit's learned servers.
pub struct Learned {
    auto: AutoMax,
    /// Whether the limit's key names the server (else keys use the origin's total).
    per_server: bool,
    servers: Box<[(IpAddr, Adaptive)]>,
}

/// What a [`Learned`] needs when its limit is built: the origin's servers and the limit's
/// key.
#[derive(Clone, Copy)]
pub struct LearnCtx<'a> {
    /// The origin's resolved upstream servers.
    pub servers: &'a [SocketAddr],
    /// The limit's key.
    pub key: &'a KeySpec,
}

impl Learned {
    /// The state for `auto` over `ctx.servers`, continuing `previous`'s estimator for each
    /// server that `previous` knew.
    pub fn new(auto: AutoMax, ctx: LearnCtx<'_>, previous: Option<&Learned>) -> Learned {
        let mut servers: Vec<(IpAddr, Adaptive)> = Vec::with_capacity(ctx.servers.len());
        for addr in ctx.servers {
            let ip = addr.ip();
            if servers.iter().any(|(known, _)| *known == ip) {
                continue;
            }
            let kept = previous.and_then(|p| p.server(ip));
            let est = match kept {
                Some(old) => Adaptive::carried(old, auto.bounds, 0),
                None => Adaptive::new(auto.bounds, 0),
            };
            servers.push((ip, est));
        }
        let per_server = ctx
            .key
            .parts()
            .iter()
            .any(|p| matches!(p, KeyPart::ServerIp | KeyPart::ServerAddr));
        Learned {
            auto,
            per_server,
            servers: servers.into_boxed_slice(),
        }
    }

    fn server(&self, ip: IpAddr) -> Option<&Adaptive> {
        self.servers
            .iter()
            .find(|(known, _)| *known == ip)
            .map(|(_, est)| est)
    }

    /// The max for a request to `server`: its server's learned limit (or, for keys without
    /// the server, the origin's total) times `share`. One relaxed load per server read; no
    /// allocation, no lock.
    pub fn max_for(&self, server: Option<IpAddr>) -> u64 {
        let learned = match (self.per_server, server.and_then(|ip| self.server(ip))) {
            (true, Some(est)) => est.limit(),
            _ => self
                .servers
                .iter()
                .map(|(_, est)| est.limit())
                .fold(0u64, u64::saturating_add),
        };
        self.auto.share_of(learned.max(1))
    }

    /// [`Self::max_for`] from one snapshot of the servers' states: the admin API's view,
    /// where the max shown and the limits listed beside it must agree (the estimators move
    /// every window, so reading them twice can disagree).
    pub fn max_in(&self, server: Option<IpAddr>, states: &[(IpAddr, AdaptiveState)]) -> u64 {
        let named = server.and_then(|ip| states.iter().find(|(s, _)| *s == ip));
        let learned = match (self.per_server, named) {
            (true, Some((_, st))) => st.limit,
            _ => (states.iter())
                .map(|(_, st)| st.limit)
                .fold(0u64, u64::saturating_add),
        };
        self.auto.share_of(learned.max(1))
    }

    /// Feeds one attempt's outcome to `server`'s estimator (unknown servers are ignored).
    pub fn record(&self, server: IpAddr, sample: Sample, now: Nanos) {
        if let Some(est) = self.server(server) {
            est.record(sample, now);
        }
    }

    /// `max: auto`'s bounds and share.
    pub fn auto(&self) -> AutoMax {
        self.auto
    }

    /// Every server's state, in upstream order.
    pub fn servers(&self) -> impl Iterator<Item = (IpAddr, AdaptiveState)> + '_ {
        self.servers.iter().map(|(ip, est)| (*ip, est.state()))
    }
}

/// The max an inflight limit applies to this request: `fixed`, or the learned one.
pub fn max_of<F: Facts + ?Sized>(fixed: u64, learned: Option<&Learned>, facts: &F) -> u64 {
    match learned {
        None => fixed,
        Some(l) => l.max_for(server_of(facts)),
    }
}

/// The upstream server a request's key names, if it names one.
pub fn server_of<F: Facts + ?Sized>(facts: &F) -> Option<IpAddr> {
    match facts.fact(&KeyPart::ServerIp) {
        Some(Fact::Ip(ip)) => Some(ip),
        _ => None,
    }
}

/// The learned state of `limit` (its first variant that learns), if it is `max: auto`.
pub fn of(limit: &LimitRt) -> Option<&Learned> {
    limit.variants.iter().find_map(|v| match &v.limiter {
        Limiter::Inflight(rt) => rt.learned.as_deref(),
        Limiter::Rate(_)
        | Limiter::TokenBucket(_)
        | Limiter::Tiered(_)
        | Limiter::Concurrency(_)
        | Limiter::SlidingLog(_) => None,
    })
}

/// Whether any of `origin`'s limits learns: only then does the proxy time its attempts.
pub fn learns(origin: &OriginRt) -> bool {
    origin.upstream_limits.iter().any(|l| of(l).is_some())
}

/// Feeds one upstream attempt's outcome to every `max: auto` limit of `origin`.
pub fn record(origin: &OriginRt, server: SocketAddr, sample: Sample, now: Nanos) {
    for limit in &origin.upstream_limits {
        for v in &limit.variants {
            if let Limiter::Inflight(rt) = &v.limiter {
                if let Some(learned) = &rt.learned {
                    learned.record(server.ip(), sample, now);
                }
            }
        }
    }
}

/// One upstream attempt being timed for the learned limits: the server and when it was
/// picked. Held in the request's context until the response's headers (or a failure).
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    /// The server picked.
    pub server: SocketAddr,
    /// When it was picked.
    pub start: Nanos,
}

impl Attempt {
    /// Records the attempt's response: a 5xx is congestion, anything else its latency.
    pub fn answered(self, origin: &OriginRt, status: u16, now: Nanos) {
        let sample = if status >= 500 {
            Sample::Congestion
        } else {
            Sample::Latency(now.saturating_sub(self.start))
        };
        record(origin, self.server, sample, now);
    }

    /// Records the attempt's failure (connect error, timeout, reset by the server).
    pub fn failed(self, origin: &OriginRt, now: Nanos) {
        record(origin, self.server, Sample::Congestion, now);
    }
}

/// Exports `tollgate_inflight_learned_max{origin,limit,server}` at each scrape: each
/// `max: auto` limit's learned limit per server (bounded by the upstream lists).
pub struct LearnedCollector {
    runtime: Arc<ArcSwap<Runtime>>,
    gauge: IntGaugeVec,
}

impl LearnedCollector {
    /// A collector over `runtime`, whichever config it holds at each scrape.
    pub fn new(runtime: Arc<ArcSwap<Runtime>>) -> Result<Self, prometheus::Error> {
        let gauge = IntGaugeVec::new(
            Opts::new(
                "tollgate_inflight_learned_max",
                "The concurrency a max: auto inflight limit learned for each upstream server (before share).",
            ),
            &["origin", "limit", "server"],
        )?;
        Ok(Self { runtime, gauge })
    }
}

impl Collector for LearnedCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let rt = self.runtime.load();
        self.gauge.reset();
        for origin in &rt.origins {
            for limit in &origin.upstream_limits {
                let Some(learned) = of(limit) else { continue };
                for (ip, state) in learned.servers() {
                    let server = ip.to_string();
                    let labels = [origin.name.as_str(), limit.name.as_str(), server.as_str()];
                    self.gauge
                        .with_label_values(&labels)
                        .set(i64::try_from(state.limit).unwrap_or(i64::MAX));
                }
            }
        }
        self.gauge.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::AdaptiveBounds;

    fn auto(share: u8) -> AutoMax {
        AutoMax {
            bounds: AdaptiveBounds {
                min: 1,
                max: 100,
                initial: 10,
            },
            share,
        }
    }

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    /// A `max: auto` limit with `share` over `servers`, keyed by `key`, after `previous`.
    fn learned_limit(
        share: u8,
        servers: &[SocketAddr],
        key: &KeySpec,
        previous: Option<&Learned>,
    ) -> Learned {
        Learned::new(auto(share), LearnCtx { servers, key }, previous)
    }

    #[test]
    fn one_estimator_per_server_ip_with_share_and_origin_total() {
        let servers = addrs(&["10.0.0.1:80", "10.0.0.1:81", "10.0.0.2:80"]);
        let per_server = KeySpec::new(vec![KeyPart::Customer, KeyPart::ServerIp]);
        let l = learned_limit(50, &servers, &per_server, None);
        assert_eq!(l.servers().count(), 2, "two ports of one IP are one server");
        assert_eq!(l.max_for(Some("10.0.0.1".parse().unwrap())), 5);
        let whole = KeySpec::new(vec![KeyPart::Customer]);
        let l = learned_limit(50, &servers, &whole, None);
        assert_eq!(
            l.max_for(Some("10.0.0.1".parse().unwrap())),
            10,
            "half of 10 + 10"
        );
    }

    #[test]
    fn a_reload_keeps_listed_servers_and_forgets_the_rest() {
        let key = KeySpec::new(vec![KeyPart::ServerIp]);
        let before = addrs(&["10.0.0.1:80", "10.0.0.2:80"]);
        let old = learned_limit(100, &before, &key, None);
        let ip1: IpAddr = "10.0.0.1".parse().unwrap();
        // Enough slow-then-fast samples for a few windows on server 1.
        let mut now = 1;
        for i in 0..400u64 {
            now += 1_000_000;
            let latency = if i < 200 { 10_000_000 } else { 1_000_000 };
            old.record(ip1, Sample::Latency(latency), now);
        }
        let learned = old.server(ip1).unwrap().state();
        assert_ne!(learned.long_secs, 0.0);
        let after = addrs(&["10.0.0.1:80", "10.0.0.3:80"]);
        let new = learned_limit(100, &after, &key, Some(&old));
        assert_eq!(new.server(ip1).unwrap().state(), learned);
        assert!(new.server("10.0.0.2".parse().unwrap()).is_none());
        assert_eq!(
            new.server("10.0.0.3".parse().unwrap())
                .unwrap()
                .state()
                .long_secs,
            0.0
        );
    }
}
