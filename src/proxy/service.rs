//! The `ProxyHttp` implementation: the request flow of `docs/architecture.md`, phase by
//! phase. It routes, resolves who is asking, and asks the runtime's one decision loop
//! ([`crate::runtime::decide`]) for each phase's limits; everything it writes itself is a
//! [`Problem`].
//!
//! Errors are logged here, not by Pingora (`suppress_error_log`): each at the level of
//! whose fault it is (a client that went away is `info`, a failing upstream `warn`, only
//! tollgate's own failures `error`), within a [`LogBudget`] per cause, since clients can
//! cause any number of them.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType, Result};
use pingora_proxy::{FailToProxy, ProxyHttp, ProxyWarnLogContext, Session};

use crate::accesslog::AccessLog;
use crate::config::{HeadersMode, UpstreamProtocol};
use crate::limits::{path, Clock, MonotonicClock, Verdict};
use crate::log_budget::{suppressed_note, LogBudget};
use crate::proxy::access;
use crate::proxy::challenge;
use crate::proxy::conn_state::{mark_request_started, Drain};
use crate::proxy::ctx::{Ctx, GaugeGuard};
use crate::proxy::forward;
use crate::proxy::grpc;
use crate::proxy::identity::{client_ip, is_trusted, RequestFacts};
use crate::proxy::pingora_log::redact;
use crate::proxy::problem::{self, Problem, RejectInfo};
use crate::proxy::request_id::{self, RequestId};
use crate::proxy::route::HostBuf;
use crate::runtime::decide::{self, Decided, Phase};
use crate::runtime::learned::{self, Attempt};
use crate::runtime::policy::{ceil_secs, limit_item};
use crate::runtime::{OriginRt, Runtime};

/// The proxy: a swappable runtime (which holds the metric handles), the process's drain
/// flag, a clock, and the log budgets of failed requests.
pub struct Tollgate {
    runtime: Arc<ArcSwap<Runtime>>,
    drain: Arc<Drain>,
    clock: MonotonicClock,
    /// Requests that failed because the client went away or sent garbage.
    client_errors: LogBudget,
    /// Requests that failed because the upstream did.
    upstream_errors: LogBudget,
    /// Upstream attempts that failed and are retried (one request can make many).
    upstream_retries: LogBudget,
    /// Requests that failed inside tollgate.
    internal_errors: LogBudget,
    /// The access log, when `server.access_log` is set (fixed until a restart).
    access_log: Option<Arc<AccessLog>>,
}

impl Tollgate {
    /// A proxy reading its config from `runtime`, which the reloader swaps; once `drain`
    /// starts, every response closes its connection. `clock` times every decision: the
    /// process's clock, which snapshots of the limiters' state are written and loaded on.
    /// Each request's line goes to `access_log`, if any.
    pub fn new(
        runtime: Arc<ArcSwap<Runtime>>,
        drain: Arc<Drain>,
        clock: MonotonicClock,
        access_log: Option<Arc<AccessLog>>,
    ) -> Self {
        Self {
            access_log,
            runtime,
            drain,
            clock,
            client_errors: LogBudget::new(),
            upstream_errors: LogBudget::new(),
            upstream_retries: LogBudget::new(),
            internal_errors: LogBudget::new(),
        }
    }

    /// Logs why a request failed, at the level of whose fault it was, within that
    /// cause's budget.
    fn log_failure(&self, session: &Session, ctx: &Ctx, e: &Error, code: u16) {
        let (level, budget, whose) = match e.esource() {
            ErrorSource::Downstream => (log::Level::Info, &self.client_errors, "client"),
            ErrorSource::Upstream => (log::Level::Warn, &self.upstream_errors, "upstream"),
            ErrorSource::Internal | ErrorSource::Unset => {
                (log::Level::Error, &self.internal_errors, "internal")
            }
        };
        if !log::log_enabled!(level) {
            return;
        }
        let Some(suppressed) = budget.admit(self.clock.now()) else {
            return;
        };
        let origin = match (ctx.rt.as_ref(), ctx.origin) {
            (Some(rt), Some(i)) => rt.origins[i].name.as_str(),
            _ => crate::metrics::UNMATCHED_ORIGIN,
        };
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map_or_else(String::new, |a| a.ip().to_string());
        let answer = match code {
            0 => "no response sent".to_string(),
            code => format!("answered {code}"),
        };
        log::log!(
            level,
            "request failed ({whose}): {}; {answer}, origin `{origin}`, client {client}, {}{}",
            redact(&e.to_string()),
            summary(session),
            suppressed_note(suppressed)
        );
    }

