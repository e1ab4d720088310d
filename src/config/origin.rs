//! The `origins:` section: names, hosts, upstreams, TLS, customer, and each origin's own
//! limits as written (merging with defaults happens in [`super::merge`]).
//!
//! Upstreams given as `host:port` are kept as names: reading a config does no network I/O.
//! The runtime resolves them when it is built (at start and at each reload), so the proxy
//! holds plain addresses and never does DNS on the request path.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::bounds;
use crate::config::limit::parse_limits;
use crate::config::model::{Upstream, UpstreamProtocol};
use crate::config::names::{is_label, label_message};
use crate::config::report::{child, item, At, Pos, Report};
use crate::config::scalar;
use crate::config::spec::LimitSpec;
use crate::config::suggest;
use crate::config::yaml::{Entry, Node};

/// The keys an origin takes.
pub(crate) const ORIGIN_KEYS: [&str; 10] = [
    "hosts",
    "upstreams",
    "tls",
    "sni",
    "tls_verify",
    "customer",
    "connect_timeout",
    "read_timeout",
    "upstream_protocol",
    "limits",
];

/// The range both upstream timeouts accept.
const TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_millis(1), Duration::from_secs(3600));

/// One origin as written, with located hosts for the cross-origin check.
#[derive(Debug)]
pub(crate) struct OriginDraft {
    /// The origin's name.
    pub name: String,
    /// Where the origin's name was written.
    pub pos: Pos,
    /// Host patterns, lower-cased and located.
    pub hosts: Vec<At<String>>,
    /// Upstream addresses and names.
    pub upstreams: Vec<Upstream>,
    /// `tls`.
    pub tls: bool,
    /// `sni`, or the first exact host when `tls` is on.
    pub sni: Option<String>,
    /// `customer`.
    pub customer: Option<String>,
    /// `tls_verify`.
    pub tls_verify: bool,
    /// `connect_timeout`.
    pub connect_timeout: Duration,
    /// `read_timeout`.
    pub read_timeout: Duration,
    /// `upstream_protocol`.
    pub upstream_protocol: UpstreamProtocol,
    /// The origin's own `limits:`, unmerged.
    pub limits: Vec<LimitSpec>,
}

/// Reads every origin; at least one is required.
pub(crate) fn parse_origins(r: &mut Report, node: &Node) -> Vec<OriginDraft> {
    let Some(entries) = scalar::map(r, node, "origins") else {
        return Vec::new();
    };
    if entries.is_empty() {
        r.error(node.pos, "origins", "at least one origin is needed");
    }
    if entries.len() > bounds::MAX_ORIGINS {
        let message = bounds::too_many("origins", entries.len(), bounds::MAX_ORIGINS);
        r.error(node.pos, "origins", message);
        return Vec::new();
    }
    entries.iter().map(|e| parse_origin(r, e)).collect()
}

fn parse_origin(r: &mut Report, entry: &Entry) -> OriginDraft {
    parse_at(r, entry, &child("origins", &entry.key), &entry.key)
}

/// The name of the origin that serves hosts no other origin names (`defaults.unmatched`),
/// and its `origin` metrics label: the label unknown hosts were already counted under.
pub(crate) const UNMATCHED: &str = "_unmatched";

/// `defaults.unmatched`: an origin (upstreams, limits, options) for every host that no
/// origin names, instead of a 404, so that unconfigured traffic can be observed (typically
/// with its limits in shadow mode) before it is configured (Charon's allow-unconfigured).
pub(crate) fn parse_unmatched(r: &mut Report, entry: &Entry) -> OriginDraft {
    parse_at(r, entry, "defaults.unmatched", UNMATCHED)
}

