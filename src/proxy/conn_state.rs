//! What one downstream connection carries across Pingora's layers, and whether the whole
//! process is draining.
//!
//! Pingora reads a request header before any `ProxyHttp` hook runs and writes its own
//! error responses (400 for a header its parser refuses, 405 for `CONNECT`) without one.
//! The connection handler ([`super::handler`]) still has to know three things about each
//! request it hands to Pingora: whether any of it arrived yet (so that an idle keep-alive
//! connection can be closed without losing a request), whether the header was complete (so
//! that its header deadline stops applying) and, when no hook ran, which status Pingora
//! wrote (so that the response is counted). [`Conn`] wraps the connection's stream to carry
//! a [`ConnState`] that records whether reads found bytes or wait, that the first hook marks
//! ([`mark_request_started`]), and that records the status line of the first response bytes
//! written. It forwards every read and write unchanged: the cost is one more virtual call
//! per socket operation and an atomic load (rarely a store) per read and per write.
//!
//! [`Drain`] says that this process is handing over to another (a graceful upgrade) or
//! shutting down: from then on every response says `Connection: close`, so keep-alive
//! clients move to the new process after their current request instead of losing the next
//! one (see `docs/architecture.md`).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use pingora::protocols::{Stream, IO};
use pingora_proxy::Session;
use tokio::io::{AsyncRead, ReadBuf};

use crate::proxy::watched::{Watch, Watched};

/// No read since the reset.
const READ_NONE: u8 = 0;
/// A read since the reset found nothing and waits for data.
const READ_WAITING: u8 = 1;
/// Bytes arrived since the reset.
const READ_BYTES: u8 = 2;

/// Per-request facts about one connection, reset by the handler before each request.
#[derive(Debug, Default)]
pub struct ConnState {
    /// A hook ran: Pingora read the whole header and handed the request to tollgate.
    started: AtomicBool,
    /// What the reads since the reset found: `READ_NONE`, `READ_WAITING`, `READ_BYTES`.
    read: AtomicU8,
    /// The status of the first response written since the reset; 0 while none was.
    status: AtomicU16,
}

impl ConnState {
    /// Forgets the previous request: called before the next one is read.
    pub fn reset(&self) {
        self.started.store(false, Ordering::Relaxed);
        self.read.store(READ_NONE, Ordering::Relaxed);
        self.status.store(0, Ordering::Relaxed);
    }

    /// Whether a hook saw the current request (its header was complete).
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    /// Whether a byte arrived on the socket since the reset.
    pub fn arrived(&self) -> bool {
        self.read.load(Ordering::Relaxed) == READ_BYTES
    }

    /// Whether the request is provably idle: Pingora waits on the socket, no byte arrived
    /// since the reset, and no hook ran (so no request was parsed from bytes read earlier).
    pub fn idle(&self) -> bool {
        !self.started() && self.read.load(Ordering::Relaxed) == READ_WAITING
    }

    fn saw_read(&self, pending: bool, got_bytes: bool) {
        let read = self.read.load(Ordering::Relaxed);
        if got_bytes && read != READ_BYTES {
            self.read.store(READ_BYTES, Ordering::Relaxed);
        } else if pending && read == READ_NONE {
            self.read.store(READ_WAITING, Ordering::Relaxed);
        }
    }

    /// The status of the first response written for the current request, if any.
    pub fn status(&self) -> Option<u16> {
        Some(self.status.load(Ordering::Relaxed)).filter(|code| *code >= 100)
    }

    fn saw_write(&self, buf: &[u8]) {
        if self.status.load(Ordering::Relaxed) == 0 {
            // One response header is one write in Pingora; its first bytes are the status
            // line. Anything else (an interim or short write) records 1, never parsed again.
            self.status
                .store(status_of(buf).unwrap_or(1), Ordering::Relaxed);
        }
    }
}

/// The status code of an HTTP/1 status line at the start of `buf`.
fn status_of(buf: &[u8]) -> Option<u16> {
    let code = buf.strip_prefix(b"HTTP/1.")?.get(2..5)?;
    if buf.get(8) != Some(&b' ') || !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(code.iter().fold(0, |n, d| n * 10 + u16::from(d - b'0')))
}

/// Marks the session's request as started: its header is complete and tollgate has it.
/// Called by the first hook; a no-op on a stream tollgate did not wrap.
pub fn mark_request_started(session: &Session) {
    if let Some(state) = session.as_downstream().stream().and_then(conn_state) {
        state.started.store(true, Ordering::Relaxed);
    }
}

