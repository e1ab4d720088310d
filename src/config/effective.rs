//! The effective config: what tollgate runs after defaults are merged into every origin,
//! written back as YAML (`tollgate check --print-effective`; the admin API reuses it).
//!
//! Every origin lists every limit it really runs, each with every parameter explicit
//! (defaults filled in), and overrides show only what they change. The output is itself a
//! valid config that parses back to the same model (a test holds it to that), so it can be
//! diffed, reviewed, or fed back to `tollgate check`. Secrets are never printed: a token or
//! password read from a file is named by its file, and a password written into a store's
//! URL is printed as `REDACTED` (`redis://:REDACTED@host`), so such a config parses back
//! to the same model but for that password.

use std::time::Duration;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::config::model::{
    Config, Cost, Fallback, Group, HeadersMode, Kind, Limit, LimitParams, Listener, Members, Mode,
    Origin, RedisEndpoint, Secret, Server, Tls,
};
use crate::config::secret::redact_url;
use crate::limits::{MatchValue, Matcher, Nanos, SketchSize};

/// The effective config as YAML text.
pub fn to_yaml(config: &Config) -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(&EffConfig::of(config))
}

/// A map whose entries keep their order (origins and limits run in config order).
struct Ordered<T>(Vec<(String, T)>);

impl<T> Ordered<T> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: Serialize> Serialize for Ordered<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

fn duration(nanos: Nanos) -> String {
    humantime::format_duration(Duration::from_nanos(nanos)).to_string()
}

