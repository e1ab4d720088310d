//! The live form of a config: routing table, resolved upstreams, limiter state and metric
//! handles, built once per load and swapped atomically on reload.
//!
//! Every front end (the HTTP proxy, the limiter API) reads one [`Runtime`] snapshot per
//! request or command and asks it for decisions ([`decide`] for a request's limits,
//! [`grant`] and [`resources`] for the API's resources; [`learned`] for what `max: auto`
//! learned about each upstream server); the reloader ([`crate::reload`])
//! builds the next one on top of the current one. It depends on [`crate::config`], [`crate::limits`],
//! [`crate::tls`] and [`crate::metrics`], never on a front end: see the module map in
//! `docs/architecture.md`.
//!
//! Each limit variant is one [`Limiter`] of one of the six kinds (inflight, rate, token
//! bucket, tiered, concurrency, sliding log), whose state lives in this process or in a
//! shared store ([`limiter::Place`]); the decision loop ([`decide`]), the API ([`grant`],
//! [`resources`]) and the collector treat both places alike, through the kind.
//!
//! Limiter state is identified by origin, limit name, override match and key parts (a
//! [`limit::StateId`]). A reload looks each identity up in the previous runtime and reuses
//! its state when it is in the same place (the very same store, for a shared one) and its
//! shape is unchanged, so an unchanged limit keeps its counters, buckets, logs, tiers and
//! holds. In process, `max` alone never shapes a rate's or inflight's state, so raising it
//! keeps the counts too; a shared limiter's shape is every parameter, so there it starts a
//! new limiter (and fallback) while Redis keeps the counts (`docs/architecture.md`,
//! *Invariants*). New identities start fresh; identities absent from the new config are
//! dropped with the old runtime once the last request holding it finishes.

pub mod admission;
pub mod collector;
pub mod decide;
pub mod grant;
pub mod learned;
pub mod limit;
pub mod limiter;
pub mod place;
pub mod policy;
pub mod resources;
pub mod rls;
pub mod router;
pub mod stores;
pub mod switch;
pub mod upstreams;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, UpstreamProtocol};
use crate::limits::{HeavyHitters, KeyPart, KeySpec};
use crate::metrics::{CodeCounters, Metrics, UNMATCHED_ORIGIN};
use crate::runtime::decide::Phase;
use crate::runtime::limit::{Building, LimitRt, StateId};
use crate::runtime::limiter::{Limiter, LimiterError};
use crate::runtime::resources::Resources;
use crate::runtime::rls::RlsRt;
use crate::runtime::router::Router;
use crate::runtime::stores::Stores;
use crate::runtime::switch::KillSwitch;
use crate::runtime::upstreams::{ResolveError, Upstreams};
use crate::segments::{Segment, SegmentError};
use crate::store::StoreError;
use crate::tls::{Managed, TlsError, TlsStore};

/// One origin, live.
pub struct OriginRt {
    /// Name (metrics label).
    pub name: String,
    /// The customer of requests that bring none from a trusted proxy: the origin's
    /// `customer`, else its name.
    pub customer: Box<[u8]>,
    /// The resolved upstream servers, picked round robin.
    pub upstreams: Upstreams,
    /// TLS to upstreams.
    pub tls: bool,
    /// SNI for TLS upstreams (empty when `tls` is off).
    pub sni: String,
    /// Verify upstream certificates.
    pub tls_verify: bool,
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
    /// Upstream read timeout: how long a response may stall.
    pub read_timeout: Duration,
    /// The HTTP version spoken to the upstreams.
    pub upstream_protocol: UpstreamProtocol,
    /// Limits decided when the request arrives, config order.
    pub request_limits: Vec<LimitRt>,
    /// Limits decided once the upstream server is picked, config order.
    pub upstream_limits: Vec<LimitRt>,
    /// `tollgate_inflight_requests{origin}`.
    pub inflight_gauge: prometheus::IntGauge,
    /// `tollgate_request_duration_seconds{origin}`.
    pub duration: prometheus::Histogram,
    /// `tollgate_requests_total{origin,code}`.
    pub requests: CodeCounters,
    /// The process's kill switch.
    pub kill: Arc<KillSwitch>,
    /// Whether a limit of each phase (`[request, upstream]`) reads the request's path (its
    /// key, its `match:` or an override's condition): only for such a phase is the path
    /// normalized (`crate::limits::path`); see [`OriginRt::reads_path`].
    pub path_readers: [bool; 2],
}

