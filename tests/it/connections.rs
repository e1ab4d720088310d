//! Hardening item 2: slow and idle clients cannot deny service. The whole request header
//! has a deadline (`server.header_timeout`), idle keep-alive connections are closed
//! (`server.keepalive_timeout`), and open connections are capped in total
//! (`server.max_connections`, derived from the open-file limit by default) and per client
//! IP (`server.max_connections_per_ip`). Each test plays the attack against the real
//! binary, on loopback, bounded in count and time.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use common::raw::{closed_within, connect_from, exchange, get, read_response};
use common::{eventually, Tollgate, Upstream, SERVER};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

fn config(up: SocketAddr, server: &str) -> String {
    format!(
        "{SERVER}{server}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{up}\"]\n"
    )
}

/// Lowers the spawned tollgate's open-file limit (soft and hard) to `n`.
fn limit_open_files(cmd: &mut Command, n: u64) {
    // SAFETY: setrlimit(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

const HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: app.test\r\n";

/// A slowloris client: the start of a request, then a header line every 200 ms, never the
/// blank line that ends the header. `true` when tollgate closed the connection within
/// `bound`, `false` when it was still open then (or never opened).
async fn trickle(addr: SocketAddr, source: IpAddr, bound: Duration) -> bool {
    let Ok(mut s) = connect_from(source, addr).await else {
        return false;
    };
    if s.write_all(HEAD).await.is_err() {
        return true;
    }
    let lines = bound.as_millis() / 200;
    for i in 0..lines {
        if closed_within(&mut s, Duration::from_millis(200)).await {
            return true;
        }
        if s.write_all(format!("X-Trickle-{i}: 1\r\n").as_bytes())
            .await
            .is_err()
        {
            return true;
        }
    }
    false
}

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
const OTHER_CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_header_is_cut_off_at_the_deadline() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, "  header_timeout: 1s\n")).await;
    // A byte every 200 ms never lets a per-read timeout fire; only a total deadline can.
    let cut = trickle(t.listen, LOOPBACK, Duration::from_secs(20)).await;
    assert!(cut, "a header trickled for 20 s kept its connection open");
    t.wait_metric(
        "tollgate_connection_timeouts_total{timeout=\"header\"}",
        1.0,
    )
    .await;
    assert!(t
        .log_text()
        .contains("request header not complete within 1s"));
    // A client that sends its header at once is not affected.
    let resp = exchange(t.listen, &get("app.test", "/")).await.unwrap();
    assert_eq!(resp.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keepalive_connection_is_closed() {
    let up = Upstream::start("127.0.0.1", "up").await;
    // 3 s: room for a loaded machine to send the next request 300 ms after a response.
    let t = Tollgate::start(&config(up.addr, "  keepalive_timeout: 3s\n")).await;
    let mut s = BufReader::new(TcpStream::connect(t.listen).await.unwrap());
    // Reused within the timeout: kept alive.
    for _ in 0..3 {
        s.get_mut().write_all(&get("app.test", "/")).await.unwrap();
        let resp = read_response(&mut s).await.unwrap();
        assert_eq!(resp.status, 200);
        assert!(!resp.closes(), "{resp:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        closed_within(&mut s, Duration::from_secs(20)).await,
        "an idle keep-alive connection stayed open 20 s past its 3 s timeout"
    );
    t.wait_metric(
        "tollgate_connection_timeouts_total{timeout=\"keepalive\"}",
        1.0,
    )
    .await;
    assert_eq!(up.requests(), 3);
}

/// The idle timeout counts from the start of each wait, not from the connection's first:
/// one timer serves many requests (`proxy::idle`), and a connection busy for longer than
/// its timeout, never idle for that long, stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_keepalive_connection_outlives_its_timeout() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, "  keepalive_timeout: 2s\n")).await;
    let mut s = BufReader::new(TcpStream::connect(t.listen).await.unwrap());
    let began = std::time::Instant::now();
    let mut sent = 0;
    // Requests 250 ms apart until well past the timeout (a wait of 2 s would close it).
    while began.elapsed() < Duration::from_millis(4_500) {
        s.get_mut().write_all(&get("app.test", "/")).await.unwrap();
        let resp = read_response(&mut s).await.unwrap();
        assert_eq!(resp.status, 200, "request {sent}");
        assert!(!resp.closes(), "{resp:?}");
        sent += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(up.requests(), sent);
    let series = "tollgate_connection_timeouts_total{timeout=\"keepalive\"}";
    assert_eq!(t.metric(series).await, 0.0);
    // Then idle: closed.
    assert!(closed_within(&mut s, Duration::from_secs(20)).await);
    t.wait_metric(series, 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_timeout_zero_closes_after_each_response() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, "  keepalive_timeout: 0s\n")).await;
    let mut s = BufReader::new(TcpStream::connect(t.listen).await.unwrap());
    s.get_mut().write_all(&get("app.test", "/")).await.unwrap();
    let resp = read_response(&mut s).await.unwrap();
    assert_eq!(resp.status, 200);
    assert!(resp.closes(), "{resp:?}");
    assert!(closed_within(&mut s, Duration::from_secs(20)).await);
}

/// The adversarial run's pattern: more trickling connections than the process has file
/// descriptors. With the defaults, the cap derived from a 128-descriptor limit (21) keeps
/// descriptors for proxying, the slow connections are cut at the header deadline, and a
/// normal client queued behind them in the listen backlog is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_clients_cannot_exhaust_file_descriptors() {
    const SLOW: usize = 120;
    const NORMAL: usize = 10;
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start_with(&config(up.addr, "  header_timeout: 1s\n"), |cmd| {
        limit_open_files(cmd, 128)
    })
    .await;
    assert!(
        t.log_text().contains("at most 21 connections"),
        "{}",
        t.log_text()
    );
    let slow: Vec<_> = (0..SLOW)
        .map(|_| tokio::spawn(trickle(t.listen, OTHER_CLIENT, Duration::from_secs(30))))
        .collect();
    eventually("the cap is reached", 500, || async {
        t.log_text().contains("connection limit reached")
    })
    .await;
    let mut served = 0;
    // Reported, not asserted: how long the slowest normal client waited.
    let mut slowest = Duration::ZERO;
    for _ in 0..NORMAL {
        let request = get("app.test", "/");
        let call = exchange(t.listen, &request);
        let began = std::time::Instant::now();
        if let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(15), call).await {
            served += usize::from(resp.status == 200);
        }
        slowest = slowest.max(began.elapsed());
    }
    let mut cut = 0;
    for s in slow {
        cut += usize::from(s.await.unwrap());
    }
    eprintln!(
        "{served}/{NORMAL} normal requests served (slowest waited {slowest:.2?}); {cut}/{SLOW} slow connections cut by tollgate"
    );
    assert_eq!(served, NORMAL, "normal clients were starved");
    assert_eq!(cut, SLOW, "slow connections outlived the header deadline");
    let text = t.metrics_text().await;
    let limited = common::sample(
        &text,
        "tollgate_connections_limited_total{limit=\"max_connections\"}",
    );
    assert!(limited >= 1.0, "{text}");
    assert!(
        !t.log_text().contains("Too many open files"),
        "{}",
        t.log_text()
    );
}

