//! One connection's loop, generic over the stream (a tokio `TcpStream`, Pingora's
//! `Stream`, an in-memory pipe in tests).
//!
//! The loop alternates two steps. **Execute**: every complete command in the read buffer
//! runs, in order, its reply appended to the output buffer; commands run synchronously, so
//! none is ever interrupted half-way. A command that must ask a shared store leaves a
//! [`Deferred`]: the loop awaits it (bounded by the store's
//! budget) and finishes it before the next command runs, so replies keep their order. **Wait**: one future both writes pending replies
//! and reads more requests, and returns as soon as either makes progress. Reading goes on
//! while replies wait, so a client that sends its whole pipeline before reading (as most
//! libraries do) never deadlocks; what bounds memory is the output buffer's limit: once
//! more than `max_output_buffer` bytes of replies wait, the client is not reading and the
//! connection is closed.
//!
//! The wait also ends on shutdown (the connection flushes its replies and closes) and on
//! the idle timeout (no byte moved either way for `idle_timeout`).

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{sleep_until, timeout, Instant};

use super::bounds::{FLUSH_ON_CLOSE, READ_CHUNK};
use super::command::{self, Deferred, Outcome, Session};
use super::reply::Reply;
use super::resp::{Parser, ProtocolError};
use super::service::{ApiService, Throttled};

/// Why a connection ends.
#[derive(Debug)]
enum End {
    /// The client closed its side (or sent `QUIT`): answer what it sent, then close.
    Client,
    /// The server is shutting down.
    Shutdown,
    /// A framing error; the error reply is in the output buffer.
    Protocol(ProtocolError),
    /// More than the output bound of replies wait: the client does not read.
    Overflow,
    /// Nothing moved for the idle timeout.
    Idle,
    /// The socket failed (reset, broken pipe).
    Io(io::Error),
}

/// Serves one connection until it ends. `peer` is for log lines only.
pub async fn serve<S>(
    service: &ApiService,
    mut stream: S,
    peer: Option<SocketAddr>,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let config = service.config();
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut wbuf = BytesMut::new();
    let mut parser = Parser::new();
    let mut session = Session::new(service.next_client_id());
    session.peer = peer;
    // A shutdown watch whose sender is gone can never fire; stop polling it.
    let mut watching = true;
    let mut last_io = Instant::now();
    let mut eof = false;
    let mut unflushed = false;
    let end = loop {
        match execute(service, &mut session, &mut parser, &mut rbuf, &mut wbuf) {
            Step::End(end) => break end,
            Step::Wait(slot, deferred) => {
                let finish = deferred.work.await;
                command::finish(service, &mut session, slot, finish, &mut wbuf);
                session.flush_counts(service);
                if wbuf.len() > config.max_output_buffer {
                    break End::Overflow;
                }
                // The commands after it may already be in the read buffer.
                continue;
            }
            Step::More => {}
        }
        if eof {
            break End::Client;
        }
        if *shutdown.borrow() {
            break End::Shutdown;
        }
        // Give back what a burst took, so idle connections stay small.
        if wbuf.is_empty() && wbuf.capacity() > 64 * 1024 {
            wbuf = BytesMut::new();
        }
        rbuf.reserve(READ_CHUNK);
        let io = poll_fn(|cx| poll_io(&mut stream, &mut rbuf, &mut wbuf, &mut unflushed, cx));
        tokio::select! {
            biased;
            result = io => match result {
                Ok(Io::Progress) => last_io = Instant::now(),
                Ok(Io::Eof) => eof = true,
                Err(e) => break End::Io(e),
            },
            changed = shutdown.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                }
            }
            () = sleep_until(last_io + config.idle_timeout) => {
                if last_io.elapsed() >= config.idle_timeout {
                    break End::Idle;
                }
            }
        }
    };
    session.flush_counts(service);
    match end {
        End::Client | End::Shutdown | End::Protocol(_) => {
            if let End::Protocol(e) = end {
                service.log_throttled(Throttled::Protocol(e), peer);
            }
            // Best effort, bounded: the client may be gone.
            let _ = timeout(FLUSH_ON_CLOSE, async {
                stream.write_all(&wbuf).await?;
                stream.flush().await?;
                stream.shutdown().await
            })
            .await;
        }
        End::Overflow => service.log_throttled(Throttled::Overflow, peer),
        End::Idle => log::debug!("limiter API: closing idle connection from {peer:?}"),
        End::Io(e) => log::debug!("limiter API: connection from {peer:?} failed: {e}"),
    }
    // Dropping the session releases its holds.
    drop(session);
}

/// What one run of [`execute`] left to do.
enum Step {
    /// Every complete command ran: wait for I/O.
    More,
    /// A command waits on a store: await it, finish it (metrics slot, work), run on.
    Wait(usize, Deferred),
    /// The connection must end.
    End(End),
}

/// Runs every complete command in `rbuf` (and first what remains of a transaction `EXEC`
/// started) against the current runtime (read once for the batch), until one must wait on
/// a store or the connection must end.
fn execute(
    service: &ApiService,
    session: &mut Session,
    parser: &mut Parser,
    rbuf: &mut BytesMut,
    wbuf: &mut BytesMut,
) -> Step {
    let limit = service.config().max_output_buffer;
    let runtime = service.runtime();
    let runtime = runtime.as_deref().map(|rt| &**rt);
    let mut step = Step::More;
    loop {
        // The rest of a transaction `EXEC` started runs before the next command is read.
        let ran = match command::resume(service, runtime, session, wbuf) {
            Some(ran) => ran,
            None => match parser.parse(rbuf) {
                Ok(true) => command::execute(service, runtime, session, &parser.args(), wbuf),
                Ok(false) => break,
                Err(e) => {
                    Reply::new(wbuf, session.resp3).error(format_args!("ERR {e}"));
                    step = Step::End(End::Protocol(e));
                    break;
                }
            },
        };
        match ran {
            (Outcome::Close, _) => {
                step = Step::End(End::Client);
                break;
            }
            (_, Some((slot, deferred))) => {
                step = Step::Wait(slot, deferred);
                break;
            }
            _ => {}
        }
        if wbuf.len() > limit {
            step = Step::End(End::Overflow);
            break;
        }
    }
    session.flush_counts(service);
    step
}

/// What one wait for I/O achieved.
enum Io {
    /// Bytes were written or read.
    Progress,
    /// The client closed its side.
    Eof,
}

/// Writes pending replies (and flushes them once written) and reads requests, until
/// either moves, the client closes, or the socket fails. `unflushed` says that written
/// bytes may still sit in the stream's own buffer (Pingora's, TLS).
fn poll_io<S>(
    stream: &mut S,
    rbuf: &mut BytesMut,
    wbuf: &mut BytesMut,
    unflushed: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<io::Result<Io>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut progress = false;
    while !wbuf.is_empty() {
        match Pin::new(&mut *stream).poll_write(cx, wbuf) {
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(n)) => {
                wbuf.advance(n);
                *unflushed = true;
                progress = true;
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => break,
        }
    }
    if wbuf.is_empty() && *unflushed {
        match Pin::new(&mut *stream).poll_flush(cx) {
            Poll::Ready(Ok(())) => *unflushed = false,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {}
        }
    }
    match tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, rbuf) {
        Poll::Ready(Ok(0)) => return Poll::Ready(Ok(Io::Eof)),
        Poll::Ready(Ok(_)) => progress = true,
        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
        Poll::Pending => {}
    }
    if progress {
        Poll::Ready(Ok(Io::Progress))
    } else {
        Poll::Pending
    }
}
