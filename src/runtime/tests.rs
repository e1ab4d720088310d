//! The runtime's decision loop, driven directly with an injected clock: counting what
//! finally happened, undoing on a later rejection, blocks, carry-over, and the collector.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus::core::Collector;

use crate::config::parse_str;
use crate::limits::{Clock, Fact, Facts, KeyPart, ManualClock, NEVER};
use crate::metrics::Metrics;
use crate::runtime::collector::RuntimeCollector;
use crate::runtime::decide::{self, Holds, Notes, Phase};
use crate::runtime::limiter::Limiter;
use crate::runtime::Runtime;

/// Runs a decision future to completion: local decisions never wait, so a current-thread
/// runtime is all a test needs.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}

/// One request as the limiters see it: a client IP, a customer and an upstream server.
struct Req {
    client: IpAddr,
    customer: &'static str,
    server: SocketAddr,
}

impl Facts for Req {
    fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
        match part {
            KeyPart::ClientIp => Some(Fact::Ip(self.client)),
            KeyPart::Customer => Some(Fact::Bytes(self.customer.as_bytes())),
            KeyPart::ServerIp => Some(Fact::Ip(self.server.ip())),
            KeyPart::Host => Some(Fact::Bytes(b"app.test")),
            _ => None,
        }
    }
}

fn req(customer: &'static str) -> Req {
    Req {
        client: "192.0.2.1".parse().unwrap(),
        customer,
        server: "127.0.0.1:9".parse().unwrap(),
    }
}

fn runtime(limits: &str, metrics: &Metrics) -> Runtime {
    let text = format!(
        "origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"127.0.0.1:9\"]\n    customer: acme\n    limits:\n{limits}"
    );
    let config = parse_str(&text, "t.yaml").unwrap().config;
    Runtime::build(Arc::new(config), None, metrics).unwrap().0
}

fn count(metrics: &Metrics, limit: &str, kind: &str, decision: &str) -> u64 {
    metrics
        .limit_decisions_total
        .with_label_values(&["app", limit, kind, decision])
        .get()
}

/// Both phases of one request, as the proxy runs them; `true` when it passed.
fn pass(rt: &Runtime, facts: &Req, now: u64, holds: &mut Holds) -> bool {
    let origin = &rt.origins[0];
    let mut notes = Notes::new();
    for phase in [Phase::Request, Phase::Upstream] {
        match block_on(decide::run(origin, phase, facts, now, holds, &mut notes)) {
            Ok(None) => {}
            _ => return false,
        }
    }
    decide::settle(origin, holds);
    true
}

#[test]
fn allowed_counts_only_requests_that_passed_every_limit() {
    let metrics = Metrics::new().unwrap();
    let rt = runtime(
        "      tokens: { kind: token_bucket, capacity: 5, refill: { amount: 1, every: 1h } }\n      conc: { kind: inflight, max: 1 }\n",
        &metrics,
    );
    let clock = ManualClock::new(0);
    let mut held = Holds::new();
    assert!(pass(&rt, &req("acme"), clock.now(), &mut held));
    // The inflight limit is full: the next two are admitted by `tokens`, then undone.
    for _ in 0..2 {
        clock.advance(Duration::from_millis(1));
        let mut holds = Holds::new();
        assert!(!pass(&rt, &req("acme"), clock.now(), &mut holds));
        assert!(holds.is_empty(), "a rejection leaves nothing held");
    }
    assert_eq!(count(&metrics, "tokens", "token_bucket", "allowed"), 1);
    assert_eq!(count(&metrics, "tokens", "token_bucket", "refunded"), 2);
    assert_eq!(count(&metrics, "conc", "inflight", "allowed"), 1);
    assert_eq!(count(&metrics, "conc", "inflight", "rejected"), 2);
    // The refunds gave the tokens back: 4 left for the first key.
    let Limiter::TokenBucket(tb) = &rt.origins[0].request_limits[0].variants[0].limiter else {
        panic!("tokens is a token bucket");
    };
    let key = rt.origins[0].request_limits[0]
        .key
        .hash(&req("acme"))
        .unwrap();
    assert_eq!(tb.state.local().unwrap().tokens(key, clock.now()), 4);
    // Releasing the held unit (the upstream is done) lets the next request through.
    drop(held);
    assert!(pass(&rt, &req("acme"), clock.now(), &mut Holds::new()));
    assert_eq!(count(&metrics, "tokens", "token_bucket", "allowed"), 2);
}

