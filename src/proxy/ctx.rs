//! The per-request context: the config snapshot a request runs under and everything it
//! holds. Its drop is the last point where inflight units are given back (normally they go
//! back earlier, as soon as the upstream is done: [`Ctx::release_upstream`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use crate::limits::Nanos;
use crate::proxy::problem::Problem;
use crate::proxy::request_id::RequestId;
use crate::proxy::route::HostBuf;
use crate::runtime::decide::{Holds, Notes, Phase};
use crate::runtime::learned::Attempt;
use crate::runtime::Runtime;

/// Decrements the origin's exact inflight gauge when dropped.
pub struct GaugeGuard(prometheus::IntGauge);

impl GaugeGuard {
    /// Increments `gauge` and returns the guard that will decrement it.
    pub fn new(gauge: &prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One request's state across Pingora's phases.
///
/// Field order matters only for readability: every guard decrements in its own `Drop`,
/// whatever ended the request (success, upstream error, client abort, timeout or panic
/// unwinding through the session task).
pub struct Ctx {
    /// When the request's headers were read.
    pub start: Instant,
    /// The config snapshot: a reload mid-request never changes what this request sees.
    pub rt: Option<Arc<Runtime>>,
    /// Index of the matched origin in `rt.origins`.
    pub origin: Option<usize>,
    /// The request's lower-cased host.
    pub host: HostBuf,
    /// The resolved client IP.
    pub client_ip: Option<IpAddr>,
    /// Whether the direct peer is a trusted proxy (its customer header is believed).
    pub trusted_peer: bool,
    /// The decision time of the request-time limits.
    pub now: Nanos,
    /// What the limits took: request-time admissions to refund if a later limit rejects,
    /// then (once the request passed every limit) only the units held while the upstream
    /// works.
    pub holds: Holds,
    /// Limits with `headers: always` to report on the response.
    pub notes: Notes,
    /// The exact per-origin inflight gauge's unit.
    pub gauge: Option<GaugeGuard>,
    /// The server the first upstream attempt goes to, picked (and its inflight limits
    /// passed) in `proxy_upstream_filter`; a retry picks again in `upstream_peer`.
    pub picked: Option<SocketAddr>,
    /// A retry's rejection, decided in `upstream_peer`, written by `fail_to_proxy`.
    pub rejection: Option<Problem>,
    /// The upstream attempt being timed for `max: auto` limits (only when the origin has
    /// one), until its response's headers or its failure.
    pub attempt: Option<Attempt>,
    /// The request's ID (`X-Request-Id`), set when the request is first seen.
    pub request_id: RequestId,
    /// When the request's header was read, on the proxy's clock (Unix nanoseconds).
    pub arrived: Nanos,
    /// The limit that rejected the request: its phase and index.
    pub rejected: Option<(Phase, u16)>,
    /// The upstream server of the last attempt.
    pub upstream: Option<SocketAddr>,
    /// When the request was sent upstream (the last attempt).
    pub upstream_sent: Option<Instant>,
    /// The upstream's status and its time to first byte (nanoseconds).
    pub upstream_answer: Option<(u16, u64)>,
    /// Whether a store's fallback (`fallback`) or deny cache (`deny_cache`) decided.
    pub source: &'static str,
}

impl Ctx {
    /// Gives the inflight units and the gauge's unit back: the upstream is done with this
    /// request. Called as soon as that is known (end of the upstream body, or a failure
    /// before the error response is written), so that a client's next request never
    /// races the bookkeeping of its previous one; `logging` and the drop call it again,
    /// which is a no-op.
    pub fn release_upstream(&mut self) {
        self.holds.clear();
        self.gauge = None;
    }
}

impl Default for Ctx {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            rt: None,
            origin: None,
            host: HostBuf::default(),
            client_ip: None,
            trusted_peer: false,
            now: 0,
            holds: Holds::new(),
            notes: Notes::new(),
            gauge: None,
            picked: None,
            rejection: None,
            attempt: None,
            request_id: RequestId::default(),
            arrived: 0,
            rejected: None,
            upstream: None,
            upstream_sent: None,
            upstream_answer: None,
            source: "",
        }
    }
}
