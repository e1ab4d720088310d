//! The capacity-drop benchmark of `max: auto` (`docs/performance.md`): an origin with `C`
//! workers of service time `S` (the rest queue, FIFO), driven through a running tollgate
//! by closed-loop clients; at a third of the run the origin loses half its workers, at two
//! thirds it gets them back. Every 250 ms it prints one CSV line:
//!
//! `t_s,learned_max,goodput_rps,rejected_rps,origin_p99_ms`
//!
//! where goodput counts 200s, the origin's p99 is the time a request spent inside the
//! origin (queue and service) and the learned max is scraped from
//! `tollgate_inflight_learned_max` (0 for a static max).
//!
//! `capacity_drop PROXY_ADDR METRICS_ADDR ORIGIN_PORT CLIENTS SECONDS [steady]`, with
//! tollgate configured for host `bench.test` with `ORIGIN_PORT` as its upstream; the origin
//! has `C = 16` workers of `S = 50 ms`. With `steady` the origin keeps its 16 workers for
//! the whole run (the steady-overload and unloaded runs). `benches/capacity_drop.sh` runs
//! it.

// A benchmark or example may unwrap: a failure aborts the measurement, not a user's request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;

const CAPACITY: u32 = 16;
const SERVICE: Duration = Duration::from_millis(50);

struct Origin {
    workers: Arc<Semaphore>,
    /// Microseconds inside the origin of each request answered since the last report.
    latencies: Mutex<Vec<u64>>,
}

async fn serve(o: Arc<Origin>) -> Result<Response<Full<Bytes>>, Infallible> {
    let arrived = Instant::now();
    let worker = o.workers.clone().acquire_owned().await;
    tokio::time::sleep(SERVICE).await;
    drop(worker);
    let micros = u64::try_from(arrived.elapsed().as_micros()).unwrap_or(u64::MAX);
    o.latencies.lock().unwrap().push(micros);
    Ok(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
}

fn learned(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("tollgate_inflight_learned_max{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let proxy: SocketAddr = args[1].parse().unwrap();
    let metrics: SocketAddr = args[2].parse().unwrap();
    let port: u16 = args[3].parse().unwrap();
    let clients: usize = args[4].parse().unwrap();
    let seconds: u64 = args[5].parse().unwrap();
    let steady = args.get(6).is_some_and(|a| a == "steady");

    let origin = Arc::new(Origin {
        workers: Arc::new(Semaphore::new(CAPACITY as usize)),
        latencies: Mutex::new(Vec::new()),
    });
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let o = origin.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let o = o.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| serve(o.clone()));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });

    let ok = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    for _ in 0..clients {
        let (ok, rejected) = (ok.clone(), rejected.clone());
        tokio::spawn(async move {
            let c = reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap();
            let url = format!("http://{proxy}/");
            while Instant::now() < end {
                match c.get(&url).header("host", "bench.test").send().await {
                    Ok(r) if r.status() == 200 => {
                        let _ = r.bytes().await;
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        rejected.fetch_add(1, Ordering::Relaxed);
                        // A rejected client retries after a pause, as a polite one would.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }

    println!("t_s,learned_max,goodput_rps,rejected_rps,origin_p99_ms");
    let tick = Duration::from_millis(250);
    let (mut dropped, mut restored) = (false, false);
    let mut next = start + tick;
    let (mut last_ok, mut last_rej) = (0, 0);
    while next <= end {
        tokio::time::sleep_until(next).await;
        let t = (next - start).as_secs_f64();
        if !steady && !dropped && t >= seconds as f64 / 3.0 {
            dropped = true;
            let workers = origin.workers.clone();
            tokio::spawn(async move {
                workers.acquire_many(CAPACITY / 2).await.unwrap().forget();
            });
        }
        if !steady && !restored && t >= 2.0 * seconds as f64 / 3.0 {
            restored = true;
            origin.workers.add_permits((CAPACITY / 2) as usize);
        }
        let (n_ok, n_rej) = (ok.load(Ordering::Relaxed), rejected.load(Ordering::Relaxed));
        let mut lat = std::mem::take(&mut *origin.latencies.lock().unwrap());
        lat.sort_unstable();
        let p99 = lat
            .get((lat.len() * 99 / 100).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |&m| m as f64 / 1000.0);
        let text = match reqwest::get(format!("http://{metrics}/metrics")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let per_sec = |n: u64| n as f64 / tick.as_secs_f64();
        println!(
            "{t:.2},{},{:.0},{:.0},{p99:.1}",
            learned(&text),
            per_sec(n_ok - last_ok),
            per_sec(n_rej - last_rej),
        );
        (last_ok, last_rej) = (n_ok, n_rej);
        next += tick;
    }
}