fn conn_state(stream: &Stream) -> Option<&ConnState> {
    let io: &dyn IO = stream.as_ref();
    io.as_any().downcast_ref::<Conn>().map(|c| &*c.watch.state)
}

/// A downstream HTTP/1 stream carrying its [`ConnState`]; every operation goes to the
/// inner one.
pub type Conn = Watched<Http1>;

/// What a [`Conn`] watches: its reads and writes, recorded in the shared [`ConnState`].
///
/// A TLS stream cannot peek (Pingora's `SslStream` says so at once), so for one the
/// one-byte peek of the keep-alive wait reads the byte and keeps it here, to be returned
/// by the next read: the wait is then bounded on TLS as on plaintext.
#[derive(Debug)]
pub struct Http1 {
    state: Arc<ConnState>,
    /// A byte read by a peek on a stream that cannot peek, not yet returned by a read.
    peeked: Option<u8>,
}

impl Conn {
    /// Wraps `inner`; the handler keeps `state` to read what the hooks and writes left.
    pub fn new(inner: Stream, state: Arc<ConnState>) -> Self {
        Watched::wrap(
            inner,
            Http1 {
                state,
                peeked: None,
            },
        )
    }
}

#[async_trait]
impl Watch for Http1 {
    fn poll_read(
        &mut self,
        inner: &mut Stream,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(byte) = self.peeked {
            if buf.remaining() > 0 {
                buf.put_slice(&[byte]);
                self.peeked = None;
                self.state.saw_read(false, true);
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(inner).poll_read(cx, buf);
        self.state
            .saw_read(polled.is_pending(), buf.filled().len() > before);
        polled
    }

    fn wrote(&mut self, buf: &[u8]) {
        self.state.saw_write(buf);
    }

    async fn try_peek(&mut self, inner: &mut Stream, buf: &mut [u8]) -> io::Result<bool> {
        if inner.get_ssl().is_none() {
            return inner.try_peek(buf).await;
        }
        // TLS: one byte at most, read and kept for the next read.
        if buf.len() != 1 {
            return Ok(false);
        }
        if self.peeked.is_none() {
            use tokio::io::AsyncReadExt;
            let mut byte = [0u8; 1];
            if inner.read(&mut byte).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.peeked = Some(byte[0]);
        }
        buf[0] = self.peeked.unwrap_or_default();
        Ok(true)
    }
}

/// Whether this process is handing over or shutting down. Set once, never cleared.
#[derive(Debug, Default)]
pub struct Drain {
    draining: AtomicBool,
}

impl Drain {
    /// A process that is not draining.
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on, responses close their connection.
    pub fn start(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether responses must close their connection.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_status_of_a_status_line_only() {
        assert_eq!(status_of(b"HTTP/1.1 400 Bad Request\r\n"), Some(400));
        assert_eq!(status_of(b"HTTP/1.0 405 \r\n"), Some(405));
        assert_eq!(status_of(b"HTTP/1.1 40"), None);
        assert_eq!(status_of(b"HTTP/2 200 OK"), None);
        assert_eq!(status_of(b"HTTP/1.1 4x0 Bad"), None);
        assert_eq!(status_of(b"{\"a\":1}"), None);
    }

    #[test]
    fn a_request_is_idle_only_while_its_read_waits_with_nothing() {
        let s = ConnState::default();
        assert!(!s.idle(), "no read yet: a buffered request may be parsed");
        s.saw_read(true, false);
        assert!(s.idle());
        s.saw_read(false, true);
        assert!(!s.idle() && s.arrived());
        s.saw_read(true, false);
        assert!(!s.idle() && s.arrived(), "bytes arrived: no longer idle");
        s.reset();
        s.saw_read(true, false);
        s.started.store(true, Ordering::Relaxed);
        assert!(!s.idle());
    }

    #[test]
    fn state_records_the_first_write_until_reset() {
        let s = ConnState::default();
        assert_eq!(s.status(), None);
        s.saw_write(b"HTTP/1.1 400 Bad Request\r\n");
        s.saw_write(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(s.status(), Some(400));
        s.reset();
        assert_eq!(s.status(), None);
        assert!(!s.started());
        s.saw_write(b"body bytes");
        s.saw_write(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(s.status(), None);
    }
}
