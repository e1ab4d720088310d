//! Issue 19, "HTTP correctness": what real clients broke, each driven by a client the
//! project did not write. h2load (nghttp2) in HTTP/1.1 mode, Python's `http.client`
//! reading pipelined responses off one socket, and curl.
//!
//! 1. A 503 from an inflight or concurrency limit keeps the connection (it said
//!    `keep-alive` and closed).
//! 2. Pipelined requests are all answered, in order (the second was lost).
//! 3. Several `X-Forwarded-For` lines are one list, everywhere.
//! 4. A repeated `Content-Length` goes upstream as one value.
//! 5. A header of too many fields is the client's 431, never a 502 and a retry; and no log
//!    line carries a raw request.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::{certs, eventually, free_port, hold_as, Tollgate, Upstream, SERVER};

/// An origin on `app.test` (and `127.0.0.1`, the host h2load sends) whose upstream is
/// `up`, with `limits` (indented YAML under `limits:`), trusting 127.0.0.1 as a proxy.
fn config(up: &str, limits: &str) -> String {
    format!(
        "{SERVER}  trusted_proxies: [\"127.0.0.1/32\"]\n  customer_header: x-customer-id\n\
         origins:\n  app:\n    hosts: [\"app.test\", \"127.0.0.1\"]\n    upstreams: [\"{up}\"]\n\
         {limits}"
    )
}

/// One response as Python's `http.client` read it, or how the connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Read {
    Response {
        status: u16,
        connection: String,
        path: String,
    },
    /// The server closed the connection before another status line.
    Closed,
    /// Neither a response nor a close within 10 s.
    Timeout,
}

/// Reads responses off one socket with Python's `http.client`, the way a pipelining
/// client does: `bytes` in one write, then up to `n` responses in order. With a CA file as
/// the third argument the socket is TLS (`ssl`, SNI `app.test`). Bytes holding NUL are
/// parts sent one at a time instead: part i is written before response i is read.
const PIPELINE: &str = r#"
import http.client, json, socket, ssl, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
data = sys.stdin.buffer.read()
parts = data.split(b"\0") if b"\0" in data else [data]
s = socket.create_connection(("127.0.0.1", port), timeout=10)
if len(sys.argv) > 3:
    s = ssl.create_default_context(cafile=sys.argv[3]).wrap_socket(s, server_hostname="app.test")
class Shared:
    """One buffered reader for every response: a response's close must not close it."""
    def __init__(self, f):
        self.f = f
    def __getattr__(self, name):
        return getattr(self.f, name)
    def close(self):
        pass
f = Shared(s.makefile("rb"))
class Sock:
    def makefile(self, *args, **kwargs):
        return f
out = []
for i in range(n):
    if i < len(parts):
        s.sendall(parts[i])
    r = http.client.HTTPResponse(Sock(), method="GET")
    try:
        r.begin()
    except (http.client.RemoteDisconnected, ConnectionError):
        out.append({"closed": True})
        break
    except socket.timeout:
        out.append({"timeout": True})
        break
    r.read()
    out.append({"status": r.status, "connection": r.getheader("connection", ""),
                "path": r.getheader("x-seen-path", "")})
print(json.dumps(out))
"#;

/// Sends `bytes` in one write to `addr` and reads up to `n` responses (see [`PIPELINE`]).
fn pipeline(addr: SocketAddr, bytes: &[u8], n: usize) -> Vec<Read> {
    pipeline_on(addr, None, bytes, n)
}

/// [`pipeline`], over TLS trusting `ca` when given.
fn pipeline_on(addr: SocketAddr, ca: Option<&Path>, bytes: &[u8], n: usize) -> Vec<Read> {
    use std::io::Write;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", PIPELINE, &addr.port().to_string(), &n.to_string()])
        .args(ca)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 (scripts/deps.sh installs it with python3-redis)");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let reads: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    reads
        .into_iter()
        .map(|r| {
            if r.get("closed").is_some() {
                Read::Closed
            } else if r.get("timeout").is_some() {
                Read::Timeout
            } else {
                Read::Response {
                    status: r["status"].as_u64().unwrap() as u16,
                    connection: r["connection"].as_str().unwrap().to_ascii_lowercase(),
                    path: r["path"].as_str().unwrap().to_string(),
                }
            }
        })
        .collect()
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n\r\n")
}