fn span(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[derive(Serialize)]
struct EffConfig {
    server: EffServer,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<EffTls>,
    api: EffApi,
    #[serde(skip_serializing_if = "Ordered::is_empty")]
    stores: Ordered<EffStore>,
    #[serde(skip_serializing_if = "Ordered::is_empty")]
    segments: Ordered<EffSegment>,
    #[serde(skip_serializing_if = "Option::is_none")]
    defaults: Option<EffDefaults>,
    origins: Ordered<EffOrigin>,
    #[serde(skip_serializing_if = "Ordered::is_empty")]
    resources: Ordered<EffLimit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rls: Option<EffRls>,
}

/// `rls:` as configured; its files' rules are printed by their own files, not here.
#[derive(Serialize)]
struct EffRls {
    config_dir: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<String>,
    max_keys: usize,
    window: &'static str,
}

impl EffConfig {
    fn of(c: &Config) -> Self {
        Self {
            server: EffServer::of(&c.server),
            tls: EffTls::of(&c.tls),
            api: EffApi {
                max_keys: c.api.max_keys,
                allow_unconfigured: c.api.allow_unconfigured,
                store: c.api.store.clone(),
                password_file: c.api.password.as_ref().map(secret_file),
            },
            defaults: c.unmatched.as_ref().map(|o| EffDefaults {
                unmatched: EffOrigin::of(o),
            }),
            stores: EffStore::all(c),
            segments: Ordered(
                c.segments
                    .iter()
                    .map(|s| {
                        let seg = EffSegment {
                            file: s.file.display().to_string(),
                            of: s.of.to_string(),
                        };
                        (s.name.clone(), seg)
                    })
                    .collect(),
            ),
            origins: Ordered(
                c.origins
                    .iter()
                    .map(|o| (o.name.clone(), EffOrigin::of(o)))
                    .collect(),
            ),
            resources: Ordered(
                c.resources
                    .iter()
                    .map(|l| (l.name.clone(), EffLimit::resource(l)))
                    .collect(),
            ),
            rls: c.rls.config_dir.as_ref().map(|dir| EffRls {
                config_dir: dir.display().to_string(),
                store: c.rls.store.clone(),
                max_keys: c.rls.max_keys,
                window: c.rls.window.name(),
            }),
        }
    }
}

/// Only the unmatched origin is printed under `defaults`: default limits are shown merged
/// into every origin (and into the unmatched origin).
#[derive(Serialize)]
struct EffDefaults {
    unmatched: EffOrigin,
}

/// A store: the local store's options, or a Redis store's.
#[derive(Serialize)]
#[serde(untagged)]
enum EffStore {
    Local {
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        snapshot: Option<String>,
        every: String,
    },
    Redis {
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        url: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        urls: Option<Vec<String>>,
        cluster: bool,
        timeout: String,
        breaker: EffBreaker,
        fallback: &'static str,
        instances: u32,
        prefix: String,
        lease: String,
        deny_cache: usize,
        /// The file only: the password itself is never printed.
        #[serde(skip_serializing_if = "Option::is_none")]
        password_file: Option<String>,
    },
}

#[derive(Serialize)]
struct EffBreaker {
    failures: u32,
    probe_every: String,
}

impl EffStore {
    fn all(c: &Config) -> Ordered<EffStore> {
        let mut out = Vec::new();
        let l = &c.local_store;
        if l.snapshot.is_some() {
            out.push((
                "local".to_string(),
                EffStore::Local {
                    kind: "local",
                    snapshot: l.snapshot.as_ref().map(|p| p.display().to_string()),
                    every: span(l.every),
                },
            ));
        }
        for s in &c.stores {
            let r = &s.redis;
            // A password written into a URL is printed as `REDACTED` (see
            // `secret::REDACTED`); one in a `password_file` is named by its file.
            let shown = |u: &String| redact_url(u).into_owned();
            let (url, urls, cluster) = match &r.endpoint {
                RedisEndpoint::Standalone(u) => (Some(shown(u)), None, false),
                RedisEndpoint::Cluster(list) => {
                    (None, Some(list.iter().map(shown).collect()), true)
                }
            };
            let store = EffStore::Redis {
                kind: "redis",
                url,
                urls,
                cluster,
                timeout: span(r.tuning.timeout),
                breaker: EffBreaker {
                    failures: r.tuning.failures,
                    probe_every: span(r.tuning.probe_every),
                },
                fallback: match r.tuning.fallback {
                    Fallback::Local => "local",
                    Fallback::Allow => "allow",
                    Fallback::Deny => "deny",
                },
                instances: r.tuning.instances,
                prefix: r.tuning.prefix.clone(),
                lease: span(r.tuning.lease),
                deny_cache: r.deny_cache,
                password_file: r.password.as_ref().map(secret_file),
            };
            out.push((s.name.clone(), store));
        }
        Ordered(out)
    }
}

/// A segment's file is printed as resolved (relative to the directory `check` ran in when
/// the config named it relatively).
#[derive(Serialize)]
struct EffSegment {
    file: String,
    of: String,
}

#[derive(Serialize)]
struct EffApi {
    max_keys: usize,
    allow_unconfigured: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<String>,
    /// The file only: the password itself is never printed.
    #[serde(skip_serializing_if = "Option::is_none")]
    password_file: Option<String>,
}

/// A secret's file as printed (resolved), never its value.
fn secret_file(s: &Secret) -> String {
    s.file.display().to_string()
}

/// A listener as written: the string form when it is plain HTTP/1.1, else the object.
#[derive(Serialize)]
#[serde(untagged)]
enum EffListener {
    Plain(String),
    Object {
        addr: String,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        tls: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        h2c: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        proxy_protocol: bool,
    },
}

impl EffListener {
    fn of(l: &Listener) -> Self {
        if l.is_plain() {
            return EffListener::Plain(l.addr.to_string());
        }
        EffListener::Object {
            addr: l.addr.to_string(),
            tls: l.tls,
            h2c: l.h2c,
            proxy_protocol: l.proxy_protocol,
        }
    }
}

/// A certificate's files, as resolved.
#[derive(Serialize)]
struct EffCert {
    cert: String,
    key: String,
}

/// `tls:`, printed only when it has certificates.
#[derive(Serialize)]
struct EffTls {
    certificates: Vec<EffCert>,
    #[serde(skip_serializing_if = "Option::is_none")]
    default: Option<String>,
    min_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ciphers: Option<String>,
    handshake_timeout: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    acme: Option<EffAcme>,
}

/// `tls.acme`, hosts resolved (`from_origins` expanded).
#[derive(Serialize)]
struct EffAcme {
    directory: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    email: Option<String>,
    hosts: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_roots: Option<String>,
    challenge: &'static str,
    retry: EffRetry,
}

#[derive(Serialize)]
struct EffRetry {
    min: String,
    max: String,
}

impl EffAcme {
    fn of(a: &crate::config::Acme) -> Self {
        let (storage, store) = match &a.storage {
            crate::config::AcmeStorage::Dir(d) => (Some(d.display().to_string()), None),
            crate::config::AcmeStorage::Store(s) => (None, Some(s.clone())),
        };
        Self {
            directory: a.directory.clone(),
            email: a.email.clone(),
            hosts: a.hosts.clone(),
            storage,
            store,
            ca_roots: a.ca_roots.as_ref().map(|p| p.display().to_string()),
            challenge: a.challenge.name(),
            retry: EffRetry {
                min: span(a.retry_min),
                max: span(a.retry_max),
            },
        }
    }
}

impl EffTls {
    fn of(t: &Tls) -> Option<Self> {
        if t.certificates.is_empty() && t.acme.is_none() {
            return None;
        }
        let shown = |p: &std::path::Path| p.display().to_string();
        Some(Self {
            certificates: t
                .certificates
                .iter()
                .map(|c| EffCert {
                    cert: shown(&c.cert),
                    key: shown(&c.key),
                })
                .collect(),
            default: t
                .default
                .and_then(|i| t.certificates.get(i))
                .map(|c| shown(&c.cert)),
            min_version: t.min_version.name(),
            ciphers: t.ciphers.clone(),
            handshake_timeout: span(t.handshake_timeout),
            acme: t.acme.as_ref().map(EffAcme::of),
        })
    }
}

#[derive(Serialize)]
struct EffServer {
    listen: Vec<EffListener>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<String>,
    threads: usize,
    grace_period: String,
    trusted_proxies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    customer_header: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    demo_upstream: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limiter_api: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rls: Option<EffListener>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin: Option<String>,
    /// The file only: the token itself is never printed.
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_token_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<String>,
    kill_switch: bool,
    header_timeout: String,
    keepalive_timeout: String,
    /// Absent: derived from the open-file limit when tollgate starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections_per_ip: Option<u32>,
    h2_max_streams: u32,
    h2_max_header_list: u32,
    h2_max_resets: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    access_log: Option<EffAccessLog>,
}

#[derive(Serialize)]
struct EffAccessLog {
    path: String,
    format: &'static str,
    only: &'static str,
    query: &'static str,
    headers: Vec<String>,
}

impl EffAccessLog {
    fn of(a: &crate::config::AccessLog) -> Self {
        use crate::config::{AccessLogFormat, AccessLogOnly, AccessLogPath};
        Self {
            path: match &a.path {
                AccessLogPath::Stdout => "stdout".to_string(),
                AccessLogPath::File(p) => p.display().to_string(),
            },
            format: match a.format {
                AccessLogFormat::Json => "json",
                AccessLogFormat::Combined => "combined",
            },
            only: match a.only {
                AccessLogOnly::All => "all",
                AccessLogOnly::Rejected => "rejected",
                AccessLogOnly::Errors => "errors",
            },
            query: if a.query { "keep" } else { "drop" },
            headers: a.headers.clone(),
        }
    }
}

impl EffServer {
    fn of(s: &Server) -> Self {
        Self {
            listen: s.listen.iter().map(EffListener::of).collect(),
            metrics: s.metrics.map(|a| a.to_string()),
            threads: s.threads,
            grace_period: span(s.grace_period),
            trusted_proxies: s.trusted_proxies.iter().map(ToString::to_string).collect(),
            customer_header: s.customer_header.clone(),
            demo_upstream: s.demo_upstream.map(|a| a.to_string()),
            limiter_api: s.limiter_api.map(|a| a.to_string()),
            rls: s.rls.as_ref().map(EffListener::of),
            admin: s.admin.map(|a| a.to_string()),
            admin_token_file: s.admin_token.as_ref().map(secret_file),
            instance: s.instance.clone(),
            kill_switch: s.kill_switch,
            header_timeout: span(s.connections.header_timeout),
            keepalive_timeout: span(s.connections.keepalive_timeout),
            max_connections: s.connections.max_connections,
            max_connections_per_ip: s.connections.max_connections_per_ip,
            h2_max_streams: s.connections.h2_max_streams,
            h2_max_header_list: s.connections.h2_max_header_list,
            h2_max_resets: s.connections.h2_max_resets,
            access_log: s.access_log.as_ref().map(EffAccessLog::of),
        }
    }
}

#[derive(Serialize)]
struct EffOrigin {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    hosts: Vec<String>,
    upstreams: Vec<String>,
    tls: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    sni: Option<String>,
    tls_verify: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    customer: Option<String>,
    connect_timeout: String,
    read_timeout: String,
    upstream_protocol: &'static str,
    limits: Ordered<EffLimit>,
}

impl EffOrigin {
    fn of(o: &Origin) -> Self {
        Self {
            hosts: o.hosts.clone(),
            upstreams: o.upstreams.iter().map(ToString::to_string).collect(),
            tls: o.tls,
            sni: o.sni.clone(),
            tls_verify: o.tls_verify,
            customer: o.customer.clone(),
            connect_timeout: span(o.connect_timeout),
            read_timeout: span(o.read_timeout),
            upstream_protocol: o.upstream_protocol.name(),
            limits: Ordered(
                o.limits
                    .iter()
                    .map(|l| (l.name.clone(), EffLimit::of(l)))
                    .collect(),
            ),
        }
    }
}

#[derive(Serialize)]
struct EffLimit {
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<EffLease>,
    key: Vec<String>,
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    scope: Option<Ordered<String>>,
    mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<&'static str>,
    #[serde(flatten)]
    params: EffParams,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_keys: Option<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    overrides: Vec<EffOverride>,
}

/// `lease:` of a limit in a Redis store: `off`, or every setting spelt out.
#[derive(Serialize)]
#[serde(untagged)]
enum EffLease {
    Off(&'static str),
    On {
        hot_above: String,
        max_share: String,
        renew_every: String,
        idle: String,
    },
}

impl EffLease {
    fn of(l: &Limit) -> Option<Self> {
        l.store.as_ref()?;
        Some(match &l.lease {
            Some(p) => EffLease::On {
                hot_above: format!("{}/s", p.hot_above),
                max_share: crate::config::lease::share_text(p.max_share),
                renew_every: duration(p.renew_every),
                idle: duration(p.idle),
            },
            None if matches!(
                l.params.kind(),
                Kind::TokenBucket | Kind::Rate | Kind::Concurrency | Kind::Inflight
            ) =>
            {
                EffLease::Off("off")
            }
            None => return None,
        })
    }
}

fn mode(m: Mode) -> &'static str {
    match m {
        Mode::Enforce => "enforce",
        Mode::Shadow => "shadow",
    }
}

impl EffLimit {
    fn of(l: &Limit) -> Self {
        let base = EffParams::of(&l.params);
        Self {
            kind: l.params.kind().name(),
            store: l.store.clone(),
            lease: EffLease::of(l),
            key: l.key.parts().iter().map(ToString::to_string).collect(),
            scope: (!l.scope.is_empty()).then(|| Ordered(l.scope.iter().map(matcher).collect())),
            mode: mode(l.mode),
            headers: Some(match l.headers {
                HeadersMode::OnReject => "on_reject",
                HeadersMode::Always => "always",
            }),
            overrides: l
                .overrides
                .iter()
                .map(|o| EffOverride {
                    matches: Ordered(o.matchers.iter().map(matcher).collect()),
                    mode: (o.mode != l.mode).then(|| mode(o.mode)),
                    params: EffParams::of(&o.params).changed_from(&base),
                })
                .collect(),
            params: base,
            top_keys: l.top_keys,
        }
    }
}

impl EffLimit {
    /// A resource: a limit without `headers` and `cost` (a command's cost is its copies).
    fn resource(l: &Limit) -> Self {
        let mut eff = Self::of(l);
        eff.headers = None;
        eff.lease = None;
        eff.params.cost = None;
        for o in &mut eff.overrides {
            o.params.cost = None;
        }
        eff
    }
}

fn matcher(m: &Matcher) -> (String, String) {
    let value = match &m.value {
        MatchValue::Exact(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        MatchValue::Prefix(bytes) => format!("{}*", String::from_utf8_lossy(bytes)),
        MatchValue::Net(net) if net.prefix_len() == net.max_prefix_len() => net.addr().to_string(),
        MatchValue::Net(net) => net.to_string(),
        MatchValue::Addr(addr) => addr.to_string(),
        MatchValue::Segment(name) => return ("segment".to_string(), name.clone()),
    };
    (m.part.to_string(), value)
}

#[derive(Serialize)]
struct EffOverride {
    #[serde(rename = "match")]
    matches: Ordered<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'static str>,
    #[serde(flatten)]
    params: EffParams,
}

/// Every parameter a kind has; absent ones are not the kind's (or, in an override,
/// unchanged from the limit's).
#[derive(Serialize, Default, PartialEq)]
struct EffParams {
    #[serde(skip_serializing_if = "Option::is_none")]
    max: Option<EffMax>,
    #[serde(skip_serializing_if = "Option::is_none")]
    share: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    per: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refill: Option<EffRefill>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<EffCost>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sketch: Option<EffSketch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    windows: Option<Vec<EffWindow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tiers: Option<Vec<EffTier>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hard_limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    global_limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    global: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    groups: Option<Vec<EffGroup>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_keys: Option<usize>,
}

/// `max`: a number, or `{auto: {min, max, initial}}` with its bounds spelt out.
#[derive(Serialize, Clone, PartialEq)]
#[serde(untagged)]
enum EffMax {
    Fixed(u64),
    Auto { auto: EffAuto },
}

#[derive(Serialize, Clone, PartialEq)]
struct EffAuto {
    min: u64,
    max: u64,
    initial: u64,
}

impl From<u64> for EffMax {
    fn from(max: u64) -> Self {
        EffMax::Fixed(max)
    }
}

#[derive(Serialize, Clone, PartialEq)]
struct EffWindow {
    max: u64,
    per: String,
}

#[derive(Serialize, Clone, PartialEq)]
struct EffTier {
    limit: u64,
    window: String,
    active: String,
    cooldown: String,
    skippable: bool,
}

#[derive(Serialize, Clone, PartialEq)]
struct EffGroup {
    name: String,
    members: Ordered<EffMembers>,
    max: u64,
}

#[derive(Serialize, Clone, PartialEq)]
#[serde(untagged)]
enum EffMembers {
    Values(Vec<String>),
    Segment(String),
}

impl<T: PartialEq> PartialEq for Ordered<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<T: Clone> Clone for Ordered<T> {
    fn clone(&self) -> Self {
        Ordered(self.0.clone())
    }
}

fn eff_cost(cost: &Cost) -> EffCost {
    match cost {
        Cost::Fixed(c) => EffCost::Fixed(*c),
        Cost::Header(name) => EffCost::Header(format!("header:{name}")),
    }
}

#[derive(Serialize, Clone, PartialEq)]
struct EffRefill {
    amount: u64,
    every: String,
}

#[derive(Serialize, Clone, PartialEq)]
#[serde(untagged)]
enum EffCost {
    Fixed(u64),
    Header(String),
}

#[derive(Serialize, Clone, Copy, PartialEq)]
struct EffSketch {
    hashes: usize,
    slots: usize,
}

impl From<SketchSize> for EffSketch {
    fn from(s: SketchSize) -> Self {
        Self {
            hashes: s.hashes,
            slots: s.slots,
        }
    }
}

impl EffParams {
    fn of(p: &LimitParams) -> Self {
        match p {
            LimitParams::Inflight { max, sketch, auto } => Self {
                max: Some(match auto {
                    Some(a) => EffMax::Auto {
                        auto: EffAuto {
                            min: a.bounds.min,
                            max: a.bounds.max,
                            initial: a.bounds.initial,
                        },
                    },
                    None => EffMax::Fixed(*max),
                }),
                share: auto.map(|a| format!("{}%", a.share)),
                sketch: Some((*sketch).into()),
                ..Self::default()
            },
            LimitParams::Rate { rate, max_keys } => Self {
                max: Some(rate.max.into()),
                per: Some(duration(rate.per)),
                strict: Some(rate.strict),
                max_keys: Some(*max_keys),
                ..Self::default()
            },
            LimitParams::TokenBucket {
                bucket,
                cost,
                max_keys,
            } => Self {
                capacity: Some(bucket.capacity),
                refill: Some(EffRefill {
                    amount: bucket.amount,
                    every: duration(bucket.every),
                }),
                cost: Some(eff_cost(cost)),
                strict: Some(bucket.strict),
                max_keys: Some(*max_keys),
                ..Self::default()
            },
            LimitParams::Tiered { tiered, max_keys } => Self {
                tiers: Some(
                    tiered
                        .tiers
                        .iter()
                        .map(|t| EffTier {
                            limit: t.limit,
                            window: duration(t.window),
                            active: duration(t.active),
                            cooldown: duration(t.cooldown),
                            skippable: t.skippable,
                        })
                        .collect(),
                ),
                hard_limit: tiered.hard_limit,
                global_limit: tiered.global_limit,
                max_keys: Some(*max_keys),
                ..Self::default()
            },
            LimitParams::Concurrency {
                max,
                global,
                groups,
                max_keys,
            } => Self {
                max: Some((*max).into()),
                global: *global,
                groups: Some(groups.iter().map(eff_group).collect()),
                max_keys: Some(*max_keys),
                ..Self::default()
            },
            LimitParams::SlidingLog {
                windows,
                cost,
                max_keys,
            } => Self {
                windows: Some(
                    windows
                        .iter()
                        .map(|w| EffWindow {
                            max: w.max,
                            per: duration(w.per),
                        })
                        .collect(),
                ),
                cost: Some(eff_cost(cost)),
                max_keys: Some(*max_keys),
                ..Self::default()
            },
        }
    }

    /// Only the fields that differ from `base` (what an override changes). `sketch` and
    /// `max_keys` cannot be overridden, so they never differ.
    fn changed_from(self, base: &EffParams) -> Self {
        fn keep<T: PartialEq>(v: Option<T>, base: &Option<T>) -> Option<T> {
            v.filter(|v| Some(v) != base.as_ref())
        }
        Self {
            max: keep(self.max, &base.max),
            share: keep(self.share, &base.share),
            per: keep(self.per, &base.per),
            capacity: keep(self.capacity, &base.capacity),
            refill: keep(self.refill, &base.refill),
            cost: keep(self.cost, &base.cost),
            strict: keep(self.strict, &base.strict),
            windows: keep(self.windows, &base.windows),
            tiers: keep(self.tiers, &base.tiers),
            hard_limit: keep(self.hard_limit, &base.hard_limit),
            global_limit: None,
            global: None,
            groups: None,
            sketch: None,
            max_keys: None,
        }
    }
}

fn eff_group(g: &Group) -> EffGroup {
    let (key, members) = match &g.members {
        Members::Values { part, values } => (
            part.to_string(),
            EffMembers::Values(
                values
                    .iter()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect(),
            ),
        ),
        Members::Segment { name, .. } => ("segment".to_string(), EffMembers::Segment(name.clone())),
    };
    EffGroup {
        name: g.name.clone(),
        members: Ordered(vec![(key, members)]),
        max: g.max,
    }
}

/// `check --print-effective`'s YAML of `config`, after checking that it parses back to the
/// same model (what every test of a printed section asserts first).
#[cfg(test)]
pub(crate) fn printed_back(config: &Config) -> String {
    let yaml = to_yaml(config).unwrap();
    let again = crate::config::parse_str(&yaml, "effective.yaml")
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
        .config;
    assert_eq!(&again, config, "\n{yaml}");
    yaml
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_str;
    use crate::config::tests::example::EXAMPLE;

    #[test]
    fn the_effective_config_parses_back_to_the_same_model() {
        let config = parse_str(EXAMPLE, "ex.yaml").unwrap().config;
        let yaml = printed_back(&config);
        // Defaults are merged in: the origin shows the default limit with its own max.
        assert!(!yaml.contains("defaults"), "{yaml}");
        assert!(yaml.contains("origin_inflight:"), "{yaml}");
        assert!(yaml.contains("max: 200"), "{yaml}");
        // An override shows only what it changes.
        assert!(yaml.contains("capacity: 600"), "{yaml}");
    }

    #[test]
    fn secrets_are_redacted_and_files_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("redis.pw"), "from-a-file\n").unwrap();
        std::fs::write(dir.path().join("api.pw"), "api-secret\n").unwrap();
        let file = dir.path().join("t.yaml");
        let text = "api:\n  password_file: api.pw\nstores:\n  inline: { url: \"redis://:written-secret@127.0.0.1:6379/0\" }\n  cluster: { urls: [\"redis://u:s2@127.0.0.1:7000\"], cluster: true }\n  filed: { url: \"redis://127.0.0.1:6380/1\", password_file: redis.pw }\norigins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";
        let config = parse_str(text, &file.to_string_lossy()).unwrap().config;
        let yaml = to_yaml(&config).unwrap();
        for secret in ["written-secret", "s2", "from-a-file", "api-secret"] {
            assert!(!yaml.contains(secret), "{secret} printed:\n{yaml}");
        }
        assert!(
            yaml.contains("url: redis://:REDACTED@127.0.0.1:6379/0"),
            "{yaml}"
        );
        assert!(
            yaml.contains("- redis://u:REDACTED@127.0.0.1:7000"),
            "{yaml}"
        );
        let pw = dir.path().join("redis.pw");
        assert!(
            yaml.contains(&format!("password_file: {}", pw.display())),
            "{yaml}"
        );
        // Still a valid config: the same model but for the passwords written in URLs.
        let again = parse_str(&yaml, "effective.yaml")
            .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
            .config;
        assert_eq!(again.api, config.api);
        assert_eq!(
            again.stores[2], config.stores[2],
            "a password_file round-trips"
        );
        assert_eq!(
            again.stores[0].redis.endpoint,
            RedisEndpoint::Standalone("redis://:REDACTED@127.0.0.1:6379/0".into())
        );
    }
}
