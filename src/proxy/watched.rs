//! A downstream stream wrapped to watch its traffic, one wrapper for both protocols:
//! [`Watched`] forwards every trait Pingora asks of a stream to the stream inside and lets
//! its [`Watch`] see the reads (which it performs, so it may also refuse them), the writes
//! and the peeks. HTTP/1 connections watch for request starts and response statuses
//! ([`super::conn_state`]), HTTP/2 ones count the client's stream resets ([`super::h2`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::TlsRef;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a [`Watched`] stream adds to the stream inside it.
#[async_trait]
pub trait Watch: std::fmt::Debug + Send + Sync + Unpin + 'static {
    /// Reads from `inner` into `buf`: at least a plain read, seen or refused.
    fn poll_read(
        &mut self,
        inner: &mut Stream,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>>;

    /// Sees the first non-empty buffer of each write (or the buffer of an empty one)
    /// before it goes to `inner`.
    fn wrote(&mut self, _buf: &[u8]) {}

    /// Peeks at `inner` (Pingora's keep-alive wait); `Ok(false)`: this stream cannot peek.
    async fn try_peek(&mut self, _inner: &mut Stream, _buf: &mut [u8]) -> io::Result<bool> {
        Ok(false)
    }
}

/// A downstream stream and its [`Watch`]; every other operation goes to the stream.
#[derive(Debug)]
pub struct Watched<W> {
    inner: Stream,
    /// What watches the stream.
    pub(super) watch: W,
}

impl<W: Watch> Watched<W> {
    /// Wraps `inner` under `watch`.
    pub fn wrap(inner: Stream, watch: W) -> Self {
        Self { inner, watch }
    }
}

impl<W: Watch> AsyncRead for Watched<W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.watch.poll_read(&mut this.inner, cx, buf)
    }
}

impl<W: Watch> AsyncWrite for Watched<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.watch.wrote(buf);
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            self.watch.wrote(first);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl<W: Watch> Shutdown for Watched<W> {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await;
    }
}

impl<W: Watch> UniqueID for Watched<W> {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl<W: Watch> Ssl for Watched<W> {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl<W: Watch> GetTimingDigest for Watched<W> {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl<W: Watch> GetProxyDigest for Watched<W> {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest);
    }
}

impl<W: Watch> GetSocketDigest for Watched<W> {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, socket_digest: SocketDigest) {
        self.inner.set_socket_digest(socket_digest);
    }
}

#[async_trait]
impl<W: Watch> Peek for Watched<W> {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.watch.try_peek(&mut self.inner, buf).await
    }
}