    /// Routes the request, checks that its header can be forwarded, resolves who is asking
    /// and runs the request-time limits. `Some` is the response to send instead of proxying
    /// (400, 404, 431 or 429).
    async fn admit(&self, session: &mut Session, ctx: &mut Ctx, rt: &Runtime) -> Option<Problem> {
        let req = session.req_header();
        let raw_host = req
            .headers
            .get(http::header::HOST)
            .map(|v| v.as_bytes())
            .or_else(|| req.uri.authority().map(|a| a.as_str().as_bytes()))
            .unwrap_or_default();
        let host = match HostBuf::parse(raw_host) {
            Ok(h) => h,
            Err(e) => return Some(problem::bad_request(e.to_string())),
        };
        ctx.host = host;
        let Some(origin_index) = rt.route(host.as_str()) else {
            return Some(problem::unknown_host(host.as_str()));
        };
        ctx.origin = Some(origin_index);
        let origin = &rt.origins[origin_index];
        if let Some(problem) = prepare_forward(session) {
            return Some(problem);
        }
        let req = session.req_header();
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
        let trusted = &rt.config.server.trusted_proxies;
        let client = match client_ip(peer, &req.headers, trusted) {
            Ok(ip) => ip,
            Err(e) => return Some(problem::bad_request(e.to_string())),
        };
        ctx.client_ip = Some(client);
        ctx.trusted_peer = is_trusted(peer, trusted);
        ctx.now = self.clock.now();
        let facts = facts(session, ctx, rt, origin, None);
        let decided = decide::run(
            origin,
            Phase::Request,
            &facts,
            ctx.now,
            &mut ctx.holds,
            &mut ctx.notes,
        )
        .await;
        match decided {
            Ok(None) => None,
            Ok(Some(rejected)) => {
                ctx.rejected = Some((rejected.phase, rejected.limit));
                Some(rejected_problem(origin, &rejected, client, ctx))
            }
            Err(e) => Some(problem::bad_request(e.to_string())),
        }
    }

    /// Picks the upstream server round robin and runs the inflight limits against it:
    /// the server, or the rejection to answer.
    async fn pick_server(
        &self,
        session: &Session,
        ctx: &mut Ctx,
        rt: &Runtime,
    ) -> Result<std::result::Result<SocketAddr, Problem>> {
        let Some(origin_index) = ctx.origin else {
            return Err(Error::explain(
                ErrorType::InternalError,
                "upstream_peer without a routed request",
            ));
        };
        let origin = &rt.origins[origin_index];
        let addr = origin.upstreams.pick().ok_or_else(|| {
            Error::explain(
                ErrorType::ConnectNoRoute,
                "origin has no upstream to select",
            )
        })?;
        // A retry picks a server again: the previous attempt failed at the server (a
        // congestion signal for `max: auto`), and its units are dropped first, so they are
        // replaced, never doubled.
        if let Some(attempt) = ctx.attempt.take() {
            attempt.failed(origin, self.clock.now());
        }
        ctx.holds.retain(|t| t.phase != Phase::Upstream);
        ctx.notes.retain(|n| n.phase != Phase::Upstream);
        let facts = facts(session, ctx, rt, origin, Some(addr));
        // The request's decision time: the holding kinds read no clock, and an undo on a
        // rejection refunds at the time the quota was taken.
        let now = ctx.now;
        let decided = decide::run(
            origin,
            Phase::Upstream,
            &facts,
            now,
            &mut ctx.holds,
            &mut ctx.notes,
        )
        .await;
        let client = ctx.client_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let rejection = match decided {
            Ok(None) => None,
            Ok(Some(rejected)) => {
                ctx.rejected = Some((rejected.phase, rejected.limit));
                Some(rejected_problem(origin, &rejected, client, ctx))
            }
            Err(e) => Some(problem::bad_request(e.to_string())),
        };
        if let Some(problem) = rejection {
            // The decision loop gave back what every limit took: no quota is burnt for a
            // request that never ran.
            return Ok(Err(problem));
        }
        ctx.source = source_of(&ctx.holds);
        decide::settle(origin, &mut ctx.holds);
        if learned::learns(origin) {
            ctx.attempt = Some(Attempt {
                server: addr,
                start: self.clock.now(),
            });
        }
        ctx.upstream = Some(addr);
        if ctx.gauge.is_none() {
            ctx.gauge = Some(GaugeGuard::new(&origin.inflight_gauge));
        }
        Ok(Ok(addr))
    }
}

