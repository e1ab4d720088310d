//! The normalized, validated configuration: what the rest of tollgate consumes.
//!
//! Nothing here is YAML: the parser ([`super::parse`]) turns a file into these types after
//! every check passed, with defaults merged into origins, durations in nanoseconds, key
//! parts parsed and overrides fully resolved. Anything holding a `Config` can trust it.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use std::path::PathBuf;

pub use crate::config::rls::{Rls, RlsDescriptor, RlsDomain, RlsLimit, RlsRule};
pub use crate::config::secret::Secret;
pub use crate::limits::lease::LeaseParams;
use crate::limits::{
    AdaptiveBounds, KeyPart, KeySpec, LogWindow, Matcher, RateParams, SketchSize, TieredParams,
    TokenBucketParams,
};

/// A whole, valid configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Process-wide settings.
    pub server: Server,
    /// The limiter API's settings.
    pub api: Api,
    /// Named sets of integer IDs (`segments:`), loaded by the runtime.
    pub segments: Vec<SegmentSpec>,
    /// Shared stores (`stores:`), in file order.
    pub stores: Vec<StoreSpec>,
    /// The in-process store's options (`stores.local`).
    pub local_store: LocalStore,
    /// TLS for the listeners that ask for it (`tls:`): certificates and handshake settings.
    pub tls: Tls,
    /// Origins in file order.
    pub origins: Vec<Origin>,
    /// `defaults.unmatched`: the origin (named `_unmatched`) that serves hosts no origin
    /// names; without it such hosts get 404.
    pub unmatched: Option<Origin>,
    /// `resources:`: named limits for limiter API callers, in file order. A resource is a
    /// [`Limit`] keyed by the command's domain (the `customer` key part).
    pub resources: Vec<Limit>,
    /// `rls:`: Envoy's rate limit service, its ratelimit files read and their rules made
    /// limits.
    pub rls: Rls,
}

/// One `segments.NAME` entry: a roaring-bitmap file of integer IDs and the key part whose
/// value is looked up in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SegmentSpec {
    /// The segment's name, as `match: { segment: NAME }` and group members use it.
    pub name: String,
    /// The file, relative paths resolved against the config file's directory.
    pub file: PathBuf,
    /// The key part whose value (an unsigned integer) is looked up: a value that is not
    /// an integer is not a member.
    pub of: KeyPart,
}

/// A shared (Redis or Valkey) store that limits select with `store: NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreSpec {
    /// The store's name: `store: NAME` in limits, the `store` label of its metrics.
    pub name: String,
    /// Where it is and how it fails.
    pub redis: RedisStoreSpec,
}

/// Where a Redis store is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RedisEndpoint {
    /// `url: redis://host:port/db`.
    Standalone(String),
    /// `urls: [...]` with `cluster: true`: seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

/// What decides while a shared store cannot answer within its budget (`fallback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fallback {
    /// An in-process limiter of the same kind at this instance's share of the limit:
    /// `max / instances` (capacity and refill for buckets), rounded up. The default.
    #[default]
    Local,
    /// Admit everything (fail open).
    Allow,
    /// Reject everything (fail closed).
    Deny,
}

/// How a Redis store is used, wherever it is and whoever uses it: the budget, the
/// breaker, the fallback and the fleet's shape. The config's `stores:` entry
/// ([`RedisStoreSpec`]) and the store library's settings
/// (`crate::store::redis::RedisStoreConfig`) both carry it, so that each field, its
/// meaning and its default are written once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreTuning {
    /// Budget of one request phase for all its calls to the store (`timeout`, default
    /// 5 ms; see `crate::store::budget`): past it the phase's remaining shared limits fall
    /// back. It is also each call's budget outside a phase.
    pub timeout: Duration,
    /// Consecutive failures that open the breaker (`breaker.failures`, default 5).
    pub failures: u32,
    /// Probe interval while the breaker is open (`breaker.probe_every`, default 500 ms).
    pub probe_every: Duration,
    /// What decides while the store cannot (`fallback`, default `local`).
    pub fallback: Fallback,
    /// Fleet size, to share limits while falling back (`instances`, default 1).
    pub instances: u32,
    /// Key prefix in Redis (`prefix`, default `tollgate:`).
    pub prefix: String,
    /// How long an instance's inflight and concurrency units outlive its last renewal
    /// (`lease`, default 10 s; renewed every third of it): a crashed instance's share is
    /// gone after one.
    pub lease: Duration,
}

