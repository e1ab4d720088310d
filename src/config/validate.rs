//! Checks across sections: each host belongs to one origin, and no two listeners bind
//! the same address.
//!
//! Both report at the *second* occurrence in file order and name the first, which is
//! where an editor's cursor is most useful.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use crate::config::bounds::MAX_WILDCARDS;
use crate::config::origin::OriginDraft;
use crate::config::report::{At, Report};

/// Every host appears once, across all origins.
///
/// At most [`MAX_WILDCARDS`] hosts are `*.suffix` wildcards; the first one beyond is an
/// error.
pub(crate) fn hosts(r: &mut Report, origins: &[OriginDraft]) {
    let mut seen: HashMap<&str, &str> = HashMap::new();
    let mut wildcards = 0usize;
    for origin in origins {
        for host in &origin.hosts {
            if host.v.starts_with("*.") {
                wildcards += 1;
                if wildcards == MAX_WILDCARDS + 1 {
                    r.error(
                        host.pos,
                        &host.path,
                        format!("more than {MAX_WILDCARDS} wildcard hosts in the config; a request for a host without an exact match tries each in turn"),
                    );
                }
            }
            match seen.get(host.v.as_str()) {
                Some(&first) if first == origin.name => r.error(
                    host.pos,
                    &host.path,
                    format!("host `{}` is listed twice in origin `{first}`", host.v),
                ),
                Some(&first) => r.error(
                    host.pos,
                    &host.path,
                    format!("host `{}` is already used by origin `{first}`", host.v),
                ),
                None => {
                    seen.insert(&host.v, &origin.name);
                }
            }
        }
    }
}

/// No two of `listen`, `metrics`, `limiter_api`, `admin` and `demo_upstream` bind the same
/// address.
pub(crate) fn listeners(r: &mut Report, binds: &[At<SocketAddr>]) {
    let mut sorted: Vec<&At<SocketAddr>> = binds.iter().collect();
    sorted.sort_by_key(|b| b.pos);
    for (j, later) in sorted.iter().enumerate() {
        if let Some(first) = sorted[..j].iter().find(|e| collide(e.v, later.v)) {
            r.error(
                later.pos,
                &later.path,
                format!(
                    "`{}` collides with `{}` (`{}`); each listener needs its own address",
                    later.v, first.path, first.v
                ),
            );
        }
    }
}

/// Whether binding both would fail: same port (not 0) and the same IP, or a wildcard IP
/// that covers the other (`[::]` covers IPv4 too, as Linux binds it dual-stack).
fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    let covers =
        |wild: IpAddr, other: IpAddr| wild.is_unspecified() && (wild.is_ipv6() || other.is_ipv4());
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || covers(a.ip(), b.ip()) || covers(b.ip(), a.ip()))
}
