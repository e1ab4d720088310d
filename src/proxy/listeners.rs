//! Which `server.listen` entry a connection arrived on, so that the connection handler
//! knows whether to read a PROXY header, handshake TLS or look for h2c.
//!
//! Pingora runs every listener of a service through one application and does not say
//! which listener accepted a connection, so the handler asks the socket for its local
//! address and looks it up here: the entry bound to exactly that address, else the one
//! bound to the wildcard address of its family and port (`0.0.0.0:8443`, `[::]:8443`), else
//! a wildcard of either family on that port (`[::]` accepts IPv4 too). Listeners cannot
//! change without a restart, so the table is built once.

use std::net::SocketAddr;

use crate::config::Listener;

/// The proxy's listeners, by address.
#[derive(Debug, Clone, Default)]
pub struct ListenerTable {
    listeners: Vec<Listener>,
}

impl ListenerTable {
    /// A table of `listeners` (`server.listen`).
    pub fn new(listeners: &[Listener]) -> Self {
        Self {
            listeners: listeners.to_vec(),
        }
    }

    /// The listener that accepted a connection whose local address is `local`; a plain
    /// HTTP/1.1 one when none matches (a Unix socket, an address the OS rewrote).
    pub fn find(&self, local: Option<SocketAddr>) -> Listener {
        let fallback = Listener::plain(SocketAddr::from(([0, 0, 0, 0], 0)));
        let Some(local) = local else {
            return fallback;
        };
        let local = SocketAddr::new(local.ip().to_canonical(), local.port());
        let same_port = |l: &&Listener| l.addr.port() == local.port();
        self.listeners
            .iter()
            .find(|l| l.addr == local)
            .or_else(|| {
                self.listeners
                    .iter()
                    .filter(same_port)
                    .find(|l| l.addr.ip().is_unspecified() && l.addr.is_ipv4() == local.is_ipv4())
            })
            .or_else(|| {
                self.listeners
                    .iter()
                    .filter(same_port)
                    .find(|l| l.addr.ip().is_unspecified())
            })
            .copied()
            .unwrap_or(fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(addr: &str, tls: bool) -> Listener {
        Listener {
            tls,
            ..Listener::plain(addr.parse().unwrap())
        }
    }

    #[test]
    fn exact_then_wildcard_of_the_port() {
        let t = ListenerTable::new(&[
            l("127.0.0.1:8080", false),
            l("0.0.0.0:8443", true),
            l("[::]:9443", true),
        ]);
        let find = |a: &str| t.find(Some(a.parse().unwrap())).tls;
        assert!(!find("127.0.0.1:8080"));
        assert!(find("10.1.2.3:8443"));
        assert!(find("[::ffff:10.1.2.3]:8443"), "a mapped v4 address is v4");
        assert!(find("10.1.2.3:9443"), "[::] takes IPv4 too");
        assert!(!find("10.1.2.3:7000"));
        assert!(!t.find(None).tls);
    }
}
