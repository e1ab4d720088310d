//! Hardening item 8: log lines that clients cause are not errors and cannot flood the log.
//! A client that aborts while its request is proxied, or while it is still sending its
//! header, costs at most a few `info` lines a second, and the next line let through says
//! how many were left out; nothing is logged at `ERROR`.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{eventually, Tollgate, Upstream, SERVER};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const FLOOD: usize = 40;

fn config(up: SocketAddr) -> String {
    format!("{SERVER}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{up}\"]\n")
}

/// Opens `n` connections and sends `bytes` on each; the caller drops them to abort.
async fn send_all(addr: SocketAddr, n: usize, bytes: &[u8]) -> Vec<TcpStream> {
    let mut conns = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(bytes).await.unwrap();
        conns.push(s);
    }
    conns
}

/// The second of the day a log line was written at (`[2026-01-01T12:34:56Z LEVEL ...`).
fn second_of(line: &str) -> Option<u32> {
    let time = line.get(12..20)?;
    let mut parts = time.split(':').map(|p| p.parse::<u32>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    Some(h * 3_600 + m * 60 + s)
}

fn lines_with<'a>(log: &'a str, needle: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(needle)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_aborts_are_info_lines_within_a_budget() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr)).await;
    let held = b"GET /hold HTTP/1.1\r\nHost: app.test\r\n\r\n";
    let partial = b"GET / HTTP/1.1\r\nHost: app.te";

    // A flood of aborts of each kind: mid-proxy (the upstream holds the request) and
    // mid-header.
    let proxied = send_all(t.listen, FLOOD, held).await;
    eventually("the upstream holds every request", 500, || async {
        up.held() == FLOOD
    })
    .await;
    drop(proxied);
    let headers = send_all(t.listen, FLOOD, partial).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(headers);
    eventually("every proxied request was abandoned", 500, || async {
        up.held() == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // One more of each in a later second: its line reports what was left out.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let late = send_all(t.listen, 1, held).await;
    eventually("the upstream holds the late request", 500, || async {
        up.held() == 1
    })
    .await;
    drop(late);
    drop(send_all(t.listen, 1, partial).await);
    eventually("the late aborts are logged", 500, || async {
        lines_with(&t.log_text(), "similar lines suppressed").len() >= 2
    })
    .await;

    let log = t.log_text();
    let errors = lines_with(&log, " ERROR ");
    assert!(
        errors.is_empty(),
        "client aborts logged as errors:\n{}",
        errors.join("\n")
    );
    let mid_proxy = lines_with(&log, "request failed (client)");
    let mid_header = lines_with(&log, "Fail to proxy");
    eprintln!(
        "{} aborts mid-proxy and {} mid-header wrote {} and {} lines",
        FLOOD + 1,
        FLOOD + 1,
        mid_proxy.len(),
        mid_header.len()
    );
    for lines in [&mid_proxy, &mid_header] {
        assert!(!lines.is_empty(), "{log}");
        // Five a budget second (on tollgate's own clock, not aligned with the log's wall
        // seconds: `k` wall seconds overlap at most `k + 1` of them). A loaded machine may
        // spread the flood over more seconds than a quiet one, so the bound follows the
        // seconds the lines span.
        let seconds: Vec<u32> = lines.iter().filter_map(|l| second_of(l)).collect();
        let span = seconds.iter().max().unwrap() - seconds.iter().min().unwrap() + 1;
        assert!(
            lines.len() <= 5 * (span as usize + 1),
            "{} lines over {span} s:\n{}",
            lines.len(),
            lines.join("\n")
        );
        assert!(
            lines.iter().all(|l| l.contains(" INFO ")),
            "{}",
            lines.join("\n")
        );
        assert!(
            lines.last().unwrap().contains("similar lines suppressed"),
            "{}",
            lines.join("\n")
        );
    }
}

/// A client can make every request fail upstream (an origin whose server is down): each
/// failure (and each attempt Pingora retries) is a warning, not tollgate's error, and
/// there are a few a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_upstream_costs_a_few_warnings_a_second() {
    const REQUESTS: usize = 30;
    // Nothing listens on 127.0.0.3 (other tests bind 127.0.0.1 only): connect is refused.
    let dead = common::free_port();
    let t = Tollgate::start(&format!(
        "{SERVER}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"127.0.0.3:{dead}\"]\n"
    ))
    .await;
    for _ in 0..REQUESTS {
        let resp = common::raw::exchange(t.listen, &common::raw::get("app.test", "/"))
            .await
            .unwrap();
        assert_eq!(resp.status, 502);
    }
    t.wait_metric(
        "tollgate_requests_total{code=\"502\",origin=\"app\"}",
        REQUESTS as f64,
    )
    .await;
    let log = t.log_text();
    let retries = lines_with(&log, "retrying");
    let failures = lines_with(&log, "request failed (upstream)");
    eprintln!(
        "{REQUESTS} requests to a dead upstream wrote {} retry and {} failure lines",
        retries.len(),
        failures.len()
    );
    assert!(lines_with(&log, " ERROR ").is_empty(), "{log}");
    assert!(!failures.is_empty(), "{log}");
    for lines in [&retries, &failures] {
        assert!(lines.len() <= 15, "{}", lines.join("\n"));
        assert!(
            lines.iter().all(|l| l.contains(" WARN ")),
            "{}",
            lines.join("\n")
        );
    }
}