fn get_close(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
}

fn ok(path: &str, connection: &str) -> Read {
    Read::Response {
        status: 200,
        connection: connection.to_string(),
        path: path.to_string(),
    }
}

fn status_of(reads: &[Read]) -> Vec<(u16, String)> {
    reads
        .iter()
        .map(|r| match r {
            Read::Response {
                status, connection, ..
            } => (*status, connection.clone()),
            other => (0, format!("{other:?}")),
        })
        .collect()
}

/// h2load's summary of a run: (done, succeeded, errored) and its status-code line.
struct H2load {
    done: u64,
    succeeded: u64,
    errored: u64,
    status_line: String,
    output: String,
}

/// Runs `h2load --h1` with `args` against `url` (bounded: `-n` requests) and reads its
/// summary.
fn h2load(args: &[&str], url: &str) -> H2load {
    let out = Command::new("h2load")
        .arg("--h1")
        .args(args)
        .arg(url)
        .output()
        .expect("h2load (scripts/deps.sh installs nghttp2-client)");
    let output = String::from_utf8_lossy(&out.stdout).to_string();
    let line = |prefix: &str| {
        output
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in h2load's output:\n{output}"))
            .to_string()
    };
    // "requests: 20 total, 20 started, 20 done, 0 succeeded, 20 failed, 0 errored, 0 timeout"
    let requests = line("requests:");
    let count = |word: &str| -> u64 {
        requests
            .split(',')
            .find(|part| part.trim().ends_with(word))
            .and_then(|part| part.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no `{word}` count in {requests:?}"))
    };
    H2load {
        done: count("done"),
        succeeded: count("succeeded"),
        errored: count("errored"),
        status_line: line("status codes:"),
        output,
    }
}

/// Item 1: a 503 from an inflight or a concurrency limit is answered like a 429: the
/// connection stays open for the next request, including one pipelined behind it. h2load's
/// clients used to die on the first 503 (`errored`: requests never sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_rejection_keeps_the_connection() {
    for kind in ["inflight", "concurrency"] {
        let limits = format!(
            "    limits:\n      busy:\n        kind: {kind}\n        max: 1\n        \
             key: [origin]\n"
        );
        let up = Upstream::start("127.0.0.1", "up").await;
        let t = Tollgate::start(&config(&up.addr.to_string(), &limits)).await;
        let held = hold_as(&t, &up, "acme").await;

        let reads = pipeline(
            t.listen,
            format!("{}{}", get("/a"), get_close("/b")).as_bytes(),
            3,
        );
        assert_eq!(
            status_of(&reads),
            vec![
                (503, "keep-alive".to_string()),
                (503, "close".to_string()),
                (0, "Closed".to_string())
            ],
            "{kind}: {reads:?}"
        );

        // 20 requests on 2 connections, every one of them refused: each is answered.
        let url = format!("http://{}/", t.listen);
        let run = h2load(&["-n", "20", "-c", "2"], &url);
        assert_eq!(
            (run.done, run.errored),
            (20, 0),
            "{kind}: a 503 lost the connection:\n{}",
            run.output
        );
        assert!(
            run.status_line.contains(" 20 5xx"),
            "{kind}: {}",
            run.output
        );

        // A 503 for a request whose body is not read closes, and says so.
        let post = "POST /p HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello";
        let reads = pipeline(t.listen, format!("{post}{}", get("/after")).as_bytes(), 2);
        assert_eq!(
            status_of(&reads),
            vec![(503, "close".to_string()), (0, "Closed".to_string())],
            "{kind}: {reads:?}"
        );

        up.release();
        held.await.unwrap().unwrap();
        assert_eq!(
            up.requests(),
            1,
            "{kind}: a rejected request reached the upstream"
        );
    }
}

