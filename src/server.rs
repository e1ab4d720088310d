//! The composition root: assembles the Pingora server from a config, with the proxy
//! service on every listener, the metrics, limiter API, admin API and demo services, and the
//! reloader, all sharing one live runtime.
//!
//! The proxy service is Pingora's `HttpProxy` behind tollgate's connection handler
//! ([`Handler`]), with the connection caps as the listeners' filter ([`AcceptFilter`]).
//! Starting raises the soft open-file limit to the hard one and derives the default
//! `max_connections` from it ([`safe_max_connections`]); a watcher of Pingora's execution
//! phases starts draining when a graceful upgrade or shutdown begins ([`Drain`]).
//!
//! Local limit state is loaded from the snapshot before any service starts (in an upgrade,
//! once the predecessor's final state is on disk), written by the snapshot writer service
//! while running, and written once more when the server has stopped ([`Started::run`]); see
//! [`crate::snapshot`].
//!
//! It is the only module that knows every other one; nothing imports it but `main`. See the
//! module map in `docs/architecture.md`.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{ExecutionPhase, RunArgs, Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;
use tokio::sync::broadcast;

use crate::accesslog::writer::{self, OpenError, Output};
use crate::accesslog::AccessLog;
use crate::acme::AcmeService;
use crate::admin::{Admin, AdminApp};
use crate::api::{ApiConfig, ApiService};
use crate::config::{ConfigError, Connections as ConnectionBounds};
use crate::limits::MonotonicClock;
use crate::metrics::{Metrics, MetricsError};
use crate::proxy::conn_caps::{AcceptFilter, Caps, Connections};
use crate::proxy::conn_state::Drain;
use crate::proxy::demo::DemoUpstream;
use crate::proxy::edge::Edge;
use crate::proxy::handler::Handler;
use crate::proxy::metrics_app::MetricsApp;
use crate::proxy::service::Tollgate;
use crate::reload::{unix_now, Hangup, Reloader, Snapshot};
use crate::rls::{Rls, RlsService};
use crate::runtime::collector::RuntimeCollector;
use crate::runtime::learned::LearnedCollector;
use crate::runtime::{BuildError, Runtime};
use crate::snapshot::service::SnapshotWriter;
use crate::snapshot::{self, Snapshots};

/// How to run: the CLI's `run` options.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The config file.
    pub config: PathBuf,
    /// Fork into the background (Pingora's `--daemon`).
    pub daemon: bool,
    /// Take over the listeners of a running tollgate (Pingora's `--upgrade`); the old
    /// process hands them over when it receives SIGQUIT.
    pub upgrade: bool,
    /// The Unix socket listeners are handed over on during an upgrade.
    pub upgrade_sock: String,
    /// Where the daemon writes its PID.
    pub pid_file: String,
}

