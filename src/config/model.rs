//! The normalized, validated configuration: what the rest of tollgate consumes.
//!
//! Nothing here is YAML: the parser ([`super::parse`]) turns a file into these types after
//! every check passed, with defaults merged into origins, durations in nanoseconds, key
//! parts parsed and overrides fully resolved. Anything holding a `Config` can trust it.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::limits::{KeySpec, Matcher, RateParams, SketchSize, TokenBucketParams};

/// A whole, valid configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Process-wide settings.
    pub server: Server,
    /// Origins in file order.
    pub origins: Vec<Origin>,
}

/// The `server:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// HTTP listeners (`server.listen`). Default `["0.0.0.0:8080"]`.
    pub listen: Vec<SocketAddr>,
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
}

/// One `origins.NAME` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    /// The origin's name: a metrics label.
    pub name: String,
    /// Host patterns, lower-cased: `example.com` or `*.example.com`.
    pub hosts: Vec<String>,
    /// Upstream servers, picked round robin.
    pub upstreams: Vec<SocketAddr>,
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
    /// Limits in the order they run: defaults first (in their order), then the origin's own.
    pub limits: Vec<Limit>,
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

/// The kind of a limit and the parameters that kind takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LimitParams {
    /// `kind: inflight`: at most `max` concurrent requests per key; 503 above it.
    Inflight {
        /// Allowed in flight per key. `0` (in an override) blocks.
        max: u64,
        /// Sketch size (`sketch: {hashes, slots}`).
        sketch: SketchSize,
    },
    /// `kind: rate`: sliding window; 429 above it.
    Rate {
        /// `max`, `per`, `strict`.
        rate: RateParams,
        /// Sketch size (`sketch: {hashes, slots}`).
        sketch: SketchSize,
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
}

impl LimitParams {
    /// The kind's name, as written in the config and in metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            LimitParams::Inflight { .. } => "inflight",
            LimitParams::Rate { .. } => "rate",
            LimitParams::TokenBucket { .. } => "token_bucket",
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
    /// Special cases, first match wins; each has its own state.
    pub overrides: Vec<Override>,
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

/// A problem found in a config file, with its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
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

impl std::fmt::Display for Diagnostic {
    /// `FILE:LINE:COLUMN: field.path: message`, the format editors and CI annotate.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file, self.line, self.column, self.path, self.message
        )
    }
}
