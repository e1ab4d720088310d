//! Bare Pingora, for `benches/e2e.sh`: the same Pingora version, allocator and release
//! profile as tollgate, proxying every request to one upstream with no routing, no limits
//! and no metrics. Its CPU per request is the floor tollgate's own work sits on.
//!
//! `bare_pingora LISTEN UPSTREAM THREADS`, e.g. `bare_pingora 127.0.0.1:8090 127.0.0.1:8081 2`.

// A benchmark or example may unwrap: a failure aborts the measurement, not a user's request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Bare {
    upstream: String,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(upstream)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: bare_pingora LISTEN UPSTREAM [THREADS]");
        std::process::exit(2);
    };
    let threads = args.get(3).and_then(|t| t.parse().ok()).unwrap_or(2);
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = http_proxy_service(
        &server.configuration,
        Bare {
            upstream: upstream.clone(),
        },
    );
    proxy.add_tcp(listen);
    server.add_service(proxy);
    server.run_forever();
}