/// One address cannot take every slot: above `max_connections_per_ip` its connections are
/// closed at once, and other clients are served while it holds its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_ip_cap_keeps_one_address_from_taking_every_slot() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let server = "  header_timeout: 10s\n  max_connections: 20\n  max_connections_per_ip: 5\n";
    let t = Tollgate::start(&config(up.addr, server)).await;
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..30 {
        let mut s = connect_from(OTHER_CLIENT, t.listen).await.unwrap();
        if closed_within(&mut s, Duration::from_millis(300)).await {
            refused += 1;
        } else {
            held.push(s);
        }
    }
    assert_eq!((held.len(), refused), (5, 25));
    t.wait_metric(
        "tollgate_connections_limited_total{limit=\"max_connections_per_ip\"}",
        25.0,
    )
    .await;
    t.wait_metric("tollgate_connections_open", 5.0).await;
    for _ in 0..10 {
        let request = get("app.test", "/");
        let call = exchange(t.listen, &request);
        let resp = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("served while another address holds its share")
            .unwrap();
        assert_eq!(resp.status, 200);
    }
    assert!(t.log_text().contains("server.max_connections_per_ip = 5"));
    drop(held);
    t.wait_metric("tollgate_connections_open", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_bounds_apply_on_reload() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, "  keepalive_timeout: 1h\n")).await;
    t.write_config(&config(up.addr, "  keepalive_timeout: 1s\n"));
    t.wait_metric("tollgate_config_reloads_total{result=\"success\"}", 1.0)
        .await;
    assert!(!t.log_text().contains("cannot be applied live"));
    let mut s = BufReader::new(TcpStream::connect(t.listen).await.unwrap());
    s.get_mut().write_all(&get("app.test", "/")).await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().status, 200);
    assert!(closed_within(&mut s, Duration::from_secs(20)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_above_the_open_file_limit_is_warned_about() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start_with(&config(up.addr, "  max_connections: 1000\n"), |cmd| {
        limit_open_files(cmd, 256)
    })
    .await;
    let log = t.log_text();
    assert!(
        log.contains("server.max_connections is 1000, but the open-file limit carries about 64"),
        "{log}"
    );
}

/// A cap must not become a new way to deny service: connections that only wait for a
/// request (silent new ones, idle kept-alive ones) give their slots up when it is reached,
/// however long their timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_give_their_slots_up_at_the_cap() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let server = "  header_timeout: 1h\n  keepalive_timeout: 1h\n  max_connections: 4\n";
    let t = Tollgate::start(&config(up.addr, server)).await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut s = BufReader::new(connect_from(OTHER_CLIENT, t.listen).await.unwrap());
        s.get_mut().write_all(&get("app.test", "/")).await.unwrap();
        assert_eq!(read_response(&mut s).await.unwrap().status, 200);
        idle.push(s);
    }
    for _ in 0..2 {
        idle.push(BufReader::new(
            connect_from(OTHER_CLIENT, t.listen).await.unwrap(),
        ));
    }
    t.wait_metric("tollgate_connections_open", 4.0).await;
    let request = get("app.test", "/");
    let resp = tokio::time::timeout(Duration::from_secs(20), exchange(t.listen, &request))
        .await
        .expect("served although idle connections held every slot")
        .unwrap();
    assert_eq!(resp.status, 200);
    for s in &mut idle {
        assert!(closed_within(s, Duration::from_secs(20)).await);
    }
    eventually("the cap is logged", 250, || async {
        t.log_text().contains("connection limit reached")
    })
    .await;
}

