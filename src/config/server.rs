//! The `server:` section: listeners (proxy, in their string or object form, metrics,
//! limiter API, admin API, demo upstream) and the admin token, threads,
//! shutdown window, trusted proxies, the customer header, the instance name, the kill
//! switch, the bounds on downstream connections (HTTP/2's included) and the access log
//! ([`super::access_log`]), with their defaults.
//!
//! Listener addresses are kept with their locations so that [`super::validate`] can point
//! at the second of two colliding listeners.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::access_log;
use crate::config::model::{AdminToken, Connections, Listener, Server};
use crate::config::report::{child, item, At, Pos, Report};
use crate::config::scalar;
use crate::config::secret;
use crate::config::suggest;
use crate::config::tls;
use crate::config::yaml::Node;

/// The keys `server:` takes.
pub(crate) const SERVER_KEYS: [&str; 21] = [
    "listen",
    "access_log",
    "metrics",
    "limiter_api",
    "rls",
    "admin",
    "admin_token_file",
    "instance",
    "kill_switch",
    "threads",
    "grace_period",
    "trusted_proxies",
    "customer_header",
    "demo_upstream",
    "header_timeout",
    "keepalive_timeout",
    "max_connections",
    "max_connections_per_ip",
    "h2_max_streams",
    "h2_max_header_list",
    "h2_max_resets",
];

/// The keys the object form of `server.rls` takes.
pub(crate) const RLS_LISTENER_KEYS: [&str; 2] = ["addr", "tls"];

/// The most HTTP/2 streams a connection may be allowed at once (`h2_max_streams`).
pub(crate) const MAX_H2_STREAMS: u64 = 10_000;

/// The largest HTTP/2 header list a client may be allowed (`h2_max_header_list`): 1 MiB.
pub(crate) const MAX_H2_HEADER_LIST: u64 = 1 << 20;

/// The most resets per window an HTTP/2 connection may be allowed (`h2_max_resets`).
pub(crate) const MAX_H2_RESETS: u64 = 1_000_000;

/// The largest connection cap accepted: far above what any fd limit allows, low enough to
/// catch a typo.
pub(crate) const MAX_CONNECTIONS: u64 = 1_000_000;

/// The listener used when `listen` is not given.
const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8080);

/// The server settings and where each listener was written.
#[derive(Debug)]
pub(crate) struct ServerDraft {
    /// The settings, defaults filled in.
    pub server: Server,
    /// Every address tollgate binds, located: `listen` items, `metrics`, `demo_upstream`.
    pub binds: Vec<At<SocketAddr>>,
    /// The `listen` items as written, located (none when `listen` is absent).
    pub listeners: Vec<At<Listener>>,
    /// `server.rls` as written, located: a `tls: true` one needs certificates too.
    pub rls: Option<At<Listener>>,
}

/// The `server:` section's defaults: what an absent section or key means.
impl Default for Server {
    fn default() -> Self {
        Self {
            listen: vec![Listener::plain(DEFAULT_LISTEN)],
            metrics: None,
            threads: 2,
            grace_period: Duration::from_secs(5),
            trusted_proxies: Vec::new(),
            customer_header: None,
            demo_upstream: None,
            limiter_api: None,
            rls: None,
            admin: None,
            admin_token: None,
            instance: None,
            kill_switch: false,
            connections: Connections::default(),
            access_log: None,
        }
    }
}

