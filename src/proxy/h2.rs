//! HTTP/2 to clients: one connection's accept loop, run by tollgate's connection handler
//! for a TLS connection that chose `h2` by ALPN and for prior-knowledge h2c on an
//! `h2c: true` listener. Each stream is one request handed to Pingora's proxy
//! (`process_new_http` on its own task), so every limit applies per stream exactly as per
//! HTTP/1.1 request: the stream's context holds its inflight and concurrency units and
//! gives them back when the stream ends, however it ends (its response done, a
//! `RST_STREAM`, or the connection dying under it). A rejection is that stream's response;
//! the connection and its other streams carry on.
//!
//! Pingora has such a loop too, but it fixes what tollgate must bound per connection:
//!
//! - **Streams** (`server.h2_max_streams`, default 100): SETTINGS_MAX_CONCURRENT_STREAMS.
//! - **Header size** (`server.h2_max_header_list`, default 64 KiB): the decoded header
//!   list a client may send (SETTINGS_MAX_HEADER_LIST_SIZE); the HPACK dynamic table stays
//!   at the protocol's 4 KiB.
//! - **Rapid reset** (CVE-2023-44487, `server.h2_max_resets`, default 100 per 10 s): the
//!   attack opens streams and resets them at once, so that the server starts work for
//!   requests whose slots the client frees at no cost. [`ResetWatch`] counts the client's
//!   `RST_STREAM` frames as they are read (a 9-byte frame header scan, no decoding) in a
//!   token bucket of `h2_max_resets` refilled over 10 s; past it the connection is cut
//!   (counted in `tollgate_h2_reset_closes_total`), its streams end and give their units
//!   back. Streams reset before they are accepted are h2's own concern (at most 20 pending,
//!   then GOAWAY `ENHANCE_YOUR_CALM`); malformed streams are answered by Pingora, at most 32
//!   a connection before it is closed.
//! - **Idle** (`server.keepalive_timeout`): a connection with no open stream is closed
//!   after that long, as an idle keep-alive connection is; the first stream must open
//!   within `server.header_timeout` of the accept.
//!
//! At shutdown the connection gets a graceful GOAWAY and its open streams finish.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::HttpServerApp;
use pingora::protocols::http::v2::server::{handshake, H2Accept, HttpSession};
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Digest, Stream};
use pingora::server::ShutdownWatch;
use pingora_proxy::HttpProxy;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::Connections;
use crate::proxy::service::Tollgate;
use crate::proxy::watched::{Watch, Watched};

/// The connection preface every HTTP/2 client sends first (RFC 9113, 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Malformed streams Pingora may refuse on one connection before it is closed.
const MAX_MALFORMED: usize = 32;

/// The frame type of `RST_STREAM`.
const RST_STREAM: u8 = 0x3;

/// Cuts HTTP/2 client frames into headers as they are read, counting resets.
#[derive(Debug, Clone)]
struct Frames {
    /// Bytes of the connection preface still to pass.
    preface: usize,
    /// The frame header being read.
    header: [u8; 9],
    /// Its bytes read so far.
    have: usize,
    /// Payload bytes of the current frame still to pass.
    skip: usize,
}

impl Frames {
    fn new() -> Self {
        Self {
            preface: PREFACE.len(),
            header: [0; 9],
            have: 0,
            skip: 0,
        }
    }

    /// Reads `bytes`; returns how many `RST_STREAM` frame headers they completed.
    fn feed(&mut self, mut bytes: &[u8]) -> u32 {
        let mut resets = 0;
        while !bytes.is_empty() {
            if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                bytes = &bytes[n..];
            } else if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
            } else {
                let n = (9 - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                bytes = &bytes[n..];
                if self.have == 9 {
                    let h = self.header;
                    self.skip =
                        usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    self.have = 0;
                    if h[3] == RST_STREAM {
                        resets += 1;
                    }
                }
            }
        }
        resets
    }
}

/// A token bucket of resets: `max` at once, `max` more per [`Connections::H2_RESET_WINDOW`].
#[derive(Debug, Clone)]
struct ResetBudget {
    max: f64,
    tokens: f64,
    last: Instant,
}

impl ResetBudget {
    fn new(max: u32, now: Instant) -> Self {
        Self {
            max: f64::from(max),
            tokens: f64::from(max),
            last: now,
        }
    }

    /// Spends `n` resets at `now`; `false` once the budget is overdrawn.
    fn spend(&mut self, n: u32, now: Instant) -> bool {
        let window = Connections::H2_RESET_WINDOW.as_secs_f64();
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.max / window).min(self.max);
        self.last = now;
        self.tokens -= f64::from(n);
        self.tokens >= 0.0
    }
}

/// An HTTP/2 client stream that fails its reads once the client has reset more streams
/// than its budget allows: the h2 connection then ends, and with it every stream on it.
pub type ResetWatch = Watched<Resets>;

/// What a [`ResetWatch`] watches: the frames the client sends, and its reset budget.
#[derive(Debug)]
pub struct Resets {
    frames: Frames,
    budget: ResetBudget,
    /// Set once the budget is overdrawn.
    tripped: Arc<AtomicBool>,
}

fn reset_watch(inner: Stream, max_resets: u32, tripped: Arc<AtomicBool>) -> ResetWatch {
    Watched::wrap(
        inner,
        Resets {
            frames: Frames::new(),
            budget: ResetBudget::new(max_resets, Instant::now()),
            tripped,
        },
    )
}

