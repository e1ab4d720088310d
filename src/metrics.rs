//! The Prometheus registry and tollgate's metric families.
//!
//! tollgate serves its **own** registry (not the global default one) on `server.metrics`,
//! so it never depends on which `prometheus` version Pingora links. Names and labels are
//! interface (docs/operating.md's metrics table); labels are bounded: origin and limit names from the
//! config, status codes, never keys or addresses. Per-limit and per-origin handles are
//! resolved once when a config is loaded, so the hot path only does atomic adds.

use std::sync::OnceLock;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The origin label used for requests whose host matched no origin.
pub const UNMATCHED_ORIGIN: &str = "_unmatched";

/// The one family every per-key table's evictions are counted in,
/// `tollgate_limit_evictions_total{origin,limit,kind}`: the runtime's limits
/// (`crate::runtime::collector`) and the limiter API's ad-hoc buckets (`origin="_api"`,
/// `kind="adhoc_bucket"`) alike, so one alert rule and one dashboard panel cover both.
pub const LIMIT_EVICTIONS: &str = "tollgate_limit_evictions_total";
/// The help text of [`LIMIT_EVICTIONS`]: both writers give this one
/// ([`Families::limit_evictions`]).
const LIMIT_EVICTIONS_HELP: &str = "Keys evicted while their state was live because the limit's table was full; each starts again as new, which only ever admits more (raise max_keys, or a key flood is under way).";
/// The labels of [`LIMIT_EVICTIONS`].
const LIMIT_EVICTIONS_LABELS: [&str; 3] = ["origin", "limit", "kind"];

