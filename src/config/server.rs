//! The `server:` section: listeners (proxy, metrics, limiter API, demo upstream), threads,
//! shutdown window, trusted proxies, the customer header, the instance name, the kill
//! switch and the bounds on downstream connections, with their defaults.
//!
//! Listener addresses are kept with their locations so that [`super::validate`] can point
//! at the second of two colliding listeners.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::model::{Connections, Server};
use crate::config::report::{child, item, At, Pos, Report};
use crate::config::scalar;
use crate::config::suggest;
use crate::config::yaml::Node;

/// The keys `server:` takes.
pub(crate) const SERVER_KEYS: [&str; 14] = [
    "listen",
    "metrics",
    "limiter_api",
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
];

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
}

/// Reads the `server:` section, or the defaults when it is absent.
pub(crate) fn parse(r: &mut Report, node: Option<&Node>) -> ServerDraft {
    let mut server = Server {
        listen: vec![DEFAULT_LISTEN],
        metrics: None,
        threads: 2,
        grace_period: Duration::from_secs(5),
        trusted_proxies: Vec::new(),
        customer_header: None,
        demo_upstream: None,
        limiter_api: None,
        instance: None,
        kill_switch: false,
        connections: Connections::default(),
    };
    let mut binds = Vec::new();
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
                        if let Some(addr) = scalar::socket_addr(r, n, &p) {
                            server.listen.push(addr);
                            binds.push(At::new(addr, n.pos, &p));
                        }
                    }
                }
            }
            "metrics" | "demo_upstream" | "limiter_api" => {
                let addr = scalar::socket_addr(r, v, &path);
                if let Some(addr) = addr {
                    binds.push(At::new(addr, v.pos, &path));
                }
                match e.key.as_str() {
                    "metrics" => server.metrics = addr,
                    "demo_upstream" => server.demo_upstream = addr,
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
    ServerDraft { server, binds }
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
}
