//! Hardening item 11: requests Pingora refuses itself, before any tollgate hook runs.
//! Pingora offers no hook to write these responses, so they are Pingora's own (an empty
//! `400`, or `405` for `CONNECT`, with `Connection: close`, not problem+json, as the
//! docs/limits.md says); tollgate counts each in `tollgate_requests_total{origin="_unmatched"}`.
//! Each kind is sent by a raw TCP client.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;

use common::raw::exchange;
use common::{Tollgate, Upstream, SERVER};

fn config(up: SocketAddr) -> String {
    format!("{SERVER}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{up}\"]\n")
}

/// Every kind Pingora's parser refuses, with the status it answers.
fn refused() -> Vec<(&'static str, Vec<u8>, u16)> {
    let many_fields: String = (0..300).map(|i| format!("X-Field-{i}: v\r\n")).collect();
    let huge_field = "a".repeat(1024 * 1024 + 16);
    vec![
        (
            "duplicate Host",
            b"GET / HTTP/1.1\r\nHost: app.test\r\nHost: other.test\r\n\r\n".to_vec(),
            400,
        ),
        (
            "conflicting Content-Length",
            b"POST / HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"
                .to_vec(),
            400,
        ),
        (
            "Transfer-Encoding not ending in chunked, with Content-Length",
            b"POST / HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello"
                .to_vec(),
            400,
        ),
        (
            "obs-fold",
            b"GET / HTTP/1.1\r\nHost: app.test\r\nX-Folded: a\r\n b\r\n\r\n".to_vec(),
            400,
        ),
        (
            "more than 256 header fields",
            format!("GET / HTTP/1.1\r\nHost: app.test\r\n{many_fields}\r\n").into_bytes(),
            400,
        ),
        (
            "a header over 1 MiB",
            format!("GET / HTTP/1.1\r\nHost: app.test\r\nX-Big: {huge_field}\r\n\r\n").into_bytes(),
            400,
        ),
        (
            "CONNECT",
            b"CONNECT app.test:443 HTTP/1.1\r\nHost: app.test:443\r\n\r\n".to_vec(),
            405,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pingora_refuses_are_answered_and_counted() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr)).await;
    let cases = refused();
    for (what, request, status) in &cases {
        let resp = exchange(t.listen, request).await.unwrap();
        assert_eq!(resp.status, *status, "{what}: {resp:?}");
        assert!(resp.body.is_empty(), "{what}: {resp:?}");
        assert!(resp.closes(), "{what}: {resp:?}");
    }
    let bad = cases.iter().filter(|c| c.2 == 400).count() as f64;
    t.wait_metric(
        "tollgate_requests_total{code=\"400\",origin=\"_unmatched\"}",
        bad,
    )
    .await;
    t.wait_metric(
        "tollgate_requests_total{code=\"405\",origin=\"_unmatched\"}",
        1.0,
    )
    .await;
    assert_eq!(up.requests(), 0, "a refused request reached the upstream");
    assert!(t
        .log_text()
        .contains("Pingora's HTTP parser refused a request from 127.0.0.1"));
}

/// `Transfer-Encoding: chunked` with a `Content-Length` is not refused: Pingora drops the
/// length, frames the body by the chunks (RFC 9112 §6.3) and closes the connection after
/// the response, so nothing can be smuggled behind it. It is counted under its origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_with_a_content_length_is_framed_by_the_chunks_and_closed() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr)).await;
    let request = b"POST / HTTP/1.1\r\nHost: app.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let resp = exchange(t.listen, request).await.unwrap();
    assert_eq!(resp.status, 200, "{resp:?}");
    assert!(resp.closes(), "{resp:?}");
    t.wait_metric("tollgate_requests_total{code=\"200\",origin=\"app\"}", 1.0)
        .await;
    assert_eq!(up.requests(), 1);
}
