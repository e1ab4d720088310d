//! Host routing: which origin serves a request's host.
//!
//! Exact names win over `*.suffix` wildcards; among wildcards the longest suffix wins, so
//! `*.api.example.com` beats `*.example.com`. A wildcard matches one or more labels in
//! front of its suffix, never the bare suffix itself (as in nginx's `server_name`).

use std::collections::HashMap;

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

/// Host → origin index.
#[derive(Debug, Default)]
pub struct Router {
    exact: HashMap<String, usize>,
    /// `(".example.com", origin)`, longest suffix first.
    wildcards: Vec<(String, usize)>,
}

impl Router {
    /// Builds the table from each origin's host patterns (already lower-cased and checked
    /// for duplicates by the config).
    pub fn new<'a>(origins: impl IntoIterator<Item = (usize, &'a [String])>) -> Self {
        let mut router = Router::default();
        for (index, hosts) in origins {
            for host in hosts {
                match host.strip_prefix('*') {
                    Some(suffix) => router.wildcards.push((suffix.to_string(), index)),
                    None => {
                        router.exact.insert(host.clone(), index);
                    }
                }
            }
        }
        router
            .wildcards
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        router
    }

    /// The origin for a lower-cased host.
    pub fn route(&self, host: &str) -> Option<usize> {
        if let Some(&index) = self.exact.get(host) {
            return Some(index);
        }
        self.wildcards
            .iter()
            .find(|(suffix, _)| host.len() > suffix.len() && host.ends_with(suffix.as_str()))
            .map(|&(_, index)| index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router {
        let a = vec!["shop.example.com".to_string(), "*.example.com".to_string()];
        let b = vec!["*.api.example.com".to_string()];
        Router::new([(0, a.as_slice()), (1, b.as_slice())])
    }

    #[test]
    fn exact_beats_wildcard_and_longest_suffix_wins() {
        let r = router();
        assert_eq!(r.route("shop.example.com"), Some(0));
        assert_eq!(r.route("www.example.com"), Some(0));
        assert_eq!(r.route("v1.api.example.com"), Some(1));
        assert_eq!(
            r.route("example.com"),
            None,
            "bare suffix is not a wildcard match"
        );
        assert_eq!(r.route("other.org"), None);
    }

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
