//! The HTTP front end: Pingora glue and nothing else. The `ProxyHttp` implementation
//! ([`service`]), reading the `Host` ([`route`]) and who is asking ([`identity`]), what the
//! request's header becomes upstream ([`forward`]), the request ID ([`request_id`]), the
//! access log's record ([`access`]), the per-request context ([`ctx`]), the responses
//! tollgate writes itself ([`problem`], and ACME HTTP-01 answers: [`challenge`]), and two
//! small HTTP side services: `/metrics` ([`metrics_app`]) and the demo upstream ([`demo`]).
//! Around the proxy, each downstream connection's life: its caps ([`conn_caps`]), its
//! deadlines and draining ([`handler`], [`conn_state`], the keep-alive timer [`idle`]),
//! what precedes its first request ([`edge`]: the listener it came in on ([`listeners`]), a
//! PROXY protocol header ([`proxy_protocol`]), the TLS handshake ([`tls_accept`])),
//! HTTP/2's own accept loop and bounds ([`h2`]), the stream wrapper both protocols watch
//! their traffic through ([`watched`]); and Pingora's own log lines that clients can cause,
//! levelled and budgeted ([`pingora_log`]).
//!
//! It reads a [`crate::runtime::Runtime`] snapshot per request and asks the runtime for
//! decisions; it never builds runtime state and never imports the reloader or the process
//! assembly ([`crate::server`]), which sit above it.

pub mod access;
pub mod challenge;
pub mod conn_caps;
pub mod conn_state;
pub mod ctx;
pub mod demo;
pub mod edge;
pub mod forward;
pub mod grpc;
pub mod h2;
pub mod handler;
pub mod identity;
pub mod idle;
pub mod listeners;
pub mod metrics_app;
pub mod pingora_log;
pub mod proxy_protocol;
pub mod request_id;
pub mod route;
pub mod service;
pub mod tls_accept;
pub mod watched;

use std::fmt;
use std::net::IpAddr;

/// A downstream peer as log lines name it: its address, or `an unknown peer`.
pub struct Peer(pub Option<IpAddr>);

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(ip) => fmt::Display::fmt(&ip, f),
            None => f.write_str("an unknown peer"),
        }
    }
}

pub use service::Tollgate;

/// The problem+json responses, shared with the admin API (see [`crate::problem`]).
pub use crate::problem;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_its_address_or_unknown() {
        assert_eq!(Peer(None).to_string(), "an unknown peer");
        assert_eq!(
            Peer(Some("10.0.0.1".parse().unwrap())).to_string(),
            "10.0.0.1"
        );
        assert_eq!(
            Peer(Some("2001:db8::1".parse().unwrap())).to_string(),
            "2001:db8::1"
        );
    }
}
