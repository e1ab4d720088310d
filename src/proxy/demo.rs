//! A built-in demo upstream (`server.demo_upstream`), so the example config serves on a
//! machine with nothing else running: `GET /` answers 200 at once, `GET /?sleep=2s` holds
//! the request for the given time (at most 30 s), enough to see an inflight limit answer
//! 503 with two `curl`s.

use std::time::Duration;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

/// The longest a demo request may be held.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// The demo upstream app.
pub struct DemoUpstream;

/// The `sleep=` query parameter, parsed as a humantime duration and capped.
fn sleep_of(query: Option<&str>) -> Option<Duration> {
    let value = query?.split('&').find_map(|kv| kv.strip_prefix("sleep="))?;
    humantime::parse_duration(value)
        .ok()
        .map(|d| d.min(MAX_SLEEP))
}

#[async_trait]
impl ServeHttp for DemoUpstream {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let sleep = sleep_of(session.req_header().uri.query());
        if let Some(d) = sleep {
            tokio::time::sleep(d).await;
        }
        let body = match sleep {
            Some(d) => format!(
                "hello from the tollgate demo upstream (held {})\n",
                humantime::format_duration(d)
            ),
            None => "hello from the tollgate demo upstream\n".to_string(),
        };
        let len = body.len();
        Response::builder()
            .status(200)
            .header("content-type", "text/plain; charset=utf-8")
            .header("content-length", len)
            .body(body.into_bytes())
            .unwrap_or_else(|_| Response::new(Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_parameter_is_parsed_and_capped() {
        assert_eq!(sleep_of(Some("sleep=2s")), Some(Duration::from_secs(2)));
        assert_eq!(
            sleep_of(Some("a=1&sleep=250ms")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(sleep_of(Some("sleep=1h")), Some(MAX_SLEEP));
        assert_eq!(sleep_of(Some("sleep=soon")), None);
        assert_eq!(sleep_of(None), None);
    }
}