/// Reads the origin `entry` at `path`, named `name`. The unmatched origin takes no
/// `hosts` (it serves every host no other origin names).
fn parse_at(r: &mut Report, entry: &Entry, path: &str, name: &str) -> OriginDraft {
    let unmatched = name == UNMATCHED;
    let path = path.to_string();
    let mut o = OriginDraft {
        name: name.to_string(),
        pos: entry.key_pos,
        hosts: Vec::new(),
        upstreams: Vec::new(),
        tls: false,
        sni: None,
        customer: None,
        tls_verify: true,
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(60),
        upstream_protocol: UpstreamProtocol::Http1,
        limits: Vec::new(),
    };
    if !unmatched && !is_label(&entry.key) {
        r.error(entry.key_pos, &path, label_message("origin", &entry.key));
    }
    if entry.key == crate::config::resources::API_ORIGIN {
        r.error(
            entry.key_pos,
            &path,
            format!(
                "origin name `{}` is taken by the limiter API's resources (their metrics label); pick another",
                entry.key
            ),
        );
    }
    let Some(fields) = scalar::map(r, &entry.value, &path) else {
        return o;
    };
    let (mut sni, mut tls_pos, mut protocol_pos) = (None, None, None);
    for e in fields {
        let sub = child(&path, &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "hosts" if unmatched => r.error(
                e.key_pos,
                &sub,
                "the unmatched origin serves every host that no origin names; it takes no `hosts`",
            ),
            "hosts" => {
                let empty = "`hosts` needs at least one host name";
                o.hosts = list(r, v, &sub, empty, ("host names", bounds::MAX_HOSTS), host);
            }
            "upstreams" => {
                let empty = "`upstreams` needs at least one address";
                let max = ("upstreams", bounds::MAX_UPSTREAMS);
                o.upstreams = list(r, v, &sub, empty, max, upstream)
                    .into_iter()
                    .map(|a| a.v)
                    .collect();
            }
            "tls" => {
                o.tls = scalar::boolean(r, v, &sub).unwrap_or(false);
                tls_pos = Some((v.pos, sub));
            }
            "tls_verify" => o.tls_verify = scalar::boolean(r, v, &sub).unwrap_or(true),
            "sni" => sni = scalar::text(r, v, &sub).map(|s| At::new(s.to_string(), v.pos, &sub)),
            "customer" => o.customer = scalar::text(r, v, &sub).map(str::to_string),
            "connect_timeout" | "read_timeout" => {
                let slot = if e.key == "connect_timeout" {
                    &mut o.connect_timeout
                } else {
                    &mut o.read_timeout
                };
                if let Some(d) = scalar::duration(r, v, &sub, TIMEOUT_RANGE, ("1ms", "1h")) {
                    *slot = d;
                }
            }
            "upstream_protocol" => {
                let names = UpstreamProtocol::NAMES;
                o.upstream_protocol = match scalar::choice(r, v, &sub, "protocol", &names) {
                    Some(1) => UpstreamProtocol::H2,
                    Some(2) => UpstreamProtocol::H2c,
                    _ => UpstreamProtocol::Http1,
                };
                protocol_pos = Some((v.pos, sub));
            }
            "limits" => o.limits = parse_limits(r, v, &sub),
            other => r.error(
                e.key_pos,
                &sub,
                suggest::unknown("key", other, &ORIGIN_KEYS),
            ),
        }
    }
    let required: &[&str] = if unmatched {
        &["upstreams"]
    } else {
        &["hosts", "upstreams"]
    };
    for &required in required {
        if fields.iter().all(|e| e.key != required) {
            r.error(
                entry.key_pos,
                &path,
                format!("missing required field `{required}`"),
            );
        }
    }
    tls_and_sni(r, &mut o, sni, tls_pos);
    if let Some((pos, path)) = protocol_pos {
        match (o.upstream_protocol, o.tls) {
            (UpstreamProtocol::H2, false) => r.error(
                pos,
                &path,
                "`h2` is HTTP/2 over TLS: set `tls: true`, or use `h2c` for plaintext HTTP/2",
            ),
            (UpstreamProtocol::H2c, true) => r.error(
                pos,
                &path,
                "`h2c` is plaintext HTTP/2: use `h2` with `tls: true`",
            ),
            _ => {}
        }
    }
    o
}

