//! The admin API: an HTTP listener (`server.admin`) beside the proxy, for operators.
//!
//! - `GET /config`: the effective config now running (defaults merged, as `tollgate check
//!   --print-effective` prints it), as YAML;
//! - `GET /certificates`: the certificates `tls.acme` manages, each host's state (valid,
//!   renewing, failed...), expiry, renewal time and last error;
//! - `GET /limits/{origin}/{limit}/state?PART=VALUE...`: one key's live state;
//! - `GET /limits/{origin}/{limit}/top?n=N`: the limit's heaviest keys (`top_keys`);
//! - `GET` and `PUT /kill-switch` (`on` or `off`): the kill switch's admin input.
//!
//! It runs as a Pingora service ([`AdminApp`]) on its own listener, never on a proxy port,
//! so it shares the proxy's graceful shutdown and upgrade, and it follows the live runtime
//! the proxy and the reloader share: each request reads the current one. With
//! `server.admin_token_file` set, every request needs `Authorization: Bearer TOKEN` (the
//! scheme in any case; the token compared in constant time) or gets 401, whatever its path. Answers are JSON (YAML for
//! `/config`), errors RFC 9457 problems.
//!
//! **Bounds.** One request per connection (the response closes it), at most
//! [`MAX_HEADERS`] header fields and [`MAX_BODY`] bytes of body, the whole exchange within
//! [`REQUEST_TIMEOUT`], at most [`MAX_CONCURRENT`] requests at once (503 beyond); Pingora
//! bounds the header's bytes. A state query of a shared store waits at most the store's
//! budget.
//!
//! **Where it sits.** A front end like the proxy and the limiter API: below the composition
//! root (`server`), above the runtime (`docs/architecture.md`, "The admin API").

pub mod query;
pub mod routes;
pub mod state;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use pingora::apps::{HttpServerApp, ReusedHttpStream};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;

use crate::config::AdminToken;
use crate::limits::MonotonicClock;
use crate::problem::{plain, Problem};
use crate::runtime::Runtime;

/// Header fields one admin request may carry.
pub const MAX_HEADERS: usize = 64;
/// Bytes of request body read at most (`on`, `off`): a longer body is refused with 413.
pub const MAX_BODY: usize = 1024;
/// The whole exchange (header, body, answer, a store's read included) must fit in this.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests served at once; more get 503.
pub const MAX_CONCURRENT: usize = 64;

/// An answer: status, content type, body, extra headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Bytes,
    /// Headers besides `Content-Type`, `Content-Length` and `Cache-Control`.
    pub headers: Vec<(&'static str, String)>,
}

impl Answer {
    /// 200 with a JSON body.
    pub fn json(value: &serde_json::Value) -> Self {
        Self {
            status: 200,
            content_type: "application/json",
            body: Bytes::from(serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec())),
            headers: Vec::new(),
        }
    }

    /// An RFC 9457 problem.
    pub fn problem(status: u16, title: &str, detail: impl Into<String>) -> Self {
        Self::from(plain(status, title, detail.into()))
    }

    /// Adds a header.
    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

impl From<Problem> for Answer {
    fn from(p: Problem) -> Self {
        Self {
            status: p.status,
            content_type: "application/problem+json",
            body: p.body,
            headers: p
                .headers
                .into_iter()
                .filter(|(k, _)| *k != "cache-control")
                .collect(),
        }
    }
}

/// What the admin API's requests share.
pub struct Admin {
    runtime: Arc<ArcSwap<Runtime>>,
    clock: MonotonicClock,
    busy: AtomicUsize,
}

impl Admin {
    /// The admin API on the live `runtime`, reading times on `clock` (the proxy's).
    pub fn new(runtime: Arc<ArcSwap<Runtime>>, clock: MonotonicClock) -> Self {
        Self {
            runtime,
            clock,
            busy: AtomicUsize::new(0),
        }
    }
}

/// Whether `authorization` (the header's value, if any) carries `token`; always true
/// without one. Constant time in the token's bytes.
fn authorized(token: Option<&AdminToken>, authorization: Option<&[u8]>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let given = authorization.and_then(bearer).unwrap_or_default();
    token.matches(given)
}

/// The credentials of a `Bearer` authorization: the scheme in any case (RFC 9110 §11.1:
/// a scheme is case-insensitive), then one or more spaces, then the token.
fn bearer(authorization: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = authorization.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"Bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
    rest.get(start..)
}