/// Every metric family tollgate exports, registered in one private registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `tollgate_requests_total{origin,code}`: responses sent, by status.
    pub requests_total: IntCounterVec,
    /// `tollgate_limit_decisions_total{origin,limit,kind,decision}`.
    pub limit_decisions_total: IntCounterVec,
    /// `tollgate_inflight_requests{origin}`: exact count of requests admitted upstream and
    /// not yet finished. Back at 0 whenever traffic stops, which proves nothing leaks.
    pub inflight_requests: IntGaugeVec,
    /// `tollgate_request_duration_seconds{origin}`.
    pub request_duration_seconds: HistogramVec,
    /// `tollgate_config_reloads_total{result}`.
    pub config_reloads_total: IntCounterVec,
    /// `tollgate_config_last_reload_success_timestamp_seconds`.
    pub config_last_reload_success: Gauge,
    /// `tollgate_connections_open`: downstream connections open now.
    pub connections_open: IntGauge,
    /// `tollgate_connections_limited_total{limit}`: connections that met a connection cap
    /// (`max_connections`: the accept waited for a slot; `max_connections_per_ip`: closed).
    pub connections_limited_total: IntCounterVec,
    /// `tollgate_connection_timeouts_total{timeout}`: connections closed by a timeout
    /// (`header`: the request header did not arrive in time; `keepalive`: idle too long).
    pub connection_timeouts_total: IntCounterVec,
    /// `tollgate_tls_handshakes_total{result,version}`: TLS handshakes on the proxy's
    /// listeners, by result (`success`, `failure`, `timeout`) and the version agreed
    /// (`1.2`, `1.3`; `none` when none was).
    pub tls_handshakes_total: IntCounterVec,
    /// `tollgate_acme_orders_total{host,result}`: ACME orders (`tls.acme`) by host and
    /// result (`success`, `failure`); a certificate another instance of the fleet ordered
    /// and this one took from the store counts as `shared`.
    pub acme_orders_total: IntCounterVec,
    /// `tollgate_h2_reset_closes_total`: HTTP/2 connections closed because they reset
    /// more streams than `server.h2_max_resets` allows (rapid reset).
    pub h2_reset_closes_total: IntCounter,
    /// `tollgate_proxy_protocol_total{result}`: PROXY protocol headers read on
    /// `proxy_protocol` listeners, by result (`trusted`: its address was used;
    /// `untrusted`: from a peer outside `trusted_proxies`, ignored; `invalid`: closed).
    pub proxy_protocol_total: IntCounterVec,
    /// `tollgate_api_commands_total{command,result}`: limiter API commands, by command
    /// (the known names, lower case, or `other`) and result (`ok`, `rejected` when a
    /// limiter said no, `error` for an error reply).
    pub api_commands_total: IntCounterVec,
    /// `tollgate_api_connections`: open limiter API connections.
    pub api_connections: IntGauge,
    /// `tollgate_api_holds{resource}`: copies held through the limiter API by open
    /// connections, exact, per configured resource (Charon's `CH.*` commands); back to 0
    /// when every holder has disconnected.
    pub api_holds: IntGaugeVec,
    /// `tollgate_rls_requests_total{domain,code}`: `ShouldRateLimit` answers by domain
    /// (configured domains, `_unknown` for the rest, so the label stays bounded) and
    /// overall code (`ok`, `over_limit`, `invalid`).
    pub rls_requests_total: IntCounterVec,
    /// `tollgate_rls_hits_total{domain,descriptor,result}`: hits (each request's
    /// `hits_addend`) per configured rule (its `DOMAIN.KEY_VALUE...` path, never a
    /// request's own values): `within_limit`, `near_limit` (past 80% of the limit, still
    /// admitted), `over_limit`, `shadow_mode` (over the limit, answered OK by
    /// `shadow_mode` or the kill switch).
    pub rls_hits_total: IntCounterVec,
    /// `tollgate_store_up{store}`: 1 while a shared store's breaker is closed (decisions
    /// go to it), 0 while it is open (decisions fall back).
    pub store_up: IntGaugeVec,
    /// `tollgate_store_requests_total{store,result}`, result `ok`, `timeout`, `error`,
    /// `key_error` (the store answered an error about one key's data: that key's failure,
    /// not the store's) or `breaker_open` (not sent: the breaker was open).
    pub store_requests_total: IntCounterVec,
    /// `tollgate_store_latency_seconds{store}`: time of the calls sent to the store,
    /// whatever their result (a timed-out call counts its budget).
    pub store_latency_seconds: HistogramVec,
    /// `tollgate_store_fallback_decisions_total{store}`: decisions made by the fallback
    /// because the store did not answer within its budget or its breaker was open.
    pub store_fallback_decisions_total: IntCounterVec,
    /// `tollgate_store_leased{store,origin,limit}`: quota this instance holds in lease
    /// slices and has not spent (tokens, counts, free slots): the bound on the
    /// under-admission leases can cause, summed over the fleet (`crate::limits::lease`).
    pub store_leased: IntGaugeVec,
    /// `tollgate_store_lease_calls_total{store,result}`: lease calls, by result
    /// (`granted`: the slice asked for; `partial`: less, the shared remainder was short;
    /// `empty`: none left, the key decides exactly; `returned`: unspent quota given back;
    /// `failed`: no answer, the key decides as the store's fallback says).
    pub store_lease_calls_total: IntCounterVec,
    /// `tollgate_access_log_dropped_total`: access log lines dropped because the buffer
    /// was full (the writer fell behind the disk) or a write failed.
    pub access_log_dropped_total: IntCounter,
}

