//! The limiter API service: shared state, the connection cap, the tokio accept loop, and
//! the Pingora [`ServerApp`] that runs it beside the proxy.
//!
//! [`ApiService`] owns what every connection shares: the live runtime it follows (the same
//! `ArcSwap` the proxy and the reloader use, so a reload changes resources, stores,
//! `api.allow_unconfigured`, `api.store` and the kill switch at once), the ad-hoc bucket
//! table, the per-process random hasher of bucket keys, the pending transfers, the bound
//! on hold entries, the counters `INFO` reports and the resolved metric handles. Connections are served by [`ApiService::handle`], generic over the
//! stream, from either front door:
//!
//! - [`ApiApp`] for Pingora (`Service::new(..., ApiApp::new(service))`, or
//!   [`ApiService::pingora_service`]): same process as the proxy, graceful shutdown and
//!   upgrade handled by Pingora, which stops accepting and signals each connection;
//! - [`ApiService::serve`], a plain tokio accept loop (examples, tests, benchmarks).
//!
//! Either way a shutdown signal ends each connection after the command in progress, with
//! its replies flushed.

use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::listeners::TcpSocketOptions;
use pingora::protocols::{Stream, TcpKeepalive};
use pingora::server::ShutdownWatch;
use pingora::services::listening::Service;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, IntGauge};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::bounds::{
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_OUTPUT_BUFFER, KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL, KEEPALIVE_PROBES,
};
use super::command::{COMMANDS, OTHER, RESULTS};
use super::conn;
use super::ledger::{ReservationBudget, Transfers};
use super::resp::ProtocolError;
use crate::config::{Secret, API_ORIGIN, UNCONFIGURED};
use crate::limits::{AdhocBuckets, AdhocParams, Clock, MonotonicClock, Nanos};
use crate::metrics::{DecisionCounters, Families, Metrics, MetricsError};
use crate::runtime::Runtime;

/// How the limiter API runs: the `api` section of the config, plus bounds that tests and
/// operators may tighten.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// `api.max_keys`: ad-hoc buckets holding state at most (49 bytes each, allocated at
    /// start). Size it at twice the keys expected to be below full at once.
    pub max_keys: usize,
    /// `api.allow_unconfigured` for a service that follows no runtime (examples, tests):
    /// `CH.*` commands grant (and record) requests for resources nobody configured. A
    /// service following a runtime reads the runtime's config instead, so a reload changes
    /// it. Unused by `RL.*`, whose buckets are ad hoc by nature.
    pub allow_unconfigured: bool,
    /// Open connections at most; more get `-ERR max number of clients reached`.
    pub max_connections: usize,
    /// A connection with no byte moving either way for this long is closed.
    pub idle_timeout: Duration,
    /// Bytes of replies waiting for a client that does not read, before it is dropped.
    pub max_output_buffer: usize,
    /// `api.password_file` for a service that follows no runtime: the password every
    /// connection must give (`AUTH`). A service following a runtime reads the runtime's
    /// config instead, so a reload changes it.
    pub password: Option<Secret>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            max_keys: 100_000,
            allow_unconfigured: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_output_buffer: DEFAULT_MAX_OUTPUT_BUFFER,
            password: None,
        }
    }
}

/// Where unconfigured resources are counted: `tollgate_limit_decisions_total{origin="_api",
/// limit="_unconfigured", kind="unconfigured"}` and `tollgate_api_holds{resource="_unconfigured"}`.
pub struct Unconfigured {
    /// Decisions on unconfigured resources (every one `allowed`).
    pub counters: DecisionCounters,
    /// Copies of unconfigured resources held.
    pub holds: IntGauge,
}

/// The limiter API: what its connections share.
pub struct ApiService {
    config: ApiConfig,
    runtime: Option<Arc<ArcSwap<Runtime>>>,
    clock: MonotonicClock,
    unconfigured: Unconfigured,
    transfers: Arc<Transfers>,
    budget: Arc<ReservationBudget>,
    buckets: Arc<AdhocBuckets>,
    /// Seeded at random per process: clients choose keys, and must not be able to aim
    /// them all at one set of the table.
    hasher: ahash::RandomState,
    started: Instant,
    next_id: AtomicU64,
    connections: AtomicUsize,
    total_connections: AtomicU64,
    rejected_connections: AtomicU64,
    /// `tollgate_api_commands_total` children, `[slot][result]`, resolved once.
    commands: Box<[[IntCounter; 3]]>,
    connections_gauge: IntGauge,
    throttles: [Throttle; 4],
}

