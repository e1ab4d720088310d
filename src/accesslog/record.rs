//! One request's line before it is formatted: [`Record`], borrowed from the request, and
//! its compact binary form. The request path only copies a record's bytes into a shard's
//! buffer ([`Record::encode`]); the writer thread decodes it ([`Record::decode`]) and does
//! the formatting (escaping, numbers, the time), so that what a request pays for its line
//! is a memcpy of its fields.
//!
//! Layout: a `u32` length of the rest, the fixed-size numbers, three addresses, then each
//! text as a `u16` length and its bytes (every text is cut at [`MAX_TEXT`]), then the
//! shadow limits and the headers, each list a `u8` count of texts (or pairs).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use smallvec::SmallVec;

/// The longest text kept from one field (a path, a header value): longer ones are cut.
pub const MAX_TEXT: usize = 4096;

/// The most shadow-rejecting limits or headers one line names.
pub const MAX_ITEMS: usize = 32;

/// The protocol a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// HTTP/1.0.
    Http10,
    /// HTTP/1.1.
    #[default]
    Http11,
    /// HTTP/2.
    H2,
}

impl Protocol {
    /// The name in a json line.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http10 => "HTTP/1.0",
            Protocol::Http11 => "HTTP/1.1",
            Protocol::H2 => "h2",
        }
    }

    /// The name in a request line (nginx's `$server_protocol`).
    pub fn request_line(self) -> &'static str {
        match self {
            Protocol::Http10 => "HTTP/1.0",
            Protocol::Http11 => "HTTP/1.1",
            Protocol::H2 => "HTTP/2.0",
        }
    }

    fn code(self) -> u8 {
        self as u8
    }

    fn of(code: u8) -> Protocol {
        match code {
            0 => Protocol::Http10,
            2 => Protocol::H2,
            _ => Protocol::Http11,
        }
    }
}

/// What one line says about one request. Empty texts are absent fields (`null`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record<'a> {
    /// When the request's header was read: nanoseconds since the Unix epoch.
    pub time: u64,
    /// How long the request took, in nanoseconds.
    pub duration: u64,
    /// The status sent to the client; 0 when none was.
    pub status: u16,
    /// The upstream's status; 0 when no upstream answered.
    pub upstream_status: u16,
    /// Nanoseconds from sending the request upstream to its response header.
    pub upstream_ttfb: Option<u64>,
    /// Request body bytes read.
    pub bytes_in: u64,
    /// Response body bytes sent.
    pub bytes_out: u64,
    /// The client (after trusted `X-Forwarded-For`).
    pub client_ip: Option<IpAddr>,
    /// The direct peer.
    pub peer: Option<SocketAddr>,
    /// The upstream server the request went to.
    pub upstream: Option<SocketAddr>,
    /// HTTP/1.0, HTTP/1.1 or h2.
    pub protocol: Protocol,
    /// The request ID (kept from a trusted proxy, or generated).
    pub request_id: &'a [u8],
    /// The customer, as the limits saw it.
    pub customer: &'a [u8],
    /// The method.
    pub method: &'a [u8],
    /// The host as served (lower case).
    pub host: &'a [u8],
    /// The path, with or without its query (`query`).
    pub path: &'a [u8],
    /// The TLS version, when the request came over TLS.
    pub tls: &'a [u8],
    /// The server name the client asked for in its TLS hello.
    pub sni: &'a [u8],
    /// The origin the host routed to.
    pub origin: &'a [u8],
    /// The limit that rejected the request.
    pub rejected_limit: &'a [u8],
    /// That limit's kind.
    pub rejected_kind: &'a [u8],
    /// Who decided the admissions on a shared store: `store`, `fallback`, `deny_cache`.
    pub source: &'a [u8],
    /// Limits in shadow mode (or under the kill switch) that would have rejected.
    pub shadow_rejected: SmallVec<[&'a [u8]; 2]>,
    /// The configured request headers the request carried.
    pub headers: SmallVec<[(&'a [u8], &'a [u8]); 4]>,
}

fn cut(text: &[u8]) -> &[u8] {
    &text[..text.len().min(MAX_TEXT)]
}

fn put_text(out: &mut Vec<u8>, text: &[u8]) {
    let text = cut(text);
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text);
}

fn put_ip(out: &mut Vec<u8>, ip: Option<IpAddr>) {
    match ip {
        None => out.push(0),
        Some(IpAddr::V4(v4)) => {
            out.push(4);
            out.extend_from_slice(&v4.octets());
        }
        Some(IpAddr::V6(v6)) => {
            out.push(6);
            out.extend_from_slice(&v6.octets());
        }
    }
}

fn put_addr(out: &mut Vec<u8>, addr: Option<SocketAddr>) {
    put_ip(out, addr.map(|a| a.ip()));
    if let Some(a) = addr {
        out.extend_from_slice(&a.port().to_le_bytes());
    }
}

/// Reads a record's bytes in the order they were written.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn text(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn ip(&mut self) -> Option<Option<IpAddr>> {
        Some(match self.u8()? {
            0 => None,
            4 => {
                let o: [u8; 4] = self.take(4)?.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(o)))
            }
            6 => {
                let o: [u8; 16] = self.take(16)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(o)))
            }
            _ => return None,
        })
    }

    fn addr(&mut self) -> Option<Option<SocketAddr>> {
        Some(match self.ip()? {
            None => None,
            Some(ip) => Some(SocketAddr::new(ip, self.u16()?)),
        })
    }
}

