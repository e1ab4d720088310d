//! The connection handler in front of Pingora's HTTP proxy: it owns each downstream
//! connection's life, where Pingora's own loop leaves three gaps open to slow clients.
//!
//! - **Header deadline** (`server.header_timeout`): Pingora times each header read (60 s
//!   on a new connection, not at all on a kept-alive one) but never the whole header, so a
//!   client sending a header line every few seconds held a connection for minutes. Here the whole header must arrive within the deadline,
//!   counted from the accept for a connection's first request and from the first byte for
//!   later ones; the connection is closed otherwise (nginx closes it the same way, without
//!   a response), counted in `tollgate_connection_timeouts_total{timeout="header"}`.
//! - **Keep-alive idle timeout** (`server.keepalive_timeout`): Pingora keeps an HTTP/1.1
//!   connection open without a request forever. Here the wait for the next request is
//!   bounded; zero turns keep-alive off.
//! - **Idle connections give way at the cap**: a connection that is only waiting for a
//!   request (new and silent, or kept alive) closes when the connection cap is reached
//!   ([`Connections::reclaim`]), so only clients in the middle of a header hold slots.
//!   A new connection's wait is a one-byte peek, so nothing is consumed before Pingora
//!   reads it.
//! - **Pipelining** (RFC 9112 §9.3.2): a client may send its next requests before it has
//!   read the responses. Pingora reads them along with the current one and, with
//!   pipelining enabled on the session (done here, for every connection), hands the bytes
//!   it read ahead to the next session, which answers them in order. So the wait for a
//!   kept-alive connection's next request cannot be a peek at the socket (the request may
//!   be in that buffer already): the next request is started at once, and the idle timeout,
//!   the cap and the shutdown close it only while it is provably idle: Pingora waits on
//!   the socket, nothing arrived, no header was parsed ([`ConnState::idle`]). One case
//!   looks idle though it is not: a pipelined request of which only the start arrived with
//!   the previous one, its rest never following; it is closed like a silent connection
//!   (the client retries it, as RFC 9112 §9.3.2 allows).
//! - **Draining** ([`super::conn_state::Drain`]): once a graceful upgrade hands the listeners
//!   over, every response says `Connection: close` (the proxy hooks see to that), so a busy
//!   keep-alive connection moves to the new process after its current request. An idle one
//!   keeps waiting for its next request, which is answered with `Connection: close` too,
//!   until the process stops listening (Pingora: 5 s after SIGQUIT; at once on SIGTERM); only
//!   then is it closed. Closing idle connections at the handover would race every client
//!   that is sending its next request at that moment, which is what lost requests before.
//!
//! It also counts the responses Pingora writes without any hook (a 400 for a header its
//! parser refuses, a 405 for `CONNECT`) under `origin="_unmatched"`, by the status line it
//! sees written ([`super::conn_state`]).
//!
//! The connection caps are applied before this handler runs, by the listener's filter
//! ([`super::conn_caps`]); the handler holds the connection's slot.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use pingora_proxy::HttpProxy;
use prometheus::IntCounter;
use tokio::time::Instant;

use crate::limits::{Clock, MonotonicClock};
use crate::log_budget::LogBudget;
use crate::metrics::Metrics;
use crate::proxy::conn_caps::Connections;
use crate::proxy::conn_state::{Conn, ConnState};
use crate::proxy::edge::{Edge, Protocol, PREFACE};
use crate::proxy::h2::{self, Ended};
use crate::proxy::idle::IdleTimer;
use crate::proxy::service::Tollgate;
use crate::proxy::Peer;
use crate::runtime::Runtime;

/// The proxy service's application: connection handling around Pingora's `HttpProxy`.
pub struct Handler {
    proxy: Arc<HttpProxy<Tollgate>>,
    /// What precedes the first request: PROXY header, TLS, the protocol.
    edge: Edge,
    /// `tollgate_h2_reset_closes_total`.
    h2_reset_closes: IntCounter,
    runtime: Arc<ArcSwap<Runtime>>,
    connections: Arc<Connections>,
    header_timeouts: IntCounter,
    keepalive_timeouts: IntCounter,
    header_log: LogBudget,
    refused_log: LogBudget,
    clock: MonotonicClock,
}

