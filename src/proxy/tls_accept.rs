//! The TLS handshake of a connection on a `tls: true` listener, run by tollgate's
//! connection handler rather than by Pingora's listener, for three reasons:
//!
//! - **A deadline of its own** (`tls.handshake_timeout`, default 10 s, counted from the
//!   accept): Pingora's is a fixed 60 s, so a client that opens TCP and never says hello
//!   held a descriptor for a minute.
//! - **The connection caps see it first**: the handshake runs after the connection holds
//!   its slot, so `max_connections` and `max_connections_per_ip` count TLS connections
//!   before any cryptography is spent on them.
//! - **Counted and quiet**: every handshake is counted in
//!   `tollgate_tls_handshakes_total{result,version}` (`result="acme_validation"`: a CA's
//!   TLS-ALPN-01 validation, closed once the handshake answered it), and a failed one (a scanner, a client
//!   that refuses the certificate, an old TLS version) is logged at `info` within a budget,
//!   where Pingora logs each at `error`.
//!
//! The acceptor is the live runtime's ([`crate::tls::TlsStore`]), loaded once per
//! connection: a certificate replaced on disk serves the next handshake, and connections
//! already established keep theirs.

use std::net::IpAddr;

use openssl::ssl::{SslAcceptor, SslVersion};
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::tls::server::handshake;
use pingora::protocols::{Ssl, Stream};
use prometheus::IntCounter;
use tokio::time::Instant;

use crate::limits::{Clock, MonotonicClock};
use crate::log_budget::LogBudget;
use crate::metrics::Metrics;
use crate::proxy::Peer;
use crate::tls::acceptor::is_acme_validation;

/// The handshake counters, resolved once, and the failures' log budget.
pub struct Handshakes {
    tls12: IntCounter,
    tls13: IntCounter,
    other: IntCounter,
    failed: IntCounter,
    timed_out: IntCounter,
    validations: IntCounter,
    log: LogBudget,
    clock: MonotonicClock,
}

impl Handshakes {
    /// The counters of `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        let c = |result: &str, version: &str| {
            metrics
                .tls_handshakes_total
                .with_label_values(&[result, version])
        };
        Self {
            tls12: c("success", "1.2"),
            tls13: c("success", "1.3"),
            other: c("success", "other"),
            failed: c("failure", "none"),
            timed_out: c("timeout", "none"),
            validations: c("acme_validation", "none"),
            log: LogBudget::new(),
            clock: MonotonicClock::new(),
        }
    }

    /// Runs the server side of a handshake on `stream` (a TCP stream as Pingora accepted
    /// it) until `deadline`. `None`: it failed or timed out, was counted and logged, and
    /// the connection is to be closed.
    pub async fn accept(
        &self,
        stream: Stream,
        acceptor: &SslAcceptor,
        deadline: Instant,
        peer: Option<IpAddr>,
    ) -> Option<Stream> {
        let tcp = match stream.into_any().downcast::<L4Stream>() {
            Ok(tcp) => *tcp,
            Err(_) => {
                log::error!("a TLS listener's connection is not a TCP stream; closed");
                return None;
            }
        };
        match tokio::time::timeout_at(deadline, handshake(acceptor, tcp)).await {
            Ok(Ok(tls)) => {
                if tls.get_ssl().is_some_and(is_acme_validation) {
                    // A CA's TLS-ALPN-01 validation: the handshake was the answer.
                    self.validations.inc();
                    return None;
                }
                let counter = match tls.get_ssl().map(|s| s.version2()) {
                    Some(Some(SslVersion::TLS1_3)) => &self.tls13,
                    Some(Some(SslVersion::TLS1_2)) => &self.tls12,
                    _ => &self.other,
                };
                counter.inc();
                Some(Box::new(tls))
            }
            Ok(Err(e)) => {
                self.failed.inc();
                self.note(peer, &format!("TLS handshake failed: {e}"));
                None
            }
            Err(_) => {
                self.timed_out.inc();
                self.note(
                    peer,
                    "TLS handshake not complete within tls.handshake_timeout",
                );
                None
            }
        }
    }

    fn note(&self, peer: Option<IpAddr>, what: &str) {
        let from = Peer(peer);
        self.log.info(
            self.clock.now(),
            format_args!("closed a connection from {from}: {what}"),
        );
    }
}
