//! Reading a request's `Host`: lower-cased into a fixed inline buffer with the port
//! stripped, so that routing ([`crate::runtime::router`]) never allocates.

/// The longest host tollgate accepts (a DNS name is at most 253 octets).
pub const MAX_HOST_LEN: usize = 253;

/// What each byte of a host name becomes: itself lower-cased when it may stand in one
/// (ASCII letters and digits, `-`, `_`, `.`), 0 when it may not.
const HOST_BYTE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.' {
            table[b] = c.to_ascii_lowercase();
        }
        b += 1;
    }
    table
};

/// A host, lower-cased into a fixed inline buffer so that matching never allocates.
#[derive(Clone, Copy)]
pub struct HostBuf {
    buf: [u8; MAX_HOST_LEN],
    len: u8,
}

impl Default for HostBuf {
    fn default() -> Self {
        Self {
            buf: [0; MAX_HOST_LEN],
            len: 0,
        }
    }
}

/// Why a `Host` could not be used: answered with 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// No `Host` header and no authority in the request target.
    #[error("the request has no Host")]
    Missing,
    /// Longer than a DNS name can be, or with bytes no host name has.
    #[error("the Host header is not a valid host name")]
    Invalid,
}

impl HostBuf {
    /// Lower-cases `raw` (a `Host` value, maybe with a port) into the buffer, port
    /// stripped. The port, when present, must be digits (`a.test:abc` is refused). A name's
    /// one trailing dot is dropped (`shop.example.com.` is `shop.example.com`). An IPv6
    /// literal must be bracketed and keeps its brackets, written in its canonical form so
    /// that `[2001:DB8:0::1]:8080` and `[2001:db8::1]` are the same host.
    pub fn parse(raw: &[u8]) -> Result<Self, HostError> {
        let (host, port) = split_port(raw)?;
        if !port.iter().all(u8::is_ascii_digit) || port.len() > 5 {
            return Err(HostError::Invalid);
        }
        if host.first() == Some(&b'[') {
            return Self::ipv6(host);
        }
        let host = host.strip_suffix(b".").unwrap_or(host);
        if host.is_empty() {
            return Err(HostError::Missing);
        }
        if host.len() > MAX_HOST_LEN {
            return Err(HostError::Invalid);
        }
        let mut out = HostBuf::default();
        for (dst, &b) in out.buf.iter_mut().zip(host) {
            // One table lookup a byte: this runs on every request.
            match HOST_BYTE[usize::from(b)] {
                0 => return Err(HostError::Invalid),
                lower => *dst = lower,
            }
        }
        // MAX_HOST_LEN < 256, so the length fits.
        out.len = host.len() as u8;
        Ok(out)
    }

    /// A bracketed IPv6 literal, in canonical form (`[::1]`).
    fn ipv6(bracketed: &[u8]) -> Result<Self, HostError> {
        let inner = bracketed
            .strip_prefix(b"[")
            .and_then(|h| h.strip_suffix(b"]"))
            .ok_or(HostError::Invalid)?;
        let addr: std::net::Ipv6Addr = std::str::from_utf8(inner)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or(HostError::Invalid)?;
        let mut out = HostBuf::default();
        let mut cursor = std::io::Cursor::new(&mut out.buf[..]);
        // At most 2 + 45 bytes: always fits.
        std::io::Write::write_fmt(&mut cursor, format_args!("[{addr}]"))
            .map_err(|_| HostError::Invalid)?;
        out.len = cursor.position() as u8;
        Ok(out)
    }

    /// The lower-cased host bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    /// The host as text (always ASCII by construction).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

/// Splits `host[:port]` or `[v6][:port]`; the port is what follows the colon (maybe
/// empty, as RFC 9110 allows). An unclosed `[`, or anything but a port after `]`, is
/// invalid.
fn split_port(raw: &[u8]) -> Result<(&[u8], &[u8]), HostError> {
    if raw.first() == Some(&b'[') {
        let end = raw
            .iter()
            .position(|&b| b == b']')
            .ok_or(HostError::Invalid)?;
        let (host, rest) = raw.split_at(end + 1);
        return match rest {
            [] => Ok((host, rest)),
            [b':', port @ ..] => Ok((host, port)),
            _ => Err(HostError::Invalid),
        };
    }
    Ok(match raw.iter().position(|&b| b == b':') {
        // A second colon is an unbracketed IPv6 literal or garbage: the port check fails.
        Some(colon) => (&raw[..colon], &raw[colon + 1..]),
        None => (raw, &[]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_lowercased_and_port_stripped() {
        assert_eq!(
            HostBuf::parse(b"Shop.Example.COM:8080").unwrap().as_str(),
            "shop.example.com"
        );
        assert_eq!(HostBuf::parse(b"[::1]:8080").unwrap().as_str(), "[::1]");
        assert_eq!(HostBuf::parse(b"").err(), Some(HostError::Missing));
        assert_eq!(HostBuf::parse(b":80").err(), Some(HostError::Missing));
        assert_eq!(HostBuf::parse(b"a b").err(), Some(HostError::Invalid));
        assert_eq!(HostBuf::parse(&[b'a'; 300]).err(), Some(HostError::Invalid));
    }

    #[test]
    fn every_byte_is_accepted_exactly_when_a_host_name_may_hold_it() {
        for b in 0..=255u8 {
            let allowed = b.is_ascii_alphanumeric() || b"-_.".contains(&b);
            let raw = [b'a', b, b'z'];
            let parsed = HostBuf::parse(&raw).map(|h| h.as_bytes().to_vec());
            let want = [b'a', b.to_ascii_lowercase(), b'z'];
            match (allowed, b) {
                // A colon starts a port (here not digits); the trailing-dot rule is apart.
                (_, b':') => assert_eq!(parsed, Err(HostError::Invalid)),
                (true, _) => assert_eq!(parsed, Ok(want.to_vec()), "byte {b}"),
                (false, _) => assert_eq!(parsed, Err(HostError::Invalid), "byte {b}"),
            }
        }
    }

    #[test]
    fn host_edge_cases() {
        let ok = |raw: &str| HostBuf::parse(raw.as_bytes()).map(|h| h.as_str().to_string());
        assert_eq!(
            ok("a.test:abc"),
            Err(HostError::Invalid),
            "a port is digits"
        );
        assert_eq!(ok("a.test:123456"), Err(HostError::Invalid));
        assert_eq!(
            ok("a.test:"),
            Ok("a.test".into()),
            "an empty port is allowed"
        );
        assert_eq!(ok("[::1"), Err(HostError::Invalid), "unclosed bracket");
        assert_eq!(ok("[::1]x"), Err(HostError::Invalid));
        assert_eq!(ok("[nope]"), Err(HostError::Invalid));
        assert_eq!(ok("::1"), Err(HostError::Invalid), "IPv6 must be bracketed");
        assert_eq!(ok("Shop.Example.com."), Ok("shop.example.com".into()));
        assert_eq!(ok("shop.example.com.:8080"), Ok("shop.example.com".into()));
        assert_eq!(ok("."), Err(HostError::Missing));
        assert_eq!(ok("[2001:DB8:0::1]:8443"), Ok("[2001:db8::1]".into()));
        assert_eq!(ok("[::ffff:10.0.0.1]"), Ok("[::ffff:10.0.0.1]".into()));
    }
}