/// How the wait for a connection's first request ended.
enum Idle {
    /// Its first byte arrived.
    Request,
    /// The first request did not start before the header deadline.
    HeaderTimeout,
    /// The client closed or the slot was reclaimed.
    Close,
}

/// How the wait for a kept-alive connection's next request ended.
enum Next<T> {
    /// The request ended without starting (the client closed, or Pingora refused it).
    Done(T),
    /// Its first byte arrived, or its header was already read with the previous request.
    Arrived,
    /// The keep-alive timeout passed, the slot was reclaimed, or the process stopped
    /// listening, while nothing of it had arrived.
    Close,
}

impl Handler {
    /// Wraps `proxy`; `connections` counts what the listener's filter admitted, `edge`
    /// knows the listeners.
    pub fn new(
        proxy: HttpProxy<Tollgate>,
        runtime: Arc<ArcSwap<Runtime>>,
        connections: Arc<Connections>,
        edge: Edge,
        metrics: &Metrics,
    ) -> Self {
        let timeouts = |t: &str| metrics.connection_timeouts_total.with_label_values(&[t]);
        Self {
            proxy: Arc::new(proxy),
            edge,
            h2_reset_closes: metrics.h2_reset_closes_total.clone(),
            runtime,
            connections,
            header_timeouts: timeouts("header"),
            keepalive_timeouts: timeouts("keepalive"),
            header_log: LogBudget::new(),
            refused_log: LogBudget::new(),
            clock: MonotonicClock::new(),
        }
    }

    /// Serves HTTP/1 requests on `stream` until it closes, a timeout passes, or the
    /// process stops listening.
    async fn serve_http1(&self, stream: Stream, peer: Option<IpAddr>, shutdown: &ShutdownWatch) {
        let state = Arc::new(ConnState::default());
        let mut stream: Stream = Box::new(Conn::new(stream, state.clone()));
        let mut settings = None;
        let header_start = Instant::now();
        let mut first = true;
        let mut idle = IdleTimer::default();
        loop {
            let limits = self.runtime.load().config.server.connections;
            if first {
                let deadline = header_start + limits.header_timeout;
                match self.wait_for_first(&mut stream, deadline).await {
                    Idle::Request => {}
                    Idle::HeaderTimeout => {
                        return self.header_timed_out(peer, limits.header_timeout)
                    }
                    Idle::Close => return,
                }
            } else if limits.keepalive_timeout.is_zero() {
                return;
            }
            let mut session = ServerSession::new_http1(stream);
            match settings.take() {
                // The previous request's keep-alive and pipelining settings, and the bytes
                // Pingora read past it (the start of a pipelined request).
                Some(settings) => HttpPersistentSettings::apply_to_session(settings, &mut session),
                None => {
                    // No per-read header timeout of Pingora's own: the deadline below
                    // bounds it.
                    session.set_keepalive(Some(0));
                    session.set_pipelining_enabled(true);
                }
            }
            state.reset();
            let request = self.proxy.process_new_http(session, shutdown);
            tokio::pin!(request);
            let mut header_start = header_start;
            let mut ended = None;
            if !first {
                idle.start(limits.keepalive_timeout);
                match self
                    .wait_for_next(request.as_mut(), &state, &mut idle, shutdown)
                    .await
                {
                    Next::Done(reused) => ended = Some(reused),
                    Next::Arrived => header_start = Instant::now(),
                    Next::Close => return,
                }
            }
            first = false;
            let reused = match ended {
                Some(reused) => reused,
                None => {
                    // Usually the whole header is there by the first poll: no timer is
                    // needed then.
                    let raced = match poll_once(request.as_mut()).await {
                        Poll::Ready(reused) => Some(reused),
                        Poll::Pending if state.started() => None,
                        Poll::Pending => tokio::select! {
                            biased;
                            reused = &mut request => Some(reused),
                            () = tokio::time::sleep_until(header_start + limits.header_timeout) => None,
                        },
                    };
                    match raced {
                        Some(reused) => reused,
                        // The header was complete in time: the request runs as long as it
                        // needs.
                        None if state.started() => request.await,
                        None => return self.header_timed_out(peer, limits.header_timeout),
                    }
                }
            };
            if !state.started() {
                if let Some(code) = state.status() {
                    self.refused(peer, code);
                }
            }
            let Some(reused) = reused else { return };
            (stream, settings) = reused.consume();
        }
    }

