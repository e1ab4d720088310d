//! Issue 26: the access log and request IDs, through the real binary with a real upstream
//! and curl as the client. Every wait polls the log file or the metrics for an event.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::{Tollgate, Upstream, SERVER};

/// The fields every json line has, in the order DESIGN lists them.
pub const FIELDS: [&str; 23] = [
    "time",
    "request_id",
    "client_ip",
    "peer",
    "customer",
    "method",
    "host",
    "path",
    "protocol",
    "tls",
    "sni",
    "status",
    "bytes_in",
    "bytes_out",
    "duration",
    "upstream",
    "upstream_status",
    "upstream_ttfb",
    "origin",
    "rejected_by",
    "shadow_rejected",
    "source",
    "headers",
];

/// A config with one origin `app` (host `app.test`) on `up`, `server_extra` server keys
/// and `limits` (indented under `limits:`).
pub fn config(up: &Upstream, server_extra: &str, limits: &str) -> String {
    format!(
        "{SERVER}{server_extra}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{}\"]\n    limits:\n{limits}",
        up.addr
    )
}

/// The log's lines as JSON objects (a torn last line is not counted).
pub fn json_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until the log at `path` holds `n` complete lines.
pub async fn wait_lines(path: &Path, n: usize) {
    let count = || std::fs::read_to_string(path).map_or(0, |t| t.matches('\n').count());
    for _ in 0..crate::common::MIN_TRIES {
        if count() >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!(
        "{n} lines never in {}: {}",
        path.display(),
        std::fs::read_to_string(path).unwrap_or_default()
    );
}

/// One curl request: status, response headers (lower-cased names), body.
pub fn curl(args: &[&str]) -> (u16, BTreeMap<String, String>, String) {
    let out = Command::new("curl")
        .args(["-s", "-S", "-D", "-", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl");
    assert!(out.status.success(), "curl {args:?}: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_has_one_json_line_and_a_rejection_names_its_limit_and_id() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let cfg = config(
        &up,
        "  access_log: { path: access.log, headers: [user-agent] }\n",
        "      watch: { kind: rate, max: 1, per: 1m, key: [client_ip], mode: shadow }\n      per_client: { kind: rate, max: 3, per: 1m, key: [client_ip] }\n",
    );
    let t = Tollgate::start(&cfg).await;
    let log = t.dir.path().join("access.log");
    let url = t.url("/items?token=secret");
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(curl(&[
            "-H",
            "host: app.test",
            "-H",
            "user-agent: test-agent/1",
            "-H",
            "authorization: Bearer hidden",
            &url,
        ]));
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    wait_lines(&log, 5).await;
    let lines = json_lines(&log);
    assert_eq!(lines.len(), 5, "{lines:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("secret") && !text.contains("hidden"),
        "{text}"
    );
    for (line, (status, headers, body)) in lines.iter().zip(&answers) {
        let keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut want = FIELDS.to_vec();
        want.sort_unstable();
        assert_eq!(keys, want, "{line}");
        let id = headers.get("x-request-id").expect("x-request-id returned");
        assert_eq!(line["request_id"], id.as_str());
        assert_eq!(id.len(), 36, "a UUID: {id}");
        assert_eq!(line["status"], *status);
        assert_eq!(line["method"], "GET");
        assert_eq!(line["host"], "app.test");
        assert_eq!(line["path"], "/items", "the query is dropped by default");
        assert_eq!(line["protocol"], "HTTP/1.1");
        assert_eq!(line["client_ip"], "127.0.0.1");
        assert_eq!(line["origin"], "app");
        assert_eq!(line["customer"], "app");
        assert_eq!(line["tls"], Value::Null);
        assert_eq!(line["headers"]["user-agent"], "test-agent/1");
        assert!(line["duration"].as_f64().unwrap() >= 0.0);
        assert!(line["time"].as_str().unwrap().ends_with('Z'));
        if *status == 200 {
            assert_eq!(line["upstream"], up.addr.to_string());
            assert_eq!(line["upstream_status"], 200);
            assert!(line["upstream_ttfb"].as_f64().is_some());
            assert_eq!(line["rejected_by"], Value::Null);
            assert_eq!(headers["x-seen-request-id"], *id, "sent upstream");
            assert!(line["bytes_out"].as_u64().unwrap() > 0);
        } else {
            assert_eq!(line["rejected_by"]["limit"], "per_client");
            assert_eq!(line["rejected_by"]["kind"], "rate");
            assert_eq!(line["upstream"], Value::Null);
            let problem: Value = serde_json::from_str(body).unwrap();
            assert_eq!(problem["request_id"], id.as_str(), "{body}");
        }
    }
    // The shadow limit (max 1) would have rejected every request but the first.
    let shadowed: Vec<bool> = lines
        .iter()
        .map(|l| l["shadow_rejected"] == serde_json::json!(["watch"]))
        .collect();
    assert_eq!(shadowed, [false, true, true, true, true]);
    // Lines are in time order.
    let times: Vec<&str> = lines.iter().map(|l| l["time"].as_str().unwrap()).collect();
    let mut sorted = times.clone();
    sorted.sort_unstable();
    assert_eq!(times, sorted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_is_kept_from_a_trusted_proxy_and_replaced_from_anyone_else() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let cfg = config(
        &up,
        "  trusted_proxies: [\"127.0.0.1/32\"]\n  access_log: { path: access.log }\n",
        "      none: { kind: rate, max: 1000, per: 1s }\n",
    );
    let t = Tollgate::start(&cfg).await;
    let log = t.dir.path().join("access.log");
    let url = t.url("/");
    let long = format!("x-request-id: {}", "a".repeat(200));
    let cases: [(&str, &str, bool); 4] = [
        ("127.0.0.1", "x-request-id: from-the-edge-42", true),
        ("127.0.0.2", "x-request-id: from-the-edge-42", false),
        ("127.0.0.1", long.as_str(), false),
        ("127.0.0.1", "x-request-id: two words", false),
    ];
    for (i, (from, header, kept)) in cases.iter().enumerate() {
        let (status, headers, _) = curl(&[
            "--interface",
            from,
            "-H",
            "host: app.test",
            "-H",
            header,
            &url,
        ]);
        assert_eq!(status, 200, "case {i}");
        let id = &headers["x-request-id"];
        assert_eq!(
            headers["x-seen-request-id"], *id,
            "case {i}: the upstream saw the same ID"
        );
        if *kept {
            assert_eq!(id, "from-the-edge-42", "case {i}");
        } else {
            assert_eq!(id.len(), 36, "case {i}: replaced by a UUID, got {id}");
            assert_eq!(&id[14..15], "7", "case {i}: a UUIDv7");
        }
        wait_lines(&log, i + 1).await;
        let lines = json_lines(&log);
        assert_eq!(lines[i]["request_id"], id.as_str());
        assert_eq!(
            lines[i]["peer"].as_str().unwrap().split(':').next(),
            Some(*from)
        );
    }
    // Two lines, even from a trusted proxy: neither is kept, and the upstream sees only
    // the new ID.
    let two = ["-H", "x-request-id: a", "-H", "x-request-id: b"];
    let (status, headers, _) = curl(&[&["-H", "host: app.test", &url][..], &two[..]].concat());
    assert_eq!(status, 200);
    let id = &headers["x-request-id"];
    assert_eq!(id.len(), 36, "replaced by a UUID, got {id}");
    assert_eq!(headers["x-seen-request-id"], *id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_only_logs_rejections_and_combined_is_nginx_s_format() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let cfg = config(
        &up,
        "  access_log: { path: access.log, only: rejected, format: combined, query: keep, headers: [referer, user-agent] }\n",
        "      per_client: { kind: rate, max: 2, per: 1m, key: [client_ip] }\n",
    );
    let t = Tollgate::start(&cfg).await;
    let log = t.dir.path().join("access.log");
    let url = t.url("/p?q=1");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let (status, _, _) = curl(&[
            "-H",
            "host: app.test",
            "-A",
            "ua/2",
            "-e",
            "http://ref/",
            &url,
        ]);
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    wait_lines(&log, 2).await;
    t.wait_metric("tollgate_requests_total{code=\"429\",origin=\"app\"}", 2.0)
        .await;
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "only the rejections: {text}");
    for line in lines {
        assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
        assert!(line.contains("] \"GET /p?q=1 HTTP/1.1\" 429 "), "{line}");
        assert!(line.ends_with(" \"http://ref/\" \"ua/2\""), "{line}");
    }
}

/// `tollgate simulate --log access.log --json` with the running config.
fn simulate(config: &Path, log: &Path) -> Value {
    let out = Command::new(crate::common::binary())
        .arg("simulate")
        .arg("--config")
        .arg(config)
        .arg("--log")
        .arg(log)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn todays_log_replays_through_simulate_to_the_same_decisions() {
    let up = Upstream::start("127.0.0.1", "up").await;
    // Hour-long periods: nothing refills between a decision and its replay.
    let cfg = config(
        &up,
        "  access_log: { path: access.log }\n",
        "      bucket: { kind: token_bucket, key: [client_ip], capacity: 8, refill: { amount: 1, every: 1h } }\n      per_ip: { kind: rate, max: 5, per: 1h, key: [client_ip] }\n",
    );
    let t = Tollgate::start(&cfg).await;
    let log = t.dir.path().join("access.log");
    // Mixed traffic: h2load from one client, curl from another, in turns.
    let url = t.url("/");
    for round in 0..3 {
        let s = crate::common::h2load::run(&[
            "--h1",
            "-n",
            "10",
            "-c",
            "1",
            "-H",
            ":authority: app.test",
            &url,
        ]);
        assert_eq!(s.done, 10, "round {round}: {}", s.text);
        for _ in 0..3 {
            curl(&["--interface", "127.0.0.2", "-H", "host: app.test", &url]);
        }
    }
    wait_lines(&log, 39).await;
    let lines = json_lines(&log);
    assert_eq!(lines.len(), 39);
    let report = simulate(&t.config_path, &log);
    assert_eq!(report["input"]["format"], "jsonl", "detected with no flag");
    assert_eq!(report["input"]["replayed"], 39, "{report:#}");
    let origin = report["origins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "app")
        .unwrap();
    let metrics = t.metrics_text().await;
    let mut compared = 0;
    for limit in origin["limits"].as_array().unwrap() {
        let name = limit["name"].as_str().unwrap();
        let kind = if name == "bucket" {
            "token_bucket"
        } else {
            "rate"
        };
        for decision in ["allowed", "rejected", "refunded"] {
            let series = format!(
                "tollgate_limit_decisions_total{{decision=\"{decision}\",kind=\"{kind}\",limit=\"{name}\",origin=\"app\"}}"
            );
            let live = crate::common::sample(&metrics, &series);
            assert_eq!(
                limit[decision].as_f64().unwrap(),
                live,
                "{name} {decision}: {limit:#}"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 6);
    // And line by line: the log's rejections are the replay's.
    let rejected_in_log = lines.iter().filter(|l| l["status"] == 429).count() as u64;
    let replay_rejected: u64 = origin["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["rejected"].as_u64().unwrap())
        .sum();
    assert!(rejected_in_log > 0);
    assert_eq!(rejected_in_log, replay_rejected);
}

/// Sends `n` GETs from curl and returns their response IDs.
fn send(t: &Tollgate, n: usize) -> Vec<String> {
    let url = t.url("/");
    (0..n)
        .map(|_| {
            let (status, headers, _) = curl(&["-H", "host: app.test", &url]);
            assert_eq!(status, 200);
            headers["x-request-id"].clone()
        })
        .collect()
}

/// Waits until `path` exists (the writer reopened it).
async fn wait_exists(path: &Path) {
    crate::common::eventually(&format!("{} reopened", path.display()), 0, || async {
        path.exists()
    })
    .await;
}

/// The request IDs of every line of `files`, in order.
fn ids(files: &[&Path]) -> Vec<String> {
    files
        .iter()
        .flat_map(|f| json_lines(f))
        .map(|l| l["request_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_log_is_reopened_on_sigusr1_and_by_itself_with_no_line_lost() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let cfg = config(
        &up,
        "  access_log: { path: access.log }\n",
        "      none: { kind: rate, max: 1000, per: 1s }\n",
    );
    let t = Tollgate::start(&cfg).await;
    let dir = t.dir.path();
    let (log, one, two) = (
        dir.join("access.log"),
        dir.join("access.log.1"),
        dir.join("access.log.2"),
    );
    let mut sent = send(&t, 4);
    wait_lines(&log, 4).await;
    // logrotate's `create` with nginx's postrotate: mv, then SIGUSR1.
    std::fs::rename(&log, &one).unwrap();
    t.signal(libc::SIGUSR1);
    wait_exists(&log).await;
    sent.extend(send(&t, 4));
    wait_lines(&log, 4).await;
    // Moved with no signal: the writer notices within a second.
    std::fs::rename(&log, &two).unwrap();
    wait_exists(&log).await;
    sent.extend(send(&t, 4));
    wait_lines(&log, 4).await;
    assert_eq!(ids(&[&one, &two, &log]), sent, "every line once, in order");
    assert_eq!(json_lines(&one).len(), 4);
    assert!(t.log_text().contains("SIGUSR1: reopening the access log"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logrotate_create_and_copytruncate_lose_and_repeat_no_line() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let cfg = config(
        &up,
        "  access_log: { path: access.log }\n",
        "      none: { kind: rate, max: 1000, per: 1s }\n",
    );
    let t = Tollgate::start(&cfg).await;
    let dir = t.dir.path();
    let log = dir.join("access.log");
    let logrotate = |body: &str| {
        let conf = dir.join("logrotate.conf");
        std::fs::write(
            &conf,
            format!("{} {{\n  rotate 5\n  nocompress\n{body}}}\n", log.display()),
        )
        .unwrap();
        let out = Command::new("logrotate")
            .arg("-f")
            .arg("-s")
            .arg(dir.join("logrotate.state"))
            .arg(&conf)
            .output()
            .expect("logrotate (scripts/deps.sh installs it)");
        assert!(out.status.success(), "{out:?}");
    };
    let mut sent = send(&t, 3);
    wait_lines(&log, 3).await;
    logrotate(&format!(
        "  create\n  postrotate\n    kill -USR1 {}\n  endscript\n",
        t.child.id()
    ));
    // `create` makes the new file itself: wait for tollgate's reopen, which logs it.
    crate::common::eventually("the reopen on SIGUSR1", 0, || async {
        t.log_text().contains("SIGUSR1: reopening the access log")
    })
    .await;
    sent.extend(send(&t, 3));
    wait_lines(&log, 3).await;
    let first = dir.join("access.log.1");
    assert_eq!(json_lines(&first).len(), 3);
    logrotate("  copytruncate\n");
    sent.extend(send(&t, 3));
    wait_lines(&log, 3).await;
    let rotated = [
        dir.join("access.log.2"),
        dir.join("access.log.1"),
        log.clone(),
    ];
    let files: Vec<&Path> = rotated.iter().map(|p| p.as_path()).collect();
    assert_eq!(ids(&files), sent, "every line once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_nobody_reads_never_blocks_requests_and_counts_its_drops() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("access.log");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Held open for reading and never read: the pipe fills, then tollgate's writer blocks.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let cfg = config(
        &up,
        "  access_log: { path: access.log, headers: [user-agent] }\n",
        "      none: { kind: rate, max: 1000000, per: 1s }\n",
    );
    let t = Tollgate::start_in(dir, &cfg, |_| {}).await;
    // Large lines (a 3 kB user agent) fill the 2 MiB buffer in about a thousand requests.
    let agent = format!("user-agent: {}", "a".repeat(3000));
    let url = t.url("/");
    let n = 4000;
    let s = crate::common::h2load::run(&[
        "--h1",
        "-n",
        &n.to_string(),
        "-c",
        "4",
        "-H",
        ":authority: app.test",
        "-H",
        &agent,
        &url,
    ]);
    assert_eq!(s.ok, n, "every request served: {}", s.text);
    t.wait_metric(
        "tollgate_requests_total{code=\"200\",origin=\"app\"}",
        n as f64,
    )
    .await;
    let dropped = t.metric("tollgate_access_log_dropped_total").await;
    assert!(dropped > 0.0, "lines dropped and counted");
    assert!(
        dropped < n as f64,
        "the buffer and pipe held some: {dropped}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_request_logs_its_version_and_sni() {
    use crate::common::certs;
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let c = certs::write(dir.path(), "app", "app.test", &["app.test"], 30);
    let cfg = format!(
        "server:\n  listen: [{{ addr: \"{{listen}}\", tls: true }}]\n  metrics: \"{{metrics}}\"\n  grace_period: 0s\n  access_log: {{ path: access.log }}\ntls:\n  certificates:\n    - {{ cert: \"{}\", key: \"{}\" }}\norigins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{}\"]\n",
        c.cert.display(),
        c.key.display(),
        up.addr
    );
    let t = Tollgate::start_in(dir, &cfg, |_| {}).await;
    let port = t.listen.port();
    for version in ["--http1.1", "--http2"] {
        let out = Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                version,
            ])
            .arg("--resolve")
            .arg(format!("app.test:{port}:127.0.0.1"))
            .arg("--cacert")
            .arg(&c.cert)
            .arg(format!("https://app.test:{port}/"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    }
    let log = t.dir.path().join("access.log");
    wait_lines(&log, 2).await;
    let lines = json_lines(&log);
    assert_eq!(lines[0]["protocol"], "HTTP/1.1");
    assert_eq!(lines[0]["sni"], "app.test");
    assert!(
        lines[0]["tls"].as_str().unwrap().starts_with("TLSv1."),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1]["protocol"], "h2");
    assert!(
        lines[1]["tls"].as_str().unwrap().starts_with("TLSv1."),
        "{}",
        lines[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_says_whether_the_store_or_its_fallback_decided() {
    use crate::common::redis::{BlackHole, RedisServer};
    let up = Upstream::start("127.0.0.1", "up").await;
    let redis = RedisServer::start();
    let hole = BlackHole::start();
    let bucket = |store: &str| {
        format!("      bucket: {{ kind: token_bucket, key: [client_ip], capacity: 1000, refill: {{ amount: 1000, every: 1s }}, store: {store} }}\n")
    };
    let cfg = format!(
        "{SERVER}  access_log: {{ path: access.log }}\nstores:\n  live: {{ kind: redis, url: \"{}\", timeout: 1s }}\n  dead: {{ kind: redis, url: \"{}\", timeout: 50ms, fallback: local, deny_cache: 0 }}\norigins:\n  live:\n    hosts: [\"live.test\"]\n    upstreams: [\"{}\"]\n    limits:\n{}  dead:\n    hosts: [\"dead.test\"]\n    upstreams: [\"{}\"]\n    limits:\n{}  none:\n    hosts: [\"none.test\"]\n    upstreams: [\"{}\"]\n",
        redis.url(),
        hole.url(),
        up.addr,
        bucket("live"),
        up.addr,
        bucket("dead"),
        up.addr,
    );
    let t = Tollgate::start(&cfg).await;
    let url = t.url("/");
    for host in ["live.test", "dead.test", "none.test"] {
        let (status, _, _) = curl(&["-H", &format!("host: {host}"), &url]);
        assert_eq!(status, 200, "{host}");
    }
    let log = t.dir.path().join("access.log");
    wait_lines(&log, 3).await;
    let sources: Vec<Value> = json_lines(&log)
        .iter()
        .map(|l| l["source"].clone())
        .collect();
    assert_eq!(
        sources,
        [
            serde_json::json!("store"),
            serde_json::json!("fallback"),
            Value::Null
        ]
    );
}
