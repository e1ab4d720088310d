//! The limiter API against hostile and broken clients: every case gets an error reply or
//! a clean close, and none crashes the process or makes it hold unbounded memory.
//!
//! The tests take a lock so that they run one at a time: some measure this process's
//! resident memory, which parallel tests would blur.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "it/common/api.rs"]
mod api;

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use api::{
    exchange, exchange_until, flood_without_reading, read_at_least, read_to_close, rss_kib,
    ApiServer,
};
use tollgate::api::{ApiApp, ApiConfig, ApiService};
use tollgate::metrics::Metrics;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits (bounded) until the server has counted every connection closed.
fn all_closed(server: &ApiServer) {
    for _ in 0..1_500 {
        if server.service.connections() == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.service.connections(), 0, "connections left open");
}

/// A PING on a new connection answers: the server is alive.
fn alive(server: &ApiServer) {
    let mut s = server.raw();
    assert_eq!(exchange(&mut s, b"PING\r\n", 7), b"+PONG\r\n");
}

#[test]
fn bad_arguments_get_error_replies_and_the_connection_stays() {
    let _serial = serial();
    let server = ApiServer::start();
    let mut s = server.raw();
    let cases: [(&[u8], &str); 6] = [
        (b"RL.REDUCE k\r\n", "-ERR wrong number of arguments for 'rl.reduce' command\r\n"),
        (b"RL.REDUCE k x 60\r\n", "-ERR invalid 'max': expected an integer from 1 to 9223372036854775807, got 'x'\r\n"),
        (b"RL.REDUCE k -5 60\r\n", "-ERR invalid 'max': expected an integer from 1 to 9223372036854775807, got '-5'\r\n"),
        (b"RL.REDUCE k 1180591620717411303424 60\r\n", "-ERR invalid 'max': expected an integer from 1 to 9223372036854775807, got '1180591620717411303424'\r\n"),
        (b"*4\r\n$6\r\nRL.GET\r\n$1\r\nk\r\n$1\r\n2\r\n$3\r\n6\r0\r\n", "-ERR invalid 'refill_seconds': expected an integer from 1 to 18446744073, got '6 0'\r\n"),
        (b"RL.REDUCE k 2 60 TAKE 99999999999999999999999\r\n", "-ERR invalid 'TAKE': expected an integer from 0 to 9223372036854775807, got '99999999999999999999999'\r\n"),
    ];
    for (request, want) in cases {
        let got = exchange(&mut s, request, want.len());
        assert_eq!(String::from_utf8_lossy(&got), want);
    }
    assert_eq!(exchange(&mut s, b"RL.REDUCE k 2 60\r\n", 4), b":2\r\n");
}

#[test]
fn a_512_mb_bulk_announcement_is_refused_before_any_allocation() {
    let _serial = serial();
    let server = ApiServer::start();
    alive(&server);
    let before = rss_kib();
    let mut s = server.raw();
    s.write_all(b"*2\r\n$4\r\nECHO\r\n$536870912\r\n").unwrap();
    // Whatever payload follows (here 4 MB of it) is never buffered.
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
    assert!(closed, "the connection is closed after a framing error");
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 32 * 1024, "resident memory grew by {grown} KiB");

    // So are an absurd argument count and a deep nesting.
    let mut s = server.raw();
    let got = exchange(&mut s, b"*2147483647\r\n", 1 << 20);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR Protocol error: 2147483647 arguments exceed the limit of 1024\r\n"
    );
    let mut s = server.raw();
    let nested = b"*1\r\n".repeat(100_000);
    let _ = s.write_all(&nested);
    let (got, closed) = read_to_close(&mut s);
    assert_eq!(got, b"-ERR Protocol error: expected '$', got '*'\r\n");
    assert!(closed);
    alive(&server);
}