/// The Pingora application of the admin listener.
pub struct AdminApp(pub Arc<Admin>);

/// Releases a concurrency slot.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AdminApp {
    /// Reads the request (bounded) and answers it.
    async fn answer(&self, session: &mut ServerSession) -> Option<Answer> {
        match session.read_request().await {
            Ok(true) => {}
            Ok(false) | Err(_) => return None,
        }
        let admin = &self.0;
        let before = admin.busy.fetch_add(1, Ordering::AcqRel);
        let _slot = Slot(&admin.busy);
        if before >= MAX_CONCURRENT {
            return Some(Answer::problem(
                503,
                "Service Unavailable",
                format!("more than {MAX_CONCURRENT} admin requests at once; retry"),
            ));
        }
        let header = session.req_header();
        if header.headers.len() > MAX_HEADERS {
            return Some(Answer::problem(
                431,
                "Request Header Fields Too Large",
                format!("at most {MAX_HEADERS} header fields"),
            ));
        }
        // The token of the running config: a reload that changes the file's token (or
        // sets one) applies to the next request.
        let runtime = admin.runtime.load_full();
        let authorization = header.headers.get("authorization").map(|v| v.as_bytes());
        if !authorized(runtime.config.server.admin_token.as_ref(), authorization) {
            return Some(
                Answer::problem(
                    401,
                    "Unauthorized",
                    "this admin API needs `Authorization: Bearer TOKEN` (the token in server.admin_token_file)",
                )
                .with("www-authenticate", "Bearer realm=\"tollgate admin\""),
            );
        }
        let method = header.method.clone();
        let uri = header.uri.clone();
        let body = match read_body(session).await {
            Ok(body) => body,
            Err(answer) => return Some(answer),
        };
        Some(routes::route(&runtime, admin.clock, &method, &uri, &body).await)
    }
}

/// The request's body, at most [`MAX_BODY`] bytes (413 beyond, 400 if unreadable).
async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, Answer> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY {
                    return Err(Answer::problem(
                        413,
                        "Content Too Large",
                        format!("an admin request body is at most {MAX_BODY} bytes"),
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                return Err(Answer::problem(
                    400,
                    "Bad Request",
                    format!("cannot read the request body: {e}"),
                ))
            }
        }
    }
}

#[async_trait]
impl HttpServerApp for AdminApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        _shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        session.set_keepalive(None);
        session.set_read_timeout(Some(REQUEST_TIMEOUT));
        session.set_write_timeout(Some(REQUEST_TIMEOUT));
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, self.answer(&mut session))
            .await
            .unwrap_or_else(|_| {
                Some(Answer::problem(
                    408,
                    "Request Timeout",
                    format!("an admin request must be answered within {REQUEST_TIMEOUT:?}"),
                ))
            })?;
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, write(&mut session, answer)).await;
        None
    }
}

/// Writes `answer` and ends the response.
async fn write(session: &mut ServerSession, answer: Answer) -> pingora::Result<()> {
    let mut header = ResponseHeader::build(answer.status, Some(4 + answer.headers.len()))?;
    header.insert_header("content-type", answer.content_type)?;
    header.insert_header("content-length", answer.body.len().to_string())?;
    header.insert_header("cache-control", "no-store")?;
    for (name, value) in answer.headers {
        header.insert_header(name, value)?;
    }
    session.write_response_header(Box::new(header)).await?;
    if !answer.body.is_empty() {
        session.write_response_body(answer.body, true).await?;
    }
    session.finish_body().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_is_not() {
        let token = AdminToken {
            file: "admin.token".into(),
            value: "s3cret".to_string(),
        };
        let ok = |header: &str| authorized(Some(&token), Some(header.as_bytes()));
        for header in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR s3cret",
            "Bearer   s3cret",
        ] {
            assert!(ok(header), "{header}");
        }
        for header in [
            "Bearer S3CRET",
            "Bearer s3cre",
            "Bearer s3cret ",
            "Bearers3cret",
            "Bearer\ts3cret",
            "Bearer",
            "Bearer ",
            "Beare s3cret",
            "Basic s3cret",
            "s3cret",
            "",
        ] {
            assert!(!ok(header), "{header:?}");
        }
        assert!(!authorized(Some(&token), None));
        assert!(authorized(None, None), "no token configured: open");
        assert!(authorized(None, Some(b"Basic x")));
    }
}
