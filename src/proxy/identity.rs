//! Who is asking: the client IP (honouring `X-Forwarded-For` only from trusted proxies),
//! the customer and the host, exposed to the limiters as [`Facts`].

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;

use crate::limits::{Fact, Facts, KeyPart};
use crate::proxy::route::HostBuf;

/// A malformed `X-Forwarded-For` from a trusted proxy: answered with 400, because the
/// proxy in front is broken and guessing the client would mis-attribute its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("X-Forwarded-For from a trusted proxy holds an entry that is not an IP address")]
pub struct BadForwardedFor;

/// Whether the direct peer is one of `trusted` (a proxy whose `X-Forwarded-For` and
/// customer header are believed).
pub fn is_trusted(peer: IpAddr, trusted: &[IpNet]) -> bool {
    let peer = peer.to_canonical();
    trusted.iter().any(|net| net.contains(&peer))
}

/// The client's IP.
///
/// When the direct `peer` is in `trusted`, walk `X-Forwarded-For` from the right and take
/// the first hop that is not itself trusted: every hop right of it was added by a proxy we
/// trust, so it is the last address that someone we trust vouched for. Anything left of it
/// was written by the client and could be forged. If every hop is trusted, the left-most one
/// is the client. An untrusted peer's header is ignored entirely.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Result<IpAddr, BadForwardedFor> {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return Ok(peer);
    }
    // Several X-Forwarded-For lines form one list, in order; walk it from the right.
    // Hops left of the chosen one were written by the client and are never parsed.
    let mut client = peer;
    for value in headers.get_all("x-forwarded-for").iter().rev() {
        let text = value.to_str().map_err(|_| BadForwardedFor)?;
        for hop in text.rsplit(',') {
            let hop = hop.trim();
            if hop.is_empty() {
                continue;
            }
            client = parse_hop(hop).ok_or(BadForwardedFor)?;
            if !is_trusted(&client) {
                return Ok(client);
            }
        }
    }
    Ok(client)
}

/// A hop is an IP, maybe with a port (`1.2.3.4:5678`, `[::1]:80`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    hop.parse::<SocketAddr>()
        .ok()
        .map(|s| s.ip().to_canonical())
}

/// One request's key parts, borrowed from the session for the duration of one decision.
pub struct RequestFacts<'a> {
    /// The resolved client IP.
    pub client_ip: IpAddr,
    /// The customer header's value from a trusted proxy, else the origin's customer.
    pub customer: &'a [u8],
    /// Lower-cased host.
    pub host: HostBuf,
    /// The selected upstream server, once known.
    pub server: Option<SocketAddr>,
    /// The origin's name.
    pub origin: &'a str,
    /// The method.
    pub method: &'a [u8],
    /// The path without query, normalized when a limit reads it (`crate::limits::path`).
    pub path: Cow<'a, [u8]>,
    /// All request headers.
    pub headers: &'a HeaderMap,
}

impl Facts for RequestFacts<'_> {
    fn fact<'b>(&'b self, part: &'b KeyPart) -> Option<Fact<'b>> {
        match part {
            KeyPart::ClientIp => Some(Fact::Ip(self.client_ip)),
            KeyPart::Customer => Some(Fact::Bytes(self.customer)),
            KeyPart::Host => Some(Fact::Bytes(self.host.as_bytes())),
            KeyPart::ServerIp => self.server.map(|s| Fact::Ip(s.ip())),
            KeyPart::ServerAddr => self.server.map(Fact::Addr),
            KeyPart::Origin => Some(Fact::Bytes(self.origin.as_bytes())),
            KeyPart::Method => Some(Fact::Bytes(self.method)),
            KeyPart::Path => Some(Fact::Bytes(&self.path)),
            KeyPart::Header(name) => self
                .headers
                .get(name.as_str())
                .map(|v| Fact::Bytes(v.as_bytes())),
            KeyPart::Const(text) => Some(Fact::Bytes(text.as_bytes())),
        }
    }

    fn repeated(&self, part: &KeyPart) -> bool {
        match part {
            KeyPart::Header(name) => self.headers.get_all(name.as_str()).iter().nth(1).is_some(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn untrusted_peer_header_is_ignored() {
        let ip = client_ip(
            "203.0.113.9".parse().unwrap(),
            &headers(&["1.1.1.1"]),
            &nets(&["127.0.0.1/32"]),
        );
        assert_eq!(ip, Ok("203.0.113.9".parse().unwrap()));
    }

    #[test]
    fn trusted_peer_takes_rightmost_untrusted_hop() {
        let trusted = nets(&["127.0.0.1/32", "10.0.0.0/8"]);
        let ip = client_ip(
            "127.0.0.1".parse().unwrap(),
            &headers(&["6.6.6.6, 198.51.100.7", "10.1.1.1"]),
            &trusted,
        );
        assert_eq!(ip, Ok("198.51.100.7".parse().unwrap()));
    }

    #[test]
    fn all_trusted_hops_give_leftmost_and_ports_are_accepted() {
        let trusted = nets(&["127.0.0.1/32", "10.0.0.0/8"]);
        let peer = "127.0.0.1".parse().unwrap();
        assert_eq!(
            client_ip(peer, &headers(&["10.0.0.2:5555, 10.0.0.3"]), &trusted),
            Ok("10.0.0.2".parse().unwrap())
        );
        assert_eq!(client_ip(peer, &headers(&[]), &trusted), Ok(peer));
        assert_eq!(
            client_ip(peer, &headers(&["[2001:db8::1]:443"]), &trusted),
            Ok("2001:db8::1".parse().unwrap())
        );
    }

    #[test]
    fn garbage_from_trusted_peer_is_an_error() {
        let trusted = nets(&["127.0.0.1/32"]);
        let peer = "127.0.0.1".parse().unwrap();
        assert_eq!(
            client_ip(peer, &headers(&["not-an-ip"]), &trusted),
            Err(BadForwardedFor)
        );
    }
}