    /// Waits for the first byte of a new connection's first request without consuming it,
    /// until its header deadline. While waiting, the connection gives its slot up when the
    /// connection cap is reached (as nginx reuses its idle connections); it does not close
    /// when the process stops listening: its request may be on its way.
    async fn wait_for_first(&self, stream: &mut Stream, deadline: Instant) -> Idle {
        let mut byte = [0u8; 1];
        let peek = stream.try_peek(&mut byte);
        tokio::pin!(peek);
        // Data, or a stream that cannot peek: the header deadline bounds the rest.
        let peeked = |peeked: std::io::Result<bool>| match peeked {
            Ok(_) => Idle::Request,
            Err(_) => Idle::Close,
        };
        // Under load the request is often there already: no timer is needed then.
        if let Poll::Ready(p) = poll_once(peek.as_mut()).await {
            return peeked(p);
        }
        let reclaim = self.connections.reclaim();
        tokio::select! {
            p = &mut peek => peeked(p),
            () = tokio::time::sleep_until(deadline) => Idle::HeaderTimeout,
            () = reclaim => {
                log::debug!("closed an idle connection: the connection cap is reached");
                Idle::Close
            }
        }
    }

    /// Runs a kept-alive connection's next `request` until it arrives (a byte of it, or a
    /// header Pingora had already read with the previous request) or ends. While it is
    /// idle ([`ConnState::idle`]) it is closed when `idle` expires (`keepalive_timeout`,
    /// started by the caller), when the connection cap is reached, or when the process
    /// stops listening; dropping it then loses nothing, since nothing of it arrived.
    async fn wait_for_next<F: Future>(
        &self,
        mut request: Pin<&mut F>,
        state: &ConnState,
        idle: &mut IdleTimer,
        shutdown: &ShutdownWatch,
    ) -> Next<F::Output> {
        // Pingora's shared 10 ms timer wheel, not a Tokio timer: registering a Tokio sleep
        // on every keep-alive request woke this worker's own driver through its eventfd
        // (one `write` and one extra `epoll_wait` a request; strace, docs/performance.md);
        // and armed once per timeout, not per request (`super::idle`).
        let reclaim = self.connections.reclaim();
        tokio::pin!(reclaim);
        let mut stopping = shutdown.clone();
        let stopped = stopping.wait_for(|stopping| *stopping);
        tokio::pin!(stopped);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(reused) = request.as_mut().poll(cx) {
                return Poll::Ready(Next::Done(reused));
            }
            if state.started() || state.arrived() {
                return Poll::Ready(Next::Arrived);
            }
            if !state.idle() {
                // Not waiting on the socket (a cooperative yield while Pingora parses
                // bytes it read earlier): the request wakes this task itself.
                return Poll::Pending;
            }
            if idle.poll_expired(cx).is_ready() {
                self.keepalive_timeouts.inc();
                let timeout = idle.timeout();
                log::debug!("closed a keep-alive connection: idle for {timeout:?}");
                return Poll::Ready(Next::Close);
            }
            if reclaim.as_mut().poll(cx).is_ready() {
                log::debug!("closed an idle connection: the connection cap is reached");
                return Poll::Ready(Next::Close);
            }
            if stopped.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Next::Close);
            }
            Poll::Pending
        })
        .await
    }

    fn header_timed_out(&self, peer: Option<IpAddr>, timeout: Duration) {
        self.header_timeouts.inc();
        let from = Peer(peer);
        self.header_log.info(
            self.clock.now(),
            format_args!("closed a connection from {from}: request header not complete within {timeout:?} (server.header_timeout)"),
        );
    }

    fn refused_h2(&self, peer: Option<IpAddr>, max: u32) {
        let (from, window) = (Peer(peer), crate::config::Connections::H2_RESET_WINDOW);
        self.refused_log.info(
            self.clock.now(),
            format_args!("closed an HTTP/2 connection from {from}: more than {max} stream resets in {window:?} (server.h2_max_resets; rapid reset)"),
        );
    }

    /// Counts a response Pingora wrote without any hook: a header its parser refused
    /// (400) or a `CONNECT` (405).
    fn refused(&self, peer: Option<IpAddr>, code: u16) {
        self.runtime.load().unmatched.inc(code);
        let what = if code == 405 {
            "refused a CONNECT request"
        } else {
            "Pingora's HTTP parser refused a request"
        };
        let from = Peer(peer);
        self.refused_log.info(
            self.clock.now(),
            format_args!("{what} from {from} with {code}, before routing (RUST_LOG=pingora_proxy=debug says why)"),
        );
    }
}

