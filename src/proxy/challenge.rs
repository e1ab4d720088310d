//! ACME HTTP-01 (RFC 8555, section 8.3): a request for
//! `/.well-known/acme-challenge/TOKEN` whose token an order of `tls.acme` is waiting on is
//! answered with the key authorization before routing, on any listener and for any host
//! (the CA asks on port 80 and follows redirects). Other tokens go on to routing, so an
//! origin that answers its own challenges keeps doing so.
//!
//! A request pays one prefix comparison; only a matching path reads the board.

use pingora::http::ResponseHeader;
use pingora::Result;
use pingora_proxy::Session;

use crate::tls::managed::{Managed, HTTP01_PREFIX};

/// The key authorization answering `path`, if it is a pending HTTP-01 challenge.
pub fn answer(path: &str, managed: &Managed) -> Option<Box<str>> {
    let token = path.strip_prefix(HTTP01_PREFIX)?;
    if token.is_empty() || token.len() > 256 {
        return None;
    }
    managed.http_answer(token)
}

/// Writes `key_authorization` as the response (200, `text/plain`).
pub async fn send(session: &mut Session, key_authorization: &str, close: bool) -> Result<()> {
    let body = bytes::Bytes::copy_from_slice(key_authorization.as_bytes());
    let mut resp = ResponseHeader::build(200, Some(3))?;
    resp.insert_header("content-type", "text/plain")?;
    resp.insert_header("content-length", body.len().to_string())?;
    if close || !session.is_body_empty() {
        session.set_keepalive(None);
        resp.insert_header("connection", "close")?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}
