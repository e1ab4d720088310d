//! A test origin with a fixed capacity: at most `capacity` requests are served at once,
//! each for `service` time, and the rest wait in a FIFO queue, so its latency grows with
//! the load as a real server's does once its workers are busy. The capacity can be changed
//! while it runs (a capacity drop and its recovery). Answers 200.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

struct Shared {
    workers: Arc<Semaphore>,
    capacity: AtomicUsize,
    service: Duration,
    served: AtomicU64,
}

/// A running capacity-limited origin. Stops when dropped.
pub struct CapacityOrigin {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl CapacityOrigin {
    /// Starts on 127.0.0.1:0 with `capacity` workers and `service` time per request.
    pub async fn start(capacity: usize, service: Duration) -> CapacityOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
        let addr = listener.local_addr().expect("origin addr");
        let shared = Arc::new(Shared {
            workers: Arc::new(Semaphore::new(capacity)),
            capacity: AtomicUsize::new(capacity),
            service,
            served: AtomicU64::new(0),
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| serve(s.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        CapacityOrigin { addr, shared, task }
    }

    /// Changes the number of workers: more at once, fewer as busy workers finish.
    pub fn set_capacity(&self, capacity: usize) {
        let before = self.shared.capacity.swap(capacity, Ordering::SeqCst);
        if capacity > before {
            self.shared.workers.add_permits(capacity - before);
        } else if capacity < before {
            let workers = self.shared.workers.clone();
            let fewer = u32::try_from(before - capacity).unwrap_or(u32::MAX);
            tokio::spawn(async move {
                if let Ok(permits) = workers.acquire_many(fewer).await {
                    permits.forget();
                }
            });
        }
    }

    /// Requests served so far.
    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::SeqCst)
    }
}

impl Drop for CapacityOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    s: Arc<Shared>,
    _req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let worker = s.workers.clone().acquire_owned().await;
    tokio::time::sleep(s.service).await;
    drop(worker);
    s.served.fetch_add(1, Ordering::SeqCst);
    Ok(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
}