impl Default for StoreTuning {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(5),
            failures: 5,
            probe_every: Duration::from_millis(500),
            fallback: Fallback::Local,
            instances: 1,
            prefix: "tollgate:".to_string(),
            lease: Duration::from_secs(10),
        }
    }
}

/// A Redis store's settings, with their defaults.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RedisStoreSpec {
    /// Standalone or Cluster.
    pub endpoint: RedisEndpoint,
    /// How it is used ([`StoreTuning`]).
    pub tuning: StoreTuning,
    /// Keys a limit remembers as rejected until their `Retry-After` (`deny_cache`, default
    /// 4096; 0 turns it off).
    pub deny_cache: usize,
    /// The password to log in with (`password_file`), put into each URL when the store
    /// connects, so that it need not be written in the config; `None`: the URL's own, if
    /// any.
    pub password: Option<Secret>,
}

impl Default for RedisStoreSpec {
    fn default() -> Self {
        Self {
            endpoint: RedisEndpoint::Standalone(String::new()),
            tuning: StoreTuning::default(),
            deny_cache: 4096,
            password: None,
        }
    }
}

/// The in-process store's options (`stores: {local: {snapshot, every}}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LocalStore {
    /// Where token buckets, rate windows, sliding logs and tiers are written so that they
    /// survive a restart or an upgrade (`snapshot`, a relative path resolved against the
    /// config file's directory); none by default.
    pub snapshot: Option<PathBuf>,
    /// How often the snapshot is written (`every`, 100 ms to 1 day, default 30 s), besides
    /// at shutdown and upgrade.
    pub every: Duration,
}

impl Default for LocalStore {
    fn default() -> Self {
        Self {
            snapshot: None,
            every: Duration::from_secs(30),
        }
    }
}

/// The `api:` section: the limiter API (Redis protocol) for non-HTTP callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Api {
    /// Bound on the ad-hoc `RL.*` buckets held at once (`api.max_keys`), allocated at
    /// start: a change needs a restart.
    pub max_keys: usize,
    /// Grant and record commands on resources that are not configured
    /// (`api.allow_unconfigured`), so that use can be measured before it is limited.
    pub allow_unconfigured: bool,
    /// The shared store `RL.*` buckets live in (`api.store`); `None` is the in-process
    /// table of `max_keys` buckets.
    pub store: Option<String>,
    /// The password every connection must give (`AUTH`, `HELLO ... AUTH`) before any
    /// other command than `AUTH`, `HELLO`, `PING` and `QUIT` (`api.password_file`, read at
    /// load and trimmed); `None`: no password asked.
    pub password: Option<Secret>,
}

impl Default for Api {
    fn default() -> Self {
        Self {
            max_keys: 100_000,
            allow_unconfigured: false,
            store: None,
            password: None,
        }
    }
}