#[test]
fn a_command_split_byte_by_byte_is_answered() {
    let _serial = serial();
    let server = ApiServer::start();
    let mut s = server.raw();
    s.set_nodelay(true).unwrap();
    let request =
        b"*4\r\n$9\r\nRL.REDUCE\r\n$5\r\nbytes\r\n$1\r\n3\r\n$2\r\n60\r\nRL.REDUCE bytes 3 60\r\n";
    for &b in request.iter() {
        s.write_all(&[b]).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(read_at_least(&mut s, 8), b":3\r\n:2\r\n");
}

#[test]
fn ten_thousand_pipelined_commands_are_answered_in_order() {
    let _serial = serial();
    let server = ApiServer::start();
    let mut s = server.raw();
    let n = 10_000;
    let mut request = Vec::new();
    for i in 0..n {
        if i % 2 == 0 {
            request.extend_from_slice(b"RL.REDUCE pipe 10000 60 AT 1700000000\r\n");
        } else {
            request.extend_from_slice(
                format!("*2\r\n$4\r\nECHO\r\n${}\r\n{i}\r\n", i.to_string().len()).as_bytes(),
            );
        }
    }
    // Everything is written before anything is read, as client libraries do.
    let mut want = Vec::new();
    for i in 0..n {
        if i % 2 == 0 {
            want.extend_from_slice(format!(":{}\r\n", 10_000 - i / 2).as_bytes());
        } else {
            want.extend_from_slice(format!("${}\r\n{i}\r\n", i.to_string().len()).as_bytes());
        }
    }
    let got = exchange(&mut s, &request, want.len());
    assert_eq!(got.len(), want.len());
    assert!(got == want, "replies out of order");
    let metrics = server.scrape();
    assert!(
        metrics.contains("tollgate_api_commands_total{command=\"echo\",result=\"ok\"} 5000"),
        "{metrics}"
    );
}

#[test]
fn a_client_that_never_reads_is_closed_at_the_output_bound() {
    let _serial = serial();
    let server = ApiServer::start();
    let before = rss_kib();
    let mut s = server.raw();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    // COMMAND replies several KiB for 9 bytes: the output bound is reached quickly.
    let error = flood_without_reading(&mut s);
    assert!(
        matches!(
            error.kind(),
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
        ),
        "the server closed the connection, not a timeout: {error:?}"
    );
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "resident memory grew by {grown} KiB");
    alive(&server);
    all_closed(&server);
}