/// Reads the `server:` section, or the defaults when it is absent. `file` is the config
/// file, whose directory a relative `admin_token_file` starts in.
pub(crate) fn parse(r: &mut Report, node: Option<&Node>, file: &str) -> ServerDraft {
    let mut server = Server::default();
    let mut binds = Vec::new();
    let mut listeners = Vec::new();
    let mut rls = None;
    let entries = node
        .and_then(|n| scalar::map(r, n, "server"))
        .unwrap_or_default();
    if entries.iter().all(|e| e.key != "listen") {
        // Not written anywhere: sorts first, so a collision is reported at the other one.
        binds.push(At::new(DEFAULT_LISTEN, Pos::default(), "server.listen"));
    }
    for e in entries {
        let path = child("server", &e.key);
        let v = &e.value;
        match e.key.as_str() {
            "listen" => {
                server.listen.clear();
                if let Some(items) = scalar::seq(r, v, &path) {
                    if items.is_empty() {
                        r.error(v.pos, &path, "`listen` needs at least one address");
                    }
                    for (i, n) in items.iter().enumerate() {
                        let p = item(&path, i);
                        if let Some(l) = tls::listener(r, n, &p) {
                            server.listen.push(l.v);
                            binds.push(At::new(l.v.addr, l.pos, &p));
                            listeners.push(l);
                        }
                    }
                }
            }
            "rls" => {
                // An address, or the listener object: `tls` only (gRPC is HTTP/2 already).
                if let Some(l) = tls::listener(r, v, &path) {
                    if l.v.h2c || l.v.proxy_protocol {
                        r.error(
                            v.pos,
                            &path,
                            format!(
                                "`server.rls` takes {} only (gRPC is HTTP/2 already)",
                                RLS_LISTENER_KEYS.map(|k| format!("`{k}`")).join(" and ")
                            ),
                        );
                    }
                    binds.push(At::new(l.v.addr, l.pos, &path));
                    server.rls = Some(l.v);
                    rls = Some(l);
                }
            }
            "metrics" | "demo_upstream" | "limiter_api" | "admin" => {
                let addr = scalar::socket_addr(r, v, &path);
                if let Some(addr) = addr {
                    binds.push(At::new(addr, v.pos, &path));
                }
                match e.key.as_str() {
                    "metrics" => server.metrics = addr,
                    "demo_upstream" => server.demo_upstream = addr,
                    "admin" => server.admin = addr,
                    _ => server.limiter_api = addr,
                }
            }
            "instance" => {
                if let Some(name) = scalar::text(r, v, &path) {
                    let ok = !name.is_empty()
                        && name.len() <= 128
                        && name.bytes().all(|b| b.is_ascii_graphic());
                    if ok {
                        server.instance = Some(name.to_string());
                    } else {
                        r.error(
                            v.pos,
                            &path,
                            "`instance` must be 1 to 128 printable characters without spaces",
                        );
                    }
                }
            }
            "admin_token_file" => {
                if let Some(name) = scalar::text(r, v, &path) {
                    server.admin_token = admin_token(r, v, &path, file, name);
                }
            }
            "kill_switch" => {
                if let Some(on) = scalar::boolean(r, v, &path) {
                    server.kill_switch = on;
                }
            }
            "threads" => {
                let threads = scalar::int(r, v, &path, 1, 1024);
                if let Some(t) = threads.and_then(|t| usize::try_from(t).ok()) {
                    server.threads = t;
                }
            }
            "grace_period" => {
                let range = (Duration::ZERO, Duration::from_secs(3600));
                if let Some(d) = scalar::duration(r, v, &path, range, ("0s", "1h")) {
                    server.grace_period = d;
                }
            }
            "trusted_proxies" => {
                if let Some(items) = scalar::seq(r, v, &path) {
                    server.trusted_proxies = items
                        .iter()
                        .enumerate()
                        .filter_map(|(i, n)| scalar::net(r, n, &item(&path, i)))
                        .collect();
                }
            }
            "header_timeout" => {
                let range = (Duration::from_millis(100), Duration::from_secs(3600));
                if let Some(d) = scalar::duration(r, v, &path, range, ("100ms", "1h")) {
                    server.connections.header_timeout = d;
                }
            }
            "keepalive_timeout" => {
                let range = (Duration::ZERO, Duration::from_secs(3600));
                if let Some(d) = scalar::duration(r, v, &path, range, ("0s", "1h")) {
                    server.connections.keepalive_timeout = d;
                }
            }
            "max_connections" | "max_connections_per_ip" => {
                let cap = scalar::int(r, v, &path, 1, MAX_CONNECTIONS)
                    .and_then(|n| u32::try_from(n).ok());
                if e.key == "max_connections" {
                    server.connections.max_connections = cap;
                } else {
                    server.connections.max_connections_per_ip = cap;
                }
            }
            "h2_max_streams" => {
                if let Some(n) = scalar::int(r, v, &path, 1, MAX_H2_STREAMS) {
                    server.connections.h2_max_streams = u32::try_from(n).unwrap_or(u32::MAX);
                }
            }
            "h2_max_header_list" => {
                if let Some(n) = scalar::int(r, v, &path, 1024, MAX_H2_HEADER_LIST) {
                    server.connections.h2_max_header_list = u32::try_from(n).unwrap_or(u32::MAX);
                }
            }
            "h2_max_resets" => {
                if let Some(n) = scalar::int(r, v, &path, 1, MAX_H2_RESETS) {
                    server.connections.h2_max_resets = u32::try_from(n).unwrap_or(u32::MAX);
                }
            }
            "access_log" => server.access_log = access_log::parse(r, v, &path, file),
            "customer_header" => {
                if let Some(name) = scalar::text(r, v, &path) {
                    if crate::limits::key::is_header_name(name) {
                        server.customer_header = Some(name.to_ascii_lowercase());
                    } else {
                        r.error(
                            v.pos,
                            &path,
                            format!("`{name}` is not a valid HTTP header name"),
                        );
                    }
                }
            }
            other => r.error(
                e.key_pos,
                &path,
                suggest::unknown("key", other, &SERVER_KEYS),
            ),
        }
    }
    ServerDraft {
        server,
        binds,
        listeners,
        rls,
    }
}