/// The `server:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// HTTP listeners (`server.listen`). Default `["0.0.0.0:8080"]`, plaintext HTTP/1.1.
    pub listen: Vec<Listener>,
    /// The `/metrics` listener (`server.metrics`); `None` disables it.
    pub metrics: Option<SocketAddr>,
    /// Proxy worker threads (`server.threads`). Default 2.
    pub threads: usize,
    /// Graceful shutdown window (`server.grace_period`). Default 5 s.
    pub grace_period: Duration,
    /// Peers whose `X-Forwarded-For` is believed (`server.trusted_proxies`).
    pub trusted_proxies: Vec<IpNet>,
    /// Lower-cased name of the header carrying the customer ID (`server.customer_header`).
    pub customer_header: Option<String>,
    /// Where tollgate serves its built-in demo upstream (`server.demo_upstream`), if at all.
    pub demo_upstream: Option<SocketAddr>,
    /// Where the limiter API (Redis protocol) listens (`server.limiter_api`), if at all.
    pub limiter_api: Option<SocketAddr>,
    /// Where Envoy's rate limit service (gRPC) listens (`server.rls`), if at all: an
    /// address (plaintext HTTP/2), or `{addr, tls: true}` (TLS with ALPN `h2`, serving the
    /// certificates of `tls:`).
    pub rls: Option<Listener>,
    /// Where the admin API (HTTP) listens (`server.admin`), if at all: never on a proxy
    /// port, loopback in the example config.
    pub admin: Option<SocketAddr>,
    /// The bearer token every admin request must carry (`server.admin_token_file`, read at
    /// load and trimmed); `None`: no token asked.
    pub admin_token: Option<AdminToken>,
    /// This process's name in shared state (`server.instance`); default
    /// `<hostname>:<pid>`, filled in at start.
    pub instance: Option<String>,
    /// Turns every rejection into a grant, still counted as `shadow_rejected`
    /// (`server.kill_switch`): neutralizes a misbehaving limit at once. The admin API can
    /// also switch it at runtime.
    pub kill_switch: bool,
    /// How long a downstream connection may take and how many may be open.
    pub connections: Connections,
    /// The per-request access log (`server.access_log`); `None`: no access log.
    pub access_log: Option<AccessLog>,
}

/// `server.access_log`: where each request's line goes, in which format, and which
/// requests get one. Written off the request path (see `docs/access-log.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    /// The file (relative to the config file's directory), or standard output.
    pub path: AccessLogPath,
    /// `json` (the default: one object per line, what `tollgate simulate` reads) or
    /// `combined` (nginx's).
    pub format: AccessLogFormat,
    /// Which requests are logged (`only`, default `all`).
    pub only: AccessLogOnly,
    /// Whether the path keeps its query (`query: keep`); dropped by default, since a
    /// query can carry tokens.
    pub query: bool,
    /// Request headers added to each line (lower-cased), never a credential.
    pub headers: Vec<String>,
}

/// Where the access log is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogPath {
    /// Standard output (`path: stdout`): for containers and journald.
    Stdout,
    /// A file, created if missing, appended to, reopened when moved or on SIGUSR1.
    File(std::path::PathBuf),
}

/// The access log's line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One JSON object per line with every field (`tollgate simulate` reads it as it is).
    Json,
    /// nginx's `combined` format, for tools that read nothing else.
    Combined,
}

/// Which requests get a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogOnly {
    /// Every request.
    All,
    /// Requests a limit rejected.
    Rejected,
    /// Requests answered with a status of 400 or more, or with none.
    Errors,
}

/// The admin API's bearer token, read from `server.admin_token_file`: a [`Secret`], whose
/// `Debug` form names only the file.
pub type AdminToken = Secret;

