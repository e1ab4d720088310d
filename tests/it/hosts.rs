//! Host edge cases through the real proxy: malformed hosts are 400, a trailing dot and an
//! IPv6 literal reach their origin, and a cost header may appear only once.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Tollgate, Upstream, SERVER};

/// Sends one raw request and returns the status code of the response.
fn raw_status(t: &Tollgate, request: &str) -> u16 {
    let mut s = TcpStream::connect(t.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn get(t: &Tollgate, host: &str, extra: &str) -> u16 {
    raw_status(
        t,
        &format!("GET / HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_edge_cases() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let config = format!(
        r#"
{SERVER}origins:
  app:
    hosts: ["app.test", "[2001:db8::1]"]
    upstreams: ["{}"]
    limits:
      tokens:
        kind: token_bucket
        key: [client_ip]
        capacity: 10
        refill: {{ amount: 1, every: 1h }}
        cost: header:x-cost
"#,
        up.addr
    );
    let t = Tollgate::start(&config).await;
    let cases = [
        ("app.test", 200),
        ("APP.test.", 200),
        ("app.test.:8080", 200),
        ("[2001:DB8:0::1]:80", 200),
        ("app.test:abc", 400),
        ("[::1", 400),
        ("::1", 400),
        ("other.test", 404),
    ];
    for (host, want) in cases {
        let got = tokio::task::block_in_place(|| get(&t, host, ""));
        assert_eq!(got, want, "Host: {host}");
    }
    // A cost given twice is refused, not charged once and forwarded twice.
    let twice = tokio::task::block_in_place(|| get(&t, "app.test", "X-Cost: 1\r\nX-Cost: 9\r\n"));
    assert_eq!(twice, 400);
    // Four cost-1 requests so far: six tokens left.
    let once = tokio::task::block_in_place(|| get(&t, "app.test", "X-Cost: 6\r\n"));
    assert_eq!(once, 200);
    assert_eq!(up.requests(), 5);
}