impl OriginRt {
    /// Whether a limit of `phase` reads the request's path (its normal form is then built
    /// for that phase's decisions, and only then).
    pub fn reads_path(&self, phase: Phase) -> bool {
        match phase {
            Phase::Request => self.path_readers[0],
            Phase::Upstream => self.path_readers[1],
        }
    }

    /// The limits of `phase`, in config order.
    pub fn limits(&self, phase: Phase) -> &[LimitRt] {
        match phase {
            Phase::Request => &self.request_limits,
            Phase::Upstream => &self.upstream_limits,
        }
    }

    /// Every limit, request phase first.
    pub fn all_limits(&self) -> impl Iterator<Item = &LimitRt> {
        self.request_limits.iter().chain(&self.upstream_limits)
    }
}

/// A whole live config.
pub struct Runtime {
    /// The config it was built from.
    pub config: Arc<Config>,
    /// Host → origin.
    pub router: Router,
    /// Origins, config order, then the unmatched origin if configured.
    pub origins: Vec<OriginRt>,
    /// The index of the origin serving hosts no origin names (`defaults.unmatched`).
    pub unmatched_origin: Option<usize>,
    /// `tollgate_requests_total` for hosts no origin serves.
    pub unmatched: CodeCounters,
    /// The loaded segments, by name.
    pub segments: HashMap<String, Arc<Segment>>,
    /// The process's kill switch, shared by every runtime it builds.
    pub kill: Arc<KillSwitch>,
    /// The shared stores, carried over reloads while their settings hold.
    pub stores: Stores,
    /// The limiter API's resources (`resources:`), by name.
    pub resources: Resources,
    /// Envoy's rate limit service: `rls.config_dir`'s domains and their rules.
    pub rls: RlsRt,
    /// The TLS listeners' certificates and acceptor; `None` without `tls.certificates`.
    /// Kept over reloads that change neither the settings nor the files' bytes.
    pub tls: Option<Arc<TlsStore>>,
    /// The certificates and challenges `tls.acme` manages: one board for the process,
    /// carried over every reload, which the TLS acceptor reads at each handshake.
    pub managed: Arc<Managed>,
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
pub enum BuildError {
    /// An upstream name did not resolve.
    #[error("origin `{origin}`: {source}")]
    Upstream {
        /// The origin.
        origin: String,
        /// What went wrong.
        source: ResolveError,
    },
    /// A segment file is missing, unreadable or corrupt.
    #[error("segment `{name}`: {source}")]
    Segment {
        /// The segment.
        name: String,
        /// What went wrong, with the file named.
        source: SegmentError,
    },
    /// A shared store could not be started (a malformed URL).
    #[error("{source}")]
    Store {
        /// What went wrong, with the store named.
        source: StoreError,
    },
    /// A certificate or key file cannot be used, or OpenSSL refused the TLS settings.
    #[error("{source}")]
    Tls {
        /// What went wrong, with the file named.
        source: TlsError,
    },
    /// A resource's state could not be built.
    #[error("resource `{resource}`: {source}")]
    Resource {
        /// The resource.
        resource: String,
        /// What went wrong.
        source: LimiterError,
    },
    /// An Envoy rate limit service rule's state could not be built.
    #[error("rls rule `{rule}`: {source}")]
    Rls {
        /// The rule's path.
        rule: String,
        /// What went wrong.
        source: LimiterError,
    },
    /// A limiter's state could not be built.
    #[error("origin `{origin}`, limit `{limit}`: {source}")]
    Limit {
        /// The origin.
        origin: String,
        /// The limit.
        limit: String,
        /// What went wrong.
        source: LimiterError,
    },
}

impl Runtime {
    /// The origin serving `host` (lower-cased): the one naming it, else the unmatched
    /// origin if one is configured.
    pub fn route(&self, host: &str) -> Option<usize> {
        self.router.route(host).or(self.unmatched_origin)
    }

