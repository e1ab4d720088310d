//! One access-log line as the simulation sees it ([`Line`], borrowed from the read buffer),
//! and the [`Facts`] the limits read from it ([`LineFacts`]): the same key parts the proxy
//! builds from a live request (`src/proxy/identity.rs`), taken from the log instead.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use smallvec::SmallVec;

use crate::limits::{Fact, Facts, KeyPart, Nanos};

/// The request headers a line carries, names as written. Four inline before spilling to
/// the heap (a combined line has two; a line is moved once per parse, so it stays small).
pub type Headers<'a> = SmallVec<[(&'a [u8], &'a [u8]); 4]>;

/// What one log line says about one request. Every field but `time` may be absent; a key
/// part the line lacks makes the limits keyed on it skip the request, as in the proxy.
#[derive(Debug, Default, Clone)]
pub struct Line<'a> {
    /// When the request arrived: nanoseconds since the Unix epoch.
    pub time: Nanos,
    /// The client's IP (the log's remote address).
    pub client_ip: Option<IpAddr>,
    /// The host the log recorded (nginx `$host`, a vhost field), as written.
    pub host: Option<&'a [u8]>,
    /// The request method.
    pub method: Option<&'a [u8]>,
    /// The path, query removed.
    pub path: Option<&'a [u8]>,
    /// An explicit customer (a jsonl `customer` field).
    pub customer: Option<&'a [u8]>,
    /// Request headers (`referer` and `user-agent` from a combined line).
    pub headers: Headers<'a>,
    /// The upstream server that served it, for `server_ip` / `server_addr` keys.
    pub upstream: Option<SocketAddr>,
    /// How long the request took (jsonl `request_time`): holding limits (inflight,
    /// concurrency) keep their unit this long in virtual time.
    pub duration: Option<Nanos>,
}

impl<'a> Line<'a> {
    /// The first header named `name`: see [`same_header`].
    pub fn header(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|(n, _)| same_header(n, name))
            .map(|&(_, v)| v)
    }

    /// Whether the line carries header `name` more than once.
    pub fn header_repeated(&self, name: &[u8]) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| same_header(n, name))
            .nth(1)
            .is_some()
    }
}

/// Whether a logged header name is `name`: ASCII case ignored, and `_` taken as `-`, so
/// that nginx's variable spelling (`http_x_customer_id`, prefix stripped by the parser)
/// names the header `x-customer-id`.
pub fn same_header(logged: &[u8], name: &[u8]) -> bool {
    let norm = |b: u8| {
        if b == b'_' {
            b'-'
        } else {
            b.to_ascii_lowercase()
        }
    };
    logged.len() == name.len() && logged.iter().zip(name).all(|(&a, &b)| norm(a) == norm(b))
}

/// A path without its query; the path of an absolute-form target (`http://h/p?q` → `/p`).
pub fn path_of(target: &[u8]) -> &[u8] {
    let target = match memchr::memchr(b'?', target) {
        Some(q) => &target[..q],
        None => target,
    };
    if target.first() == Some(&b'/') {
        return target;
    }
    // Absolute form: skip `scheme://authority`.
    match memchr::memmem::find(target, b"://") {
        Some(i) => {
            let rest = &target[i + 3..];
            memchr::memchr(b'/', rest).map_or(b"/", |slash| &rest[slash..])
        }
        None => target,
    }
}

/// One line's facts for one origin: the line plus what routing decided.
pub struct LineFacts<'a, 'l> {
    /// The line.
    pub line: &'a Line<'l>,
    /// The host, lower-cased, port stripped (the origin's first host for a line without).
    pub host: &'a [u8],
    /// The origin's name.
    pub origin: &'a str,
    /// The customer: the line's, else the origin's.
    pub customer: &'a [u8],
    /// The upstream server (the line's, else the origin's next one), for holding kinds.
    pub server: Option<SocketAddr>,
    /// The line's path, normalized as the proxy normalizes it for limits
    /// (`crate::limits::path`).
    pub path: Option<Cow<'l, [u8]>>,
}

impl Facts for LineFacts<'_, '_> {
    fn fact<'b>(&'b self, part: &'b KeyPart) -> Option<Fact<'b>> {
        match part {
            KeyPart::ClientIp => self.line.client_ip.map(Fact::Ip),
            KeyPart::Customer => Some(Fact::Bytes(self.customer)),
            KeyPart::Host => Some(Fact::Bytes(self.host)),
            KeyPart::ServerIp => self.server.map(|s| Fact::Ip(s.ip())),
            KeyPart::ServerAddr => self.server.map(Fact::Addr),
            KeyPart::Origin => Some(Fact::Bytes(self.origin.as_bytes())),
            KeyPart::Method => self.line.method.map(Fact::Bytes),
            KeyPart::Path => self.path.as_deref().map(Fact::Bytes),
            KeyPart::Header(name) => self.line.header(name.as_bytes()).map(Fact::Bytes),
            KeyPart::Const(text) => Some(Fact::Bytes(text.as_bytes())),
        }
    }

    fn repeated(&self, part: &KeyPart) -> bool {
        match part {
            KeyPart::Header(name) => self.line.header_repeated(name.as_bytes()),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_lose_query_and_authority() {
        assert_eq!(path_of(b"/a/b?x=1"), b"/a/b");
        assert_eq!(path_of(b"/"), b"/");
        assert_eq!(path_of(b"http://h.test/p?q"), b"/p");
        assert_eq!(path_of(b"https://h.test"), b"/");
        assert_eq!(path_of(b"*"), b"*");
    }

    #[test]
    fn headers_match_case_insensitively() {
        let mut line = Line::default();
        line.headers.push((b"X-Customer", b"acme"));
        assert_eq!(line.header(b"x-customer"), Some(&b"acme"[..]));
        assert!(!line.header_repeated(b"x-customer"));
        line.headers.push((b"x_customer", b"other"));
        assert!(line.header_repeated(b"x-customer"));
    }
}