/// Log lines a client can trigger at will, written at most once per
/// `THROTTLE_PERIOD` (10 s) each, with a count of those suppressed.
#[derive(Debug)]
pub enum Throttled {
    /// A framing error (the client got `-ERR Protocol error` and was closed).
    Protocol(ProtocolError),
    /// A client that did not read its replies was dropped.
    Overflow,
    /// A connection was refused at the cap.
    MaxClients,
    /// `AUTH` or `HELLO ... AUTH` with wrong credentials.
    WrongPass,
}

/// At most one line per kind per this period.
const THROTTLE_PERIOD: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct Throttle {
    /// Milliseconds since start when the next line may be written.
    next: AtomicU64,
    suppressed: AtomicU64,
}

impl ApiService {
    /// A service that follows `runtime`, the live config the proxy and the reloader share:
    /// each batch of commands reads the current one. Metric handles are resolved in
    /// `metrics` (and the bucket table's gauges registered there).
    pub fn with_runtime(
        config: ApiConfig,
        runtime: Arc<ArcSwap<Runtime>>,
        metrics: &Metrics,
    ) -> Self {
        Self {
            runtime: Some(runtime),
            ..Self::new(config, metrics)
        }
    }

    /// A service that follows no runtime: `RL.*` on its local table; `CH.*` knows no
    /// resource (each is unconfigured: granted and recorded if `allow_unconfigured`).
    /// For examples, tests and benchmarks; tollgate itself uses
    /// [`with_runtime`](Self::with_runtime).
    pub fn new(config: ApiConfig, metrics: &Metrics) -> Self {
        let buckets = Arc::new(AdhocBuckets::new(config.max_keys));
        let commands = (0..=OTHER)
            .map(|slot| {
                let label = COMMANDS.get(slot).map_or("other", |s| s.label);
                RESULTS.map(|r| metrics.api_commands_total.with_label_values(&[label, r]))
            })
            .collect();
        let collector = BucketCollector::new(&buckets).map_err(MetricsError::from);
        if let Err(e) = collector.and_then(|c| metrics.register_collector(Box::new(c))) {
            // Only a second service on the same registry gets here: the first one reports.
            log::warn!("limiter API: bucket table metrics not registered: {e}");
        }
        let unconfigured = Unconfigured {
            counters: metrics.decisions(API_ORIGIN, UNCONFIGURED, "unconfigured"),
            holds: metrics.api_holds.with_label_values(&[UNCONFIGURED]),
        };
        Self {
            config,
            runtime: None,
            clock: MonotonicClock::new(),
            unconfigured,
            transfers: Arc::new(Transfers::default()),
            budget: Arc::new(ReservationBudget::default()),
            buckets,
            hasher: ahash::RandomState::new(),
            started: Instant::now(),
            next_id: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            commands,
            connections_gauge: metrics.api_connections.clone(),
            throttles: Default::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ApiConfig {
        &self.config
    }

    /// The ad-hoc bucket table of `RL.*`.
    pub fn buckets(&self) -> &AdhocBuckets {
        &self.buckets
    }

    /// The shared bucket table, for work that outlives a command (a store call's local
    /// fallback).
    pub fn buckets_arc(&self) -> &Arc<AdhocBuckets> {
        &self.buckets
    }

    /// The current runtime, if the service follows one: one cheap guard per batch of
    /// commands.
    pub fn runtime(&self) -> Option<Guard<Arc<Runtime>>> {
        self.runtime.as_ref().map(|r| r.load())
    }

    /// Whether unknown resources are granted and recorded: the runtime's
    /// `api.allow_unconfigured`, or the service's own setting without a runtime.
    pub fn allow_unconfigured(&self, runtime: Option<&Runtime>) -> bool {
        runtime.map_or(self.config.allow_unconfigured, |rt| {
            rt.config.api.allow_unconfigured
        })
    }

    /// The password connections must give: the runtime's `api.password_file`, or the
    /// service's own without a runtime.
    pub fn password<'a>(&'a self, runtime: Option<&'a Runtime>) -> Option<&'a Secret> {
        match runtime {
            Some(rt) => rt.config.api.password.as_ref(),
            None => self.config.password.as_ref(),
        }
    }

    /// The clock of in-process resource decisions (monotonic, from the service's start).
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// Where unconfigured resources are counted.
    pub fn unconfigured(&self) -> &Unconfigured {
        &self.unconfigured
    }

    /// The pending transfers.
    pub fn transfers(&self) -> &Arc<Transfers> {
        &self.transfers
    }

    /// The process's bound on hold entries.
    pub fn hold_budget(&self) -> &Arc<ReservationBudget> {
        &self.budget
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// The table key of the bucket `(key, params)`: the key's bytes and the parameters
    /// hashed together, so one key's several parameter sets land in different sets.
    pub fn bucket_key(&self, key: &[u8], params: &AdhocParams) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(key);
        h.write_u64(params.capacity);
        h.write_u64(params.amount);
        h.write_u64(params.every);
        h.finish()
    }

    /// A new client ID.
    pub(crate) fn next_client_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Adds `n` to the counter of command `slot` with result index `result`.
    pub(crate) fn count(&self, slot: usize, result: usize, n: u64) {
        if let Some(c) = self.commands.get(slot).and_then(|r| r.get(result)) {
            c.inc_by(n);
        }
    }

    /// Commands processed since start, over every connection (flushed per batch).
    pub fn commands_processed(&self) -> u64 {
        self.commands.iter().flatten().map(IntCounter::get).sum()
    }

    /// Serves one connection until it ends: refuses it at the connection cap, else runs
    /// the command loop (see [`conn`]). `shutdown` turning `true` ends it after the
    /// command in progress.
    pub async fn handle<S>(
        &self,
        mut stream: S,
        peer: Option<SocketAddr>,
        shutdown: watch::Receiver<bool>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        self.total_connections.fetch_add(1, Ordering::Relaxed);
        let Some(_slot) = self.admit() else {
            self.rejected_connections.fetch_add(1, Ordering::Relaxed);
            self.log_throttled(Throttled::MaxClients, peer);
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                stream
                    .write_all(b"-ERR max number of clients reached\r\n")
                    .await?;
                stream.shutdown().await
            })
            .await;
            return;
        };
        conn::serve(self, stream, peer, shutdown).await;
    }