/// Item 2: requests written together are all answered, in order (RFC 9112 §9.3.2), with a
/// body between them too; h2load pipelining 4 deep gets every response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(&up.addr.to_string(), "")).await;

    let bytes = format!("{}{}{}", get("/1"), get("/2?x=2"), get_close("/3"));
    let reads = pipeline(t.listen, bytes.as_bytes(), 4);
    assert_eq!(
        reads,
        vec![
            ok("/1", "keep-alive"),
            ok("/2?x=2", "keep-alive"),
            ok("/3", "close"),
            Read::Closed
        ]
    );
    assert_eq!(up.requests(), 3);

    let post = "POST /p HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello";
    let reads = pipeline(t.listen, format!("{post}{}", get_close("/q")).as_bytes(), 3);
    assert_eq!(
        reads,
        vec![ok("/p", "keep-alive"), ok("/q", "close"), Read::Closed]
    );

    let url = format!("http://{}/", t.listen);
    let run = h2load(&["-n", "40", "-c", "2", "-m", "4"], &url);
    assert_eq!(
        (run.done, run.succeeded, run.errored),
        (40, 40, 0),
        "pipelined requests were lost:\n{}",
        run.output
    );
}

/// Items 1 and 2 on a TLS listener (Python's `ssl`): pipelined requests are answered in
/// order, and a 503 keeps the connection for the next request, whether pipelined behind it
/// or sent once the 503 was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelining_and_a_503_keep_a_tls_connection() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let cert = certs::write(dir.path(), "app", "app.test", &["app.test"], 30);
    let tls = free_port();
    let limits = "    limits:\n      busy: { kind: inflight, max: 1, key: [origin] }\n";
    let text = config(&up.addr.to_string(), limits).replace(
        "listen: [\"{listen}\"]",
        &format!("listen: [\"{{listen}}\", {{ addr: \"127.0.0.1:{tls}\", tls: true }}]"),
    ) + &format!(
        "tls:\n  certificates:\n    - {{ cert: \"{}\", key: \"{}\" }}\n",
        cert.cert.display(),
        cert.key.display()
    );
    let t = Tollgate::start(&text).await;
    eventually("the TLS listener accepts", 250, || async {
        std::net::TcpStream::connect(("127.0.0.1", tls)).is_ok()
    })
    .await;
    let addr: SocketAddr = format!("127.0.0.1:{tls}").parse().unwrap();
    let ca = Some(cert.cert.as_path());

    let bytes = format!("{}{}{}", get("/1"), get("/2?x=2"), get_close("/3"));
    assert_eq!(
        pipeline_on(addr, ca, bytes.as_bytes(), 4),
        vec![
            ok("/1", "keep-alive"),
            ok("/2?x=2", "keep-alive"),
            ok("/3", "close"),
            Read::Closed
        ]
    );
    let bytes = format!("{}\0{}", get("/a"), get_close("/b"));
    assert_eq!(
        pipeline_on(addr, ca, bytes.as_bytes(), 3),
        vec![ok("/a", "keep-alive"), ok("/b", "close"), Read::Closed]
    );
    assert_eq!(up.requests(), 5);

    // The inflight limit's one unit held: every request is a 503 that keeps the connection.
    let held = hold_as(&t, &up, "acme").await;
    let pipelined = format!("{}{}", get("/c"), get_close("/d"));
    let one_by_one = format!("{}\0{}\0{}", get("/e"), get("/f"), get_close("/g"));
    for (bytes, kept) in [(pipelined, 1), (one_by_one, 2)] {
        let reads = pipeline_on(addr, ca, bytes.as_bytes(), 4);
        let mut want = vec![(503, "keep-alive".to_string()); kept];
        want.push((503, "close".to_string()));
        want.push((0, "Closed".to_string()));
        assert_eq!(status_of(&reads), want, "{bytes:?}: {reads:?}");
    }
    up.release();
    held.await.unwrap().unwrap();
    assert_eq!(up.requests(), 6, "a rejected request reached the upstream");
}