/// The bounds on downstream connections (`server.header_timeout`, `keepalive_timeout`,
/// `max_connections`, `max_connections_per_ip`): what keeps slow or idle clients from
/// holding file descriptors and memory (see docs/security.md, "Limits and defaults under
/// attack"). Every one applies live on reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    /// The whole request header must arrive within this time, counted from the accept
    /// (first request) or from its first byte (later requests on a kept-alive connection);
    /// the connection is closed otherwise. A total, not a per-read timeout, so a client
    /// trickling a header line every few seconds cannot hold a connection. Default 60 s
    /// (nginx's `client_header_timeout`).
    pub header_timeout: Duration,
    /// An idle kept-alive connection is closed after this long without a new request.
    /// Zero turns keep-alive off (every response says `Connection: close`). Default 75 s
    /// (nginx's `keepalive_timeout`).
    pub keepalive_timeout: Duration,
    /// Open downstream connections at most; at the cap tollgate stops accepting and new
    /// connections wait in the kernel's listen backlog. `None`: derived at start from the
    /// open-file limit (`RLIMIT_NOFILE`), at most [`Connections::DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: Option<u32>,
    /// Open connections per client IP (the direct peer) at most; a connection above it is
    /// closed at once. `None` (the default): no per-IP cap, since clients behind one NAT or
    /// load balancer share an address.
    pub max_connections_per_ip: Option<u32>,
    /// HTTP/2 streams a client may have open at once on one connection
    /// (`h2_max_streams`, SETTINGS_MAX_CONCURRENT_STREAMS). Default 100 (nginx's
    /// `http2_max_concurrent_streams`).
    pub h2_max_streams: u32,
    /// The largest decoded request header list an HTTP/2 client may send
    /// (`h2_max_header_list`, SETTINGS_MAX_HEADER_LIST_SIZE), in bytes. Default 64 KiB.
    pub h2_max_header_list: u32,
    /// Stream resets (RST_STREAM) one HTTP/2 connection may send per
    /// [`Connections::H2_RESET_WINDOW`] (`h2_max_resets`); past it the connection is closed
    /// (rapid reset, CVE-2023-44487). Default 100.
    pub h2_max_resets: u32,
}

impl Connections {
    /// The ceiling of the derived `max_connections`: at the ~90 KB a connection costs,
    /// about 370 MB.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 4096;

    /// The window `h2_max_resets` counts over: a token bucket of `h2_max_resets` resets
    /// refilled over this time.
    pub const H2_RESET_WINDOW: Duration = Duration::from_secs(10);
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(75),
            max_connections: None,
            max_connections_per_ip: None,
            h2_max_streams: 100,
            h2_max_header_list: 64 * 1024,
            h2_max_resets: 100,
        }
    }
}

/// One `server.listen` entry: a string is plaintext HTTP/1.1; the object form adds TLS,
/// prior-knowledge h2c and the PROXY protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Listener {
    /// Where it binds.
    pub addr: SocketAddr,
    /// TLS, with ALPN `h2` and `http/1.1` (`tls: true`); certificates from `tls:`.
    pub tls: bool,
    /// Prior-knowledge HTTP/2 on a plaintext listener, beside HTTP/1.1 (`h2c: true`).
    pub h2c: bool,
    /// A PROXY protocol (v1 or v2) header precedes every connection (`proxy_protocol:
    /// true`); its client address is believed only from `trusted_proxies`.
    pub proxy_protocol: bool,
}

impl Listener {
    /// A plaintext HTTP/1.1 listener on `addr`.
    pub fn plain(addr: SocketAddr) -> Self {
        Self {
            addr,
            tls: false,
            h2c: false,
            proxy_protocol: false,
        }
    }

    /// Whether it is the string form: nothing but an address.
    pub fn is_plain(&self) -> bool {
        !self.tls && !self.h2c && !self.proxy_protocol
    }
}

impl fmt::Display for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.addr)?;
        for (on, what) in [
            (self.tls, " tls"),
            (self.h2c, " h2c"),
            (self.proxy_protocol, " proxy_protocol"),
        ] {
            if on {
                f.write_str(what)?;
            }
        }
        Ok(())
    }
}

/// The lowest TLS version a listener accepts (`tls.min_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2 (the default): every client of the last decade.
    V1_2,
    /// TLS 1.3 only.
    V1_3,
}

impl TlsVersion {
    /// As written in the config: `1.2` or `1.3`.
    pub fn name(self) -> &'static str {
        match self {
            TlsVersion::V1_2 => "1.2",
            TlsVersion::V1_3 => "1.3",
        }
    }
}

/// One `tls.certificates` entry: a PEM certificate chain (leaf first) and its PEM private
/// key, relative paths resolved against the config file's directory. Which names it serves
/// comes from the certificate's own SAN, read when the runtime is built.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CertSpec {
    /// The certificate chain file.
    pub cert: PathBuf,
    /// The private key file.
    pub key: PathBuf,
}