/// Why the registry could not be built: a programming error (duplicate or invalid name),
/// reported instead of panicking.
#[derive(Debug, thiserror::Error)]
#[error("cannot register metric: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    /// Registers every family in a fresh registry.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let f = Families::new(&registry);
        let requests_total = f.counter_vec(
            "tollgate_requests_total",
            "Responses sent downstream, by origin and status code.",
            &["origin", "code"],
        )?;
        let limit_decisions_total = f.counter_vec(
            "tollgate_limit_decisions_total",
            "Limit decisions by origin, limit, kind and decision: allowed (the request passed every limit), refunded (admitted, then undone because a later limit rejected), rejected, shadow_rejected, skipped.",
            &["origin", "limit", "kind", "decision"],
        )?;
        let inflight_requests = f.gauge_vec(
            "tollgate_inflight_requests",
            "Requests admitted to an upstream and not yet finished, exact, by origin.",
            &["origin"],
        )?;
        let request_duration_seconds = f.histogram_vec(
            "tollgate_request_duration_seconds",
            "Time from request headers to the end of the response, by origin.",
            &["origin"],
            vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ],
        )?;
        let config_reloads_total = f.counter_vec(
            "tollgate_config_reloads_total",
            "Config reload attempts by result (success, failure).",
            &["result"],
        )?;
        let store_up = f.gauge_vec(
            "tollgate_store_up",
            "1 while the shared store answers (breaker closed), 0 while decisions fall back.",
            &["store"],
        )?;
        let store_requests_total = f.counter_vec(
            "tollgate_store_requests_total",
            "Calls to a shared store by result (ok, timeout, error, key_error, breaker_open).",
            &["store", "result"],
        )?;
        let store_latency_seconds = f.histogram_vec(
            "tollgate_store_latency_seconds",
            "Time of the calls sent to a shared store, from send to answer or timeout.",
            &["store"],
            vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
            ],
        )?;
        let store_fallback_decisions_total = f.counter_vec(
            "tollgate_store_fallback_decisions_total",
            "Decisions made by a shared store's fallback (local, allow or deny) instead of the store.",
            &["store"],
        )?;
        let config_last_reload_success = f.float_gauge(
            "tollgate_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful config load or reload.",
        )?;
        let connections_open = f.gauge(
            "tollgate_connections_open",
            "Downstream (client) connections open now.",
        )?;
        let connections_limited_total = f.counter_vec(
            "tollgate_connections_limited_total",
            "Connections that met a connection cap: max_connections (accepting waited for a slot), max_connections_per_ip (closed at once).",
            &["limit"],
        )?;
        let connection_timeouts_total = f.counter_vec(
            "tollgate_connection_timeouts_total",
            "Downstream connections closed by a timeout: header (the request header was not complete within header_timeout), keepalive (idle longer than keepalive_timeout).",
            &["timeout"],
        )?;
        let tls_handshakes_total = f.counter_vec(
            "tollgate_tls_handshakes_total",
            "TLS handshakes on the proxy's listeners by result (success, failure, timeout, acme_validation) and version agreed (1.2, 1.3, none).",
            &["result", "version"],
        )?;
        let h2_reset_closes_total = f.counter(
            "tollgate_h2_reset_closes_total",
            "HTTP/2 connections closed for resetting more streams than server.h2_max_resets allows (rapid reset).",
        )?;
        let proxy_protocol_total = f.counter_vec(
            "tollgate_proxy_protocol_total",
            "PROXY protocol headers read, by result: trusted (the address is used), untrusted (from a peer outside trusted_proxies, ignored), invalid (connection closed).",
            &["result"],
        )?;
        let acme_orders_total = f.counter_vec(
            "tollgate_acme_orders_total",
            "ACME certificate orders (tls.acme) by host and result: success, failure, shared (a certificate another instance ordered, taken from the store).",
            &["host", "result"],
        )?;
        let api_commands_total = f.counter_vec(
            "tollgate_api_commands_total",
            "Limiter API commands by command and result (ok, rejected, error).",
            &["command", "result"],
        )?;
        let api_connections =
            f.gauge("tollgate_api_connections", "Open limiter API connections.")?;
        let api_holds = f.gauge_vec(
            "tollgate_api_holds",
            "Copies of a resource held by open limiter API connections, exact.",
            &["resource"],
        )?;
        let rls_requests_total = f.counter_vec(
            "tollgate_rls_requests_total",
            "Envoy rate limit service ShouldRateLimit answers by domain (_unknown for unconfigured ones) and overall code (ok, over_limit, invalid).",
            &["domain", "code"],
        )?;
        let rls_hits_total = f.counter_vec(
            "tollgate_rls_hits_total",
            "Envoy rate limit service hits per configured rule (domain, descriptor path) by result: within_limit, near_limit (past 80%), over_limit, shadow_mode.",
            &["domain", "descriptor", "result"],
        )?;
        let store_leased = f.gauge_vec(
            "tollgate_store_leased",
            "Quota this instance holds in lease slices and has not spent, by store, origin and limit: summed over the fleet, the bound on the under-admission leases cause.",
            &["store", "origin", "limit"],
        )?;
        let store_lease_calls_total = f.counter_vec(
            "tollgate_store_lease_calls_total",
            "Lease calls to a shared store by result (granted, partial, empty, returned, failed).",
            &["store", "result"],
        )?;
        let access_log_dropped_total = f.counter(
            "tollgate_access_log_dropped_total",
            "Access log lines dropped: the buffer was full (the writer fell behind) or a write failed.",
        )?;
        // Every label value exists from the start, so `rate()` and alerts see a 0, not a gap.
        config_reloads_total.with_label_values(&["success"]);
        config_reloads_total.with_label_values(&["failure"]);
        for limit in ["max_connections", "max_connections_per_ip"] {
            connections_limited_total.with_label_values(&[limit]);
        }
        for timeout in ["header", "keepalive"] {
            connection_timeouts_total.with_label_values(&[timeout]);
        }
        Ok(Self {
            registry,
            requests_total,
            limit_decisions_total,
            inflight_requests,
            request_duration_seconds,
            config_reloads_total,
            config_last_reload_success,
            connections_open,
            connections_limited_total,
            connection_timeouts_total,
            tls_handshakes_total,
            acme_orders_total,
            h2_reset_closes_total,
            proxy_protocol_total,
            api_commands_total,
            api_connections,
            api_holds,
            rls_requests_total,
            rls_hits_total,
            store_up,
            store_requests_total,
            store_latency_seconds,
            store_fallback_decisions_total,
            store_leased,
            store_lease_calls_total,
            access_log_dropped_total,
        })
    }

    /// A [`Families`] that registers in this registry (a module's own families).
    pub fn families(&self) -> Families<'_> {
        Families::new(&self.registry)
    }

    /// Registers a collector read at each scrape (a limiter's own counters, such as the
    /// limiter API's bucket table). Fails if its names are already registered.
    pub fn register_collector(
        &self,
        collector: Box<dyn prometheus::core::Collector>,
    ) -> Result<(), MetricsError> {
        Ok(self.registry.register(collector)?)
    }

    /// The Prometheus text exposition of every family.
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(8192);
        // Encoding into a Vec cannot fail on I/O; a family error would be a bug, and an
        // empty scrape is better than a crash.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            log::error!("cannot encode metrics: {e}");
        }
        buf
    }

    /// The decision counters of one limit of one origin, resolved once.
    pub fn decisions(&self, origin: &str, limit: &str, kind: &str) -> DecisionCounters {
        let c = |d: &str| {
            self.limit_decisions_total
                .with_label_values(&[origin, limit, kind, d])
        };
        DecisionCounters {
            allowed: c("allowed"),
            refunded: c("refunded"),
            rejected: c("rejected"),
            shadow_rejected: c("shadow_rejected"),
            skipped: c("skipped"),
        }
    }

    /// The metric children of one shared store, resolved once: every family gets its
    /// series at once (every result at 0, so `rate()` and alerts see a 0, not a gap).
    pub fn store(&self, store: &str) -> StoreMetrics {
        let result = |r: &str| self.store_requests_total.with_label_values(&[store, r]);
        let lease = |r: &str| self.store_lease_calls_total.with_label_values(&[store, r]);
        StoreMetrics {
            up: self.store_up.with_label_values(&[store]),
            ok: result("ok"),
            timeout: result("timeout"),
            error: result("error"),
            key_error: result("key_error"),
            breaker_open: result("breaker_open"),
            latency: self.store_latency_seconds.with_label_values(&[store]),
            fallback: self
                .store_fallback_decisions_total
                .with_label_values(&[store]),
            leased: LeasedGauges {
                family: self.store_leased.clone(),
                store: store.to_string(),
            },
            lease_calls: LeaseCalls {
                granted: lease("granted"),
                partial: lease("partial"),
                empty: lease("empty"),
                returned: lease("returned"),
                failed: lease("failed"),
            },
        }
    }

    /// The `tollgate_store_leased` gauge of one limit in one store.
    pub fn leased(&self, store: &str, origin: &str, limit: &str) -> IntGauge {
        self.store_leased.with_label_values(&[store, origin, limit])
    }

    /// The inflight gauge of one origin.
    pub fn inflight(&self, origin: &str) -> IntGauge {
        self.inflight_requests.with_label_values(&[origin])
    }
}

