//! The `server:` section: listeners, threads, shutdown window, trusted proxies, the
//! customer header and the demo upstream, with their defaults.
//!
//! Listener addresses are kept with their locations so that [`super::validate`] can point
//! at the second of two colliding listeners.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::model::Server;
use crate::config::report::{child, item, At, Pos, Report};
use crate::config::scalar;
use crate::config::suggest;
use crate::config::yaml::Node;

/// The keys `server:` takes.
const SERVER_KEYS: [&str; 7] = [
    "listen",
    "metrics",
    "threads",
    "grace_period",
    "trusted_proxies",
    "customer_header",
    "demo_upstream",
];

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
            "metrics" | "demo_upstream" => {
                let addr = scalar::socket_addr(r, v, &path);
                if let Some(addr) = addr {
                    binds.push(At::new(addr, v.pos, &path));
                }
                if e.key == "metrics" {
                    server.metrics = addr;
                } else {
                    server.demo_upstream = addr;
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