/// The `tls:` section.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tls {
    /// The certificates, matched by SNI against their SAN names (`tls.certificates`).
    pub certificates: Vec<CertSpec>,
    /// The index in `certificates` of the one served to clients that send no SNI or an
    /// unknown name (`tls.default`, naming its `cert` file); `None` refuses such handshakes.
    pub default: Option<usize>,
    /// The lowest TLS version accepted (`tls.min_version`, default 1.2); 1.0 and 1.1 are
    /// never accepted.
    pub min_version: TlsVersion,
    /// The TLS 1.2 cipher list, in OpenSSL's syntax (`tls.ciphers`); `None`: the modern
    /// default (ECDHE with AES-GCM or ChaCha20-Poly1305 only). TLS 1.3's suites are
    /// OpenSSL's, all AEAD.
    pub ciphers: Option<String>,
    /// The whole TLS handshake (and a PROXY protocol header before it) must be done within
    /// this time from the accept (`tls.handshake_timeout`, default 10 s); the connection is
    /// closed otherwise.
    pub handshake_timeout: Duration,
    /// Certificates tollgate orders and renews itself from an ACME CA (`tls.acme`).
    pub acme: Option<Acme>,
}

/// `tls.acme`: certificates ordered from an RFC 8555 CA (Let's Encrypt, or any other) for
/// the hosts named, one certificate per host, renewed at two thirds of their lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Acme {
    /// The CA's directory URL (`directory`), e.g. Let's Encrypt's
    /// `https://acme-v02.api.letsencrypt.org/directory`.
    pub directory: String,
    /// The account's contact (`email`), for the CA's expiry and policy mail.
    pub email: Option<String>,
    /// The hosts to manage: `hosts`, plus every exact host of every origin with
    /// `from_origins: true` (wildcards need DNS-01, which tollgate does not answer), in
    /// order, without repeats.
    pub hosts: Vec<String>,
    /// Whether `from_origins: true` was written.
    pub from_origins: bool,
    /// Where the account key and the certificates live.
    pub storage: AcmeStorage,
    /// The CA roots trusted for the directory's HTTPS (`ca_roots`, a PEM file); `None`:
    /// the system's.
    pub ca_roots: Option<PathBuf>,
    /// The challenge answered (`challenge`, default `auto`).
    pub challenge: AcmeChallenge,
    /// The first wait after a failed order (`retry.min`, default 1 min); doubled at each
    /// failure up to `retry.max` (default 6 h), each jittered.
    pub retry_min: Duration,
    /// The longest wait between failed orders (`retry.max`).
    pub retry_max: Duration,
}

/// Where `tls.acme` keeps its account key and certificates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AcmeStorage {
    /// `storage: DIR`: files in a directory (mode 0700, files 0600, written atomically).
    Dir(PathBuf),
    /// `store: NAME`: a Redis store of `stores:`, shared by a fleet (one certificate per
    /// host, one instance orders at a time).
    Store(String),
}

/// Which challenge `tls.acme` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcmeChallenge {
    /// TLS-ALPN-01 when a TLS listener exists and the CA offers it, else HTTP-01.
    Auto,
    /// TLS-ALPN-01 on the TLS listeners (port 443 for a public CA).
    TlsAlpn01,
    /// HTTP-01 on the plaintext listeners (port 80 for a public CA).
    Http01,
}

impl AcmeChallenge {
    /// As written in the config.
    pub fn name(self) -> &'static str {
        match self {
            AcmeChallenge::Auto => "auto",
            AcmeChallenge::TlsAlpn01 => "tls-alpn-01",
            AcmeChallenge::Http01 => "http-01",
        }
    }
}

impl Default for Tls {
    fn default() -> Self {
        Self {
            certificates: Vec::new(),
            default: None,
            min_version: TlsVersion::V1_2,
            ciphers: None,
            handshake_timeout: Duration::from_secs(10),
            acme: None,
        }
    }
}