    /// Takes a connection slot, or `None` at the cap.
    fn admit(&self) -> Option<ConnSlot<'_>> {
        let before = self.connections.fetch_add(1, Ordering::AcqRel);
        if before >= self.config.max_connections {
            self.connections.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        self.connections_gauge.inc();
        Some(ConnSlot(self))
    }

    /// Accepts connections on `listener` until `shutdown` turns `true` (or its sender is
    /// dropped), then waits for open connections to finish their command in progress
    /// and close. Accepted sockets get `TCP_NODELAY` and TCP keepalive.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let tasks = TaskTracker::new();
        loop {
            if *shutdown.borrow() {
                break;
            }
            tokio::select! {
                accepted = accept(&listener) => match accepted {
                    Ok((stream, peer)) => {
                        let service = self.clone();
                        let shutdown = shutdown.clone();
                        tasks.spawn(async move { service.handle(stream, Some(peer), shutdown).await });
                    }
                    Err(e) => {
                        // Out of descriptors, mostly: wait for connections to close
                        // rather than spin on an accept that keeps failing.
                        log::warn!("limiter API: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                changed = shutdown.changed() => if changed.is_err() { break },
            }
        }
        drop(listener);
        tasks.close();
        tasks.wait().await;
    }

    /// A Pingora service listening on `addrs` with TCP keepalive on accepted sockets
    /// (see [`tcp_options`]): add it to the server beside the proxy.
    pub fn pingora_service(self: &Arc<Self>, addrs: &[String]) -> Service<ApiApp> {
        let mut service = Service::new("limiter api".to_string(), ApiApp::new(self.clone()));
        for addr in addrs {
            service.add_tcp_with_settings(addr, tcp_options());
        }
        service
    }

    /// The `INFO` text of the sections wanted (server, clients, stats, limiter).
    pub(crate) fn info(&self, wanted: [bool; 4]) -> String {
        let uptime = self.started.elapsed().as_secs();
        let mut text = String::with_capacity(1024);
        let mut section = |on: bool, body: String| {
            if on {
                if !text.is_empty() {
                    text.push_str("\r\n");
                }
                text.push_str(&body);
            }
        };
        section(
            wanted[0],
            format!(
                "# Server\r\nredis_version:7.0.0\r\ntollgate_version:{}\r\nredis_mode:standalone\r\nprocess_id:{}\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                std::process::id(),
                uptime / 86_400,
            ),
        );
        section(
            wanted[1],
            format!(
                "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n",
                self.connections(),
                self.config.max_connections
            ),
        );
        section(
            wanted[2],
            format!(
                "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\n",
                self.total_connections.load(Ordering::Relaxed),
                self.commands_processed(),
                self.rejected_connections.load(Ordering::Relaxed),
            ),
        );
        section(
            wanted[3],
            format!(
                "# Limiter\r\nadhoc_keys:{}\r\nadhoc_max_keys:{}\r\nadhoc_evictions:{}\r\nresources:{}\r\nhold_entries:{}\r\npending_transfers:{}\r\n",
                self.buckets.len(),
                self.buckets.slots(),
                self.buckets.evictions(),
                self.runtime().map_or(0, |rt| rt.resources.len()),
                self.budget.used(),
                self.transfers.len(),
            ),
        );
        text
    }

    /// Logs `what` unless a line of its kind was written in the last
    /// [`THROTTLE_PERIOD`]; counts the lines it suppresses.
    pub(crate) fn log_throttled(&self, what: Throttled, peer: Option<SocketAddr>) {
        let index = match what {
            Throttled::Protocol(_) => 0,
            Throttled::Overflow => 1,
            Throttled::MaxClients => 2,
            Throttled::WrongPass => 3,
        };
        let throttle = &self.throttles[index];
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = throttle.next.load(Ordering::Relaxed);
        let period = THROTTLE_PERIOD.as_millis() as u64;
        if now < next
            || throttle
                .next
                .compare_exchange(next, now + period, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            throttle.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = throttle.suppressed.swap(0, Ordering::Relaxed);
        let peer = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
        match what {
            Throttled::Protocol(e) => log::info!(
                "limiter API: closed connection from {peer}: {e} ({suppressed} more since the last such line)"
            ),
            Throttled::Overflow => log::warn!(
                "limiter API: closed connection from {peer}: over {} bytes of replies unread ({suppressed} more since the last such line)",
                self.config.max_output_buffer
            ),
            Throttled::MaxClients => log::warn!(
                "limiter API: refused connection from {peer}: {} connections open, the maximum ({suppressed} more since the last such line)",
                self.config.max_connections
            ),
            Throttled::WrongPass => log::info!(
                "limiter API: wrong credentials from {peer} ({suppressed} more since the last such line)"
            ),
        }
    }
}

/// A taken connection slot, given back on drop.
struct ConnSlot<'a>(&'a ApiService);

impl Drop for ConnSlot<'_> {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
        self.0.connections_gauge.dec();
    }
}

