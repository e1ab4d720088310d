//! Envoy's rate limit service (third front end): `envoy.service.ratelimit.v3.
//! RateLimitService/ShouldRateLimit` over gRPC on `server.rls`, with gRPC health checking
//! (`grpc.health.v1.Health`), answered from the live runtime's [`RlsRt`].
//!
//! The service is tonic's HTTP/2 server, run as a Pingora background service on its own
//! listener, bound at start (with `SO_REUSEPORT`, so that a process taking over in a
//! graceful upgrade can bind it while this one drains). Each call loads the current
//! runtime once, so a reload changes domains, rules, stores and the kill switch at once.
//! The types are `envoy-types`' (Envoy's own protos, generated with prost for tonic).
//!
//! Bounds: a message is at most [`MAX_MESSAGE_BYTES`], a request at most
//! [`MAX_DESCRIPTORS`] descriptors of at most [`MAX_ENTRIES`] entries, a call at most
//! [`CALL_TIMEOUT`] (a client that opens a stream and never sends is cut there), at most
//! [`MAX_STREAMS`] streams per connection. A malformed request (no domain, no
//! descriptor, an empty entry key, past a bound) is `INVALID_ARGUMENT`; a domain or
//! descriptor no file defines is `OK`, as envoyproxy/ratelimit answers.
//!
//! gRPC server reflection (`grpc.reflection.v1`) describes the service ([`reflection`]).
//! TLS (`server.rls: {addr, tls: true}`) is [`tls`]'s: handshakes with the proxy's
//! certificates before tonic sees the connection.
//!
//! [`RlsRt`]: crate::runtime::rls::RlsRt

pub mod reflection;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use parking_lot::Mutex;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tonic::{Request, Response, Status as GrpcStatus};

use crate::limits::{Clock, MonotonicClock, Nanos};
use crate::runtime::rls::Status;
use crate::runtime::Runtime;
use crate::store::redis::gather::together;

/// The largest request message accepted (Envoy's are a few hundred bytes).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;

/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;

/// The longest a call may take, from its headers to its answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Concurrent streams per connection.
pub const MAX_STREAMS: u32 = 256;

/// The gRPC service: the live runtime and the proxy's clock.
#[derive(Clone)]
pub struct Rls {
    runtime: Arc<ArcSwap<Runtime>>,
    clock: MonotonicClock,
}

impl Rls {
    /// A service answering from `runtime`, deciding at `clock`'s instants.
    pub fn new(runtime: Arc<ArcSwap<Runtime>>, clock: MonotonicClock) -> Self {
        Self { runtime, clock }
    }

    /// Answers one request (the gRPC method, without the transport).
    pub async fn answer(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, GrpcStatus> {
        let rt = self.runtime.load_full();
        if let Err(why) = check(req) {
            if let Some(c) = &rt.rls.invalid {
                c.inc();
            }
            log::info!("rls: refused a malformed request: {why}");
            return Err(GrpcStatus::invalid_argument(why));
        }
        let ok = |n: usize| RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                };
                n
            ],
            ..RateLimitResponse::default()
        };
        let Some(domain) = rt.rls.domain(&req.domain) else {
            if let Some(c) = &rt.rls.unknown {
                c.ok.inc();
            }
            return Ok(ok(req.descriptors.len()));
        };
        let mut entries: Vec<(&str, &str)> = Vec::with_capacity(MAX_ENTRIES);
        let mut matched = Vec::with_capacity(req.descriptors.len());
        for d in &req.descriptors {
            entries.clear();
            entries.extend(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
            matched.push(domain.find(&entries));
        }
        // `replaces`: a rule named by another matched rule is not evaluated at all.
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|m| m.rule.replaces.iter().map(String::as_str))
            .collect();
        let kill = rt.kill.on();
        let now = self.clock.now();
        // Every descriptor is decided (as envoyproxy/ratelimit does: an over-limit one does
        // not spare the others), concurrently, so that the shared ones' script calls leave
        // in one pipeline: one round trip to each store, however many descriptors. Under
        // `together` the calls are queued in descriptor order, and Redis runs them in that
        // order, so two descriptors on one key see each other as they did one by one.
        let decisions = req.descriptors.iter().zip(&matched).map(|(d, m)| {
            let live = m.as_ref().filter(|m| {
                m.rule
                    .name
                    .as_deref()
                    .is_none_or(|n| !replaced.contains(&n))
            });
            let hits = d
                .hits_addend
                .map(|h| h.value)
                .unwrap_or(u64::from(req.hits_addend))
                .max(1);
            async move {
                match live {
                    Some(m) => m.rule.decide(&m.key, hits, now, kill).await,
                    None => Status::NoRule,
                }
            }
        });
        let statuses = together(futures_util::future::join_all(decisions)).await;
        let over = statuses
            .iter()
            .any(|s| matches!(s, Status::Limited { over: true, .. }));
        let mut out = ok(0);
        out.statuses = statuses.into_iter().map(descriptor_status).collect();
        if over {
            out.overall_code = Code::OverLimit as i32;
            domain.over.inc();
        } else {
            domain.ok.inc();
        }
        Ok(out)
    }
}