/// A GET through tollgate with curl; the response's headers, lower-cased names.
fn curl(t: &Tollgate, args: &[&str], path: &str) -> (u16, Vec<(String, String)>) {
    let out = Command::new("curl")
        .args(["-sS", "-D", "-", "-o", "/dev/null", "-H", "Host: app.test"])
        .args(args)
        .arg(t.url(path))
        .output()
        .expect("curl");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}

/// Item 3: two `X-Forwarded-For` lines from a trusted proxy are one list: the upstream
/// receives both, in order, as one line with the peer appended, and the limit keys on the
/// client that list names (the right-most untrusted hop, on the second line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_forwarded_for_lines_are_one_list() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "    limits:\n      per_client:\n        kind: rate\n        max: 1\n        \
                  per: 1h\n        key: [client_ip]\n";
    let t = Tollgate::start(&config(&up.addr.to_string(), limits)).await;

    let lines = [
        "-H",
        "X-Forwarded-For: 203.0.113.9",
        "-H",
        "X-Forwarded-For: 198.51.100.7",
    ];
    let (status, headers) = curl(&t, &lines, "/");
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "x-seen-forwarded-for"),
        "203.0.113.9, 198.51.100.7, 127.0.0.1"
    );
    assert_eq!(header(&headers, "x-seen-forwarded-for-lines"), "1");

    // The same client behind another forged first line: the same key, refused.
    let forged = [
        "-H",
        "X-Forwarded-For: 192.0.2.1",
        "-H",
        "X-Forwarded-For: 198.51.100.7",
    ];
    assert_eq!(curl(&t, &forged, "/").0, 429);
    // The same list on one line: the same client.
    let one_line = ["-H", "X-Forwarded-For: 192.0.2.1, 198.51.100.7"];
    assert_eq!(curl(&t, &one_line, "/").0, 429);
    // Another client on the second line: its own key.
    let other = [
        "-H",
        "X-Forwarded-For: 198.51.100.7",
        "-H",
        "X-Forwarded-For: 198.51.100.8",
    ];
    assert_eq!(curl(&t, &other, "/").0, 200);
    assert_eq!(up.requests(), 2);
}

/// Item 4: a repeated `Content-Length` (one line `5, 5`, or two lines of 5) goes upstream
/// as one value; different values are refused with 400 (RFC 9112 §6.3) and never reach
/// the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_content_length_goes_upstream_once() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(&up.addr.to_string(), "")).await;
    let data = ["--data-binary", "hello"];
    for lengths in [
        &["-H", "Content-Length: 5, 5"][..],
        &["-H", "Content-Length: 5", "-H", "Content-Length: 5"][..],
    ] {
        let args = [&data[..], lengths].concat();
        let (status, headers) = curl(&t, &args, "/");
        assert_eq!(status, 200, "{lengths:?}: {headers:?}");
        assert_eq!(
            header(&headers, "x-seen-content-length"),
            "5",
            "{lengths:?}"
        );
        assert_eq!(header(&headers, "x-seen-body-bytes"), "5", "{lengths:?}");
    }
    assert_eq!(up.requests(), 2);
    for lengths in [
        &["-H", "Content-Length: 5, 6"][..],
        &["-H", "Content-Length: 5", "-H", "Content-Length: 6"][..],
    ] {
        let args = [&data[..], lengths].concat();
        assert_eq!(curl(&t, &args, "/").0, 400, "{lengths:?}");
    }
    assert_eq!(up.requests(), 2);
}

