//! The `/metrics` listener: tollgate's own registry in Prometheus text format, plus the
//! counters limiters keep themselves (token-bucket evictions), synced at each scrape.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::metrics::Metrics;
use crate::proxy::runtime::{Runtime, State};

/// Serves `GET /metrics`; anything else is 404.
pub struct MetricsApp {
    metrics: Arc<Metrics>,
    runtime: Arc<ArcSwap<Runtime>>,
    /// Evictions already added to the counter, per token-bucket state (by address: a state
    /// replaced by a reload is a new address, starting from 0).
    seen: Mutex<HashMap<usize, u64>>,
}

impl MetricsApp {
    /// Serves `metrics`, syncing limiter-held counters from `runtime` at each scrape.
    pub fn new(metrics: Arc<Metrics>, runtime: Arc<ArcSwap<Runtime>>) -> Self {
        Self {
            metrics,
            runtime,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Adds each token bucket's evictions since the last scrape to its counter. Done here,
    /// not per request, so the decision path stays free of metric work.
    fn sync_evictions(&self) {
        let rt = self.runtime.load();
        let mut seen = self.seen.lock();
        let mut live = HashMap::with_capacity(seen.len());
        for origin in &rt.origins {
            for limit in &origin.request_limits {
                for variant in &limit.variants {
                    let State::TokenBucket(tb) = &*variant.state else {
                        continue;
                    };
                    let id = Arc::as_ptr(&variant.state) as usize;
                    let total = tb.evictions();
                    let before = seen.get(&id).copied().unwrap_or(0);
                    let counter = self
                        .metrics
                        .token_bucket_evictions_total
                        .with_label_values(&[origin.name.as_str(), limit.name.as_str()]);
                    counter.inc_by(total.saturating_sub(before));
                    live.insert(id, total.max(before));
                }
            }
        }
        // Forget states no longer in the config.
        *seen = live;
    }
}

#[async_trait]
impl ServeHttp for MetricsApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let (status, ctype, body) = if session.req_header().uri.path() == "/metrics" {
            self.sync_evictions();
            (
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics.encode(),
            )
        } else {
            (404, "text/plain", b"not found: try /metrics\n".to_vec())
        };
        let len = body.len();
        Response::builder()
            .status(status)
            .header("content-type", ctype)
            .header("content-length", len)
            .body(body)
            .unwrap_or_else(|_| Response::new(Vec::new()))
    }
}