/// What making a family returns: `prometheus`'s error is a bad name or label (a bug).
type Made<T> = Result<T, prometheus::Error>;

/// Creates metric families and registers each as it is made, so a family cannot be
/// created and forgotten (it would never be scraped), and `Opts` is spelled once.
/// `Families::unregistered` makes families a [`Collector`](prometheus::core::Collector)
/// reads and exports itself at scrape time.
pub struct Families<'a> {
    registry: Option<&'a Registry>,
}

impl<'a> Families<'a> {
    /// Families registered in `registry`.
    pub fn new(registry: &'a Registry) -> Self {
        Self {
            registry: Some(registry),
        }
    }

    /// Families registered nowhere: their owner is a collector that exports them itself.
    pub fn unregistered() -> Self {
        Self { registry: None }
    }

    fn registered<C: Collector + Clone + 'static>(&self, family: C) -> Made<C> {
        if let Some(registry) = self.registry {
            registry.register(Box::new(family.clone()))?;
        }
        Ok(family)
    }

    /// An `IntCounterVec` named `name` with `labels`.
    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> Made<IntCounterVec> {
        self.registered(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    /// The [`LIMIT_EVICTIONS`] family, with the help text and labels every writer of it
    /// gives.
    pub fn limit_evictions(&self) -> Made<IntCounterVec> {
        self.counter_vec(
            LIMIT_EVICTIONS,
            LIMIT_EVICTIONS_HELP,
            &LIMIT_EVICTIONS_LABELS,
        )
    }

    /// An `IntGaugeVec` named `name` with `labels`.
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> Made<IntGaugeVec> {
        self.registered(IntGaugeVec::new(Opts::new(name, help), labels)?)
    }

    /// A `HistogramVec` named `name` with `labels` and upper bounds `buckets`.
    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> Made<HistogramVec> {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.registered(HistogramVec::new(opts, labels)?)
    }

    /// An unlabelled `IntCounter`.
    pub fn counter(&self, name: &str, help: &str) -> Made<IntCounter> {
        self.registered(IntCounter::new(name, help)?)
    }

    /// An unlabelled `IntGauge`.
    pub fn gauge(&self, name: &str, help: &str) -> Made<IntGauge> {
        self.registered(IntGauge::new(name, help)?)
    }

    /// An unlabelled float `Gauge` (timestamps).
    pub fn float_gauge(&self, name: &str, help: &str) -> Made<Gauge> {
        self.registered(Gauge::new(name, help)?)
    }
}

/// Status codes are below 600; one slot each.
const CODE_SLOTS: usize = 600;

/// The `tollgate_requests_total` children of one origin, resolved once per status code.
///
/// Resolving a child through the family hashes the labels and takes the family's read
/// lock; per request that is a shared lock on the hot path. Here a request costs one
/// `OnceLock` load and one atomic add. 600 slots × 16 bytes ≈ 10 KiB per origin.
pub struct CodeCounters {
    family: IntCounterVec,
    origin: String,
    slots: Box<[OnceLock<IntCounter>]>,
}

impl CodeCounters {
    /// The counters of `origin` in `metrics`.
    pub fn new(metrics: &Metrics, origin: &str) -> Self {
        Self {
            family: metrics.requests_total.clone(),
            origin: origin.to_string(),
            slots: (0..CODE_SLOTS).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Counts one response with status `code` (0 when none was sent).
    pub fn inc(&self, code: u16) {
        let slot = self.slots.get(usize::from(code)).unwrap_or(&self.slots[0]);
        slot.get_or_init(|| {
            let label = if (100..CODE_SLOTS as u16).contains(&code) {
                code.to_string()
            } else {
                "000".to_string()
            };
            self.family
                .with_label_values(&[self.origin.as_str(), &label])
        })
        .inc();
    }
}

/// The metric children of one shared store (see [`Metrics::store`]): a call costs atomic
/// adds only, no label lookup.
#[derive(Clone)]
pub struct StoreMetrics {
    /// `tollgate_store_up{store}`.
    pub up: IntGauge,
    /// `tollgate_store_requests_total{store,result="ok"}`.
    pub ok: IntCounter,
    /// `...{result="timeout"}`: the call missed its budget.
    pub timeout: IntCounter,
    /// `...{result="error"}`: the store answered an error or the connection failed.
    pub error: IntCounter,
    /// `...{result="key_error"}`: the store answered an error about the data of a key the
    /// call named (another type written over it, data no script wrote): the key's
    /// decision fell back and the key was repaired; the breaker took no note.
    pub key_error: IntCounter,
    /// `...{result="breaker_open"}`: not sent, the breaker was open.
    pub breaker_open: IntCounter,
    /// `tollgate_store_latency_seconds{store}`.
    pub latency: Histogram,
    /// `tollgate_store_fallback_decisions_total{store}`.
    pub fallback: IntCounter,
    /// `tollgate_store_lease_calls_total{store,result}`.
    pub lease_calls: LeaseCalls,
    /// `tollgate_store_leased{store,origin,limit}`, this store's.
    pub leased: LeasedGauges,
}

/// One store's `tollgate_store_leased` family: a leased limit takes its gauge once, at
/// build.
#[derive(Clone)]
pub struct LeasedGauges {
    family: IntGaugeVec,
    store: String,
}

impl LeasedGauges {
    /// The gauge of `origin`'s `limit` in this store.
    pub fn of(&self, origin: &str, limit: &str) -> IntGauge {
        self.family
            .with_label_values(&[self.store.as_str(), origin, limit])
    }
}

/// One store's `tollgate_store_lease_calls_total` children, one per result.
#[derive(Clone)]
pub struct LeaseCalls {
    /// A take granted the slice asked for.
    pub granted: IntCounter,
    /// A take granted less: the shared remainder was short.
    pub partial: IntCounter,
    /// A take granted nothing: the key decides exactly.
    pub empty: IntCounter,
    /// Unspent quota given back (idle, surplus slots, reload).
    pub returned: IntCounter,
    /// A lease call got no answer (timeout, error, breaker open).
    pub failed: IntCounter,
}

impl StoreMetrics {
    /// Children registered nowhere, for a store built without a registry (tools, tests).
    pub fn unregistered(store: &str) -> Result<Self, MetricsError> {
        Ok(Metrics::new()?.store(store))
    }
}

/// One limit's decision counters.
#[derive(Clone)]
pub struct DecisionCounters {
    /// Admitted by this limit, and the request passed every other limit too.
    pub allowed: IntCounter,
    /// Admitted by this limit, then given back because a later limit rejected the request.
    pub refunded: IntCounter,
    /// Rejected (enforced).
    pub rejected: IntCounter,
    /// Would have been rejected; shadow mode let it through.
    pub shadow_rejected: IntCounter,
    /// The request lacked a key part, so the limit did not apply.
    pub skipped: IntCounter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_every_family_with_its_labels() {
        let m = Metrics::new().unwrap();
        let codes = CodeCounters::new(&m, "shop");
        codes.inc(200);
        codes.inc(0);
        codes.inc(61000);
        m.decisions("shop", "per_client", "rate").rejected.inc();
        m.inflight("shop").set(0);
        let store = m.store("shared");
        store.up.set(1);
        store.ok.inc();
        store.latency.observe(0.00008);
        m.leased("shared", "shop", "api_tokens").set(7);
        m.request_duration_seconds
            .with_label_values(&["shop"])
            .observe(0.01);
        let text = String::from_utf8(m.encode()).unwrap();
        for needle in [
            "tollgate_requests_total{code=\"200\",origin=\"shop\"} 1",
            "tollgate_requests_total{code=\"000\",origin=\"shop\"} 2",
            "tollgate_limit_decisions_total{decision=\"rejected\",kind=\"rate\",limit=\"per_client\",origin=\"shop\"} 1",
            "tollgate_limit_decisions_total{decision=\"allowed\",kind=\"rate\",limit=\"per_client\",origin=\"shop\"} 0",
            "tollgate_inflight_requests{origin=\"shop\"} 0",
            "tollgate_request_duration_seconds_count{origin=\"shop\"} 1",
            "tollgate_config_reloads_total{result=\"failure\"} 0",
            "tollgate_config_last_reload_success_timestamp_seconds 0",
            "tollgate_connections_open 0",
            "tollgate_connections_limited_total{limit=\"max_connections\"} 0",
            "tollgate_connections_limited_total{limit=\"max_connections_per_ip\"} 0",
            "tollgate_connection_timeouts_total{timeout=\"header\"} 0",
            "tollgate_connection_timeouts_total{timeout=\"keepalive\"} 0",
            "tollgate_api_connections 0",
            "tollgate_store_up{store=\"shared\"} 1",
            "tollgate_store_requests_total{result=\"ok\",store=\"shared\"} 1",
            "tollgate_store_requests_total{result=\"breaker_open\",store=\"shared\"} 0",
            "tollgate_store_latency_seconds_bucket{store=\"shared\",le=\"0.0001\"} 1",
            "tollgate_store_fallback_decisions_total{store=\"shared\"} 0",
            "tollgate_store_lease_calls_total{result=\"granted\",store=\"shared\"} 0",
            "tollgate_store_lease_calls_total{result=\"failed\",store=\"shared\"} 0",
            "tollgate_store_leased{limit=\"api_tokens\",origin=\"shop\",store=\"shared\"} 7",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
