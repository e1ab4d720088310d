//! The `/metrics` listener: tollgate's own registry in Prometheus text format (including
//! the collectors that read the live runtime at scrape time, see
//! [`crate::runtime::collector`]).

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::metrics::Metrics;

/// Serves `GET /metrics`; anything else is 404.
pub struct MetricsApp {
    metrics: Arc<Metrics>,
}

impl MetricsApp {
    /// Serves `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

#[async_trait]
impl ServeHttp for MetricsApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let (status, ctype, body) = if session.req_header().uri.path() == "/metrics" {
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
