//! The PROXY protocol on a listener (issue 20, part E) and WebSocket upgrades (part D),
//! with clients tollgate did not write: curl's `--haproxy-protocol` (v1), a v2 header made
//! with the `ppp` crate on a raw connection, and Python's `websockets` on both ends of an
//! upgraded connection, whose inflight unit is held until it closes.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use common::raw::{read_response, Response};
use common::{free_port, Tollgate, Upstream};
use tokio::io::{AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::TcpStream;

fn config(up: SocketAddr, trusted: &str) -> String {
    format!(
        "server:\n  listen: [{{ addr: \"{{listen}}\", proxy_protocol: true }}]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\n  trusted_proxies: [{trusted}]\norigins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{up}\"]\n"
    )
}

/// A GET on a raw connection that starts with `header`.
async fn with_header(addr: SocketAddr, header: &[u8]) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(header).await?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await?;
    read_response(&mut AsyncBufReader::new(s)).await
}

fn v2_from(source: &str) -> Vec<u8> {
    let addrs: ppp::v2::Addresses = (
        source.parse::<SocketAddr>().unwrap(),
        "127.0.0.1:443".parse::<SocketAddr>().unwrap(),
    )
        .into();
    ppp::v2::Builder::with_addresses(
        ppp::v2::Version::Two | ppp::v2::Command::Proxy,
        ppp::v2::Protocol::Stream,
        addrs,
    )
    .build()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_header_names_the_client_only_from_a_trusted_proxy() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(up.addr, "\"127.0.0.1/32\"")).await;
    // curl speaks v1 with its own address: served.
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--haproxy-protocol",
        ])
        .args(["-H", "host: app.test", "--max-time", "10"])
        .arg(t.url("/"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    // A v2 header from a trusted peer: the upstream sees the client it names.
    let r = with_header(t.listen, &v2_from("203.0.113.7:4000"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-seen-forwarded-for"), Some("203.0.113.7"));
    let r = with_header(t.listen, b"PROXY TCP4 198.51.100.2 127.0.0.1 5000 443\r\n")
        .await
        .unwrap();
    assert_eq!(r.header("x-seen-forwarded-for"), Some("198.51.100.2"));
    // No header: closed, no response.
    assert!(with_header(t.listen, b"").await.is_err());
    t.wait_metric("tollgate_proxy_protocol_total{result=\"trusted\"}", 3.0)
        .await;

    // From a peer outside trusted_proxies the header is read and ignored.
    let t = Tollgate::start(&config(up.addr, "\"10.0.0.0/8\"")).await;
    let r = with_header(t.listen, &v2_from("203.0.113.7:4000"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-seen-forwarded-for"), Some("127.0.0.1"));
    t.wait_metric("tollgate_proxy_protocol_total{result=\"untrusted\"}", 1.0)
        .await;
}

const WS_SERVER: &str = r#"
import asyncio, sys, websockets
async def echo(ws, *args):
    async for m in ws:
        await ws.send(m)
async def main():
    async with websockets.serve(echo, "127.0.0.1", int(sys.argv[1])):
        print("ready", flush=True)
        await asyncio.sleep(60)
asyncio.run(main())
"#;

const WS_CLIENT: &str = r#"
import asyncio, sys, websockets
async def main():
    async with websockets.connect("ws://127.0.0.1:" + sys.argv[1] + "/chat") as ws:
        await ws.send("hello")
        print("echo", await ws.recv(), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await ws.send("again")
        print("echo", await ws.recv(), flush=True)
    print("closed", flush=True)
asyncio.run(main())
"#;

/// A WebSocket echo through tollgate: the upgrade passes, messages flow both ways, and the
/// upgraded connection holds its inflight unit (it occupies the origin) until it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_passes_and_holds_its_inflight_unit_until_closed() {
    let ws_port = free_port();
    let mut server = Command::new("/usr/bin/python3")
        .args(["-c", WS_SERVER, &ws_port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let config = format!(
        "server:\n  listen: [\"{{listen}}\"]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\norigins:\n  ws:\n    hosts: [\"127.0.0.1\"]\n    upstreams: [\"127.0.0.1:{ws_port}\"]\n    limits:\n      inflight: {{ kind: inflight, key: [host], max: 1 }}\n"
    );
    let t = Tollgate::start(&config).await;
    let mut client = Command::new("/usr/bin/python3")
        .args(["-c", WS_CLIENT, &t.listen.port().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(client.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "echo hello");
    t.wait_metric("tollgate_inflight_requests{origin=\"ws\"}", 1.0)
        .await;
    // The unit is held: a second request to the origin is over its inflight max of 1.
    let second = common::client()
        .get(t.url("/"))
        .header("host", "127.0.0.1")
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 503);
    client.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "echo again");
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "closed");
    assert!(client.wait().unwrap().success());
    t.wait_metric("tollgate_inflight_requests{origin=\"ws\"}", 0.0)
        .await;
    let _ = server.kill();
    let _ = server.wait();
}
