//! The Grafana dashboard `conf/grafana/tollgate.json`: every PromQL expression in it passes
//! `promtool check rules` (as recording rules in a temporary file), and every metric it
//! names is in a real scrape of the running binary, so a renamed metric fails here.
//! promtool and redis-server are required (`make test` installs them).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::redis as harness;

use std::collections::BTreeSet;
use std::process::Command;

use common::{client, free_port, Tollgate, Upstream, SERVER};
use harness::RedisServer;
use serde_json::Value;

fn dashboard() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/grafana/tollgate.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every string under an `expr` key (panel targets, annotations), and every templating
/// query (`label_values(...)`, not PromQL: only its metric is checked).
fn expressions(v: &Value, exprs: &mut Vec<String>, queries: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(e)) => exprs.push(e.clone()),
                    ("definition", Value::String(q)) => queries.push(q.clone()),
                    _ => expressions(v, exprs, queries),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| expressions(i, exprs, queries)),
        _ => {}
    }
}

/// `expr` with Grafana's variables replaced by what Prometheus would be sent.
fn substituted(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$instance", ".*")
        .replace("$origin", ".*")
}

/// The `tollgate_*` names in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("tollgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn every_expression_passes_promtool() {
    let (mut exprs, mut queries) = (Vec::new(), Vec::new());
    expressions(&dashboard(), &mut exprs, &mut queries);
    assert!(exprs.len() >= 20, "only {} expressions found", exprs.len());
    for e in &exprs {
        assert!(!substituted(e).contains('$'), "unknown variable in {e}");
    }
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({"record": format!("dashboard:expr_{i}"), "expr": substituted(e)}))
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dashboard_rules.yml");
    std::fs::write(&path, serde_yaml::to_string(&file).unwrap()).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool must be installed (make test installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool check rules failed on the dashboard's expressions:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // A broken expression is refused: the check can fail.
    std::fs::write(
        &path,
        "groups:\n- name: x\n  rules:\n  - record: x:y\n    expr: sum by (origin (tollgate_requests_total)\n",
    )
    .unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_names_is_in_a_real_scrape() {
    let (mut exprs, mut queries) = (Vec::new(), Vec::new());
    expressions(&dashboard(), &mut exprs, &mut queries);
    let wanted = metric_names(&format!("{}\n{}", exprs.join("\n"), queries.join("\n")));
    assert!(wanted.len() >= 25, "{wanted:?}");

    // A tollgate with every family live: a Redis store, the limiter API, a local-state
    // snapshot, and a limit of every kind, with traffic through each.
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let api = free_port();
    let config = format!(
        r#"{SERVER}  limiter_api: "127.0.0.1:{api}"
stores:
  local: {{ snapshot: "state.snap", every: 100ms }}
  shared: {{ url: "{url}", timeout: 1s }}
resources:
  seats: {{ kind: concurrency, max: 2 }}
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
    customer: acme
    limits:
      inflight: {{ kind: inflight, max: 10 }}
      rate: {{ kind: rate, max: 1, per: 1m }}
      fleet: {{ kind: rate, max: 100, per: 1m, store: shared }}
      bucket: {{ kind: token_bucket, capacity: 10, refill: {{ amount: 1, every: 1s }} }}
      tiers: {{ kind: tiered, tiers: [{{ limit: 10, window: 1s, active: 10s }}] }}
      seats: {{ kind: concurrency, max: 10, global: 20 }}
      caps: {{ kind: sliding_log, windows: [{{ max: 10, per: 1h }}] }}
"#,
        url = redis.url(),
        up = up.addr,
    );
    let t = Tollgate::start(&config).await;
    for _ in 0..2 {
        client()
            .get(t.url("/"))
            .header("host", "app.test")
            .send()
            .await
            .unwrap();
    }
    // A copy held over an open limiter API connection.
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{api}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let reply: redis::Value = redis::cmd("CH.RESERVE")
        .arg("seats")
        .arg("d1")
        .arg(1)
        .query(&mut con)
        .unwrap();
    assert!(!matches!(reply, redis::Value::ServerError(_)), "{reply:?}");

    // Polled: the snapshot and the store's first call come a moment after the requests.
    let mut missing = wanted.clone();
    for _ in 0..1_500 {
        let text = t.metrics_text().await;
        let scraped: BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        missing.retain(|w| !scraped.contains(w.as_str()));
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(con);
    assert!(
        missing.is_empty(),
        "the dashboard names metrics a real scrape lacks: {missing:?}"
    );
}