/// The peer for `addr`, a server of the request's origin.
fn peer_for(ctx: &Ctx, addr: SocketAddr) -> Result<Box<HttpPeer>> {
    let (Some(rt), Some(origin_index)) = (ctx.rt.as_ref(), ctx.origin) else {
        return Err(Error::explain(
            ErrorType::InternalError,
            "upstream_peer without a routed request",
        ));
    };
    let origin = &rt.origins[origin_index];
    let mut peer = HttpPeer::new(addr, origin.tls, origin.sni.clone());
    peer.options.connection_timeout = Some(origin.connect_timeout);
    peer.options.read_timeout = Some(origin.read_timeout);
    if origin.tls && !origin.tls_verify {
        peer.options.verify_cert = false;
        peer.options.verify_hostname = false;
    }
    upstream_http2(&mut peer, origin.upstream_protocol);
    Ok(Box::new(peer))
}

/// Makes the request's header fit to forward (see [`forward`]): one canonical
/// `Content-Length`, and no more fields than the upstream can read. `Some` is the
/// response to send instead (400 or 431).
fn prepare_forward(session: &mut Session) -> Option<Problem> {
    let req = session.req_header_mut();
    if let Some(fields) = forward::too_many_fields(&req.headers) {
        return Some(problem::too_many_fields(
            fields,
            forward::MAX_FORWARDED_FIELDS,
        ));
    }
    match forward::content_length(&req.headers) {
        Ok(None) => None,
        Ok(Some(length)) => req
            .insert_header(http::header::CONTENT_LENGTH, length.to_string())
            .err()
            .map(|e| problem::bad_request(format!("cannot rewrite Content-Length: {e}"))),
        Err(e) => Some(problem::bad_request(e.to_string())),
    }
}

/// What a log line says about a request: its method only (at most 16 bytes). The path,
/// the query and the header can carry credentials (tokens in a query, keys in a path),
/// so no log line carries them; the origin and the client are logged beside it.
fn summary(session: &Session) -> String {
    let method = session.req_header().method.as_str();
    let end = method.len().min(16);
    method.as_bytes()[..end].escape_ascii().to_string()
}

/// HTTP/2 to the upstream when the origin says so (`upstream_protocol`): ALPN `h2` over
/// TLS, prior knowledge in plaintext; streams share a connection, up to
/// [`UPSTREAM_H2_STREAMS`] on one.
fn upstream_http2(peer: &mut HttpPeer, protocol: UpstreamProtocol) {
    if protocol != UpstreamProtocol::Http1 {
        peer.options.set_http_version(2, 2);
        peer.options.max_h2_streams = UPSTREAM_H2_STREAMS;
    }
}

/// Streams one upstream HTTP/2 connection carries before another is opened.
const UPSTREAM_H2_STREAMS: usize = 100;

/// Builds the facts of the current request; `server` once an upstream is picked. The
/// customer header is believed only from a trusted proxy (like `X-Forwarded-For`): from
/// anyone else it would let a client pick its own limits. Otherwise the customer is the
/// origin's `customer` (its name by default).
///
/// The facts copy what they need out of the context (the host is `Copy`), so that the
/// limits can then write their holds and notes into the context.
fn facts<'a>(
    session: &'a Session,
    ctx: &Ctx,
    rt: &'a Runtime,
    origin: &'a OriginRt,
    server: Option<std::net::SocketAddr>,
) -> RequestFacts<'a> {
    let req = session.req_header();
    let from_header = match (&rt.config.server.customer_header, ctx.trusted_peer) {
        (Some(name), true) => req.headers.get(name.as_str()).map(|v| v.as_bytes()),
        _ => None,
    };
    // `server` is known in the upstream phase only.
    let phase = if server.is_some() {
        Phase::Upstream
    } else {
        Phase::Request
    };
    RequestFacts {
        client_ip: ctx.client_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        customer: from_header.unwrap_or(&origin.customer),
        host: ctx.host,
        server,
        origin: &origin.name,
        method: req.method.as_str().as_bytes(),
        path: if origin.reads_path(phase) {
            path::normalize(req.uri.path().as_bytes())
        } else {
            Cow::Borrowed(req.uri.path().as_bytes())
        },
        headers: &req.headers,
    }
}