/// Reads the admin token from `name` (relative to the config file's directory): the
/// whole file, trimmed (see [`secret::read`]).
fn admin_token(r: &mut Report, v: &Node, path: &str, file: &str, name: &str) -> Option<AdminToken> {
    let what = ("the admin token", "`Authorization: Bearer TOKEN`");
    secret::read(r, v, path, file, name, what)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::model::Connections;
    use crate::config::{parse_str, ConfigError};

    const ORIGIN: &str = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";

    fn connections(server: &str) -> Result<Connections, Vec<String>> {
        match parse_str(&format!("server:\n{server}{ORIGIN}"), "t.yaml") {
            Ok(l) => Ok(l.config.server.connections),
            Err(ConfigError::Invalid(d)) => Err(d.iter().map(ToString::to_string).collect()),
            Err(e) => Err(vec![e.to_string()]),
        }
    }

    #[test]
    fn connection_bounds_default_to_nginx_like_values() {
        let c = connections("  threads: 2\n").unwrap();
        assert_eq!(c, Connections::default());
        assert_eq!(c.header_timeout, Duration::from_secs(60));
        assert_eq!(c.keepalive_timeout, Duration::from_secs(75));
        assert_eq!(c.max_connections, None);
        assert_eq!(c.max_connections_per_ip, None);
    }

    #[test]
    fn connection_bounds_are_read_and_checked() {
        let c = connections(
            "  header_timeout: 1s\n  keepalive_timeout: 0s\n  max_connections: 100\n  max_connections_per_ip: 10\n",
        )
        .unwrap();
        assert_eq!(c.header_timeout, Duration::from_secs(1));
        assert_eq!(c.keepalive_timeout, Duration::ZERO);
        assert_eq!(c.max_connections, Some(100));
        assert_eq!(c.max_connections_per_ip, Some(10));

        let e = connections("  header_timeout: 10ms\n").unwrap_err();
        assert_eq!(e, ["t.yaml:2:19: server.header_timeout: duration `10ms` is out of range: must be between 100ms and 1h"]);
        let e = connections("  max_connections: 0\n").unwrap_err();
        assert_eq!(
            e,
            ["t.yaml:2:20: server.max_connections: must be between 1 and 1000000, found 0"]
        );
        let e = connections("  max_conections: 5\n").unwrap_err();
        assert!(e[0].contains("did you mean `max_connections`"), "{e:?}");
    }

    fn server_in(
        dir: &std::path::Path,
        server: &str,
    ) -> Result<crate::config::Server, Vec<String>> {
        let file = dir.join("t.yaml");
        let file = file.to_string_lossy();
        match parse_str(&format!("server:\n{server}{ORIGIN}"), &file) {
            Ok(l) => Ok(l.config.server),
            Err(ConfigError::Invalid(d)) => Err(d.iter().map(ToString::to_string).collect()),
            Err(e) => Err(vec![e.to_string()]),
        }
    }

    #[test]
    fn the_admin_token_is_read_trimmed_relative_to_the_config_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "  s3cret-token\n").unwrap();
        let s = server_in(
            dir.path(),
            "  admin: \"127.0.0.1:9180\"\n  admin_token_file: token\n",
        )
        .unwrap();
        assert_eq!(s.admin, Some("127.0.0.1:9180".parse().unwrap()));
        let token = s.admin_token.unwrap();
        assert_eq!(token.value, "s3cret-token");
        assert_eq!(token.file, dir.path().join("token"));
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn an_empty_or_missing_token_file_is_an_error_at_the_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("empty"), " \n").unwrap();
        let e = server_in(dir.path(), "  admin_token_file: empty\n").unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("t.yaml:2:21: server.admin_token_file: the admin token file"),
            "{e:?}"
        );
        assert!(e[0].contains("is empty"), "{e:?}");
        let e = server_in(dir.path(), "  admin_token_file: nowhere\n").unwrap_err();
        assert!(
            e[0].contains("server.admin_token_file: cannot read the admin token file"),
            "{e:?}"
        );
        std::fs::write(dir.path().join("spaced"), "two words").unwrap();
        let e = server_in(dir.path(), "  admin_token_file: spaced\n").unwrap_err();
        assert!(e[0].contains("printable ASCII"), "{e:?}");
        assert!(
            !e[0].contains("two words"),
            "the token is never shown: {e:?}"
        );
    }

    #[test]
    fn top_keys_is_bounded_and_allowed_in_defaults() {
        let text = "defaults:\n  limits:\n    d: {kind: rate, max: 1, per: 1s, top_keys: 5}\norigins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n    limits:\n      own: {kind: rate, max: 1, per: 1s, top_keys: 1000}\n";
        let c = parse_str(text, "t.yaml").unwrap().config;
        let tops: Vec<_> = c.origins[0].limits.iter().map(|l| l.top_keys).collect();
        assert_eq!(tops, [Some(5), Some(1000)]);
        let bad = text.replace("top_keys: 1000", "top_keys: 1001");
        let Err(ConfigError::Invalid(d)) = parse_str(&bad, "t.yaml") else {
            panic!("1001 accepted");
        };
        assert_eq!(
            d[0].to_string(),
            "t.yaml:9:52: origins.a.limits.own.top_keys: too large: must be at most 1000, found 1001"
        );
        let over = text.replace(
            "top_keys: 1000",
            "overrides: [{match: {method: GET}, top_keys: 3}]",
        );
        assert!(
            parse_str(&over, "t.yaml").is_err(),
            "an override cannot change top_keys"
        );
    }
}