/// Accepts one connection on `listener` and configures it (`configure`); a socket option
/// that cannot be set is logged, and the connection served anyway.
async fn accept(listener: &TcpListener) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    let (stream, peer) = listener.accept().await?;
    if let Err(e) = configure(&stream) {
        log::debug!("limiter API: socket options for {peer}: {e}");
    }
    Ok((stream, peer))
}

/// `TCP_NODELAY` (replies are small and must leave at once) and keepalive.
fn configure(stream: &tokio::net::TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// Pingora listener options for the API: TCP keepalive on accepted sockets (Pingora sets
/// `TCP_NODELAY` itself).
pub fn tcp_options() -> TcpSocketOptions {
    let mut options = TcpSocketOptions::default();
    options.tcp_keepalive = Some(TcpKeepalive {
        idle: KEEPALIVE_IDLE,
        interval: KEEPALIVE_INTERVAL,
        count: KEEPALIVE_PROBES as usize,
        #[cfg(target_os = "linux")]
        user_timeout: Duration::ZERO,
    });
    options
}

/// The limiter API as a Pingora application: one [`ApiService::handle`] per connection.
pub struct ApiApp {
    service: Arc<ApiService>,
}

impl ApiApp {
    /// Serves connections with `service`.
    pub fn new(service: Arc<ApiService>) -> Self {
        Self { service }
    }

    /// The service behind it.
    pub fn service(&self) -> &Arc<ApiService> {
        &self.service
    }
}

#[async_trait]
impl ServerApp for ApiApp {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet().copied()));
        self.service.handle(stream, peer, shutdown.clone()).await;
        // A RESP connection is never handed back for reuse.
        None
    }
}