/// The response to a limit's rejection, logged at info within the limit's log budget (a
/// flood of rejections writes a few lines a second, then says how many it left out).
fn rejected_problem(origin: &OriginRt, rejected: &Decided, client: IpAddr, ctx: &Ctx) -> Problem {
    let now = ctx.now;
    let Some(limit) = decide::limit_of(origin, rejected.phase, rejected.limit) else {
        return problem::bad_request("the rejecting limit is gone".to_string());
    };
    let Some(variant) = limit.variants.get(usize::from(rejected.variant)) else {
        return problem::bad_request("the rejecting limit is gone".to_string());
    };
    let status = limit.kind.reject_status();
    if let Some(suppressed) = limit.log.admit(now) {
        log::info!(
            "rejected {status}: origin `{}` limit `{}` ({}) client {client}{}",
            origin.name,
            limit.name,
            limit.kind,
            suppressed_note(suppressed)
        );
    }
    problem::rejection(&RejectInfo {
        status,
        origin: &origin.name,
        limit: &limit.name,
        policy_text: &variant.policy.text,
        policy_item: variant.policy.item(rejected.policy),
        remaining: rejected.verdict.remaining,
        retry_after: rejected.verdict.retry_after,
        request_id: ctx.request_id.as_str(),
    })
}

/// Who decided the request's admissions on a shared store (the access log's `source`):
/// `fallback` or `deny_cache` when any was not the store, `store` when the store decided
/// them all, empty when no limit is on a shared store.
fn source_of(holds: &decide::Holds) -> &'static str {
    use crate::runtime::limiter::Hold;
    use crate::store::Source;
    let mut seen = "";
    for t in holds {
        if let Hold::Refund {
            source: Some(source),
            ..
        } = &t.hold
        {
            match source {
                Source::Fallback => return "fallback",
                Source::DenyCache => return "deny_cache",
                Source::Store => seen = "store",
            }
        }
    }
    seen
}

/// Writes a response tollgate built itself. When the request has an unread body the
/// connection is closed afterwards, so a keep-alive client never waits on a body nobody
/// reads (Pingora issues 766 and 540); so it is when `close` says the process drains.
async fn send(session: &mut Session, problem: &Problem, close: bool, id: &RequestId) -> Result<()> {
    if grpc::is_grpc(&session.req_header().headers) {
        return grpc::send(session, problem).await;
    }
    let mut resp = ResponseHeader::build(problem.status, Some(problem.headers.len() + 3))?;
    resp.insert_header("content-type", "application/problem+json")?;
    if !id.is_empty() {
        resp.insert_header(request_id::HEADER, id.as_str())?;
    }
    resp.insert_header("content-length", problem.body.len().to_string())?;
    for (name, value) in &problem.headers {
        resp.insert_header(*name, value.as_str())?;
    }
    if close || !session.is_body_empty() {
        session.set_keepalive(None);
        resp.insert_header("connection", "close")?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(problem.body.clone()), true)
        .await
}

#[async_trait]
impl ProxyHttp for Tollgate {
    /// Boxed: Pingora keeps the context inside its per-request future (12 KB in Pingora
    /// 0.9), which is built on the stack and copied into a box for every request. The
    /// 1.1 KB context has more than one place in that future's layout; a pointer instead
    /// costs one allocation and shrinks the copy to 8.8 KB (`docs/performance.md`,
    /// "Against Pingap").
    type CTX = Box<Ctx>;

    fn new_ctx(&self) -> Box<Ctx> {
        Box::default()
    }

    async fn early_request_filter(&self, session: &mut Session, ctx: &mut Box<Ctx>) -> Result<()> {
        // The header is complete: the connection's header deadline no longer applies.
        mark_request_started(session);
        ctx.arrived = self.clock.now();
        Ok(())
    }

    fn request_summary(&self, session: &Session, _ctx: &Box<Ctx>) -> String {
        // Pingora's own lines use this; never the path or the header (see `summary`).
        summary(session)
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Box<Ctx>) -> Result<bool> {
        // One refcount increment per request: the snapshot moves into the context after
        // the decisions, which borrow it.
        let rt = self.runtime.load_full();
        let close =
            self.drain.is_draining() || rt.config.server.connections.keepalive_timeout.is_zero();
        if close {
            // Pingora then answers `Connection: close` and does not read another request.
            session.set_keepalive(None);
        }
        let trusted = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .is_some_and(|a| is_trusted(a.ip(), &rt.config.server.trusted_proxies));
        ctx.request_id = RequestId::of(
            &session.req_header().headers,
            trusted,
            ctx.arrived / 1_000_000,
        );
        if let Some(key_authorization) =
            challenge::answer(session.req_header().uri.path(), &rt.managed)
        {
            ctx.rt = Some(rt);
            challenge::send(session, &key_authorization, close).await?;
            return Ok(true);
        }
        let answer = self.admit(session, ctx, &rt).await;
        ctx.rt = Some(rt);
        match answer {
            None => Ok(false),
            Some(problem) => {
                send(session, &problem, close, &ctx.request_id).await?;
                Ok(true)
            }
        }
    }