/// Why `req` is malformed, if it is.
fn check(req: &RateLimitRequest) -> Result<(), String> {
    if req.domain.is_empty() {
        return Err("rate limit domain must not be empty".into());
    }
    if req.descriptors.is_empty() {
        return Err("rate limit descriptor list must not be empty".into());
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(format!(
            "{} descriptors; at most {MAX_DESCRIPTORS} are allowed",
            req.descriptors.len()
        ));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
            return Err(format!(
                "descriptor {i} has {} entries; between 1 and {MAX_ENTRIES} are allowed",
                d.entries.len()
            ));
        }
        if d.entries.iter().any(|e| e.key.is_empty()) {
            return Err(format!("descriptor {i} has an entry with an empty key"));
        }
    }
    Ok(())
}

fn descriptor_status(status: Status) -> DescriptorStatus {
    match status {
        Status::NoRule => DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        },
        Status::Unlimited => DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..DescriptorStatus::default()
        },
        Status::Limited {
            over,
            remaining,
            reset_after,
            unit,
            requests_per_unit,
        } => DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit,
                unit,
            }),
            limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(duration(reset_after)),
            quota: None,
        },
    }
}

fn duration(n: Nanos) -> PbDuration {
    const NS: u64 = 1_000_000_000;
    PbDuration {
        seconds: i64::try_from(n / NS).unwrap_or(i64::MAX),
        nanos: (n % NS) as i32,
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, GrpcStatus> {
        self.answer(request.get_ref()).await.map(Response::new)
    }
}

/// Binds `addr` for the service: non-blocking, `SO_REUSEADDR` and `SO_REUSEPORT` (a
/// successor in a graceful upgrade binds it beside this process).
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// The background service running the gRPC server on a bound listener until shutdown.
pub struct RlsService {
    listener: Mutex<Option<std::net::TcpListener>>,
    tls: bool,
    rls: Rls,
}

impl RlsService {
    /// The service for `rls` on `listener` (from [`bind`]); `tls`: every connection
    /// starts with a TLS handshake ([`tls`]).
    pub fn new(listener: std::net::TcpListener, tls: bool, rls: Rls) -> Self {
        Self {
            listener: Mutex::new(Some(listener)),
            tls,
            rls,
        }
    }
}

#[async_trait]
impl BackgroundService for RlsService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(listener) = self.listener.lock().take() else {
            return;
        };
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                log::error!("rls: cannot use the listener: {e}");
                return;
            }
        };
        let reflection = tonic_reflection::server::Builder::configure()
            .register_file_descriptor_set(reflection::descriptors())
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1();
        let reflection = match reflection {
            Ok(r) => Some(r),
            Err(e) => {
                log::error!("rls: gRPC reflection is off: {e}");
                None
            }
        };
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter.set_serving::<RateLimitServiceServer<Rls>>().await;
        let service = RateLimitServiceServer::new(self.rls.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let router = tonic::transport::Server::builder()
            .timeout(CALL_TIMEOUT)
            .max_concurrent_streams(MAX_STREAMS)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .add_service(health)
            .add_service(service)
            .add_optional_service(reflection);
        let stopping = async move {
            let _ = shutdown.wait_for(|stopping| *stopping).await;
        };
        let served = if self.tls {
            let incoming = tls::incoming(listener, self.rls.runtime.clone());
            router
                .serve_with_incoming_shutdown(incoming, stopping)
                .await
        } else {
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            router
                .serve_with_incoming_shutdown(incoming, stopping)
                .await
        };
        if let Err(e) = served {
            log::error!("rls: the gRPC server stopped: {e}");
        }
    }
}
