//! The PROXY protocol (HAProxy's, v1 text and v2 binary) on a `proxy_protocol: true`
//! listener: an L4 load balancer in front of tollgate says who the client is in a header
//! before the connection's own bytes (before TLS on a TLS listener).
//!
//! Every connection on such a listener must start with a header (one that does not is
//! closed: its bytes cannot be HTTP); the header is believed only when the TCP peer is in
//! `server.trusted_proxies`, as `X-Forwarded-For` is. Believed, its source address becomes
//! the connection's peer address (the socket digest's), so client identity, limits keyed
//! by `client_ip` and the logs see the real client, and `X-Forwarded-For` trust is then
//! judged on that client; from any other peer it is read, counted as `untrusted` and
//! ignored. A `LOCAL` command (the balancer's health check) or an `UNKNOWN` family keeps
//! the TCP peer.
//!
//! The header is read exactly (nothing past it is consumed) and is bounded: a v1 line is at
//! most 107 bytes, a v2 header at most [`MAX_V2_BYTES`]; reading it counts against the
//! connection's first deadline. Parsing is the `ppp` crate's.

use std::net::SocketAddr;
use std::os::unix::io::AsRawFd;

use pingora::protocols::l4::socket::SocketAddr as PingoraAddr;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{SocketDigest, Stream};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

/// The v2 signature.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest v1 line (the spec's bound, CRLF included).
const MAX_V1_BYTES: usize = 107;

/// The longest v2 header accepted: addresses and the TLVs balancers add (AWS, GCP) fit
/// well within it.
pub const MAX_V2_BYTES: usize = 16 + 2048;

/// Why a connection's PROXY header was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProxyHeaderError {
    /// The connection did not start with a PROXY header.
    #[error("no PROXY protocol header")]
    Missing,
    /// It started with one that does not parse or is too long.
    #[error("invalid PROXY protocol header: {0}")]
    Invalid(String),
    /// It did not arrive before the deadline.
    #[error("PROXY protocol header not complete in time")]
    Timeout,
    /// The connection failed or closed while it was read.
    #[error("connection closed while reading the PROXY protocol header: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads the header at the start of `stream` before `deadline`: `Some` client address when
/// it names one (a `PROXY` command over TCP), `None` for `LOCAL` or `UNKNOWN`.
pub async fn read(
    stream: &mut Stream,
    deadline: Instant,
) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    tokio::time::timeout_at(deadline, read_header(stream))
        .await
        .map_err(|_| ProxyHeaderError::Timeout)?
}

async fn read_header(stream: &mut Stream) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    let mut buf = [0u8; MAX_V2_BYTES];
    stream.read_exact(&mut buf[..8]).await?;
    if buf[..8] == V2_SIGNATURE[..8] {
        stream.read_exact(&mut buf[8..16]).await?;
        if buf[..12] != V2_SIGNATURE {
            return Err(ProxyHeaderError::Missing);
        }
        let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
        if 16 + len > MAX_V2_BYTES {
            return Err(ProxyHeaderError::Invalid(format!(
                "a v2 header of {} bytes (at most {MAX_V2_BYTES})",
                16 + len
            )));
        }
        stream.read_exact(&mut buf[16..16 + len]).await?;
        let header = ppp::v2::Header::try_from(&buf[..16 + len])
            .map_err(|e| ProxyHeaderError::Invalid(e.to_string()))?;
        if header.command == ppp::v2::Command::Local {
            return Ok(None);
        }
        return Ok(match header.addresses {
            ppp::v2::Addresses::IPv4(a) => {
                Some(SocketAddr::from((a.source_address, a.source_port)))
            }
            ppp::v2::Addresses::IPv6(a) => {
                Some(SocketAddr::from((a.source_address, a.source_port)))
            }
            _ => None,
        });
    }
    if &buf[..6] != b"PROXY " {
        return Err(ProxyHeaderError::Missing);
    }
    let mut len = 8;
    while !buf[..len].ends_with(b"\r\n") {
        if len == MAX_V1_BYTES {
            return Err(ProxyHeaderError::Invalid(format!(
                "a v1 line longer than {MAX_V1_BYTES} bytes"
            )));
        }
        stream.read_exact(&mut buf[len..len + 1]).await?;
        len += 1;
    }
    let header = ppp::v1::Header::try_from(&buf[..len])
        .map_err(|e| ProxyHeaderError::Invalid(e.to_string()))?;
    Ok(match header.addresses {
        ppp::v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        ppp::v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        ppp::v1::Addresses::Unknown => None,
    })
}

