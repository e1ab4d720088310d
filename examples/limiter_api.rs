//! The limiter API on its own: a RESP server answering `RL.REDUCE`, `RL.GET`, `PING`,
//! `INFO`... over the local bucket table, for trying it with `redis-cli` and for
//! `benches/api.sh`.
//!
//! ```text
//! cargo run --example limiter_api -- [ADDR] [THREADS] [MAX_KEYS]
//! redis-cli -p PORT RL.REDUCE TwoPerMin 2 60     # 2, then 1, then 0
//! ```
//!
//! `ADDR` defaults to `127.0.0.1:0` (an ephemeral port); the line `listening on ADDR` on
//! stdout says which. `THREADS` 1 (the default) runs a current-thread runtime, one core;
//! more runs a multi-thread runtime. Ctrl-C (or SIGTERM) stops accepting, lets open
//! connections finish their command, and exits.

// A benchmark or example may unwrap: a failure aborts the measurement, not a user's request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::Arc;

use tokio::net::TcpSocket;
use tokio::signal::unix::{signal, SignalKind};
use tollgate::api::{ApiConfig, ApiService};
use tollgate::metrics::Metrics;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:0".to_string());
    let threads: usize = args.next().map_or(Ok(1), |t| t.parse())?;
    let max_keys: usize = args.next().map_or(Ok(100_000), |k| k.parse())?;
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async move {
        let metrics = Metrics::new()?;
        let config = ApiConfig {
            max_keys,
            ..ApiConfig::default()
        };
        let service = Arc::new(ApiService::new(config, &metrics));
        // A deep accept queue (Pingora's listeners use one too): benchmarks open many
        // connections at once.
        let addr: std::net::SocketAddr = addr.parse()?;
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(4096)?;
        println!("listening on {}", listener.local_addr()?);
        std::io::stdout().flush()?;
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let mut term = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            let _ = stop.send(true);
        });
        service.serve(listener, shutdown).await;
        Ok(())
    })
}
