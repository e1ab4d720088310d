//! Issue 2: the metrics exposition passes `promtool check metrics`, and the shipped alert
//! rules pass their unit tests. promtool is required (`make test` installs it): a missing
//! promtool fails these tests rather than skipping them.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{client, Tollgate, Upstream, SERVER};

fn promtool() -> Command {
    Command::new("promtool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposition_passes_promtool_check_metrics() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let config = format!(
        r#"
{SERVER}stores:
  local: {{ snapshot: "state.snap", every: 1h }}
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{}"]
    customer: acme
    limits:
      conc: {{ kind: inflight, max: 10 }}
      per_client: {{ kind: rate, max: 1, per: 1m }}
"#,
        up.addr
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
    t.wait_metric(
        "tollgate_request_duration_seconds_count{origin=\"app\"}",
        2.0,
    )
    .await;
    let text = t.metrics_text().await;
    for family in [
        "tollgate_requests_total{code=\"200\",origin=\"app\"} 1",
        "tollgate_requests_total{code=\"429\",origin=\"app\"} 1",
        "tollgate_limit_decisions_total{decision=\"allowed\",kind=\"inflight\",limit=\"conc\",origin=\"app\"} 1",
        "tollgate_limit_decisions_total{decision=\"rejected\",kind=\"rate\",limit=\"per_client\",origin=\"app\"} 1",
        "tollgate_inflight_requests{origin=\"app\"} 0",
        "tollgate_request_duration_seconds_count{origin=\"app\"} 2",
        "tollgate_config_reloads_total{result=\"success\"} 0",
        "# TYPE tollgate_config_last_reload_success_timestamp_seconds gauge",
        "tollgate_snapshot_writes_total{result=\"error\"} 0",
        "tollgate_snapshot_loads_total{result=\"absent\"} 1",
        "tollgate_snapshot_keys{kind=\"token_bucket\"} 0",
        "# TYPE tollgate_snapshot_last_success_timestamp_seconds gauge",
    ] {
        assert!(text.contains(family), "missing `{family}` in\n{text}");
    }
    let mut child = promtool()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool must be installed (make test installs Debian's prometheus package)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = promtool()
        .args([
            "check",
            "rules",
            &format!("{root}/conf/prometheus/alerts.yml"),
        ])
        .output()
        .expect("promtool must be installed (make test installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = promtool()
        .args([
            "test",
            "rules",
            &format!("{root}/conf/prometheus/alerts_test.yml"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