    async fn proxy_upstream_filter(
        &self,
        session: &mut Session,
        ctx: &mut Box<Ctx>,
    ) -> Result<bool> {
        // The first attempt's server and inflight limits are decided here rather than in
        // `upstream_peer`: Pingora never reuses the downstream connection after an
        // `upstream_peer` error (whatever `fail_to_proxy` says), while a response written
        // here ends the request normally, so a 503 keeps the connection like a 429.
        let Some(rt) = ctx.rt.take() else {
            return Ok(true);
        };
        let picked = self.pick_server(session, ctx, &rt).await;
        ctx.rt = Some(rt);
        match picked {
            Ok(Ok(addr)) => {
                ctx.picked = Some(addr);
                Ok(true)
            }
            Ok(Err(problem)) => {
                send(session, &problem, self.drain.is_draining(), &ctx.request_id).await?;
                Ok(false)
            }
            // No server to pick: `upstream_peer` meets the same error and answers it.
            Err(_) => Ok(true),
        }
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Box<Ctx>,
    ) -> Result<Box<HttpPeer>> {
        if let Some(addr) = ctx.picked.take() {
            return peer_for(ctx, addr);
        }
        // A retry: pick a server again and decide its inflight limits again.
        let Some(rt) = ctx.rt.take() else {
            return Err(Error::explain(
                ErrorType::InternalError,
                "upstream_peer without a routed request",
            ));
        };
        let picked = self.pick_server(session, ctx, &rt).await;
        ctx.rt = Some(rt);
        match picked? {
            Ok(addr) => peer_for(ctx, addr),
            Err(problem) => {
                let status = problem.status;
                ctx.rejection = Some(problem);
                Err(Error::explain(
                    ErrorType::HTTPStatus(status),
                    "rejected by a limit",
                ))
            }
        }
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut pingora::http::RequestHeader,
        ctx: &mut Box<Ctx>,
    ) -> Result<()> {
        // The request's ID replaces whatever the client sent (kept only from a trusted
        // proxy, and only well formed: see `request_id`). A kept one is already the
        // request's only X-Request-Id line: no insert (about 2 000 instructions).
        if !ctx.request_id.kept() {
            upstream_request.insert_header(request_id::HEADER, ctx.request_id.as_str())?;
        }
        ctx.upstream_sent = Some(std::time::Instant::now());
        // Tell the upstream who connected: every X-Forwarded-For line as one list, with the
        // direct peer appended.
        if let Some(peer) = session.client_addr().and_then(|a| a.as_inet()) {
            let value = forward::forwarded_for(&upstream_request.headers, peer.ip());
            upstream_request.insert_header("x-forwarded-for", value)?;
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Box<Ctx>,
    ) -> Result<()> {
        if self.drain.is_draining() {
            // Handed over while this request ran: its client moves on after this response.
            session.set_keepalive(None);
        }
        if let (Some(attempt), Some(rt), Some(i)) = (ctx.attempt.take(), &ctx.rt, ctx.origin) {
            // The end of the upstream's headers: what `max: auto` measures.
            let status = upstream_response.status.as_u16();
            attempt.answered(&rt.origins[i], status, self.clock.now());
        }
        let ttfb = ctx
            .upstream_sent
            .map_or(0, |t| t.elapsed().as_nanos() as u64);
        ctx.upstream_answer = Some((upstream_response.status.as_u16(), ttfb));
        if !ctx.request_id.is_empty() {
            upstream_response.insert_header(request_id::HEADER, ctx.request_id.as_str())?;
        }
        if ctx.notes.is_empty() {
            return Ok(());
        }
        let (Some(rt), Some(origin_index)) = (ctx.rt.as_ref(), ctx.origin) else {
            return Ok(());
        };
        let origin = &rt.origins[origin_index];
        let mut policies = String::new();
        let mut limits = String::new();
        for note in &ctx.notes {
            // Only limits with `headers: always` become headers (shadow rejections are
            // noted for the access log).
            let Some(limit) = decide::limit_of(origin, note.phase, note.limit) else {
                continue;
            };
            if limit.headers != HeadersMode::Always {
                continue;
            }
            let Some(variant) = limit.variants.get(note.variant as usize) else {
                continue;
            };
            let Verdict {
                remaining,
                reset_after,
                ..
            } = note.verdict;
            if !policies.is_empty() {
                policies.push_str(", ");
                limits.push_str(", ");
            }
            policies.push_str(variant.policy.item(note.policy));
            limits.push_str(&limit_item(&limit.name, remaining, ceil_secs(reset_after)));
        }
        if !policies.is_empty() {
            upstream_response.insert_header("ratelimit-policy", policies)?;
            upstream_response.insert_header("ratelimit", limits)?;
        }
        Ok(())
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<Ctx>,
    ) -> Result<Option<std::time::Duration>> {
        if end_of_stream {
            ctx.release_upstream();
        }
        Ok(None)
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Box<Ctx>, _error: &Error) -> bool {
        // Rejections are logged where they are decided, every other failure by `logging`,
        // at its own level and within a budget: Pingora's line is an `error` for each.
        true
    }

    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        ctx: &Box<Ctx>,
        error: &Error,
        context: ProxyWarnLogContext,
    ) -> bool {
        // Pingora's line for each failed attempt, written here within a budget: with an
        // upstream down, every request would otherwise write one per retry.
        if let Some(suppressed) = self.upstream_retries.admit(self.clock.now()) {
            let origin = match (ctx.rt.as_ref(), ctx.origin) {
                (Some(rt), Some(i)) => rt.origins[i].name.as_str(),
                _ => crate::metrics::UNMATCHED_ORIGIN,
            };
            log::warn!(
                "upstream attempt failed ({context:?}), retrying: {}; origin `{origin}`{}",
                redact(&error.to_string()),
                suppressed_note(suppressed)
            );
        }
        true
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<Ctx>,
    ) -> FailToProxy {
        if let (Some(attempt), Some(rt), Some(i)) = (ctx.attempt.take(), &ctx.rt, ctx.origin) {
            // The server failed (connect error, timeout, reset): congestion. A client that
            // left is no news about the server: no sample.
            if *e.esource() == ErrorSource::Upstream {
                attempt.failed(&rt.origins[i], self.clock.now());
            }
        }
        ctx.release_upstream();
        if let Some(problem) = ctx.rejection.as_ref() {
            // A retry's rejection (the first attempt's is answered in
            // `proxy_upstream_filter`). Pingora closes the connection after an
            // `upstream_peer` error, so the response says so.
            let status = problem.status;
            if let Err(err) = send(session, problem, true, &ctx.request_id).await {
                log::debug!("cannot send rejection downstream: {err}");
            }
            return FailToProxy {
                error_code: status,
                can_reuse_downstream: false,
            };
        }
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            _ => match e.esource() {
                ErrorSource::Upstream => 502,
                ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                ErrorSource::Internal | ErrorSource::Unset => 500,
            },
        };
        let code = match e.etype() {
            ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout
                if code == 502 =>
            {
                504
            }
            _ => code,
        };
        if code > 0 {
            // Not reused: say so, rather than `keep-alive` and a close.
            session.set_keepalive(None);
            if let Err(err) = session.respond_error(code).await {
                log::debug!("cannot send error response downstream: {err}");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Box<Ctx>) {
        let code = session.response_written().map_or(0, |r| r.status.as_u16());
        if let Some(e) = e.filter(|_| ctx.rejection.is_none()) {
            self.log_failure(session, ctx, e, code);
        }
        match (ctx.rt.as_ref(), ctx.origin) {
            (Some(rt), Some(i)) => {
                let origin = &rt.origins[i];
                origin.duration.observe(ctx.start.elapsed().as_secs_f64());
                origin.requests.inc(code);
            }
            (Some(rt), None) => rt.unmatched.inc(code),
            // No snapshot: the request failed before routing (rare). Count it anyway.
            (None, _) => self.runtime.load().unmatched.inc(code),
        }
        // Normally already released at the end of the upstream body; this covers the rest.
        ctx.release_upstream();
        if let Some(log) = &self.access_log {
            if log.wants(code, ctx.rejected.is_some()) {
                access::push(log, session, ctx, code, self.clock.now());
            }
        }
    }
}
