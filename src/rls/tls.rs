//! TLS on `server.rls` (`{addr, tls: true}`): the handshakes before tonic sees a
//! connection, with the proxy's certificates, SNI table and settings (the live runtime's
//! [`TlsStore`](crate::tls::TlsStore) acceptor, loaded once per connection, so a
//! certificate replaced on disk serves the next handshake) and its deadline
//! (`tls.handshake_timeout`). ALPN: the acceptor prefers `h2`; a connection that settles
//! on anything else (`http/1.1`) is closed, since gRPC is HTTP/2 only.
//!
//! Each accepted TCP connection gets its own task for the handshake, so a client that
//! never says hello holds only its own task until the deadline; finished connections go
//! to tonic through a bounded channel ([`TlsIncoming`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use openssl::ssl::Ssl;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_openssl::SslStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::runtime::Runtime;

/// Connections past their handshake waiting for tonic to take them.
const QUEUE: usize = 64;

/// A connection past its TLS handshake, as tonic serves it.
pub struct TlsConn(SslStream<TcpStream>);

/// The finished connections, in the order their handshakes ended.
pub type TlsIncoming = ReceiverStream<io::Result<TlsConn>>;

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.get_ref().connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepts on `listener` for as long as the returned stream is read, handshaking each
/// connection with the live runtime's certificates.
pub fn incoming(listener: TcpListener, runtime: Arc<ArcSwap<Runtime>>) -> TlsIncoming {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let tcp = match tcp {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    log::debug!("rls: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let rt = runtime.load();
            let Some(store) = rt.tls.clone() else {
                // The config requires certificates for `tls: true`; none were loaded.
                log::warn!("rls: a TLS connection arrived but no certificate is loaded; closed");
                continue;
            };
            let deadline = rt.config.tls.handshake_timeout;
            let tx = tx.clone();
            tokio::spawn(async move {
                let handshake = async {
                    let ssl = Ssl::new(store.acceptor.context()).map_err(io::Error::other)?;
                    let mut stream = SslStream::new(ssl, tcp).map_err(io::Error::other)?;
                    Pin::new(&mut stream)
                        .accept()
                        .await
                        .map_err(io::Error::other)?;
                    Ok::<_, io::Error>(stream)
                };
                match tokio::time::timeout(deadline, handshake).await {
                    Ok(Ok(stream)) => {
                        let alpn = stream.ssl().selected_alpn_protocol();
                        if alpn.is_some_and(|p| p != b"h2") {
                            log::debug!("rls: a TLS client chose a protocol other than h2");
                            return;
                        }
                        let _ = tx.send(Ok(TlsConn(stream))).await;
                    }
                    Ok(Err(e)) => log::debug!("rls: TLS handshake failed: {e}"),
                    Err(_) => log::debug!("rls: TLS handshake not complete in time"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