impl<'a> Record<'a> {
    /// Appends the record's binary form to `out`: its length, then its fields.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.time.to_le_bytes());
        out.extend_from_slice(&self.duration.to_le_bytes());
        out.extend_from_slice(&self.upstream_ttfb.unwrap_or(u64::MAX).to_le_bytes());
        out.extend_from_slice(&self.bytes_in.to_le_bytes());
        out.extend_from_slice(&self.bytes_out.to_le_bytes());
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.upstream_status.to_le_bytes());
        out.push(self.protocol.code());
        put_ip(out, self.client_ip);
        put_addr(out, self.peer);
        put_addr(out, self.upstream);
        for text in [
            self.request_id,
            self.customer,
            self.method,
            self.host,
            self.path,
            self.tls,
            self.sni,
            self.origin,
            self.rejected_limit,
            self.rejected_kind,
            self.source,
        ] {
            put_text(out, text);
        }
        let shadows = &self.shadow_rejected[..self.shadow_rejected.len().min(MAX_ITEMS)];
        out.push(shadows.len() as u8);
        for s in shadows {
            put_text(out, s);
        }
        let headers = &self.headers[..self.headers.len().min(MAX_ITEMS)];
        out.push(headers.len() as u8);
        for (name, value) in headers {
            put_text(out, name);
            put_text(out, value);
        }
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// The first record of `buf` and the bytes after it; `None` when `buf` does not start
    /// with a whole, well-formed record (never the case for what [`Record::encode`]
    /// wrote).
    pub fn decode(buf: &'a [u8]) -> Option<(Record<'a>, &'a [u8])> {
        let len = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
        let body = buf.get(4..4 + len)?;
        let rest = &buf[4 + len..];
        let mut r = Reader { buf: body };
        let mut rec = Record {
            time: r.u64()?,
            duration: r.u64()?,
            upstream_ttfb: Some(r.u64()?).filter(|t| *t != u64::MAX),
            bytes_in: r.u64()?,
            bytes_out: r.u64()?,
            status: r.u16()?,
            upstream_status: r.u16()?,
            protocol: Protocol::of(r.u8()?),
            client_ip: r.ip()?,
            peer: r.addr()?,
            upstream: r.addr()?,
            ..Record::default()
        };
        rec.request_id = r.text()?;
        rec.customer = r.text()?;
        rec.method = r.text()?;
        rec.host = r.text()?;
        rec.path = r.text()?;
        rec.tls = r.text()?;
        rec.sni = r.text()?;
        rec.origin = r.text()?;
        rec.rejected_limit = r.text()?;
        rec.rejected_kind = r.text()?;
        rec.source = r.text()?;
        for _ in 0..r.u8()? {
            rec.shadow_rejected.push(r.text()?);
        }
        for _ in 0..r.u8()? {
            let name = r.text()?;
            rec.headers.push((name, r.text()?));
        }
        Some((rec, rest))
    }
}

#[cfg(test)]
impl Record<'_> {
    /// A record that names every field (so that a new one is round-tripped by the tests)
    /// and sets most, with a path to escape: the encoding's and the formats' tests share it.
    pub(crate) fn sample() -> Self {
        Record {
            time: 1_795_784_701_123_456_789,
            duration: 1_234_567,
            status: 429,
            upstream_status: 0,
            upstream_ttfb: None,
            bytes_in: 10,
            bytes_out: 200,
            client_ip: Some("2001:db8::1".parse().unwrap()),
            peer: Some("127.0.0.1:5555".parse().unwrap()),
            upstream: None,
            protocol: Protocol::H2,
            request_id: b"id-1",
            customer: b"acme",
            method: b"GET",
            host: b"shop.test",
            path: b"/a\"b\xff\n",
            tls: b"TLSv1.3",
            sni: b"shop.test",
            origin: b"shop",
            rejected_limit: b"per_ip",
            rejected_kind: b"rate",
            source: b"",
            shadow_rejected: SmallVec::from_slice(&[b"new".as_slice()]),
            headers: SmallVec::from_slice(&[(b"user-agent".as_slice(), b"curl/8".as_slice())]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_records_follow_each_other() {
        let mut buf = Vec::new();
        let a = Record::sample();
        let b = Record {
            upstream: Some("10.0.0.1:80".parse().unwrap()),
            upstream_ttfb: Some(5),
            client_ip: None,
            ..Record::default()
        };
        a.encode(&mut buf);
        b.encode(&mut buf);
        let (got_a, rest) = Record::decode(&buf).unwrap();
        assert_eq!(got_a, a);
        let (got_b, rest) = Record::decode(rest).unwrap();
        assert_eq!(got_b, b);
        assert!(rest.is_empty());
        assert!(
            Record::decode(&buf[..buf.len() - 1]).is_some(),
            "first is whole"
        );
        assert!(Record::decode(&buf[..10]).is_none());
    }

    #[test]
    fn long_texts_are_cut() {
        let long = vec![b'x'; MAX_TEXT + 10];
        let rec = Record {
            path: &long,
            ..Record::default()
        };
        let mut buf = Vec::new();
        rec.encode(&mut buf);
        let (got, _) = Record::decode(&buf).unwrap();
        assert_eq!(got.path.len(), MAX_TEXT);
    }
}
