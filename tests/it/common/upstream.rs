//! A real HTTP upstream for the tests (hyper on loopback) whose requests can be held open
//! for as long as a test wants.
//!
//! - `/hold...` waits until the test calls [`Upstream::release`], or until its connection's
//!   client closes (hyper alone does not always notice that while a handler runs).
//! - `/status/NNN` answers NNN.
//! - `/slow...` answers after 3 ms, counting the `/slow` requests in progress and their
//!   peak ([`Upstream::busy`], [`Upstream::peak`]): what a holding limit lets through at
//!   once.
//! - anything else answers 200 with the upstream's name, echoing the `X-Forwarded-For` it
//!   received as `x-seen-forwarded-for` (its first line) and `x-seen-forwarded-for-lines`
//!   (how many lines), the path and query as `x-seen-path`, every `Content-Length` line
//!   joined by ` | ` as `x-seen-content-length`, every `X-Request-Id` line
//!   joined by ` | ` as `x-seen-request-id`, and the body's length as `x-seen-body-bytes`.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct Shared {
    name: String,
    requests: AtomicUsize,
    /// Requests to `/hold...` received.
    holds: AtomicUsize,
    held: AtomicUsize,
    /// `/slow` requests in progress, and the most at once.
    busy: AtomicUsize,
    peak: AtomicUsize,
    /// Bumped on each release; holders wait for it to change.
    release: watch::Sender<u64>,
}

/// A running upstream. Stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Starts an upstream on `ip`:0.
    pub async fn start(ip: &str, name: &str) -> Upstream {
        let listener = TcpListener::bind(format!("{ip}:0"))
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let (release, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            name: name.to_string(),
            requests: AtomicUsize::new(0),
            holds: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            release,
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = s.clone();
                let (closed, watch_closed) = watch::channel(false);
                let stream = Watched { stream, closed };
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(s.clone(), watch_closed.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Upstream { addr, shared, task }
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Requests to `/hold...` received so far (held or not any more).
    pub fn holds(&self) -> usize {
        self.shared.holds.load(Ordering::SeqCst)
    }

    /// Requests currently held.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// `/slow` requests in progress now.
    pub fn busy(&self) -> usize {
        self.shared.busy.load(Ordering::SeqCst)
    }

    /// The most `/slow` requests ever in progress at once.
    pub fn peak(&self) -> usize {
        self.shared.peak.load(Ordering::SeqCst)
    }

    /// Lets every held request answer.
    pub fn release(&self) {
        self.shared.release.send_modify(|v| *v += 1);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.release();
        self.task.abort();
    }
}

/// Decrements `held` when the handler ends, even if hyper drops it (client went away).
struct HeldGuard(Arc<Shared>);

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection that says when its client closed it: a read found the end of the stream
/// or failed.
struct Watched {
    stream: TcpStream,
    closed: watch::Sender<bool>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let eof = matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() == before;
        if eof || matches!(polled, Poll::Ready(Err(_))) {
            self.closed.send_replace(true);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

async fn handle(
    s: Arc<Shared>,
    mut closed: watch::Receiver<bool>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let path = req.uri().path().to_string();
    if path.starts_with("/hold") {
        let mut rx = s.release.subscribe();
        let start = *rx.borrow();
        s.holds.fetch_add(1, Ordering::SeqCst);
        s.held.fetch_add(1, Ordering::SeqCst);
        let _guard = HeldGuard(s.clone());
        let released = async {
            while *rx.borrow() == start {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        };
        tokio::select! {
            () = released => {}
            // The client (tollgate) closed the connection: nobody waits for the answer.
            _ = closed.wait_for(|closed| *closed) => {
                return Ok(Response::new(Full::new(Bytes::new())));
            }
        }
    }
    if path.starts_with("/slow") {
        let now = s.busy.fetch_add(1, Ordering::SeqCst) + 1;
        s.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        s.busy.fetch_sub(1, Ordering::SeqCst);
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let code = code.parse().unwrap_or(500);
        return Ok(Response::builder()
            .status(code)
            .body(Full::new(Bytes::from_static(b"upstream error\n")))
            .expect("response"));
    }
    let text = |v: &hyper::header::HeaderValue| v.to_str().unwrap_or("?").to_string();
    let xff = req
        .headers()
        .get("x-forwarded-for")
        .map(text)
        .unwrap_or_default();
    let xff_lines = req.headers().get_all("x-forwarded-for").iter().count();
    let lengths: Vec<String> = req
        .headers()
        .get_all("content-length")
        .iter()
        .map(text)
        .collect();
    let seen_id: Vec<String> = req
        .headers()
        .get_all("x-request-id")
        .iter()
        .map(text)
        .collect();
    let seen_path = req
        .uri()
        .path_and_query()
        .map_or_else(String::new, |p| p.to_string());
    let body_bytes = match req.into_body().collect().await {
        Ok(body) => body.to_bytes().len().to_string(),
        Err(_) => "error".to_string(),
    };
    Ok(Response::builder()
        .status(200)
        .header("x-upstream", s.name.as_str())
        .header("x-seen-forwarded-for", xff)
        .header("x-seen-forwarded-for-lines", xff_lines)
        .header("x-seen-path", seen_path)
        .header("x-seen-request-id", seen_id.join(" | "))
        .header("x-seen-content-length", lengths.join(" | "))
        .header("x-seen-body-bytes", body_bytes)
        .body(Full::new(Bytes::from(format!("hello from {}\n", s.name))))
        .expect("response"))
}
