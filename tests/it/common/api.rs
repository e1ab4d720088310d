//! Harness for the limiter API tests: the real service on an ephemeral loopback port, in
//! its own runtime thread, and the real clients (`redis` crate, `redis-cli`, raw TCP).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::watch;
use tollgate::api::{ApiConfig, ApiService};
use tollgate::metrics::Metrics;

/// A limiter API server running in-process; stopped (gracefully) on drop.
pub struct ApiServer {
    pub addr: SocketAddr,
    pub service: Arc<ApiService>,
    pub metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// Starts a server with the default configuration.
    pub fn start() -> Self {
        Self::with(ApiConfig::default())
    }

    /// Starts a server with `config` on 127.0.0.1, port 0.
    pub fn with(config: ApiConfig) -> Self {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let service = Arc::new(ApiService::new(config, &metrics));
        let (stop, shutdown) = watch::channel(false);
        let (tx, rx) = std::sync::mpsc::channel();
        let svc = service.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                // A deep accept queue, as Pingora's listeners have: tests open thousands
                // of connections at once.
                let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                socket
                    .bind("127.0.0.1:0".parse().expect("addr"))
                    .expect("bind");
                let listener = socket.listen(4096).expect("listen");
                tx.send(listener.local_addr().expect("addr")).expect("send");
                svc.serve(listener, shutdown).await;
            });
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).expect("server up");
        Self {
            addr,
            service,
            metrics,
            stop,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A `redis` crate connection, RESP2 or RESP3.
    pub fn client(&self, resp3: bool) -> redis::Connection {
        let proto = if resp3 { "?protocol=resp3" } else { "" };
        let url = format!("redis://{}/{proto}", self.addr);
        let client = redis::Client::open(url).expect("client");
        client
            .get_connection_with_timeout(Duration::from_secs(10))
            .expect("connect")
    }

    /// A raw TCP connection with a read timeout.
    pub fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s
    }

    /// Stops accepting, lets connections finish, joins the server thread.
    pub fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread");
        }
    }

    /// The metrics exposition.
    pub fn scrape(&self) -> String {
        String::from_utf8(self.metrics.encode()).expect("utf-8")
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Runs `redis-cli -p PORT ARGS...`; returns its stdout (`redis-cli` must be installed:
/// scripts/deps.sh does it).
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (install redis-tools: scripts/deps.sh)");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs `redis-cli -p PORT` with `input` on stdin (one command a line).
pub fn redis_cli_stdin(port: u16, extra: &[&str], input: &str) -> String {
    use std::process::Stdio;
    let mut child = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("redis-cli output");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Sends `request` and reads until `expect` bytes arrived or the peer closed; returns what
/// was read.
pub fn exchange(stream: &mut TcpStream, request: &[u8], expect: usize) -> Vec<u8> {
    stream.write_all(request).expect("write");
    read_at_least(stream, expect)
}

/// Reads until `n` bytes arrived, the peer closed, or the read timed out.
pub fn read_at_least(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    while got.len() < n {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.extend_from_slice(&chunk[..k]),
        }
    }
    got
}

/// Reads until the peer closes (or 10 s of silence): whatever the server still sent.
pub fn read_to_close(stream: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return (got, true),
            Ok(k) => got.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

/// This process's resident memory in KiB (Linux).
pub fn rss_kib() -> u64 {
    rss_kib_of("self")
}

/// Resident memory in KiB of process `pid` (a number, or `self`) (Linux).
pub fn rss_kib_of(pid: impl std::fmt::Display) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Sends `request` and reads until what arrived ends with `suffix` (or the peer closed,
/// or 10 s of silence).
pub fn exchange_until(stream: &mut TcpStream, request: &[u8], suffix: &[u8]) -> Vec<u8> {
    stream.write_all(request).expect("write");
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    while !got.ends_with(suffix) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.extend_from_slice(&chunk[..k]),
        }
    }
    got
}

/// Pipelines `COMMAND` (a reply of several KiB for 9 bytes) and never reads, until a write
/// fails: the server closed the connection at its output bound. Returns the write's error;
/// fails the test if 256 MiB went out with the connection still open.
pub fn flood_without_reading(stream: &mut TcpStream) -> std::io::Error {
    let burst = b"COMMAND\r\n".repeat(1000);
    let mut sent = 0usize;
    loop {
        match stream.write_all(&burst) {
            Ok(()) => sent += burst.len(),
            Err(e) => return e,
        }
        assert!(
            sent < 256 << 20,
            "still open after {sent} bytes of commands"
        );
    }
}