/// Established TCP connections whose local port is one of `ports` (the upstreams' side of
/// tollgate's upstream connections), from `/proc/net/tcp`.
fn established_to(ports: &[u16]) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            fields[3] == "01" && port.is_some_and(|p| ports.contains(&p))
        })
        .count()
}

/// Pingora's idle upstream pool holds `upstream_keepalive_pool_size` × `threads`
/// connections (the README said 128 where about 250 stayed with two threads). With the
/// open-file limit at 256 the derived cap is 64 connections, which the descriptor budget
/// counts with one idle pooled connection each: 64 idle upstream connections in all, not
/// 64 a thread. Two upstreams fill the pool in turn, 60 connections each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_upstream_pool_stays_within_the_connection_budget() {
    let (a, b) = (
        Upstream::start("127.0.0.1", "a").await,
        Upstream::start("127.0.0.1", "b").await,
    );
    let text = format!(
        "{SERVER}  threads: 2\norigins:\n  a:\n    hosts: [\"a.test\"]\n    upstreams: [\"{}\"]\n  b:\n    hosts: [\"b.test\"]\n    upstreams: [\"{}\"]\n",
        a.addr, b.addr
    );
    let t = Tollgate::start_with(&text, |cmd| limit_open_files(cmd, 256)).await;
    let ports = [a.addr.port(), b.addr.port()];
    let http = common::client();
    for (up, host) in [(&a, "a.test"), (&b, "b.test")] {
        let held: Vec<_> = (0..60)
            .map(|_| {
                let req = http.get(t.url("/hold")).header("host", host);
                tokio::spawn(req.send())
            })
            .collect();
        eventually("60 requests held upstream", 1_500, || async {
            up.held() == 60
        })
        .await;
        up.release();
        for h in held {
            assert_eq!(h.await.unwrap().unwrap().status(), 200);
        }
    }
    // b's connections went back to the pool (more than one thread's share: pooling works;
    // a loaded machine closes a few), and the pool evicted a's down to the budget.
    let mut seen = Vec::new();
    for _ in 0..common::MIN_TRIES {
        let open = established_to(&ports);
        if seen.last() != Some(&open) {
            seen.push(open);
        }
        if (33..=64).contains(&open) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("idle upstream connections never within 33..=64: {seen:?}");
}