/// Whether `stream` (whose first byte has arrived) starts with the HTTP/2 preface: only a
/// `P` can start one, so an HTTP/1 request other than `POST`, `PUT` or `PATCH` is known at
/// once; those wait for 24 bytes, at most until `deadline`.
async fn starts_with_preface(stream: &mut Stream, deadline: Instant) -> bool {
    let mut first = [0u8; 1];
    if !matches!(stream.try_peek(&mut first).await, Ok(true)) || first[0] != PREFACE[0] {
        return false;
    }
    let mut buf = [0u8; PREFACE.len()];
    let peeked = tokio::time::timeout_at(deadline, stream.try_peek(&mut buf)).await;
    matches!(peeked, Ok(Ok(true))) && buf == *PREFACE
}

/// Polls `fut` once.
async fn poll_once<F: Future>(mut fut: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
}

#[async_trait]
impl ServerApp for Handler {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
        let accepted = Instant::now();
        let _slot = self.connections.claim(peer);
        let rt = self.runtime.load_full();
        let opened = self.edge.open(stream, peer, accepted, &rt).await?;
        let (mut stream, peer) = (opened.stream, opened.peer);
        let limits = rt.config.server.connections;
        drop(rt);
        let h2 = match opened.protocol {
            Protocol::H2 => true,
            Protocol::Http1 => false,
            Protocol::Http1OrH2c => {
                let deadline = accepted + limits.header_timeout;
                match self.wait_for_first(&mut stream, deadline).await {
                    Idle::Request => starts_with_preface(&mut stream, deadline).await,
                    Idle::HeaderTimeout => {
                        self.header_timed_out(peer, limits.header_timeout);
                        return None;
                    }
                    Idle::Close => return None,
                }
            }
        };
        if h2 {
            let first = accepted + limits.header_timeout;
            match h2::serve(&self.proxy, stream, &limits, first, shutdown).await {
                Ended::HandshakeTimeout => self.header_timed_out(peer, limits.header_timeout),
                Ended::TooManyResets => {
                    self.h2_reset_closes.inc();
                    self.refused_h2(peer, limits.h2_max_resets);
                }
                Ended::Normally | Ended::Malformed => {}
            }
            return None;
        }
        self.serve_http1(stream, peer, shutdown).await;
        None
    }

    // Deliberately not Pingora's `http_cleanup`: that aborts every connection waiting for
    // a request header when the listeners close, including one whose request is on its
    // way. This handler bounds those waits itself.
    async fn cleanup(&self) {}
}