/// Item 5: 256 header fields through tollgate to its demo upstream (a Pingora server,
/// which reads at most 256): the forwarded request would carry 258 with the
/// `X-Forwarded-For` and `X-Request-Id` tollgate adds, so the client gets 431, not a 502 and a retry. The
/// demo upstream reached directly with too many fields, a dead upstream, and a request to
/// it: no line carries the request's credentials, none is an `ERROR`, and client-caused
/// lines stay within their budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_header_fields_are_the_clients_431_and_no_log_line_carries_a_request() {
    const REQUESTS: usize = 100;
    let demo: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let dead = free_port();
    let text = format!(
        "{SERVER}  demo_upstream: \"{demo}\"\norigins:\n  app:\n    hosts: [\"app.test\"]\n    \
         upstreams: [\"{demo}\"]\n  dead:\n    hosts: [\"dead.test\"]\n    \
         upstreams: [\"127.0.0.3:{dead}\"]\n"
    );
    let t = Tollgate::start(&text).await;
    eventually("the demo upstream listens", 500, || async {
        std::net::TcpStream::connect(demo).is_ok()
    })
    .await;
    let started = Instant::now();

    // curl sends Host, User-Agent and Accept: with these, 256 fields in all.
    let secret = ["-H", "Authorization: Bearer SECRET-TOKEN-1"];
    let mut fields: Vec<String> = Vec::new();
    for i in 0..252 {
        fields.push("-H".to_string());
        fields.push(format!("X-Field-{i}: v"));
    }
    let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
    let url = t.url("/?token=SECRET-TOKEN-2");
    // One curl, one connection: each URL with its own `-o`.
    let urls: Vec<&str> = (0..REQUESTS)
        .flat_map(|_| ["-o", "/dev/null", url.as_str()])
        .collect();
    let out = Command::new("curl")
        .args(["-sS", "-w", "%{http_code}\\n", "-H", "Host: app.test"])
        .args(secret)
        .args(&fields)
        .args(&urls)
        .output()
        .expect("curl");
    let codes = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        codes.lines().filter(|c| *c == "431").count(),
        REQUESTS,
        "{codes}"
    );
    t.wait_metric(
        "tollgate_requests_total{code=\"431\",origin=\"app\"}",
        REQUESTS as f64,
    )
    .await;
    assert_eq!(
        t.metric("tollgate_requests_total{code=\"502\",origin=\"app\"}")
            .await,
        0.0
    );

    // The same request without the two fields too many is proxied.
    let (status, _) = curl(&t, &[&secret[..], &fields[4..]].concat(), "/");
    assert_eq!(status, 200);

    // The demo upstream reached directly with 257 fields: it cannot read them.
    let too_many = [&secret[..], &fields[..], &["-H", "X-One-More: v"][..]].concat();
    for _ in 0..REQUESTS {
        let _ = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "--max-time", "10"])
            .args(&too_many)
            .arg(format!("http://{demo}/?token=SECRET-TOKEN-2"))
            .output()
            .expect("curl");
    }
    // A request to a dead upstream fails there: its line names no path nor query.
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Host: dead.test",
        ])
        .args(secret)
        .arg(t.url("/?token=SECRET-TOKEN-2"))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "502");
    eventually(
        "the demo's and the dead upstream's lines are logged",
        500,
        || async {
            let log = t.log_text();
            log.contains("HTTP server fails to read from downstream")
                && log.contains("request failed (upstream)")
        },
    )
    .await;

    let log = t.log_text();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let leaked: Vec<&str> = log.lines().filter(|l| l.contains("SECRET-TOKEN")).collect();
    assert!(leaked.is_empty(), "{}", leaked.join("\n"));
    let unread: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("HTTP server fails to read from downstream"))
        .collect();
    // Five lines a second at most (the budget), over the seconds the flood lasted.
    let budget = 5 * (started.elapsed().as_secs() as usize + 2);
    eprintln!(
        "{REQUESTS} unreadable requests to the demo upstream wrote {} lines (budget {budget})",
        unread.len()
    );
    assert!(unread.len() <= budget, "{}", unread.join("\n"));
    assert!(
        unread.iter().all(|l| l.contains(" INFO ")),
        "{}",
        unread.join("\n")
    );
}