/// Exposes the bucket table's state at scrape time: its evictions in the one eviction
/// family, `tollgate_limit_evictions_total{origin="_api",limit="adhoc",kind="adhoc_bucket"}`,
/// and `tollgate_api_buckets`.
///
/// The eviction family is registered by the runtime's collector; this one describes only
/// its gauge and adds its series to the family at scrape time (the registry merges
/// families of one name), so there is one family for every per-key table.
struct BucketCollector {
    buckets: Arc<AdhocBuckets>,
    evictions: IntCounter,
    family: IntCounterVec,
    held: IntGauge,
    descs: Vec<Desc>,
}

impl BucketCollector {
    fn new(buckets: &Arc<AdhocBuckets>) -> Result<Self, prometheus::Error> {
        let f = Families::unregistered();
        let family = f.limit_evictions()?;
        let evictions = family.with_label_values(&[API_ORIGIN, "adhoc", "adhoc_bucket"]);
        let held = f.gauge(
            "tollgate_api_buckets",
            "Limiter API ad-hoc buckets holding state (not full).",
        )?;
        let descs = held.desc().into_iter().cloned().collect();
        Ok(Self {
            buckets: buckets.clone(),
            evictions,
            family,
            held,
            descs,
        })
    }
}

impl Collector for BucketCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let total = self.buckets.evictions();
        self.evictions
            .inc_by(total.saturating_sub(self.evictions.get()));
        self.held
            .set(i64::try_from(self.buckets.len()).unwrap_or(i64::MAX));
        let mut families = self.family.collect();
        families.extend(self.held.collect());
        families
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use socket2::SockRef;

    /// The values `bounds` documents: first probe after 60 s idle, every 10 s, 6 probes.
    const IDLE: Duration = Duration::from_secs(60);
    const INTERVAL: Duration = Duration::from_secs(10);
    const PROBES: u32 = 6;

    /// A connected pair on loopback: the accepted side through `accept_with`, and the
    /// client kept open so the accepted socket stays established.
    async fn accepted<F, Fut>(accept_with: F) -> (tokio::net::TcpStream, tokio::net::TcpStream)
    where
        F: FnOnce(TcpListener) -> Fut,
        Fut: std::future::Future<Output = tokio::net::TcpStream>,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        (accept_with(listener).await, client)
    }

    fn assert_keepalive_as_documented(stream: &tokio::net::TcpStream) {
        let sock = SockRef::from(stream);
        assert!(sock.keepalive().unwrap(), "SO_KEEPALIVE on");
        assert_eq!(sock.tcp_keepalive_time().unwrap(), IDLE);
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), INTERVAL);
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), PROBES);
    }

    #[test]
    fn tcp_options_enable_keepalive_with_the_documented_values() {
        let options = tcp_options();
        let ka = options.tcp_keepalive.as_ref().expect("keepalive set");
        assert_eq!(
            (ka.idle, ka.interval, ka.count),
            (IDLE, INTERVAL, PROBES as usize)
        );
        // 0: no TCP_USER_TIMEOUT, the probes alone decide.
        #[cfg(target_os = "linux")]
        assert_eq!(ka.user_timeout, Duration::ZERO);
    }

    #[tokio::test]
    async fn pingora_applies_tcp_options_to_an_accepted_socket_as_documented() {
        // Pingora's listener applies `tcp_keepalive` to each accepted socket with
        // `set_tcp_keepalive` (its accept path is private): apply it the same way to an
        // accepted socket and read the kernel's settings back.
        let (stream, _client) = accepted(|l| async move { l.accept().await.unwrap().0 }).await;
        assert!(
            !SockRef::from(&stream).keepalive().unwrap(),
            "off by default"
        );
        let options = tcp_options();
        let ka = options.tcp_keepalive.as_ref().unwrap();
        pingora::protocols::l4::ext::set_tcp_keepalive(&stream, ka).unwrap();
        assert_keepalive_as_documented(&stream);
    }

    #[tokio::test]
    async fn serve_accepts_with_keepalive_and_nodelay() {
        let (stream, _client) = accepted(|l| async move { accept(&l).await.unwrap().0 }).await;
        assert_keepalive_as_documented(&stream);
        assert!(stream.nodelay().unwrap(), "TCP_NODELAY on");
    }
}
