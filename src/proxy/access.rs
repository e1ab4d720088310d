//! A request's access log line: what the session and the context know when the request
//! ends, borrowed into an [`accesslog::Record`] and queued ([`push`]). Nothing here
//! formats or allocates beyond the record's few inline lists: the writer thread formats
//! (see [`crate::accesslog`]).

use std::net::SocketAddr;

use http::Version;
use pingora_proxy::Session;
use smallvec::SmallVec;

use crate::accesslog::{self, AccessLog, Protocol, Record};
use crate::limits::Nanos;
use crate::proxy::ctx::Ctx;
use crate::runtime::decide;

/// Queues the line of the request `session` ends with `status` (0: none sent), at `now`
/// on the proxy's clock.
pub fn push(log: &AccessLog, session: &Session, ctx: &Ctx, status: u16, now: Nanos) {
    let conf = log.conf();
    let req = session.req_header();
    let peer: Option<SocketAddr> = session.client_addr().and_then(|a| a.as_inet()).copied();
    let path = if conf.query {
        req.uri.path_and_query().map_or("", |p| p.as_str())
    } else {
        req.uri.path()
    };
    let protocol = match req.version {
        Version::HTTP_10 | Version::HTTP_09 => Protocol::Http10,
        Version::HTTP_2 => Protocol::H2,
        _ => Protocol::Http11,
    };
    let (origin, customer, rejected, shadows) = limits(ctx, req);
    let (tls, sni) = tls(session);
    let mut headers = SmallVec::new();
    for name in &conf.headers {
        for value in req.headers.get_all(name.as_str()) {
            headers.push((name.as_bytes(), value.as_bytes()));
        }
    }
    let (upstream_status, upstream_ttfb) = match ctx.upstream_answer {
        Some((s, t)) => (s, Some(t)),
        None => (0, None),
    };
    let arrived = if ctx.arrived == 0 { now } else { ctx.arrived };
    let rec = Record {
        time: arrived,
        duration: now.saturating_sub(arrived),
        status,
        upstream_status,
        upstream_ttfb,
        bytes_in: session.body_bytes_read() as u64,
        bytes_out: session.body_bytes_sent() as u64,
        client_ip: ctx.client_ip.or(peer.map(|p| p.ip())),
        peer,
        upstream: ctx.upstream,
        protocol,
        request_id: ctx.request_id.as_str().as_bytes(),
        customer,
        method: req.method.as_str().as_bytes(),
        host: ctx.host.as_str().as_bytes(),
        path: path.as_bytes(),
        tls: tls.as_bytes(),
        sni: sni.as_bytes(),
        origin,
        rejected_limit: rejected.0,
        rejected_kind: rejected.1,
        source: ctx.source.as_bytes(),
        shadow_rejected: shadows,
        headers,
    };
    log.push(&rec);
}

/// What the limits saw and said: the origin's name, the customer, the rejecting limit
/// (name, kind) and the shadow-rejecting ones.
#[allow(clippy::type_complexity)]
fn limits<'a>(
    ctx: &'a Ctx,
    req: &'a pingora::http::RequestHeader,
) -> (
    &'a [u8],
    &'a [u8],
    (&'a [u8], &'a [u8]),
    SmallVec<[&'a [u8]; 2]>,
) {
    let mut shadows = SmallVec::new();
    let (Some(rt), Some(i)) = (ctx.rt.as_ref(), ctx.origin) else {
        return (b"", b"", (b"", b""), shadows);
    };
    let origin = &rt.origins[i];
    let from_header = match (&rt.config.server.customer_header, ctx.trusted_peer) {
        (Some(name), true) => req.headers.get(name.as_str()).map(|v| v.as_bytes()),
        _ => None,
    };
    let customer = from_header.unwrap_or(&origin.customer);
    let rejected = ctx
        .rejected
        .and_then(|(phase, limit)| decide::limit_of(origin, phase, limit))
        .map_or((&b""[..], &b""[..]), |l| {
            (l.name.as_bytes(), l.kind.name().as_bytes())
        });
    for note in &ctx.notes {
        if !note.verdict.allowed {
            if let Some(l) = decide::limit_of(origin, note.phase, note.limit) {
                shadows.push(l.name.as_bytes());
            }
        }
    }
    (origin.name.as_bytes(), customer, rejected, shadows)
}

/// The TLS version and the SNI of the request's connection (empty when plaintext; the
/// SNI is known on HTTP/1 connections, whose stream tollgate sees).
fn tls(session: &Session) -> (&str, &str) {
    let down = session.as_downstream();
    if let Some(ssl) = down.stream().and_then(|s| s.get_ssl()) {
        let sni = ssl
            .servername(openssl::ssl::NameType::HOST_NAME)
            .unwrap_or_default();
        return (ssl.version_str(), sni);
    }
    match down.digest().and_then(|d| d.ssl_digest.as_ref()) {
        Some(d) => (&d.version, ""),
        None => ("", ""),
    }
}

// The record's lists stay inline for the usual request.
const _: () = assert!(accesslog::record::MAX_ITEMS >= 2);