#[test]
fn five_thousand_idle_connections_are_held_cheaply() {
    let _serial = serial();
    // Each connection is two descriptors in this process (client and server side).
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    assert!(
        limit.rlim_max >= 10_500,
        "RLIMIT_NOFILE hard limit {}",
        limit.rlim_max
    );
    limit.rlim_cur = limit.rlim_max;
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);

    let server = ApiServer::start();
    alive(&server);
    let before = rss_kib();
    // From 25 threads: on a loaded machine a SYN is now and then retried after 1 s, and
    // parallel connects overlap those waits.
    let addr = server.addr;
    let mut idle: Vec<TcpStream> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..25)
            .map(|_| {
                scope.spawn(move || {
                    (0..200)
                        .map(|_| TcpStream::connect(addr).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    assert_eq!(idle.len(), 5_000);
    // One in ten has sent a command and keeps its buffers.
    for s in idle.iter_mut().step_by(10) {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(exchange(s, b"RL.REDUCE idle 9 60\r\n", 4).len(), 4);
    }
    let mut s = server.raw();
    let got = exchange_until(&mut s, b"INFO clients\r\n", b"maxclients:10000\r\n\r\n");
    assert!(
        String::from_utf8_lossy(&got).contains("connected_clients:5001\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let grown = rss_kib().saturating_sub(before);
    eprintln!("5,000 idle connections: resident memory +{grown} KiB");
    // About 10 KiB per connection, both ends included; far under 64 MB.
    assert!(grown < 64 * 1024, "5,000 idle connections took {grown} KiB");
    drop(idle);
    drop(s);
    all_closed(&server);
    assert!(server.scrape().contains("tollgate_api_connections 0"));
}

#[test]
fn connections_beyond_the_cap_are_refused_with_an_error() {
    let _serial = serial();
    let server = ApiServer::with(ApiConfig {
        max_connections: 2,
        ..ApiConfig::default()
    });
    let mut a = server.raw();
    let mut b = server.raw();
    assert_eq!(exchange(&mut a, b"PING\r\n", 7), b"+PONG\r\n");
    assert_eq!(exchange(&mut b, b"PING\r\n", 7), b"+PONG\r\n");
    let mut c = server.raw();
    let (got, closed) = read_to_close(&mut c);
    assert_eq!(got, b"-ERR max number of clients reached\r\n");
    assert!(closed);
    drop(a);
    // A freed slot is taken again.
    let mut ok = false;
    for _ in 0..1_500 {
        let mut d = server.raw();
        if exchange(&mut d, b"PING\r\n", 7) == b"+PONG\r\n" {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ok, "a slot freed by a closed connection is reused");
}

#[test]
fn idle_connections_are_closed_after_the_timeout() {
    let _serial = serial();
    let server = ApiServer::with(ApiConfig {
        idle_timeout: Duration::from_millis(200),
        ..ApiConfig::default()
    });
    let mut s = server.raw();
    assert_eq!(exchange(&mut s, b"PING\r\n", 7), b"+PONG\r\n");
    // A command half sent does not keep the connection either.
    s.write_all(b"*2\r\n$4\r\nECHO\r\n$5\r\nab").unwrap();
    let (got, closed) = read_to_close(&mut s);
    assert!(got.is_empty() && closed, "{got:?} {closed}");
}

#[test]
fn shutdown_finishes_commands_flushes_and_closes() {
    let _serial = serial();
    let mut server = ApiServer::start();
    let mut s = server.raw();
    let request = b"RL.REDUCE sd 1000 60\r\n".repeat(500);
    s.write_all(&request).unwrap();
    let mut got = read_at_least(&mut s, 7);
    assert!(got.starts_with(b":1000\r\n"), "{got:?}");
    server.shutdown();
    let (rest, closed) = read_to_close(&mut s);
    assert!(closed, "the connection is closed at shutdown");
    // Every reply that left is whole and in order: no command was cut half-way.
    got.extend_from_slice(&rest);
    let text = String::from_utf8(got).unwrap();
    assert!(text.ends_with("\r\n"), "{text:?}");
    for (i, reply) in text.split_terminator("\r\n").enumerate() {
        assert_eq!(reply, format!(":{}", 1000 - i));
    }
    assert!(
        TcpStream::connect(server.addr).is_err(),
        "no longer accepting"
    );
}

#[test]
fn the_pingora_app_serves_a_connection_and_ends_it_on_shutdown() {
    use pingora::apps::ServerApp;
    let _serial = serial();
    let metrics = Metrics::new().unwrap();
    let service = Arc::new(ApiService::new(ApiConfig::default(), &metrics));
    let app = Arc::new(ApiApp::new(service.clone()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let (listener, addr) = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    });
    let served = rt.spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let stream: pingora::protocols::Stream =
            Box::new(pingora::protocols::l4::stream::Stream::from(tcp));
        app.process_new(stream, &shutdown).await.is_none()
    });
    let client = redis::Client::open(format!("redis://{addr}/?protocol=resp3")).unwrap();
    let mut con = client.get_connection().unwrap();
    let got: Vec<i64> = (0..3)
        .map(|_| {
            redis::cmd("RL.REDUCE")
                .arg("pingora")
                .arg(2)
                .arg(60)
                .query(&mut con)
                .unwrap()
        })
        .collect();
    assert_eq!(got, [2, 1, 0]);
    assert_eq!(service.connections(), 1);
    stop.send(true).unwrap();
    assert!(
        rt.block_on(served).unwrap(),
        "the stream is not handed back for reuse"
    );
    assert_eq!(service.connections(), 0);
    assert!(
        redis::cmd("PING").query::<String>(&mut con).is_err(),
        "closed"
    );
}
