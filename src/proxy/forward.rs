//! What tollgate changes in a request's header before it goes upstream, and the requests it
//! refuses because their header cannot be forwarded as it is.
//!
//! - **`Content-Length`.** Pingora's parser accepts a length repeated with one value
//!   (`Content-Length: 5, 5`, or two lines of `5`) and refuses different values with 400
//!   (RFC 9112 §6.3), but it forwards the field as it came. An upstream or a cache behind
//!   tollgate may read a repeated length differently (request smuggling lives in such
//!   disagreements), so the request goes upstream with one canonical value
//!   ([`content_length`]).
//! - **`X-Forwarded-For`.** Several lines of it are one comma-separated list, in order
//!   (RFC 9110 §5.3): the client's identity walks all of them ([`super::identity`]), and the
//!   upstream receives all of them as one line with the direct peer appended
//!   ([`forwarded_for`]). Keeping only the first line would drop what a trusted proxy
//!   appended on its own line and forward what the client wrote.
//! - **Field count.** Pingora's HTTP/1 parser reads at most [`MAX_FORWARDED_FIELDS`]
//!   header fields, in tollgate as in a Pingora upstream (tollgate's demo upstream is one).
//!   A request that arrives with that many, without `X-Forwarded-For` and `X-Request-Id`,
//!   would go upstream with two more: the upstream refuses it by closing the connection, which tollgate saw as
//!   a failed upstream (502, and a retry of an idempotent request). Such a request is the
//!   client's: it is answered 431 Request Header Fields Too Large (RFC 6585 §5) before any
//!   limit counts it ([`forwarded_fields`]). More fields than that never reach tollgate's
//!   hooks: Pingora answers them 400 itself.

use std::io::Write;
use std::net::IpAddr;

use http::header::{HeaderName, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue};

/// The most header fields a request may carry upstream: Pingora's parser bound
/// (`MAX_HEADERS` in `pingora-core`), which tollgate's listener applies to what it reads
/// and a Pingora upstream applies to what tollgate sends.
pub const MAX_FORWARDED_FIELDS: usize = 256;

/// The field's name, parsed once: a lookup by `&str` parses the name on every call.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `X-Request-Id`'s name, parsed once (see [`X_FORWARDED_FOR`]).
const X_REQUEST_ID: HeaderName = HeaderName::from_static(super::request_id::HEADER);

/// The longest canonical address in text: an IPv6 address with an embedded IPv4 one
/// (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`) is 45 bytes.
const MAX_ADDR_LEN: usize = 45;

/// `Content-Length` values that disagree or are not numbers: the request's framing is
/// unknown (RFC 9112 §6.3), so it is answered 400. Pingora refuses these before any hook
/// runs; this is the same rule where tollgate rewrites the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Content-Length holds different or invalid values")]
pub struct BadContentLength;

/// The one value a repeated `Content-Length` stands for, when it must be rewritten:
/// `Ok(None)` when there is nothing to rewrite (no field, one line holding one number, or a
/// `Transfer-Encoding`, which frames the body instead: Pingora drops the length then);
/// `Ok(Some(n))` when the lines and comma-separated members all say `n`.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, BadContentLength> {
    let mut lines = headers.get_all(CONTENT_LENGTH).iter();
    let Some(first) = lines.next() else {
        return Ok(None);
    };
    let repeated = lines.next().is_some();
    if !repeated && !first.as_bytes().contains(&b',') || headers.contains_key(TRANSFER_ENCODING) {
        return Ok(None);
    }
    let mut value = None;
    for line in headers.get_all(CONTENT_LENGTH) {
        for member in line.as_bytes().split(|b| *b == b',') {
            let n = parse_length(member.trim_ascii()).ok_or(BadContentLength)?;
            if value.is_some_and(|v| v != n) {
                return Err(BadContentLength);
            }
            value = Some(n);
        }
    }
    value.map(Some).ok_or(BadContentLength)
}