/// Why tollgate could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The config is unreadable or invalid.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The runtime could not be built.
    #[error("{0}")]
    Build(#[from] BuildError),
    /// The metrics registry could not be built.
    #[error("{0}")]
    Metrics(#[from] MetricsError),
    /// The rate limit service's listener could not be bound.
    #[error("server.rls: cannot listen on {addr}: {source}")]
    Rls {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A runtime metric could not be registered.
    #[error("cannot register runtime metrics: {0}")]
    Collector(#[from] prometheus::Error),
    /// The access log cannot be opened.
    #[error("{0}")]
    AccessLog(#[from] OpenError),
}

/// How long the exit waits for leased slices to go back to their stores.
const GIVE_BACK_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// A bootstrapped server with its local-state snapshots loaded, ready to run.
pub struct Started {
    /// The Pingora server.
    pub server: Server,
    /// The snapshots of its local limit state.
    pub snapshots: Arc<Snapshots>,
    /// The access log's writer, started with the services (after a daemon's fork).
    pub access_log: Option<Arc<AccessLogService>>,
}

impl Started {
    /// Runs the server until it stops (a signal), writes the last snapshot once no
    /// decision can be made any more (unless an upgrade handed the file over), and exits.
    pub fn run(self) -> ! {
        let mut phases = self.server.watch_execution_phase();
        self.server.run(RunArgs::default());
        if let Some(log) = &self.access_log {
            // Every request has ended: write their lines before the process exits.
            log.finish();
        }
        self.snapshots.after_run(&mut phases);
        // The live config's leased slices go back to their stores (docs/fleet.md).
        let (sent, ended) = crate::store::lease_close::give_back_all(GIVE_BACK_WITHIN);
        if sent > 0 {
            log::info!("gave {ended} of {sent} leased slices back");
        }
        std::process::exit(0)
    }
}

/// Loads the config and builds a bootstrapped server ready to [`Started::run`]: with the
/// listeners in hand (from the old process in an upgrade) and the local-state snapshot
/// loaded.
pub fn build(opts: &RunOptions) -> Result<Started, StartError> {
    // First, so that a SIGHUP from now on is applied (once the reloader runs), never lost
    // nor fatal (its default action ends the process).
    let hangup = match Hangup::listen() {
        Ok(h) => Some(h),
        Err(e) => {
            log::error!("cannot listen for SIGHUP, reload on signal is off: {e}");
            None
        }
    };
    // Before anything else: a predecessor's upgrade snapshot is written after this.
    let started_at = snapshot::unix_nanos();
    // Read once, as the reloader reads: it compares later reads with this one.
    let snapshot = Snapshot::read(&opts.config).map_err(|source| ConfigError::Read {
        file: opts.config.display().to_string(),
        source,
    })?;
    let loaded = snapshot.parse(&opts.config)?;
    for warning in &loaded.warnings {
        log::warn!("{warning}");
    }
    let metrics = Arc::new(Metrics::new()?);
    let config = Arc::new(loaded.config);
    let (runtime, _) = Runtime::build(config.clone(), None, &metrics)?;
    metrics.config_last_reload_success.set(unix_now());
    let runtime = Arc::new(ArcSwap::from_pointee(runtime));
    metrics.register_collector(Box::new(RuntimeCollector::new(runtime.clone())?))?;
    metrics.register_collector(Box::new(LearnedCollector::new(runtime.clone())?))?;

    let server_cfg = &config.server;
    let derived_max = safe_max_connections(raise_open_file_limit());
    check_max_connections(&server_cfg.connections, derived_max);
    let grace =
        server_cfg.grace_period.as_secs() + u64::from(server_cfg.grace_period.subsec_nanos() > 0);
    let conf = ServerConf {
        threads: server_cfg.threads,
        grace_period_seconds: Some(grace),
        graceful_shutdown_timeout_seconds: Some(grace.max(1)),
        upgrade_sock: opts.upgrade_sock.clone(),
        pid_file: opts.pid_file.clone(),
        // Idle pooled upstream connections hold descriptors too: never more of them than
        // the derived connection cap allows for (`safe_max_connections`).
        upstream_keepalive_pool_size: pool_per_thread(derived_max, server_cfg.threads),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: opts.upgrade,
        daemon: opts.daemon,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    // In an upgrade, this waits for the old process to hand its listeners over.
    server.bootstrap();

    // The proxy's clock reads Unix time at start and then moves monotonically: snapshot
    // times map into it, and rate periods keep their phase over a restart.
    let clock = MonotonicClock::from_unix_epoch();
    let snapshots = Snapshots::new(runtime.clone(), clock, &metrics)?;
    if opts.upgrade {
        snapshots.await_predecessor(started_at);
    }
    snapshots.load();

    let access_log = match &server_cfg.access_log {
        Some(conf) => {
            // Opened now, so that a path that cannot be written stops the start with a
            // clear error; the writer thread starts with the services.
            let out = Output::open(&conf.path)?;
            let log = Arc::new(AccessLog::new(
                conf.clone(),
                metrics.access_log_dropped_total.clone(),
            ));
            Some(Arc::new(AccessLogService::new(log, out)))
        }
        None => None,
    };

    let drain = Arc::new(Drain::new());
    server.add_service(background_service(
        "drain watcher",
        DrainWatch {
            phases: Mutex::new(Some(server.watch_execution_phase())),
            drain: drain.clone(),
        },
    ));
    let caps_runtime = runtime.clone();
    let connections = Connections::new(&metrics, move || {
        caps(&caps_runtime.load().config.server.connections, derived_max)
    });
    let handler = Handler::new(
        pingora_proxy::http_proxy(
            &server.configuration,
            Tollgate::new(
                runtime.clone(),
                drain,
                clock,
                access_log.as_ref().map(|s| s.log.clone()),
            ),
        ),
        runtime.clone(),
        connections.clone(),
        Edge::new(&server_cfg.listen, &metrics),
        &metrics,
    );
    let mut proxy = Service::new("tollgate proxy".to_string(), handler);
    // Every listener is plain TCP to Pingora: TLS, h2c and the PROXY protocol are the
    // connection handler's (see `proxy::edge`), so that they are bounded and counted.
    for listener in &server_cfg.listen {
        proxy.add_tcp(&listener.addr.to_string());
    }
    proxy.set_connection_filter(Arc::new(AcceptFilter(connections)));
    server.add_service(proxy);

    if let Some(addr) = server_cfg.metrics {
        let mut svc = Service::new("metrics".to_string(), MetricsApp::new(metrics.clone()));
        svc.threads = Some(1);
        svc.add_tcp(&addr.to_string());
        server.add_service(svc);
    }
    if let Some(addr) = server_cfg.limiter_api {
        // The API follows the live runtime (resources, stores, api.allow_unconfigured,
        // api.store, the kill switch change with a reload); only its bucket table's size
        // is fixed at start.
        let api = ApiConfig {
            max_keys: config.api.max_keys,
            ..ApiConfig::default()
        };
        let api = Arc::new(ApiService::with_runtime(api, runtime.clone(), &metrics));
        let mut svc = api.pingora_service(&[addr.to_string()]);
        svc.threads = Some(1);
        server.add_service(svc);
    }
    if let Some(l) = &server_cfg.rls {
        let addr = l.addr;
        // Envoy's rate limit service follows the live runtime too (domains, rules, stores,
        // the kill switch); its address is fixed until a restart.
        let listener = crate::rls::bind(addr).map_err(|source| StartError::Rls { addr, source })?;
        let rls = RlsService::new(listener, l.tls, Rls::new(runtime.clone(), clock));
        server.add_service(background_service("envoy rate limit service", rls));
    }
    if let Some(addr) = server_cfg.admin {
        // The admin API follows the live runtime too (its /config, limits, token and kill
        // switch change with a reload); only its address is fixed until a restart.
        let admin = Admin::new(runtime.clone(), clock);
        let mut svc = Service::new("admin api".to_string(), AdminApp(Arc::new(admin)));
        svc.threads = Some(1);
        svc.add_tcp(&addr.to_string());
        server.add_service(svc);
    }
    if let Some(addr) = server_cfg.demo_upstream {
        let mut svc = Service::new("demo upstream".to_string(), DemoUpstream);
        svc.threads = Some(1);
        svc.add_tcp(&addr.to_string());
        server.add_service(svc);
    }
    server.add_service(background_service(
        "acme",
        AcmeService::new(runtime.clone(), metrics.clone()),
    ));
    server.add_service(background_service(
        "config reloader",
        Reloader::new(
            opts.config.clone(),
            runtime,
            metrics,
            Some(snapshot),
            hangup,
        ),
    ));
    server.add_service(background_service(
        "snapshot writer",
        SnapshotWriter::new(snapshots.clone(), server.watch_execution_phase()),
    ));
    if let Some(svc) = &access_log {
        server.add_service(background_service("access log", AccessLogTask(svc.clone())));
    }
    Ok(Started {
        server,
        snapshots,
        access_log,
    })
}

/// The access log's writer as a service: it starts the writer thread when the services
/// start (a thread started before a daemon's fork would not survive it), reopens the file
/// on SIGUSR1, and writes the last lines when the server has stopped.
pub struct AccessLogService {
    log: Arc<AccessLog>,
    output: Mutex<Option<Output>>,
    writer: Mutex<Option<writer::Handle>>,
    usr1: Mutex<Option<tokio::signal::unix::Signal>>,
}

impl AccessLogService {
    fn new(log: Arc<AccessLog>, output: Output) -> Self {
        // Registered now: SIGUSR1's default action ends the process.
        let usr1 = listen_usr1()
            .map_err(|e| {
                log::error!(
                    "cannot listen for SIGUSR1, the access log reopens only when moved: {e}"
                )
            })
            .ok();
        Self {
            log,
            output: Mutex::new(Some(output)),
            writer: Mutex::new(None),
            usr1: Mutex::new(usr1),
        }
    }

    /// Writes what is left and stops the writer (at most 5 s).
    fn finish(&self) {
        if let Some(handle) = self.writer.lock().take() {
            handle.finish(std::time::Duration::from_secs(5));
        }
    }
}

/// Registers the SIGUSR1 handler (outside a runtime too, as [`Hangup::listen`] does).
fn listen_usr1() -> std::io::Result<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    if tokio::runtime::Handle::try_current().is_ok() {
        return signal(SignalKind::user_defined1());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let _in = rt.enter();
    signal(SignalKind::user_defined1())
}

/// [`AccessLogService`] as the background service Pingora runs.
struct AccessLogTask(Arc<AccessLogService>);

#[async_trait]
impl BackgroundService for AccessLogTask {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.0.run(shutdown).await;
    }
}

impl AccessLogService {
    async fn run(&self, mut shutdown: ShutdownWatch) {
        if let Some(out) = self.output.lock().take() {
            match writer::spawn(self.log.clone(), out) {
                Ok(handle) => *self.writer.lock() = Some(handle),
                Err(e) => log::error!("cannot start the access log writer: {e}"),
            }
        }
        let Some(mut usr1) = self.usr1.lock().take() else {
            return;
        };
        loop {
            tokio::select! {
                got = usr1.recv() => {
                    if got.is_none() {
                        return;
                    }
                    log::info!("SIGUSR1: reopening the access log");
                    self.log.request_reopen();
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Pingora's default size of the idle upstream connection pool, per worker thread.
const UPSTREAM_POOL: usize = 128;

/// Pingora's `upstream_keepalive_pool_size` for `threads` worker threads: Pingora keeps one
/// pool (an LRU) of that size × `threads` idle upstream connections (`ConnectorOptions::
/// from_server_conf`), so 256 with its default of 128 and two threads. At most
/// [`UPSTREAM_POOL`] per thread, and never more in all than `derived_max`, the connection
/// cap the open-file limit carries with one idle pooled connection per client connection
/// ([`safe_max_connections`]).
fn pool_per_thread(derived_max: u32, threads: usize) -> usize {
    (derived_max as usize / threads.max(1)).clamp(1, UPSTREAM_POOL)
}

/// Descriptors kept out of the connection budget: stdio, listeners, the runtimes' epoll
/// and event descriptors, the config watcher (about 35 with two threads) and headroom.
const RESERVED_FDS: u64 = 64;

/// The `max_connections` that `nofile` descriptors carry safely: each connection may hold
/// three (itself, its upstream connection, and one idle in the upstream pool, which is
/// sized to match), after [`RESERVED_FDS`]; at most
/// [`ConnectionBounds::DEFAULT_MAX_CONNECTIONS`], at least 1. Unknown limit: the ceiling.
pub fn safe_max_connections(nofile: Option<u64>) -> u32 {
    let ceiling = ConnectionBounds::DEFAULT_MAX_CONNECTIONS;
    nofile.map_or(ceiling, |n| {
        let fit = n.saturating_sub(RESERVED_FDS) / 3;
        u32::try_from(fit).unwrap_or(u32::MAX).clamp(1, ceiling)
    })
}

/// The caps in force: the configured ones, `max_connections` defaulting to `derived_max`.
fn caps(bounds: &ConnectionBounds, derived_max: u32) -> Caps {
    Caps {
        max: bounds.max_connections.unwrap_or(derived_max) as usize,
        per_ip: bounds.max_connections_per_ip,
    }
}

/// Raises the soft open-file limit to the hard one (tollgate uses epoll, never `select`,
/// so descriptors above 1024 are fine, as Go's runtime assumes too) and returns the limit
/// in force; `None` if it cannot be read.
fn raise_open_file_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            log::info!("raised the open-file limit from {soft} to {hard}");
            Some(hard)
        }
        Err(e) => {
            log::warn!("cannot raise the open-file limit from {soft} to {hard}: {e}");
            Some(soft)
        }
    }
}

/// Warns when a configured `max_connections` is more than the open-file limit carries.
fn check_max_connections(bounds: &ConnectionBounds, derived_max: u32) {
    match bounds.max_connections {
        Some(max) if max > derived_max => log::warn!(
            "server.max_connections is {max}, but the open-file limit carries about {derived_max} connections safely (three descriptors each); past that, accept() fails with EMFILE and proxying fails: raise the limit (ulimit -n, LimitNOFILE=) or lower max_connections"
        ),
        Some(_) => {}
        None => log::info!(
            "server.max_connections not set: at most {derived_max} connections (from the open-file limit)"
        ),
    }
}

/// Starts draining ([`Drain`]) when Pingora begins a graceful upgrade (the listeners are
/// being handed over) or a graceful shutdown.
struct DrainWatch {
    phases: Mutex<Option<broadcast::Receiver<ExecutionPhase>>>,
    drain: Arc<Drain>,
}

#[async_trait]
impl BackgroundService for DrainWatch {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(mut phases) = self.phases.lock().take() else {
            return;
        };
        loop {
            let why = tokio::select! {
                phase = phases.recv() => match phase {
                    Ok(ExecutionPhase::GracefulUpgradeTransferringFds) => "handing the listeners over",
                    Ok(ExecutionPhase::GracefulTerminate) => "shutting down",
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = shutdown.wait_for(|stopping| *stopping) => "shutting down",
            };
            self.drain.start();
            log::info!("draining ({why}): every response now closes its connection");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_pool_stays_within_the_connection_budget() {
        // 128 a thread (Pingora's default) while the budget allows it in all.
        assert_eq!(pool_per_thread(4096, 2), 128);
        assert_eq!(pool_per_thread(4096, 64), 64);
        // (256 - 64) / 3 = 64 connections: 32 idle a thread, 64 in all.
        assert_eq!(pool_per_thread(safe_max_connections(Some(256)), 2), 32);
        assert_eq!(pool_per_thread(1, 4), 1);
    }

    #[test]
    fn connection_budget_follows_the_open_file_limit() {
        // Three descriptors a connection after the reserve.
        assert_eq!(safe_max_connections(Some(128)), 21);
        assert_eq!(safe_max_connections(Some(1024)), 320);
        assert_eq!(safe_max_connections(Some(1 << 20)), 4096);
        assert_eq!(safe_max_connections(Some(10)), 1);
        assert_eq!(safe_max_connections(None), 4096);
        let bounds = ConnectionBounds::default();
        assert_eq!(
            caps(&bounds, 21),
            Caps {
                max: 21,
                per_ip: None
            }
        );
        let set = ConnectionBounds {
            max_connections: Some(7),
            max_connections_per_ip: Some(2),
            ..bounds
        };
        assert_eq!(
            caps(&set, 21),
            Caps {
                max: 7,
                per_ip: Some(2)
            }
        );
    }
}
