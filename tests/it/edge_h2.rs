//! HTTP/2 to clients (issue 20, part B) against the real binary: curl's prior-knowledge
//! h2c, h2load over TLS and h2c against an origin with an inflight and a rate limit (each
//! rejection answers on its stream, every other stream completes, no connection error, the
//! inflight gauge back to 0), units given back when a stream is reset or its connection
//! dies (the `h2` crate as the client, holding requests at a real upstream), and rapid
//! reset: the abusive connection is closed before the origin sees more than the reset
//! budget, while another client is served.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::{certs, eventually, free_port, Tollgate, Upstream};
use tokio::net::TcpStream;

/// h2load's summary: (2xx, 4xx, 5xx, errored, succeeded+failed).
fn h2load(args: &[&str]) -> (u64, u64, u64, u64, u64, String) {
    let out = Command::new("h2load")
        .args(args)
        .output()
        .expect("h2load runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |line: &str, name: &str| -> u64 {
        line.split(',')
            .find_map(|part| part.trim().strip_suffix(name).map(str::trim))
            .and_then(|n| n.split_whitespace().last()?.parse().ok())
            .unwrap_or(u64::MAX)
    };
    let codes = text
        .lines()
        .find(|l| l.starts_with("status codes:"))
        .unwrap_or_default();
    let reqs = text
        .lines()
        .find(|l| l.starts_with("requests:"))
        .unwrap_or_default();
    (
        field(codes, "2xx"),
        field(codes, "4xx"),
        field(codes, "5xx"),
        field(reqs, "errored"),
        field(reqs, "done"),
        text,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2load_streams_get_their_own_rejections_over_tls_and_h2c() {
    let dir = tempfile::tempdir().unwrap();
    let cert = certs::write(dir.path(), "tls", "tls.test", &["tls.test"], 30);
    let (h2c, demo) = (free_port(), free_port());
    let limits = "    limits:\n      rate: { kind: rate, key: [host], max: 100, per: 1m }\n      inflight: { kind: inflight, key: [host], max: 15 }\n";
    let config = format!(
        "server:\n  listen: [{{ addr: \"{{listen}}\", tls: true }}, {{ addr: \"127.0.0.1:{h2c}\", h2c: true }}]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\n  demo_upstream: \"127.0.0.1:{demo}\"\ntls:\n  certificates:\n    - {{ cert: \"{}\", key: \"{}\" }}\norigins:\n  tls:\n    hosts: [\"tls.test\"]\n    upstreams: [\"127.0.0.1:{demo}\"]\n{limits}  h2c:\n    hosts: [\"h2c.test\"]\n    upstreams: [\"127.0.0.1:{demo}\"]\n{limits}",
        cert.cert.display(),
        cert.key.display()
    );
    let t = Tollgate::start(&config).await;
    eventually("the demo upstream and h2c listener accept", 250, || async {
        std::net::TcpStream::connect(("127.0.0.1", demo)).is_ok()
            && std::net::TcpStream::connect(("127.0.0.1", h2c)).is_ok()
    })
    .await;
    let tls_url = format!("https://tls.test:{}/?sleep=20ms", t.listen.port());
    let connect_to = format!("--connect-to=127.0.0.1:{}", t.listen.port());
    let h2c_url = format!("http://127.0.0.1:{h2c}/?sleep=20ms");
    for (name, args) in [
        ("tls", vec![tls_url.as_str(), connect_to.as_str()]),
        ("h2c", vec![h2c_url.as_str(), "-H", ":authority: h2c.test"]),
    ] {
        let mut all = vec!["-n", "600", "-c", "3", "-m", "10"];
        all.extend(args);
        let (ok, too_many, unavailable, errored, done, text) = h2load(&all);
        assert_eq!(errored, 0, "{name}: no stream or connection error: {text}");
        assert_eq!(done, 600, "{name}: every stream completes: {text}");
        assert_eq!(ok + too_many + unavailable, 600, "{name}: {text}");
        assert!(too_many > 0, "{name}: the rate limit answers 429: {text}");
        assert!(
            unavailable > 0,
            "{name}: the inflight limit answers 503: {text}"
        );
        assert!(ok > 0, "{name}: {text}");
        t.wait_metric(
            &format!("tollgate_inflight_requests{{origin=\"{name}\"}}"),
            0.0,
        )
        .await;
        let text = t.metrics_text().await;
        let rejected = |kind: &str, limit: &str| {
            common::sample(
                &text,
                &format!("tollgate_limit_decisions_total{{decision=\"rejected\",kind=\"{kind}\",limit=\"{limit}\",origin=\"{name}\"}}"),
            )
        };
        assert_eq!(rejected("rate", "rate"), too_many as f64, "{text}");
        assert_eq!(
            rejected("inflight", "inflight"),
            unavailable as f64,
            "{text}"
        );
    }
    // curl's prior-knowledge h2c, and HTTP/1.1 on the same listener.
    for (flag, version) in [("--http2-prior-knowledge", "2"), ("--http1.1", "1.1")] {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_version}", flag])
            .args(["-H", "host: h2c.test", "--max-time", "10"])
            .arg(format!("http://127.0.0.1:{h2c}/"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), version);
    }
}

/// An h2c client on `addr`: the request sender, with its connection driven on a task.
async fn h2_client(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client.ready().await.unwrap()
}

fn get(path: &str) -> http::Request<()> {
    http::Request::builder()
        .uri(format!("http://app.test{path}"))
        .body(())
        .unwrap()
}

fn h2c_config(up: SocketAddr, h2c: u16, server: &str) -> String {
    format!(
        "server:\n  listen: [\"{{listen}}\", {{ addr: \"127.0.0.1:{h2c}\", h2c: true }}]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\n{server}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{up}\"]\n    limits:\n      inflight: {{ kind: inflight, key: [host], max: 10 }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_stream_and_a_dead_connection_give_their_units_back() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let h2c = free_port();
    let t = Tollgate::start(&h2c_config(up.addr, h2c, "")).await;
    let addr: SocketAddr = format!("127.0.0.1:{h2c}").parse().unwrap();
    let gauge = "tollgate_inflight_requests{origin=\"app\"}";

    // RST_STREAM on one stream: its unit comes back, the connection and its other stream
    // carry on.
    let mut client = h2_client(addr).await;
    let (_kept, _) = client.send_request(get("/hold/kept"), true).unwrap();
    let mut client = client.ready().await.unwrap();
    let (_reset, mut reset_stream) = client.send_request(get("/hold/reset"), false).unwrap();
    eventually("both streams held at the upstream", 500, || async {
        up.held() == 2
    })
    .await;
    t.wait_metric(gauge, 2.0).await;
    reset_stream.send_reset(h2::Reason::CANCEL);
    t.wait_metric(gauge, 1.0).await;
    let mut client = client.ready().await.unwrap();
    let (ok, _) = client.send_request(get("/"), true).unwrap();
    assert_eq!(
        ok.await.unwrap().status(),
        200,
        "the connection still serves"
    );

    // The connection dies with a stream held: its unit comes back.
    drop(client);
    drop(_kept);
    t.wait_metric(gauge, 0.0).await;
    up.release();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_closes_the_connection_and_spares_the_origin() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let h2c = free_port();
    let t = Tollgate::start(&h2c_config(up.addr, h2c, "  h2_max_resets: 50\n")).await;
    let addr: SocketAddr = format!("127.0.0.1:{h2c}").parse().unwrap();
    let mut attacker = h2_client(addr).await;
    let mut sent = 0u32;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Open and reset streams in a loop until the connection is cut (bounded: 10 s, 100 000
    // streams).
    let closed = loop {
        if tokio::time::Instant::now() > deadline || sent > 100_000 {
            break false;
        }
        attacker = match attacker.ready().await {
            Ok(c) => c,
            Err(_) => break true,
        };
        match attacker.send_request(get("/hold/attack"), false) {
            Ok((_, mut stream)) => {
                stream.send_reset(h2::Reason::CANCEL);
                sent += 1;
            }
            Err(_) => break true,
        }
        tokio::task::yield_now().await;
    };
    assert!(
        closed,
        "the attacker's connection was closed ({sent} streams reset)"
    );
    t.wait_metric("tollgate_h2_reset_closes_total", 1.0).await;
    // The origin saw at most the budget's worth of the attack (plus the streams in flight
    // when the budget ran out), not the loop's.
    assert!(
        up.requests() <= 50 + 100,
        "origin requests {} for {sent} resets",
        up.requests()
    );
    // A normal client, meanwhile and after, is served.
    let mut normal = h2_client(addr).await;
    let (resp, _) = normal.send_request(get("/"), true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 200);
    t.wait_metric("tollgate_inflight_requests{origin=\"app\"}", 0.0)
        .await;
}