/// A length: 1 to 19 decimal digits (below `u64::MAX`), nothing else.
fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The `X-Forwarded-For` line the upstream receives: every line of the request's field,
/// in order, joined into one list, with `peer` (the direct peer, canonical) appended, the
/// way every proxy in a chain does (trust is the next hop's decision, as it is ours).
/// Empty lines and empty members at a line's ends are left out.
pub fn forwarded_for(headers: &HeaderMap, peer: IpAddr) -> HeaderValue {
    let mut buf = [0u8; MAX_ADDR_LEN];
    let peer = addr_text(peer.to_canonical(), &mut buf);
    let mut lines = headers.get_all(X_FORWARDED_FOR).iter().peekable();
    if lines.peek().is_none() {
        // The common case: the address alone, one copy.
        return HeaderValue::from_bytes(peer).unwrap_or(HeaderValue::from_static(""));
    }
    let mut value: Vec<u8> = Vec::new();
    for line in lines {
        let list = trim_list(line.as_bytes());
        if !list.is_empty() {
            value.extend_from_slice(list);
            value.extend_from_slice(b", ");
        }
    }
    value.extend_from_slice(peer);
    // Each part came from a valid field value, and ", " and an address are valid too.
    HeaderValue::from_bytes(&value).unwrap_or(HeaderValue::from_static(""))
}

/// `addr` as text, written into `buf` without the formatter's padding machinery (it
/// formats an address twice to support widths: a third of an upstream request's own
/// cost here). IPv4 is written digit by digit; IPv6 through `Display`, which is exact.
fn addr_text(addr: IpAddr, buf: &mut [u8; MAX_ADDR_LEN]) -> &[u8] {
    let len = match addr {
        IpAddr::V4(v4) => {
            let mut at = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[at] = b'.';
                    at += 1;
                }
                if octet >= 100 {
                    buf[at] = b'0' + octet / 100;
                    at += 1;
                }
                if octet >= 10 {
                    buf[at] = b'0' + octet / 10 % 10;
                    at += 1;
                }
                buf[at] = b'0' + octet % 10;
                at += 1;
            }
            at
        }
        IpAddr::V6(v6) => {
            let mut out = &mut buf[..];
            // 45 bytes hold every IPv6 address's text; a failure writes nothing.
            let _ = write!(out, "{v6}");
            MAX_ADDR_LEN - out.len()
        }
    };
    &buf[..len]
}