/// `sni` without `tls` is a warning; `tls` without `sni` uses the first exact host.
fn tls_and_sni(
    r: &mut Report,
    o: &mut OriginDraft,
    sni: Option<At<String>>,
    tls_pos: Option<(Pos, String)>,
) {
    match (sni, o.tls) {
        (Some(s), true) => o.sni = Some(s.v),
        (Some(s), false) => {
            r.warn(s.pos, &s.path, "`sni` has no effect without `tls: true`");
            o.sni = Some(s.v);
        }
        (None, true) => {
            o.sni = o
                .hosts
                .iter()
                .find(|h| !h.v.starts_with("*."))
                .map(|h| h.v.clone());
            if let (None, Some((pos, path)), false) = (&o.sni, tls_pos, o.hosts.is_empty()) {
                r.error(
                    pos,
                    &path,
                    "every host is a wildcard, so `tls: true` needs an explicit `sni`",
                );
            }
        }
        (None, false) => {}
    }
}

/// A non-empty list of at most `max.1` `max.0` whose items `parse` checks, each error
/// located at its item.
fn list<T>(
    r: &mut Report,
    node: &Node,
    path: &str,
    empty: &str,
    max: (&str, usize),
    parse: fn(&str) -> Result<T, String>,
) -> Vec<At<T>> {
    let Some(items) = scalar::seq(r, node, path) else {
        return Vec::new();
    };
    if items.is_empty() {
        r.error(node.pos, path, empty);
    }
    if items.len() > max.1 {
        r.error(node.pos, path, bounds::too_many(max.0, items.len(), max.1));
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, n) in items.iter().enumerate() {
        let p = item(path, i);
        match scalar::text(r, n, &p).map(parse) {
            Some(Ok(v)) => out.push(At::new(v, n.pos, &p)),
            Some(Err(message)) => r.error(n.pos, &p, message),
            None => {}
        }
    }
    out
}

/// A DNS name: dot-separated labels of letters, digits, `-` and `_`.
pub(crate) fn is_hostname(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A host pattern: `shop.example.com` or `*.shop.example.com`, lower-cased, one trailing
/// dot dropped; or an IPv6 literal (`[2001:db8::1]` or bare), kept bracketed in canonical
/// form as requests carry it.
fn host(text: &str) -> Result<String, String> {
    let lower = text.to_ascii_lowercase();
    if lower.contains("://") {
        return Err(format!(
            "host `{text}` takes no scheme; write just the name, e.g. `shop.example.com`"
        ));
    }
    let inner = lower
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&lower);
    if let Ok(v6) = inner.parse::<std::net::Ipv6Addr>() {
        return Ok(format!("[{v6}]"));
    }
    if lower.contains(':') {
        return Err(format!(
            "host `{text}` takes no port; hosts are matched by name only (write IPv6 literals as `[2001:db8::1]`)"
        ));
    }
    let lower = lower.strip_suffix('.').unwrap_or(&lower);
    if is_hostname(lower.strip_prefix("*.").unwrap_or(lower)) {
        Ok(lower.to_string())
    } else {
        Err(format!(
            "`{text}` is not a valid host name; expected e.g. `shop.example.com` or `*.shop.example.com`"
        ))
    }
}

/// An upstream: an `ip:port` literal, or a `host:port` that the runtime resolves.
fn upstream(text: &str) -> Result<Upstream, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(Upstream::Addr(addr));
    }
    if text.contains("://") {
        return Err(format!(
            "upstream `{text}` takes no scheme; write host:port, e.g. `10.0.0.5:80`"
        ));
    }
    let Some((name, port)) = text.rsplit_once(':') else {
        return Err(format!("upstream `{text}` needs a port, e.g. `{text}:80`"));
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(format!("upstream `{text}` has an invalid port `{port}`"));
    };
    if !is_hostname(name) {
        return Err(format!(
            "upstream `{text}` is not an address of the form ip:port or host:port"
        ));
    }
    Ok(Upstream::Name {
        host: name.to_ascii_lowercase(),
        port,
    })
}
