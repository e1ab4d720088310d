//! The limiter API served by the real binary beside the proxy: `redis-cli` talks to
//! `server.limiter_api` and gets `RL.REDUCE`'s answers, SIGTERM closes it with the rest,
//! and hostile clients (a 512 MB announcement, a pipeline never read) are refused and
//! closed while the API and the proxy go on serving.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::api;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use api::{flood_without_reading, read_to_close, rss_kib_of};
use common::{free_port, Tollgate, Upstream, SERVER};

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (Debian's redis-tools; make test installs it)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A tollgate with the limiter API on, proxying `app.test` to `up`: the process and the
/// API's port, once it accepts.
async fn start(up: &Upstream) -> (Tollgate, u16) {
    let api = free_port();
    let config = format!(
        "{SERVER}  limiter_api: \"127.0.0.1:{api}\"\napi:\n  max_keys: 1000\norigins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"{}\"]\n",
        up.addr
    );
    let t = Tollgate::start(&config).await;
    common::eventually("the limiter API answers", 250, || async {
        TcpStream::connect(("127.0.0.1", api)).is_ok()
    })
    .await;
    (t, api)
}

/// Connects to the API with 10 s read and write timeouts.
fn connect(api: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", api)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// The proxy beside the API answers `GET /` with 200.
async fn assert_proxy_serves(t: &Tollgate) {
    let resp = common::client()
        .get(t.url("/"))
        .header("host", "app.test")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// `PING` on a new connection answers `+PONG`.
fn ping(api: u16) -> Vec<u8> {
    let mut s = connect(api);
    s.write_all(b"PING\r\n").unwrap();
    let mut got = vec![0u8; 7];
    s.read_exact(&mut got).unwrap();
    got
}

/// The timer of the established sockets whose local port is `port` in `/proc/net/tcp`:
/// `(kind, seconds until it fires)` each, kind 2 being the keepalive timer.
fn server_side_timers(port: u16) -> Vec<(u8, f64)> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            if local_port != port || *f.get(3)? != "01" {
                return None;
            }
            let (kind, when) = f.get(5)?.split_once(':')?;
            let when = u64::from_str_radix(when, 16).ok()? as f64 / ticks;
            Some((u8::from_str_radix(kind, 16).ok()?, when))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_are_closed_and_the_binary_goes_on_serving() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let (t, api) = start(&up).await;
    let pid = t.child.id();
    tokio::task::spawn_blocking(move || {
        assert_eq!(ping(api), b"+PONG\r\n");
        let before = rss_kib_of(pid);

        // A 512 MB bulk announced: refused before any payload is read, and closed.
        let mut s = connect(api);
        s.write_all(b"*1\r\n$536870912\r\n").unwrap();
        let payload = vec![b'a'; 1 << 20];
        for _ in 0..4 {
            if s.write_all(&payload).is_err() {
                break;
            }
        }
        let (got, closed) = read_to_close(&mut s);
        assert_eq!(
            String::from_utf8_lossy(&got),
            "-ERR Protocol error: bulk length 536870912 exceeds the limit of 65536 bytes\r\n"
        );
        assert!(closed, "closed after the framing error");

        // A client that pipelines commands and never reads: its replies pile up to the
        // output bound, then the connection is closed (the writes fail), not buffered on.
        let error = flood_without_reading(&mut connect(api));
        assert!(
            matches!(
                error.kind(),
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
            ),
            "the server closed the connection, not a timeout: {error:?}"
        );
        let grown = rss_kib_of(pid).saturating_sub(before);
        assert!(
            grown < 64 * 1024,
            "the binary's resident memory grew by {grown} KiB"
        );

        // A fresh connection is served, and its socket carries the keepalive timer
        // (first probe 60 s after the last exchange).
        let mut s = connect(api);
        s.write_all(b"PING\r\n").unwrap();
        let mut got = vec![0u8; 7];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, b"+PONG\r\n");
        let timers = server_side_timers(api);
        assert!(
            timers
                .iter()
                .any(|&(kind, when)| kind == 2 && when > 50.0 && when <= 60.0),
            "no keepalive timer on the API's accepted socket: {timers:?}"
        );
    })
    .await
    .unwrap();
    // The proxy beside it still serves.
    assert_proxy_serves(&t).await;
    let metrics = t.metrics_text().await;
    assert!(
        metrics.contains("tollgate_api_commands_total{command=\"ping\",result=\"ok\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_reduces_a_bucket_through_the_real_binary() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let (mut t, api) = start(&up).await;
    let replies: Vec<String> = (0..3)
        .map(|_| redis_cli(api, &["RL.REDUCE", "TwoPerMin", "2", "60"]))
        .collect();
    assert_eq!(replies, ["2", "1", "0"]);
    assert_eq!(redis_cli(api, &["PING"]), "PONG");
    let metrics = t.metrics_text().await;
    assert!(
        metrics.contains("tollgate_api_commands_total{command=\"rl.reduce\",result=\"ok\"} 2"),
        "{metrics}"
    );
    // The proxy beside it is unaffected.
    assert_proxy_serves(&t).await;
    t.signal(libc::SIGTERM);
    let status = tokio::task::block_in_place(|| t.child.wait()).unwrap();
    assert!(status.success() || status.code().is_some(), "{status:?}");
    assert!(TcpStream::connect(("127.0.0.1", api)).is_err());
}