/// `bytes` without whitespace and commas at either end.
fn trim_list(bytes: &[u8]) -> &[u8] {
    let skip = |b: &u8| b.is_ascii_whitespace() || *b == b',';
    let start = bytes.iter().position(|b| !skip(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !skip(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// How many header fields the request carries upstream: its own, with every
/// `X-Forwarded-For` line merged into the one line tollgate sends, and every
/// `X-Request-Id` line into the one ID tollgate sends (kept or generated).
fn forwarded_fields(headers: &HeaderMap) -> usize {
    let xff_lines = headers.get_all(X_FORWARDED_FOR).iter().count();
    let id_lines = headers.get_all(X_REQUEST_ID).iter().count();
    headers.len() - xff_lines - id_lines + 2
}

/// Whether the request carries more fields upstream than [`MAX_FORWARDED_FIELDS`]
/// (`Some(count)`), counted only when it could: merging lines only lowers the count, so a
/// request with at most `MAX_FORWARDED_FIELDS - 2` fields passes without a lookup.
pub fn too_many_fields(headers: &HeaderMap) -> Option<usize> {
    if headers.len() + 2 <= MAX_FORWARDED_FIELDS {
        return None;
    }
    Some(forwarded_fields(headers)).filter(|&n| n > MAX_FORWARDED_FIELDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in fields {
            h.append(*name, value.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_repeated_length_becomes_one_value() {
        let cl = |f: &[(&'static str, &str)]| content_length(&headers(f));
        assert_eq!(cl(&[]), Ok(None));
        assert_eq!(cl(&[("content-length", "5")]), Ok(None));
        assert_eq!(cl(&[("content-length", "5, 5")]), Ok(Some(5)));
        assert_eq!(cl(&[("content-length", "5,5,5")]), Ok(Some(5)));
        assert_eq!(
            cl(&[("content-length", "5"), ("content-length", " 5 ")]),
            Ok(Some(5))
        );
        assert_eq!(
            cl(&[("content-length", "5"), ("content-length", "6")]),
            Err(BadContentLength)
        );
        assert_eq!(cl(&[("content-length", "5, 6")]), Err(BadContentLength));
        assert_eq!(cl(&[("content-length", "5, ")]), Err(BadContentLength));
        assert_eq!(cl(&[("content-length", "-5, -5")]), Err(BadContentLength));
        assert_eq!(
            cl(&[(
                "content-length",
                "99999999999999999999, 99999999999999999999"
            )]),
            Err(BadContentLength)
        );
        assert_eq!(
            cl(&[("content-length", "5, 6"), ("transfer-encoding", "chunked")]),
            Ok(None)
        );
    }

    #[test]
    fn every_forwarded_for_line_reaches_the_upstream_in_order() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let xff = |f: &[(&'static str, &str)]| forwarded_for(&headers(f), peer);
        assert_eq!(xff(&[]), "127.0.0.1");
        assert_eq!(
            xff(&[("x-forwarded-for", "198.51.100.1")]),
            "198.51.100.1, 127.0.0.1"
        );
        assert_eq!(
            xff(&[
                ("x-forwarded-for", "6.6.6.6, 198.51.100.1"),
                ("x-forwarded-for", "10.0.0.1"),
            ]),
            "6.6.6.6, 198.51.100.1, 10.0.0.1, 127.0.0.1"
        );
        assert_eq!(
            xff(&[("x-forwarded-for", " , "), ("x-forwarded-for", "1.1.1.1,")]),
            "1.1.1.1, 127.0.0.1"
        );
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(forwarded_for(&HeaderMap::new(), mapped), "127.0.0.1");
    }

    #[test]
    fn an_address_is_written_as_display_writes_it() {
        let mut buf = [0u8; MAX_ADDR_LEN];
        for text in [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "198.51.100.7",
            "::1",
            "2001:db8::8a2e:370:7334",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:1.2.3.4",
        ] {
            let addr: IpAddr = text.parse().unwrap();
            assert_eq!(
                addr_text(addr, &mut buf),
                addr.to_string().as_bytes(),
                "{text}"
            );
        }
        for n in (0..=u32::MAX).step_by(7_919_993) {
            let addr = IpAddr::V4(n.into());
            assert_eq!(addr_text(addr, &mut buf), addr.to_string().as_bytes());
        }
    }

    #[test]
    fn fields_are_counted_only_near_the_bound() {
        let mut h = HeaderMap::new();
        for i in 0..MAX_FORWARDED_FIELDS - 2 {
            h.append(
                HeaderName::try_from(format!("f{i}")).unwrap(),
                "v".parse().unwrap(),
            );
        }
        assert_eq!(too_many_fields(&h), None);
        h.append("x-forwarded-for", "1.1.1.1".parse().unwrap());
        assert_eq!(
            too_many_fields(&h),
            None,
            "the merged line replaces this one"
        );
        h.append("f-last", "v".parse().unwrap());
        assert_eq!(too_many_fields(&h), Some(MAX_FORWARDED_FIELDS + 1));
    }

    #[test]
    fn forwarded_fields_count_one_forwarded_for_line_and_one_request_id() {
        let h = headers(&[("host", "a"), ("accept", "*/*")]);
        assert_eq!(forwarded_fields(&h), 4);
        let h = headers(&[
            ("host", "a"),
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
            ("x-request-id", "a"),
            ("x-request-id", "b"),
        ]);
        assert_eq!(forwarded_fields(&h), 3);
    }
}
