//! An origin's upstream servers, resolved when the runtime is built and picked round robin.
//!
//! Names (`app.internal:8080`) are resolved here, at start and at each reload, never on the
//! request path and never while reading a config (so `tollgate check` and a reload's parse
//! do no network I/O). Every address a name resolves to joins the rotation. A name that no
//! longer resolves fails the build, so a reload that would lose an origin's servers is
//! refused and the old runtime keeps serving.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::Upstream;

/// Why an upstream could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The resolver failed.
    #[error("upstream `{upstream}` does not resolve: {source}")]
    Lookup {
        /// The upstream as written.
        upstream: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// The name resolved to nothing.
    #[error("upstream `{upstream}` resolves to no address")]
    Empty {
        /// The upstream as written.
        upstream: String,
    },
}

/// The resolved servers of one origin, in rotation.
#[derive(Debug)]
pub struct Upstreams {
    addrs: Box<[SocketAddr]>,
    next: AtomicUsize,
}

impl Upstreams {
    /// Resolves every upstream (DNS for names), keeping the order written and dropping
    /// duplicates.
    pub fn resolve(list: &[Upstream]) -> Result<Upstreams, ResolveError> {
        let mut addrs: Vec<SocketAddr> = Vec::with_capacity(list.len());
        for upstream in list {
            let found: Vec<SocketAddr> = match upstream {
                Upstream::Addr(addr) => vec![*addr],
                Upstream::Name { host, port } => (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|source| ResolveError::Lookup {
                        upstream: upstream.to_string(),
                        source,
                    })?
                    .collect(),
            };
            if found.is_empty() {
                return Err(ResolveError::Empty {
                    upstream: upstream.to_string(),
                });
            }
            for addr in found {
                if !addrs.contains(&addr) {
                    addrs.push(addr);
                }
            }
        }
        Ok(Upstreams {
            addrs: addrs.into_boxed_slice(),
            next: AtomicUsize::new(0),
        })
    }

    /// The next server in rotation; `None` only for an empty list (the config requires at
    /// least one upstream). One relaxed atomic add: no lock.
    pub fn pick(&self) -> Option<SocketAddr> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.addrs.get(i % self.addrs.len().max(1)).copied()
    }

    /// Every resolved address, in rotation order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_rotate_round_robin() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let list = [
            Upstream::Addr(a),
            Upstream::Name {
                host: "localhost".into(),
                port: 2,
            },
            Upstream::Addr(a),
        ];
        let u = Upstreams::resolve(&list).unwrap();
        assert!(u.addrs().len() >= 2, "{:?}", u.addrs());
        assert_eq!(u.addrs()[0], a, "order kept, duplicate dropped");
        let n = u.addrs().len();
        let picks: Vec<_> = (0..2 * n).filter_map(|_| u.pick()).collect();
        assert_eq!(&picks[..n], u.addrs());
        assert_eq!(&picks[n..], u.addrs());
    }

    #[test]
    fn a_name_that_does_not_resolve_is_an_error_naming_it() {
        let list = [Upstream::Name {
            host: "no-such-host.invalid".into(),
            port: 80,
        }];
        let err = Upstreams::resolve(&list).unwrap_err().to_string();
        assert!(err.contains("no-such-host.invalid:80"), "{err}");
    }
}