/// One `origins.NAME` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    /// The origin's name: a metrics label.
    pub name: String,
    /// Host patterns, lower-cased: `example.com` or `*.example.com`.
    pub hosts: Vec<String>,
    /// Upstream servers, picked round robin; names are resolved when the runtime is built.
    pub upstreams: Vec<Upstream>,
    /// Reach the upstreams over TLS.
    pub tls: bool,
    /// The SNI (and certificate name) for TLS upstreams; defaults to the first host.
    pub sni: Option<String>,
    /// Verify the upstream's certificate chain and name (`tls_verify`, default true).
    /// Off only for upstreams with self-signed certificates on a trusted network.
    pub tls_verify: bool,
    /// The customer used when the request carries no customer header.
    pub customer: Option<String>,
    /// Upstream connect timeout (`connect_timeout`, default 5 s).
    pub connect_timeout: Duration,
    /// How long an upstream response may stall before tollgate answers 504
    /// (`read_timeout`, default 60 s).
    pub read_timeout: Duration,
    /// The HTTP version spoken to the upstreams (`upstream_protocol`, default `http1`).
    pub upstream_protocol: UpstreamProtocol,
    /// Limits in the order they run: defaults first (in their order), then the origin's own.
    pub limits: Vec<Limit>,
}

/// The HTTP version tollgate speaks to an origin's upstreams (`upstream_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (the default), over TLS when `tls` is on.
    #[default]
    Http1,
    /// HTTP/2 over TLS, negotiated by ALPN (needs `tls: true`); streams share connections.
    H2,
    /// HTTP/2 in plaintext with prior knowledge (gRPC services without TLS).
    H2c,
}

impl UpstreamProtocol {
    /// The names `upstream_protocol` takes, in variant order.
    pub const NAMES: [&'static str; 3] = ["http1", "h2", "h2c"];

    /// As written in the config.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// An upstream server as written: an address, or a name that the runtime resolves when it
/// is built (at start and at each reload), so that reading a config never does network I/O.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Upstream {
    /// `ip:port`.
    Addr(SocketAddr),
    /// `host:port`.
    Name {
        /// The DNS name.
        host: String,
        /// The port.
        port: u16,
    },
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Upstream::Addr(addr) => write!(f, "{addr}"),
            Upstream::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// A limit's kind, as written in `kind:` and in the `kind` metrics label.
///
/// The names are the variants in snake case, derived once (parsing, display, the list in
/// messages), so a new kind is one line here plus its fields in `spec.rs`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantNames,
    strum::EnumIter,
)]
#[strum(serialize_all = "snake_case")]
pub enum Kind {
    /// Count-min estimate of requests in flight; 503 above `max`.
    Inflight,
    /// Sliding-window estimate of requests per period; 429 above `max`.
    Rate,
    /// Exact per-key token bucket; 429 when empty.
    TokenBucket,
    /// Charon's burst tiers with hard and global limits; 429.
    Tiered,
    /// Exact copies held per key, globally and per group; 503.
    Concurrency,
    /// Exact sliding log over several windows (frequency caps); 429.
    SlidingLog,
}

impl Kind {
    /// The name written in the config.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Every kind's name, in declaration order.
    pub fn names() -> &'static [&'static str] {
        <Kind as strum::VariantNames>::VARIANTS
    }

    /// The key a limit of this kind gets when `key` is not given.
    pub fn default_key(self) -> Vec<KeyPart> {
        match self {
            Kind::Inflight => vec![KeyPart::Customer, KeyPart::ServerIp, KeyPart::Host],
            Kind::Concurrency => vec![KeyPart::Customer],
            Kind::Rate | Kind::TokenBucket | Kind::Tiered | Kind::SlidingLog => {
                vec![KeyPart::ClientIp]
            }
        }
    }

    /// Whether the kind holds a unit for the whole time the upstream works on the request
    /// (and so is decided once the upstream server is picked, where `server_ip` is known),
    /// rather than deciding once at request time.
    pub fn holds_upstream(self) -> bool {
        matches!(self, Kind::Inflight | Kind::Concurrency)
    }

    /// 503 for capacity kinds (the origin is busy), 429 for quota kinds (the client
    /// asked too often).
    pub fn reject_status(self) -> u16 {
        if self.holds_upstream() {
            503
        } else {
            429
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a limit's rejections are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Reject (the default).
    #[default]
    Enforce,
    /// Decide, count and log, but let the request through.
    Shadow,
}

/// When a limit adds the `RateLimit` / `RateLimit-Policy` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HeadersMode {
    /// Only on its own rejections (the default).
    #[default]
    OnReject,
    /// On every response to a request it decided, admitted ones too.
    Always,
}

