//! Rejections a gRPC client understands. A gRPC request (`content-type: application/grpc`,
//! with or without a `+proto` style suffix) that tollgate answers itself gets a
//! *trailers-only* response, as Envoy's local replies do: `:status 200`,
//! `content-type: application/grpc`, `grpc-status` and `grpc-message` in one header block
//! that ends the stream, plus the headers the HTTP answer would carry (`Retry-After`,
//! `RateLimit`, `RateLimit-Policy`), so a gRPC client sees a status code instead of an HTTP
//! error it cannot map.
//!
//! The code: `RESOURCE_EXHAUSTED` (8) where the HTTP answer is 429, `UNAVAILABLE` (14) for
//! 503, and otherwise gRPC's own HTTP mapping (400 `INTERNAL`, 404 `UNIMPLEMENTED`, anything
//! else `UNKNOWN`).

use http::HeaderMap;
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::Result;
use pingora_proxy::Session;

use crate::problem::Problem;

/// Writes `problem` to a gRPC client as a trailers-only response: one header block with
/// `END_STREAM` on HTTP/2.
pub async fn send(session: &mut Session, problem: &Problem) -> Result<()> {
    let detail = serde_json::from_slice::<serde_json::Value>(&problem.body)
        .ok()
        .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_string))
        .unwrap_or_default();
    let mut resp = ResponseHeader::build(200, Some(problem.headers.len() + 3))?;
    resp.insert_header("content-type", "application/grpc")?;
    resp.insert_header("grpc-status", status_of(problem.status).to_string())?;
    resp.insert_header("grpc-message", encode_message(&detail))?;
    for (name, value) in &problem.headers {
        resp.insert_header(*name, value.as_str())?;
    }
    drain_small_body(session).await;
    // Pingora's session writes an HTTP/2 header block without END_STREAM (the body's empty
    // DATA frame ends the stream), which a gRPC client reads as initial metadata followed by
    // a stream without a status. The h2 session itself can end the stream with the headers.
    if let ServerSession::H2(h2) = session.as_downstream_mut() {
        return h2.write_response_header(Box::new(resp), true);
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(None, true).await
}

/// Request body read before a gRPC rejection, at most: a unary call's message.
const DRAIN_BYTES: usize = 64 * 1024;

/// How long a gRPC rejection waits for the rest of a request body, at most.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads a short request body to its end (at most [`DRAIN_BYTES`] within [`DRAIN_TIME`]):
/// an HTTP/2 stream whose body is left unread is reset when the response ends, and a gRPC
/// client that sees the reset reports `CANCELLED`/`UNKNOWN` instead of the status sent.
/// A longer or slower body is left: its stream is reset after the reply, as any.
async fn drain_small_body(session: &mut Session) {
    if session.is_body_empty() {
        return;
    }
    let drain = async {
        let mut read = 0;
        while read <= DRAIN_BYTES {
            match session.read_request_body().await {
                Ok(Some(chunk)) => read += chunk.len(),
                Ok(None) | Err(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
    if !session.is_body_done() {
        session.set_keepalive(None);
    }
}

/// Whether a request with `headers` is a gRPC call.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.as_bytes())
        .is_some_and(|ct| {
            ct.len() >= 16
                && ct[..16].eq_ignore_ascii_case(b"application/grpc")
                && matches!(ct.get(16), None | Some(b'+' | b';'))
        })
}

/// The gRPC status for an HTTP status tollgate would have answered.
pub fn status_of(http: u16) -> u8 {
    match http {
        429 => 8,
        502..=504 => 14,
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        _ => 2,
    }
}

/// `text` percent-encoded as `grpc-message` requires: printable ASCII but `%` as is,
/// everything else `%XX`.
pub fn encode_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_grpc_content_types_only() {
        let h = |ct: &str| {
            let mut m = HeaderMap::new();
            m.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
            is_grpc(&m)
        };
        assert!(h("application/grpc"));
        assert!(h("application/grpc+proto"));
        assert!(h("Application/GRPC;charset=utf-8"));
        assert!(!h("application/grpc-web"));
        assert!(!h("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn maps_statuses_and_encodes_messages() {
        assert_eq!(status_of(429), 8);
        assert_eq!(status_of(503), 14);
        assert_eq!(status_of(404), 12);
        assert_eq!(status_of(418), 2);
        assert_eq!(
            encode_message("rate 100% used: ü"),
            "rate 100%25 used: %C3%BC"
        );
    }
}
