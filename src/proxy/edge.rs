//! What happens to a new connection before its first request is read: which listener it
//! came in on ([`ListenerTable`]), the PROXY protocol header on a `proxy_protocol`
//! listener ([`proxy_protocol`]), the TLS handshake on a `tls` listener ([`tls_accept`]),
//! and so which protocol its requests will speak: HTTP/1.1, HTTP/2 chosen by ALPN, or
//! HTTP/1.1 that may turn out to be prior-knowledge h2c on an `h2c` listener (the handler
//! looks at the first bytes: [`PREFACE`]).
//!
//! The connection handler ([`super::handler`]) calls [`Edge::open`] once the connection
//! holds its slot, so the connection caps count a connection before any of this costs
//! anything.

use std::net::IpAddr;

use prometheus::IntCounter;
use tokio::time::Instant;

use pingora::protocols::{Stream, ALPN};

use crate::config::Listener;
use crate::limits::{Clock, MonotonicClock};
use crate::log_budget::LogBudget;
use crate::metrics::Metrics;
use crate::proxy::identity::is_trusted;
use crate::proxy::listeners::ListenerTable;
use crate::proxy::proxy_protocol::{self, ProxyHeaderError};
use crate::proxy::tls_accept::Handshakes;
use crate::proxy::Peer;
use crate::runtime::Runtime;

pub use crate::proxy::h2::PREFACE;

/// The protocol a connection's requests speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.x.
    Http1,
    /// HTTP/2 (ALPN `h2` on TLS).
    H2,
    /// HTTP/1.x, or h2c if the connection starts with the HTTP/2 preface.
    Http1OrH2c,
}

/// A connection ready for its requests.
pub struct Opened {
    /// The stream to read requests from (TLS decrypted).
    pub stream: Stream,
    /// The client: the TCP peer, or the PROXY header's source from a trusted balancer.
    pub peer: Option<IpAddr>,
    /// What its requests speak.
    pub protocol: Protocol,
}

/// The listeners, the handshake counters and the PROXY protocol's counters.
pub struct Edge {
    listeners: ListenerTable,
    handshakes: Handshakes,
    proxy_trusted: IntCounter,
    proxy_untrusted: IntCounter,
    proxy_invalid: IntCounter,
    log: LogBudget,
    clock: MonotonicClock,
}

impl Edge {
    /// For the proxy's `listeners` (`server.listen`, fixed until a restart).
    pub fn new(listeners: &[Listener], metrics: &Metrics) -> Self {
        let proxy = |r: &str| metrics.proxy_protocol_total.with_label_values(&[r]);
        Self {
            listeners: ListenerTable::new(listeners),
            handshakes: Handshakes::new(metrics),
            proxy_trusted: proxy("trusted"),
            proxy_untrusted: proxy("untrusted"),
            proxy_invalid: proxy("invalid"),
            log: LogBudget::new(),
            clock: MonotonicClock::new(),
        }
    }

    /// Reads what precedes the first request on `stream`, accepted at `accepted` from
    /// `peer`; `None`: the connection is to be closed (counted and logged already).
    pub async fn open(
        &self,
        mut stream: Stream,
        mut peer: Option<IpAddr>,
        accepted: Instant,
        rt: &Runtime,
    ) -> Option<Opened> {
        let local = stream
            .get_socket_digest()
            .and_then(|d| d.local_addr().and_then(|a| a.as_inet()).copied());
        let listener = self.listeners.find(local);
        let tls = &rt.config.tls;
        let first_deadline = accepted
            + if listener.tls {
                tls.handshake_timeout
            } else {
                rt.config.server.connections.header_timeout
            };
        if listener.proxy_protocol {
            peer = self
                .proxy_header(&mut stream, peer, first_deadline, rt)
                .await?;
        }
        if !listener.tls {
            let protocol = if listener.h2c {
                Protocol::Http1OrH2c
            } else {
                Protocol::Http1
            };
            return Some(Opened {
                stream,
                peer,
                protocol,
            });
        }
        let Some(store) = rt.tls.as_ref() else {
            // The config reader refuses a TLS listener without certificates.
            log::error!("a TLS listener has no certificates to serve; connection closed");
            return None;
        };
        let stream = self
            .handshakes
            .accept(stream, &store.acceptor, first_deadline, peer)
            .await?;
        let protocol = match stream.selected_alpn_proto() {
            Some(ALPN::H2) => Protocol::H2,
            _ => Protocol::Http1,
        };
        Some(Opened {
            stream,
            peer,
            protocol,
        })
    }

    /// Reads the PROXY header; the client it names when `peer` is a trusted proxy, else
    /// `peer`. `None`: no valid header, the connection is to be closed.
    async fn proxy_header(
        &self,
        stream: &mut Stream,
        peer: Option<IpAddr>,
        deadline: Instant,
        rt: &Runtime,
    ) -> Option<Option<IpAddr>> {
        match proxy_protocol::read(stream, deadline).await {
            Ok(client) => {
                let trusted = peer.is_some_and(|p| {
                    is_trusted(p.to_canonical(), &rt.config.server.trusted_proxies)
                });
                match (trusted, client) {
                    (true, Some(client)) => {
                        self.proxy_trusted.inc();
                        proxy_protocol::set_peer(stream, client);
                        Some(Some(client.ip().to_canonical()))
                    }
                    (true, None) => {
                        self.proxy_trusted.inc();
                        Some(peer)
                    }
                    (false, _) => {
                        self.proxy_untrusted.inc();
                        self.note(peer, "its PROXY protocol header was ignored: the peer is not in server.trusted_proxies");
                        Some(peer)
                    }
                }
            }
            // Closed before a header: a health check's connect, or a client gone.
            Err(ProxyHeaderError::Io(_)) => None,
            Err(e) => {
                self.proxy_invalid.inc();
                self.note(peer, &format!("closed: {e}"));
                None
            }
        }
    }

    fn note(&self, peer: Option<IpAddr>, what: &str) {
        let from = Peer(peer);
        self.log.info(
            self.clock.now(),
            format_args!("connection from {from} on a proxy_protocol listener: {what}"),
        );
    }
}