#[async_trait]
impl Watch for Resets {
    fn poll_read(
        &mut self,
        inner: &mut Stream,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.tripped.load(Ordering::Relaxed) {
            return Poll::Ready(Err(io::Error::other("too many stream resets")));
        }
        let before = buf.filled().len();
        let polled = Pin::new(inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let resets = self.frames.feed(&buf.filled()[before..]);
            if resets > 0 && !self.budget.spend(resets, Instant::now()) {
                self.tripped.store(true, Ordering::Relaxed);
                // The bytes read are dropped with the connection.
                return Poll::Ready(Err(io::Error::other("too many stream resets")));
            }
        }
        polled
    }
}

/// The streams of one connection still being served.
#[derive(Default)]
struct Active {
    count: AtomicUsize,
    idle: Notify,
}

/// Held by a stream's task while it runs.
struct StreamGuard(Arc<Active>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Active {
    fn start(self: &Arc<Self>) -> StreamGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        StreamGuard(self.clone())
    }

    /// Completes once no stream runs and `then` has passed since (or at `until`, when
    /// given, whichever applies: the first stream's deadline).
    async fn idle(&self, then: Duration, until: Option<Instant>) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                break;
            }
            notified.await;
        }
        match until {
            Some(at) => tokio::time::sleep_until(at).await,
            None => tokio::time::sleep(then).await,
        }
    }
}

/// How one HTTP/2 connection ended, for the handler's metrics and log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Closed by the client, idle, shut down, or a protocol error.
    Normally,
    /// The client did not finish the HTTP/2 handshake before the first-stream deadline.
    HandshakeTimeout,
    /// Cut for resetting too many streams.
    TooManyResets,
    /// Too many malformed streams.
    Malformed,
}

/// Serves the HTTP/2 connection `stream` (its preface not read yet) with `limits` until it
/// ends. `first` is the deadline for the handshake and the first stream.
pub async fn serve(
    proxy: &Arc<HttpProxy<Tollgate>>,
    stream: Stream,
    limits: &Connections,
    first: Instant,
    shutdown: &ShutdownWatch,
) -> Ended {
    let tripped = Arc::new(AtomicBool::new(false));
    let io: Stream = Box::new(reset_watch(stream, limits.h2_max_resets, tripped.clone()));
    let digest = Arc::new(Digest {
        ssl_digest: io.get_ssl_digest(),
        timing_digest: io.get_timing_digest(),
        proxy_digest: io.get_proxy_digest(),
        socket_digest: io.get_socket_digest(),
    });
    let mut options = pingora::protocols::http::v2::server::H2Options::new();
    options.max_concurrent_streams(limits.h2_max_streams);
    options.max_header_list_size(limits.h2_max_header_list);
    let mut conn = match tokio::time::timeout_at(first, handshake(io, Some(options))).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            log::debug!("HTTP/2 handshake failed: {e}");
            return Ended::Normally;
        }
        Err(_) => return Ended::HandshakeTimeout,
    };
    let active = Arc::new(Active::default());
    let mut shutdown_rx = shutdown.clone();
    let mut shutting = *shutdown.borrow();
    if shutting {
        conn.graceful_shutdown();
    }
    let mut malformed = 0usize;
    let mut seen_stream = false;
    loop {
        let until = (!seen_stream).then_some(first);
        let accepted = tokio::select! {
            biased;
            changed = shutdown_rx.changed(), if !shutting => {
                if changed.is_err() || *shutdown_rx.borrow() {
                    conn.graceful_shutdown();
                    shutting = true;
                }
                continue;
            }
            accepted = HttpSession::from_h2_conn(&mut conn, digest.clone()) => accepted,
            () = active.idle(limits.keepalive_timeout, until), if !shutting => {
                log::debug!("closed an idle HTTP/2 connection");
                return Ended::Normally;
            }
        };
        match accepted {
            Err(e) => {
                if tripped.load(Ordering::Relaxed) {
                    return Ended::TooManyResets;
                }
                log::debug!("HTTP/2 connection ended: {e}");
                return Ended::Normally;
            }
            Ok(None) => return Ended::Normally,
            Ok(Some(H2Accept::Rejected)) => {
                malformed += 1;
                if malformed > MAX_MALFORMED {
                    return Ended::Malformed;
                }
            }
            Ok(Some(H2Accept::Session(session))) => {
                seen_stream = true;
                let guard = active.start();
                let proxy = proxy.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let _guard = guard;
                    proxy
                        .process_new_http(ServerSession::new_http2(session), &shutdown)
                        .await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, len: usize) -> Vec<u8> {
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            1,
        ];
        f.extend(std::iter::repeat_n(0xAB, len));
        f
    }

    #[test]
    fn counts_resets_across_any_split_of_the_bytes() {
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(0x4, 18)); // SETTINGS
        wire.extend(frame(RST_STREAM, 4));
        wire.extend(frame(0x1, 300)); // HEADERS whose payload holds a 0x3 byte or two
        wire.extend(frame(RST_STREAM, 4));
        wire.extend(frame(0x0, 0));
        for chunk in [1, 2, 7, 9, 10, 64, wire.len()] {
            let mut f = Frames::new();
            let total: u32 = wire.chunks(chunk).map(|c| f.feed(c)).sum();
            assert_eq!(total, 2, "chunks of {chunk}");
        }
    }

    #[test]
    fn the_reset_budget_refills_over_the_window() {
        let t0 = Instant::now();
        let mut b = ResetBudget::new(10, t0);
        assert!(b.spend(10, t0));
        assert!(!b.spend(1, t0));
        // A tenth of the window gives one reset back (the overdraft first).
        let mut b = ResetBudget::new(10, t0);
        assert!(b.spend(10, t0));
        assert!(b.spend(1, t0 + Connections::H2_RESET_WINDOW / 10));
        assert!(!b.spend(1, t0 + Connections::H2_RESET_WINDOW / 10));
        let mut b = ResetBudget::new(10, t0);
        assert!(b.spend(5, t0));
        assert!(b.spend(10, t0 + Connections::H2_RESET_WINDOW * 5));
    }
}