/// A token-bucket request's cost.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cost {
    /// Every request costs this many tokens.
    Fixed(u64),
    /// The cost is read from this (lower-cased) request header, clamped to `[1, capacity]`.
    Header(String),
}

/// `max: auto` (or `max: {auto: {min, max, initial}}`) with `share`: an inflight limit whose
/// max is learned from each upstream server's latency (`crate::limits::adaptive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AutoMax {
    /// Where each server's learned limit starts and what it may reach.
    pub bounds: AdaptiveBounds,
    /// `share`, percent (1 to 100, default 100): a key's max is this share of what the
    /// server it names takes, so that one customer cannot fill a server while others wait.
    pub share: u8,
}

impl AutoMax {
    /// A key's max given what its server (or the origin, for keys without `server_ip`)
    /// takes: `learned × share / 100`, at least 1.
    pub fn share_of(&self, learned: u64) -> u64 {
        (learned.saturating_mul(u64::from(self.share)) / 100).max(1)
    }
}

/// The kind of a limit and the parameters that kind takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LimitParams {
    /// `kind: inflight`: at most `max` concurrent requests per key; 503 above it.
    Inflight {
        /// Allowed in flight per key. `0` (in an override) blocks. Under `max: auto`, the
        /// `initial` bound (what a server nothing was learned about gets).
        max: u64,
        /// Sketch size (`sketch: {hashes, slots}`).
        sketch: SketchSize,
        /// `max: auto`: the max is learned per upstream server (see [`AutoMax`]).
        auto: Option<AutoMax>,
    },
    /// `kind: rate`: sliding window, exact per key; 429 above it.
    Rate {
        /// `max`, `per`, `strict`.
        rate: RateParams,
        /// Bound on keys holding state (`max_keys`).
        max_keys: usize,
    },
    /// `kind: token_bucket`: exact per-key bucket; 429 when empty.
    TokenBucket {
        /// `capacity`, `refill`, `strict`.
        bucket: TokenBucketParams,
        /// `cost`.
        cost: Cost,
        /// Bound on keys holding state (`max_keys`).
        max_keys: usize,
    },
    /// `kind: tiered`: Charon's burst tiers; 429.
    Tiered {
        /// The normalized tiers, `hard_limit` and `global_limit`.
        tiered: TieredParams,
        /// Bound on keys holding state (`max_keys`).
        max_keys: usize,
    },
    /// `kind: concurrency`: exact copies per key, globally and per group; 503.
    Concurrency {
        /// Copies one key may hold (`max`, the domain limit); 0 (in an override) blocks.
        max: u64,
        /// Copies all keys together may hold (`global`).
        global: Option<u64>,
        /// Bulkheads: each group's members share its `max`.
        groups: Vec<Group>,
        /// Bound on keys holding copies (`max_keys`).
        max_keys: usize,
    },
    /// `kind: sliding_log`: exact frequency caps over one or more windows; 429.
    SlidingLog {
        /// `windows: [{max, per}, ...]`.
        windows: Vec<LogWindow>,
        /// `cost`.
        cost: Cost,
        /// Bound on keys holding a log (`max_keys`).
        max_keys: usize,
    },
}

/// A concurrency group (a bulkhead): its members share `max` copies.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    /// The group's name: the `group` label of `tollgate_concurrency_in_use`.
    pub name: String,
    /// Who belongs to it.
    pub members: Members,
    /// Copies the members hold together.
    pub max: u64,
}