/// Makes `client` the peer address of `stream` (a TCP stream as Pingora accepted it), for
/// everything that asks the socket digest who the client is. The local address is kept.
pub fn set_peer(stream: &mut Stream, client: SocketAddr) {
    let Some(fd) = stream
        .as_any()
        .downcast_ref::<L4Stream>()
        .map(AsRawFd::as_raw_fd)
    else {
        return;
    };
    let local = stream
        .get_socket_digest()
        .and_then(|d| d.local_addr().cloned());
    let digest = SocketDigest::from_raw_fd(fd);
    let _ = digest.peer_addr.set(Some(PingoraAddr::Inet(client)));
    let _ = digest.local_addr.set(local);
    stream.set_socket_digest(digest);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8]) -> Result<Option<SocketAddr>, ProxyHeaderError> {
        let mut data = bytes.to_vec();
        data.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let mut stream: Stream = Box::new(std::io::Cursor::new(data));
        let got = read_header(&mut stream).await;
        if got.is_ok() {
            let mut rest = [0u8; 3];
            stream.read_exact(&mut rest).await.unwrap();
            assert_eq!(&rest, b"GET", "exactly the header is consumed");
        }
        got
    }

    #[tokio::test]
    async fn reads_v1_and_v2_headers_exactly() {
        let v1 = parse(b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 443\r\n").await;
        assert_eq!(v1.unwrap(), Some("203.0.113.7:51234".parse().unwrap()));
        let v1 = parse(b"PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n").await;
        assert_eq!(v1.unwrap(), Some("[2001:db8::7]:51234".parse().unwrap()));
        assert_eq!(parse(b"PROXY UNKNOWN\r\n").await.unwrap(), None);
        let addrs: ppp::v2::Addresses = (
            "198.51.100.9:4000".parse::<SocketAddr>().unwrap(),
            "10.0.0.1:443".parse::<SocketAddr>().unwrap(),
        )
            .into();
        let v2 = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Proxy,
            ppp::v2::Protocol::Stream,
            addrs,
        )
        .write_tlv(ppp::v2::Type::NoOp, b"pad")
        .unwrap()
        .build()
        .unwrap();
        assert_eq!(
            parse(&v2).await.unwrap(),
            Some("198.51.100.9:4000".parse().unwrap())
        );
        let local = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Local,
            ppp::v2::Protocol::Stream,
            addrs,
        )
        .build()
        .unwrap();
        assert_eq!(parse(&local).await.unwrap(), None);
    }

    #[tokio::test]
    async fn refuses_what_is_not_a_header() {
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\n").await,
            Err(ProxyHeaderError::Missing)
        ));
        assert!(matches!(
            parse(b"PROXY TCP4 not-an-ip 10.0.0.1 1 2\r\n").await,
            Err(ProxyHeaderError::Invalid(_))
        ));
        let long = format!("PROXY TCP4 {}\r\n", "1".repeat(200));
        assert!(matches!(
            parse(long.as_bytes()).await,
            Err(ProxyHeaderError::Invalid(_))
        ));
        let mut huge = V2_SIGNATURE.to_vec();
        huge.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert!(matches!(
            parse(&huge).await,
            Err(ProxyHeaderError::Invalid(_))
        ));
    }
}
