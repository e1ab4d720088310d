//! Issue 26: the access log and request IDs, through the real binary with a real upstream
//! and curl as the client. Every wait polls the log file or the metrics for an event.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::{eventually, Tollgate, Upstream, SERVER};

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
    eventually(&format!("{n} lines in {}", path.display()), 0, || async {
        std::fs::read_to_string(path).is_ok_and(|t| t.matches('\n').count() >= n)
    })
    .await;
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