    /// Builds the runtime for `config`, resolving upstream names and reusing state from
    /// `previous` where the identity and shape are unchanged.
    pub fn build(
        config: Arc<Config>,
        previous: Option<&Runtime>,
        metrics: &Metrics,
    ) -> Result<(Runtime, Carried), BuildError> {
        let before: HashMap<StateId, &Limiter> = previous
            .map(|p| {
                p.origins
                    .iter()
                    .flat_map(|o| o.all_limits().flat_map(|l| l.states(&o.name)))
                    .chain(p.resources.states())
                    .chain(p.rls.states())
                    .collect()
            })
            .unwrap_or_default();
        let tops: HashMap<(String, String), Arc<HeavyHitters>> = previous
            .map(|p| {
                p.origins
                    .iter()
                    .flat_map(|o| {
                        o.all_limits().filter_map(|l| {
                            let top = l.top.clone()?;
                            Some(((o.name.clone(), l.name.clone()), top))
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut carried = Carried::default();
        let kill = previous.map_or_else(Arc::default, |p| p.kill.clone());
        kill.set_config(config.server.kill_switch);
        let mut segments = HashMap::with_capacity(config.segments.len());
        for spec in &config.segments {
            let set = Segment::load(&spec.file).map_err(|source| BuildError::Segment {
                name: spec.name.clone(),
                source,
            })?;
            segments.insert(spec.name.clone(), Arc::new(set));
        }
        let managed = previous.map_or_else(Managed::new, |p| p.managed.clone());
        let tls = TlsStore::build(&config.tls, previous.and_then(|p| p.tls.as_ref()), &managed)
            .map_err(|source| BuildError::Tls { source })?;
        let stores = Stores::build(&config, previous.map(|p| &p.stores), metrics)
            .map_err(|source| BuildError::Store { source })?;
        let mut origins = Vec::with_capacity(config.origins.len() + 1);
        for origin in config.origins.iter().chain(&config.unmatched) {
            let upstreams =
                Upstreams::resolve(&origin.upstreams).map_err(|source| BuildError::Upstream {
                    origin: origin.name.clone(),
                    source,
                })?;
            let (mut request_limits, mut upstream_limits) = (Vec::new(), Vec::new());
            let mut keys: Vec<&KeySpec> = Vec::new();
            let at = Building {
                origin: &origin.name,
                previous: &before,
                segments: &segments,
                stores: &stores,
                tops: &tops,
                servers: upstreams.addrs(),
            };
            for limit in &origin.limits {
                let kind = limit.params.kind();
                let counters = metrics.decisions(&origin.name, &limit.name, kind.name());
                let slot = keys
                    .iter()
                    .position(|k| **k == limit.key)
                    .unwrap_or_else(|| {
                        keys.push(&limit.key);
                        keys.len() - 1
                    });
                let rt =
                    LimitRt::build(&at, limit, slot, counters, &mut carried).map_err(|source| {
                        BuildError::Limit {
                            origin: origin.name.clone(),
                            limit: limit.name.clone(),
                            source,
                        }
                    })?;
                if kind.holds_upstream() {
                    upstream_limits.push(rt);
                } else {
                    request_limits.push(rt);
                }
            }
            let reads = |limits: &[LimitRt]| limits.iter().any(|l| l.reads(&KeyPart::Path));
            let path_readers = [reads(&request_limits), reads(&upstream_limits)];
            origins.push(OriginRt {
                name: origin.name.clone(),
                customer: origin
                    .customer
                    .as_deref()
                    .unwrap_or(&origin.name)
                    .as_bytes()
                    .into(),
                upstreams,
                tls: origin.tls,
                sni: origin.sni.clone().unwrap_or_default(),
                tls_verify: origin.tls_verify,
                connect_timeout: origin.connect_timeout,
                read_timeout: origin.read_timeout,
                upstream_protocol: origin.upstream_protocol,
                request_limits,
                upstream_limits,
                inflight_gauge: metrics.inflight(&origin.name),
                duration: metrics
                    .request_duration_seconds
                    .with_label_values(&[origin.name.as_str()]),
                requests: CodeCounters::new(metrics, &origin.name),
                kill: kill.clone(),
                path_readers,
            });
        }
        let resources =
            Resources::build(&config, &before, &segments, &stores, metrics, &mut carried)
                .map_err(|(resource, source)| BuildError::Resource { resource, source })?;
        let rls = RlsRt::build(&config, &before, &stores, metrics, &mut carried)
            .map_err(|(rule, source)| BuildError::Rls { rule, source })?;
        carried.dropped = before.len().saturating_sub(carried.kept);
        let router = Router::new(
            config
                .origins
                .iter()
                .enumerate()
                .map(|(i, o)| (i, o.hosts.as_slice())),
        );
        let unmatched_origin = config.unmatched.as_ref().map(|_| origins.len() - 1);
        let runtime = Runtime {
            config,
            router,
            origins,
            unmatched_origin,
            unmatched: CodeCounters::new(metrics, UNMATCHED_ORIGIN),
            segments,
            kill,
            stores,
            resources,
            rls,
            tls,
            managed,
        };
        Ok((runtime, carried))
    }
}

#[cfg(test)]
mod tests;
