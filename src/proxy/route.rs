//! Reading a request's `Host`: lower-cased into a fixed inline buffer with the port
//! stripped, so that routing ([`crate::runtime::router`]) never allocates.

/// The longest host tollgate accepts (a DNS name is at most 253 octets).
pub const MAX_HOST_LEN: usize = 253;

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
    /// Lower-cases `raw` (a `Host` value, maybe with a port) into the buffer, port stripped.
    /// IPv6 literals keep their brackets: `[::1]:8080` becomes `[::1]`.
    pub fn parse(raw: &[u8]) -> Result<Self, HostError> {
        let host = strip_port(raw);
        if host.is_empty() {
            return Err(HostError::Missing);
        }
        if host.len() > MAX_HOST_LEN {
            return Err(HostError::Invalid);
        }
        let mut out = HostBuf::default();
        for (dst, &b) in out.buf.iter_mut().zip(host) {
            if !(b.is_ascii_alphanumeric() || b"-._:[]".contains(&b)) {
                return Err(HostError::Invalid);
            }
            *dst = b.to_ascii_lowercase();
        }
        // MAX_HOST_LEN < 256, so the length fits.
        out.len = host.len() as u8;
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

fn strip_port(raw: &[u8]) -> &[u8] {
    if raw.first() == Some(&b'[') {
        // [v6]:port
        return match raw.iter().position(|&b| b == b']') {
            Some(end) => &raw[..=end],
            None => raw,
        };
    }
    match raw.iter().rposition(|&b| b == b':') {
        Some(colon) => &raw[..colon],
        None => raw,
    }
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
}