#[test]
fn a_block_never_invites_a_retry_and_other_keys_pass() {
    let metrics = Metrics::new().unwrap();
    let rt = runtime(
        "      tokens:\n        kind: token_bucket\n        key: [customer]\n        capacity: 5\n        refill: { amount: 1, every: 1s }\n        overrides:\n          - match: { customer: blocked }\n            capacity: 0\n      per_client:\n        kind: rate\n        max: 10\n        per: 1s\n        overrides:\n          - match: { customer: muted }\n            max: 0\n",
        &metrics,
    );
    let origin = &rt.origins[0];
    for (customer, limit) in [("blocked", "tokens"), ("muted", "per_client")] {
        let mut holds = Holds::new();
        let rejected = block_on(decide::run(
            origin,
            Phase::Request,
            &req(customer),
            0,
            &mut holds,
            &mut Notes::new(),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(rejected.verdict.retry_after, NEVER, "{customer}");
        assert_eq!(
            origin.request_limits[usize::from(rejected.limit)].name,
            limit
        );
    }
    assert!(pass(&rt, &req("acme"), 0, &mut Holds::new()));
}

#[test]
fn reload_keeps_unchanged_state_and_the_collector_follows_the_live_runtime() {
    let metrics = Metrics::new().unwrap();
    let limits = |max_keys: u64, capacity: u64| {
        format!(
            "      small: {{ kind: token_bucket, key: [client_ip], capacity: {capacity}, refill: {{ amount: 1, every: 1h }}, max_keys: {max_keys} }}\n"
        )
    };
    let first = runtime(&limits(8, 10), &metrics);
    let live = Arc::new(ArcSwap::from_pointee(first));
    let collector = RuntimeCollector::new(live.clone()).unwrap();
    let evictions = |c: &RuntimeCollector| -> u64 {
        c.collect()[0]
            .get_metric()
            .iter()
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    };
    // Nine clients spend a token each in a table of 8: one eviction.
    let spend = |rt: &Runtime| {
        for i in 1..=9u8 {
            let facts = Req {
                client: IpAddr::from([10, 0, 0, i]),
                ..req("acme")
            };
            assert!(pass(rt, &facts, 0, &mut Holds::new()));
        }
    };
    spend(&live.load());
    assert_eq!(evictions(&collector), 1);
    // Same shape: the table is carried over, and so is its count.
    let config = live.load().config.clone();
    let (same, carried) = Runtime::build(config, Some(&live.load()), &metrics).unwrap();
    assert_eq!((carried.kept, carried.fresh, carried.dropped), (1, 0, 0));
    live.store(Arc::new(same));
    assert_eq!(evictions(&collector), 1);
    // A new capacity is a new state: counted from 0, as Prometheus expects of a reset.
    let text = format!(
        "origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"127.0.0.1:9\"]\n    customer: acme\n    limits:\n{}",
        limits(8, 11)
    );
    let config = Arc::new(parse_str(&text, "t.yaml").unwrap().config);
    let (changed, carried) = Runtime::build(config, Some(&live.load()), &metrics).unwrap();
    assert_eq!((carried.kept, carried.fresh, carried.dropped), (0, 1, 1));
    live.store(Arc::new(changed));
    assert_eq!(evictions(&collector), 0);
    spend(&live.load());
    assert_eq!(evictions(&collector), 1);
}

/// A runtime with one origin and `resources` (YAML lines under `resources:`).
fn with_resources(resources: &str, metrics: &Metrics) -> Runtime {
    let text = format!(
        "origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"127.0.0.1:9\"]\nresources:\n{resources}"
    );
    let config = parse_str(&text, "t.yaml").unwrap().config;
    Runtime::build(Arc::new(config), None, metrics).unwrap().0
}

#[test]
fn resources_grant_the_largest_count_per_domain_and_carry_over_a_reload() {
    use crate::runtime::resources::Domain;
    let metrics = Metrics::new().unwrap();
    let lines = "  logins: { kind: token_bucket, capacity: 10, refill: { amount: 1, every: 1h } }\n  search:\n    kind: tiered\n    hard_limit: 4\n    tiers: [{ limit: 2, window: 1m, active: 10m, cooldown: 0s }, { limit: 5, window: 1m, active: 10m, cooldown: 0s }]\n  uploads:\n    kind: concurrency\n    max: 3\n    groups: [{ name: big, members: { customer: [bigco] }, max: 4 }]\n    overrides: [{ match: { customer: bigco }, max: 2 }]\n";
    let rt = with_resources(lines, &metrics);
    assert_eq!(rt.resources.len(), 3);
    assert!(rt.resources.get(b"nope").is_none());
    let logins = rt.resources.get(b"logins").unwrap();
    let (alice, bob) = (Domain(b"alice"), Domain(b"bob"));
    let grant = |domain: &Domain<'_>, min, want, now| {
        let (_, limiter) = logins.select(domain);
        block_on(limiter.grant(logins.key(domain).unwrap(), min, want, now, None)).unwrap()
    };
    // Domains have their own buckets: 10 each.
    assert_eq!(grant(&alice, 4, 7, 0).grant.granted, 7);
    assert_eq!(grant(&alice, 2, 7, 0).grant.granted, 3);
    assert!(!grant(&alice, 1, 1, 0).grant.verdict.allowed);
    assert_eq!(grant(&bob, 10, 10, 0).grant.granted, 10);
    // A tiered resource says which tier and limit decided: 2 in tier 1, then 2 of the 3
    // copies burst into tier 2 until the hard limit of 4 a second stops them.
    let search = rt.resources.get(b"search").unwrap();
    let (_, limiter) = search.select(&alice);
    let g = block_on(limiter.grant(search.key(&alice).unwrap(), 1, 5, 0, None)).unwrap();
    let d = g.tiered.unwrap();
    assert_eq!((g.grant.granted, d.tier), (4, 2));
    let g = block_on(limiter.grant(search.key(&alice).unwrap(), 1, 1, 0, None)).unwrap();
    assert_eq!(
        g.tiered.unwrap().decided_by,
        crate::limits::DecidedBy::HardLimit
    );
    // Concurrency resources are reserved, not requested; the override and group match
    // the domain.
    let uploads = rt.resources.get(b"uploads").unwrap();
    let big = Domain(b"bigco");
    let (variant, limiter) = uploads.select(&big);
    assert_eq!(variant, 1, "the override for bigco");
    assert!(!limiter.requestable());
    let Limiter::Concurrency(c) = limiter else {
        panic!("uploads is a concurrency limit");
    };
    assert_eq!((c.max, c.groups_of(&big), c.groups_of(&bob)), (2, 1, 0));
    // A reload with the same resources keeps their state; the API's origin is `_api`.
    let (again, carried) = Runtime::build(rt.config.clone(), Some(&rt), &metrics).unwrap();
    assert_eq!((carried.kept, carried.fresh, carried.dropped), (4, 0, 0));
    let logins = again.resources.get(b"logins").unwrap();
    let (_, limiter) = logins.select(&alice);
    let g = block_on(limiter.grant(logins.key(&alice).unwrap(), 1, 1, 0, None)).unwrap();
    assert!(!g.grant.verdict.allowed, "alice's bucket is still empty");
    assert_eq!(logins.limit.counters.allowed.get(), 0, "counted by the API");
    assert_eq!(
        metrics
            .limit_decisions_total
            .with_label_values(&["_api", "logins", "token_bucket", "allowed"])
            .get(),
        0
    );
    logins.limit.counters.allowed.inc();
    assert_eq!(
        metrics
            .limit_decisions_total
            .with_label_values(&["_api", "logins", "token_bucket", "allowed"])
            .get(),
        1
    );
}

#[test]
fn heavy_hitters_count_decisions_only_when_on_and_survive_a_reload() {
    let metrics = Metrics::new().unwrap();
    let limits = "      tb: {kind: token_bucket, key: [customer, host], capacity: 2, refill: {amount: 1, every: 1h}, top_keys: 3}\n      off: {kind: rate, key: [customer], max: 100, per: 1s}\n";
    let rt = runtime(limits, &metrics);
    let origin = &rt.origins[0];
    assert!(origin.request_limits[1].top.is_none(), "off by default");
    let mut holds = Holds::new();
    for _ in 0..3 {
        pass(&rt, &req("big"), 0, &mut holds);
    }
    pass(&rt, &req("small"), 0, &mut holds);
    let top = origin.request_limits[0].top.clone().unwrap();
    let admitted = top.top(crate::limits::Ranking::Admitted, 3, 0);
    assert_eq!(admitted[0].key, "customer=big&host=app.test");
    assert_eq!((admitted[0].admitted, admitted[0].rejected), (2, 1));
    let rejected = top.top(crate::limits::Ranking::Rejected, 3, 0);
    assert_eq!(rejected.len(), 1);
    // A reload with the same top_keys keeps the lists; another size starts afresh.
    let (again, _) = Runtime::build(rt.config.clone(), Some(&rt), &metrics).unwrap();
    assert!(Arc::ptr_eq(
        again.origins[0].request_limits[0].top.as_ref().unwrap(),
        &top
    ));
    let mut config = (*rt.config).clone();
    config.origins[0].limits[0].top_keys = Some(4);
    let (resized, _) = Runtime::build(Arc::new(config), Some(&rt), &metrics).unwrap();
    let fresh = resized.origins[0].request_limits[0].top.as_ref().unwrap();
    assert!(!Arc::ptr_eq(fresh, &top));
    assert_eq!(fresh.k(), 4);
}