/// A group's members.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Members {
    /// Requests whose `part` has one of these exact values (`members: {customer: [a, b]}`).
    Values {
        /// The key part compared.
        part: KeyPart,
        /// The values, exact bytes.
        values: Vec<Box<[u8]>>,
    },
    /// Requests whose value of the segment's `of` part is in the segment
    /// (`members: {segment: NAME}`).
    Segment {
        /// The segment's key part.
        part: KeyPart,
        /// The segment's name.
        name: String,
    },
}

impl LimitParams {
    /// The kind these parameters belong to.
    pub fn kind(&self) -> Kind {
        match self {
            LimitParams::Inflight { .. } => Kind::Inflight,
            LimitParams::Rate { .. } => Kind::Rate,
            LimitParams::TokenBucket { .. } => Kind::TokenBucket,
            LimitParams::Tiered { .. } => Kind::Tiered,
            LimitParams::Concurrency { .. } => Kind::Concurrency,
            LimitParams::SlidingLog { .. } => Kind::SlidingLog,
        }
    }

    /// Whether a limit of these parameters in a Redis store leases its hot keys' quota:
    /// token buckets, rates, inflight, and concurrency without a global or group counter
    /// (a block of slots spans one counter; see `docs/fleet.md`).
    pub fn leases(&self) -> bool {
        match self {
            LimitParams::Inflight { .. }
            | LimitParams::Rate { .. }
            | LimitParams::TokenBucket { .. } => true,
            LimitParams::Concurrency { global, groups, .. } => {
                global.is_none() && groups.is_empty()
            }
            LimitParams::Tiered { .. } | LimitParams::SlidingLog { .. } => false,
        }
    }
}

/// One named limit of an origin, after defaults were merged in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Limit {
    /// The limit's name: a metrics label and the policy name in headers and problem bodies.
    pub name: String,
    /// The key parts.
    pub key: KeySpec,
    /// Enforce or shadow.
    pub mode: Mode,
    /// When to add RateLimit headers.
    pub headers: HeadersMode,
    /// Kind and parameters for requests that match no override.
    pub params: LimitParams,
    /// The shared store its state lives in (`store: NAME`); `None` is the in-process
    /// store.
    pub store: Option<String>,
    /// How a hot key's quota is leased from the shared store (`lease:`, default `auto` on
    /// a Redis store for token buckets, rates, concurrency and inflight); `None`: one call
    /// per decision (`lease: off`, a local limit, or a kind that stays exact).
    pub lease: Option<LeaseParams>,
    /// Special cases, first match wins; each has its own state.
    pub overrides: Vec<Override>,
    /// `match:`: the requests the limit applies to (all its conditions hold; empty: every
    /// request). Any other request passes it untouched, counted as `skipped`.
    pub scope: Vec<Matcher>,
    /// `top_keys: N`: keep a heavy-hitter sketch of this limit's keys for the admin API's
    /// `/top` (its `N` heaviest keys); `None` (the default) keeps none and costs nothing.
    pub top_keys: Option<usize>,
}

/// `overrides: [{match: {...}, FIELD: VALUE}]`, resolved against its limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Override {
    /// All must match.
    pub matchers: Vec<Matcher>,
    /// The limit's parameters with the override's fields applied; same kind.
    pub params: LimitParams,
    /// The limit's mode, unless the override sets its own.
    pub mode: Mode,
}

/// Whether a diagnostic makes the config unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The config is refused.
    Error,
    /// Suspicious but valid.
    Warning,
}

/// A problem found in a config file, with its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// The file as given.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Dotted field path, e.g. `origins.shop.limits.per_client.max`.
    pub path: String,
    /// What is wrong, and what to do instead.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    /// `FILE:LINE:COLUMN: field.path: message` for an error and
    /// `FILE:LINE:COLUMN: field.path: warning: message` for a warning: the format editors
    /// and CI annotate, the same in `tollgate check` and in the logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Error => "",
            Severity::Warning => "warning: ",
        };
        write!(
            f,
            "{}:{}:{}: {}: {severity}{}",
            self.file, self.line, self.column, self.path, self.message
        )
    }
}
