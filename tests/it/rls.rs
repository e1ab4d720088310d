//! Envoy's rate limit service (issue 24) with a client the project did not write: Python's
//! grpcio and protobuf (`common/rls_client.py`) calling `ShouldRateLimit` and the gRPC
//! health check on `server.rls`, against envoyproxy/ratelimit's README examples read as
//! they are (units raised to an hour or a day where a count must not slide out of its
//! window on a loaded machine), a config directory rewritten under a running process, and
//! two processes sharing one Redis store, frozen or not.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::redis as harness;

use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use common::{eventually, free_port, Tollgate};
use harness::RedisServer;

const CLIENT: &str = include_str!("common/rls_client.py");

/// README examples 2, 3, 5, 6, 7 and 9, and one with `detailed_metric`.
const MESSAGING: &str = "domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

const PER_IP: &str = "domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 10
  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: hour
      requests_per_unit: 0
";

const INTERNAL: &str = "domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

const SHADOW: &str = "domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 2
          unit: hour
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 2
          unit: hour
";

const REPLACES: &str = "domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: hour
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: hour
";

const WILDCARD: &str = "domain: example9
descriptors:
  - key: path
    value: /api/*/action
    rate_limit:
      unit: hour
      requests_per_unit: 20
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
";

/// Writes `files` into `dir/rls/`.
fn write_rls(dir: &Path, files: &[(&str, &str)]) {
    let rls = dir.join("rls");
    std::fs::create_dir_all(&rls).unwrap();
    for (name, text) in files {
        std::fs::write(rls.join(name), text).unwrap();
    }
}

/// A config with the service on `rls_port`, `rls:` pointing at `rls/` and `extra` appended.
fn config(rls_port: u16, extra: &str) -> String {
    format!(
        "{}  rls: \"127.0.0.1:{rls_port}\"\norigins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"127.0.0.1:1\"]\nrls:\n  config_dir: rls\n{extra}",
        common::SERVER
    )
}

/// Starts tollgate with `files` in its `rls/` directory; returns it and the service's port
/// once the service accepts.
async fn start(files: &[(&str, &str)], extra: &str) -> (Tollgate, u16) {
    let dir = tempfile::tempdir().unwrap();
    write_rls(dir.path(), files);
    let port = free_port();
    let t = Tollgate::start_in(dir, &config(port, extra), |_| {}).await;
    eventually("the rate limit service accepts", 250, || async {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    (t, port)
}

/// Runs the Python client's `steps` against the service on `port`: one answer each.
fn run(port: u16, steps: Value) -> Vec<Value> {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(CLIENT)
        .arg(format!("127.0.0.1:{port}"))
        .arg(steps.to_string())
        .output()
        .expect("/usr/bin/python3 with grpcio and protobuf (scripts/deps.sh installs them)");
    assert!(out.status.success(), "python: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// One call of `descriptors` (lists of `[key, value]` entries) in `domain`, `repeat`
/// times; the last answer.
fn call(port: u16, domain: &str, descriptors: Value, repeat: u32) -> Value {
    let step = json!([{"call": {"domain": domain, "descriptors": descriptors}, "repeat": repeat}]);
    run(port, step).remove(0)
}

fn codes(answer: &Value) -> Vec<String> {
    answer["statuses"]
        .as_array()
        .unwrap_or_else(|| panic!("no statuses in {answer}"))
        .iter()
        .map(|s| s["code"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn readme_examples_answer_as_envoyproxy_ratelimit_documents() {
    let files = [
        ("messaging.yaml", MESSAGING),
        ("per_ip.yaml", PER_IP),
        ("internal.yml", INTERNAL),
        ("shadow.yaml", SHADOW),
        ("replaces.yaml", REPLACES),
        ("wildcard.yaml", WILDCARD),
    ];
    let (t, port) = start(&files, "").await;

    // Example 2: nested descriptors. The 6th marketing message to one number is over
    // the limit of 5 a day; the per-number limit of 100 still has 94 left.
    let both = json!([
        [["message_type", "marketing"], ["to_number", "2061111111"]],
        [["to_number", "2061111111"]]
    ]);
    let a = call(port, "messaging", both.clone(), 5);
    assert_eq!(a["overall"], "OK", "{a}");
    assert_eq!(a["statuses"][0]["remaining"], 0);
    let a = call(port, "messaging", both, 1);
    assert_eq!(a["overall"], "OVER_LIMIT", "{a}");
    assert_eq!(codes(&a), ["OVER_LIMIT", "OK"]);
    assert_eq!(a["statuses"][0]["limit"], 5);
    assert_eq!(a["statuses"][0]["unit"], 4, "DAY");
    assert_eq!(a["statuses"][1]["limit"], 100);
    assert_eq!(a["statuses"][1]["remaining"], 94);
    assert!(a["statuses"][1]["reset"].as_f64().unwrap() > 0.0, "{a}");
    // Another number has its own count.
    let a = call(
        port,
        "messaging",
        json!([[["message_type", "marketing"], ["to_number", "2062222222"]]]),
        1,
    );
    assert_eq!(a["statuses"][0]["remaining"], 4, "{a}");
    // Example 4: a descriptor deeper than the tree matches nothing.
    let a = call(
        port,
        "messaging",
        json!([[["to_number", "1"], ["extra", "x"]]]),
        1,
    );
    assert_eq!(a["statuses"][0], json!({"code": "OK", "remaining": 0}));

    // Example 3: the most specific match wins: key and value before key alone.
    let a = call(
        port,
        "edge_proxy_per_ip",
        json!([[["remote_address", "50.0.0.5"]]]),
        1,
    );
    assert_eq!(a["overall"], "OVER_LIMIT", "{a}");
    assert_eq!(a["statuses"][0]["limit"], 0);
    let a = call(
        port,
        "edge_proxy_per_ip",
        json!([[["remote_address", "50.0.0.1"]]]),
        10,
    );
    assert_eq!(a["overall"], "OK", "{a}");
    assert_eq!(a["statuses"][0]["limit"], 10);
    let a = call(
        port,
        "edge_proxy_per_ip",
        json!([[["remote_address", "50.0.0.1"]]]),
        1,
    );
    assert_eq!(a["overall"], "OVER_LIMIT", "{a}");

    // Example 5: unlimited is OK with u32::MAX remaining and no limit.
    let a = call(port, "internal", json!([[["ldap", "x"]]]), 3);
    assert_eq!(
        a["statuses"][0],
        json!({"code": "OK", "remaining": 4294967295u32})
    );

    // Example 6: shadow_mode answers OK over the limit; the enforced twin does not.
    let a = call(
        port,
        "example6",
        json!([[["service", "s"], ["user", "user-a"]]]),
        3,
    );
    assert_eq!(a["overall"], "OK", "{a}");
    assert_eq!(a["statuses"][0]["limit"], 2);
    let a = call(
        port,
        "example6",
        json!([[["service", "s"], ["user", "user-b"]]]),
        3,
    );
    assert_eq!(a["overall"], "OVER_LIMIT", "{a}");

    // Example 7: with both rules matched, the replaced one is not evaluated (nor
    // counted): 6 calls pass under the replacing 10, and the named rule alone still
    // allows its 5.
    let both = json!([
        [["key_1", "value_1"], ["user", "bkthomps"]],
        [["key_2", "value_2"], ["user", "bkthomps"]]
    ]);
    let a = call(port, "example7", both, 6);
    assert_eq!(a["overall"], "OK", "{a}");
    assert_eq!(a["statuses"][0], json!({"code": "OK", "remaining": 0}));
    assert_eq!(a["statuses"][1]["limit"], 10);
    assert_eq!(a["statuses"][1]["remaining"], 4);
    let a = call(
        port,
        "example7",
        json!([[["key_1", "value_1"], ["user", "bkthomps"]]]),
        1,
    );
    assert_eq!(a["statuses"][0]["remaining"], 4, "{a}");

    // Example 9: a middle wildcard; example 11: share_threshold shares one count.
    let a = call(port, "example9", json!([[["path", "/api/123/action"]]]), 1);
    assert_eq!(a["statuses"][0]["limit"], 20, "{a}");
    let a = call(port, "example9", json!([[["path", "/api/123/other"]]]), 1);
    assert_eq!(a["statuses"][0], json!({"code": "OK", "remaining": 0}));
    call(port, "example9", json!([[["files", "files/a.pdf"]]]), 2);
    let a = call(port, "example9", json!([[["files", "files/b.csv"]]]), 1);
    assert_eq!(a["statuses"][0]["remaining"], 0, "{a}");
    let a = call(port, "example9", json!([[["files", "files/c.txt"]]]), 1);
    assert_eq!(a["overall"], "OVER_LIMIT", "{a}");

    // Unknown domain or descriptor: OK, as upstream answers.
    let a = call(port, "nobody", json!([[["a", "b"]]]), 1);
    assert_eq!(
        a,
        json!({"overall": "OK", "statuses": [{"code": "OK", "remaining": 0}]})
    );
    let a = call(port, "internal", json!([[["unknown", "b"]]]), 1);
    assert_eq!(a["overall"], "OK");

    // Metrics: per rule path, never per request value.
    let m = t.metrics_text().await;
    assert!(
        m.contains(r#"tollgate_rls_hits_total{descriptor="messaging.message_type_marketing.to_number",domain="messaging",result="over_limit"} 1"#),
        "{m}"
    );
    assert!(m.contains(r#"tollgate_rls_hits_total{descriptor="example6.service.user_user-a",domain="example6",result="shadow_mode"} 1"#), "{m}");
    assert!(
        m.contains(r#"tollgate_rls_requests_total{code="ok",domain="_unknown"} 1"#),
        "{m}"
    );
    assert!(!m.contains("2061111111"), "a request value became a label");
}

#[tokio::test]
async fn hits_addend_counts_per_request_and_per_descriptor() {
    let (_t, port) = start(&[("messaging.yaml", MESSAGING)], "").await;
    let d = json!([[["to_number", "1"]]]);
    let steps = json!([
        {"call": {"domain": "messaging", "descriptors": d, "hits_addend": 60}},
        {"call": {"domain": "messaging", "descriptors": d, "hits_addend": 60}},
        {"call": {"domain": "messaging", "descriptors": [[["to_number", "2"]]], "hits_addend": 60, "descriptor_hits": [30]}},
    ]);
    let out = run(port, steps);
    assert_eq!(out[0]["statuses"][0]["remaining"], 40, "{out:?}");
    // 60 more do not fit in the 40 left: over, and (not strict) nothing is taken.
    assert_eq!(out[1]["overall"], "OVER_LIMIT", "{out:?}");
    assert_eq!(out[1]["statuses"][0]["remaining"], 40);
    // A descriptor's own hits_addend wins over the request's.
    assert_eq!(out[2]["statuses"][0]["remaining"], 70, "{out:?}");
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_and_health_is_served() {
    let (t, port) = start(&[("messaging.yaml", MESSAGING)], "").await;
    let many: Vec<Value> = (0..100).map(|i| json!([["k", i.to_string()]])).collect();
    let steps = json!([
        {"call": {"domain": "", "descriptors": [[["a", "b"]]]}},
        {"call": {"domain": "messaging", "descriptors": []}},
        {"call": {"domain": "messaging", "descriptors": [[["", "b"]]]}},
        {"call": {"domain": "messaging", "descriptors": many}},
        {"health": ""},
        {"health": "envoy.service.ratelimit.v3.RateLimitService"},
        {"health": "no.such.Service"},
    ]);
    let out = run(port, steps);
    for a in &out[..4] {
        assert_eq!(a["error"], "INVALID_ARGUMENT", "{out:?}");
    }
    assert_eq!(out[4]["status"], "SERVING");
    assert_eq!(out[5]["status"], "SERVING");
    assert_eq!(out[6]["error"], "NOT_FOUND");
    let invalid = r#"tollgate_rls_requests_total{code="invalid",domain="_unknown"}"#;
    assert_eq!(t.metric(invalid).await, 4.0);
}

#[tokio::test]
async fn a_changed_config_dir_reloads_live_and_a_broken_file_is_refused_at_its_line() {
    let (t, port) = start(&[("messaging.yaml", MESSAGING)], "").await;
    let d = json!([[["to_number", "1"]]]);
    assert_eq!(
        call(port, "messaging", d.clone(), 1)["statuses"][0]["limit"],
        100
    );
    // A new domain's file appears, and an existing one changes its limit.
    write_rls(t.dir.path(), &[("per_ip.yaml", PER_IP)]);
    std::fs::write(
        t.dir.path().join("rls/messaging.yaml"),
        MESSAGING.replace("requests_per_unit: 100", "requests_per_unit: 7"),
    )
    .unwrap();
    eventually("the new domain and limit are served", 500, || async {
        let a = call(
            port,
            "edge_proxy_per_ip",
            json!([[["remote_address", "1.2.3.4"]]]),
            1,
        );
        let b = call(port, "messaging", d.clone(), 1);
        a["statuses"][0]["limit"] == 10 && b["statuses"][0]["limit"] == 7
    })
    .await;
    // The count carried over the reload (same rule, same window): 1 + the polls so far.
    let b = call(port, "messaging", d.clone(), 1);
    assert!(b["statuses"][0]["remaining"].as_u64().unwrap() < 6, "{b}");

    // A broken file is refused with its file, line and column; the old rules keep serving.
    let before = t
        .metric(r#"tollgate_config_reloads_total{result="failure"}"#)
        .await;
    std::fs::write(
        t.dir.path().join("rls/per_ip.yaml"),
        PER_IP.replace("unit: hour", "unit: fortnight"),
    )
    .unwrap();
    t.wait_metric(
        r#"tollgate_config_reloads_total{result="failure"}"#,
        before + 1.0,
    )
    .await;
    let log = t.log_text();
    assert!(
        log.contains("rls/per_ip.yaml:5:13: descriptors[0].rate_limit.unit: invalid rate limit unit `fortnight`"),
        "{log}"
    );
    let a = call(
        port,
        "edge_proxy_per_ip",
        json!([[["remote_address", "1.2.3.4"]]]),
        1,
    );
    assert_eq!(a["statuses"][0]["limit"], 10);
}

#[test]
fn check_names_the_ratelimit_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    write_rls(
        dir.path(),
        &[
            ("a.yaml", MESSAGING),
            (
                "b.yaml",
                "domain: messaging\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unlimited: true}\n  - value: v\n  - key: k\n    shadow: true\n",
            ),
        ],
    );
    let path = dir.path().join("tollgate.yaml");
    let text = config(free_port(), "")
        .replace("{listen}", "127.0.0.1:1")
        .replace("{metrics}", "127.0.0.1:2");
    std::fs::write(&path, &text).unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let b = dir.path().join("rls/b.yaml").display().to_string();
    for want in [
        format!("{b}:1:1: domain: domain `messaging` is defined in another file too"),
        format!("{b}:4:24: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited"),
        format!("{b}:5:5: descriptors[1].key: descriptor has empty key"),
        format!("{b}:6:5: descriptors[2]: duplicate descriptor composite key `messaging.k`"),
        format!("{b}:7:5: descriptors[2].shadow: unknown key `shadow`"),
    ] {
        assert!(err.contains(&want), "missing {want:?} in:\n{err}");
    }

    // The shipped example directory is a valid one.
    let conf = format!("{}/conf/rls", env!("CARGO_MANIFEST_DIR"));
    std::fs::write(
        &path,
        text.replace("config_dir: rls", &format!("config_dir: {conf}")),
    )
    .unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `stores: fleet` on `redis_url` with a short budget, and `rls.store: fleet`.
fn fleet(redis_url: &str) -> String {
    format!(
        "  store: fleet\nstores:\n  fleet:\n    kind: redis\n    url: {redis_url}\n    timeout: 100ms\n    breaker: {{ failures: 3, probe_every: 100ms }}\n    fallback: allow\n    deny_cache: 0\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tollgates_share_one_count_in_redis_and_fail_open_when_it_freezes() {
    let mut redis = RedisServer::start();
    let files = [("messaging.yaml", MESSAGING)];
    let (a, pa) = start(&files, &fleet(&redis.url())).await;
    let (_b, pb) = start(&files, &fleet(&redis.url())).await;
    let d = json!([[["message_type", "marketing"], ["to_number", "9"]]]);
    assert_eq!(
        call(pa, "messaging", d.clone(), 3)["statuses"][0]["remaining"],
        2
    );
    // The other process sees the same count: 2 more fit, the 6th in all is over.
    assert_eq!(
        call(pb, "messaging", d.clone(), 2)["statuses"][0]["remaining"],
        0
    );
    let over = call(pb, "messaging", d.clone(), 1);
    assert_eq!(over["overall"], "OVER_LIMIT", "{over}");
    let over = call(pa, "messaging", d.clone(), 1);
    assert_eq!(over["overall"], "OVER_LIMIT", "{over}");

    // Redis frozen: each answer comes within the budget's fallback (`allow`): OK.
    redis.freeze();
    let fell_back = "tollgate_store_fallback_decisions_total{store=\"fleet\"}";
    let before = a.metric(fell_back).await;
    let started = std::time::Instant::now();
    let open = call(pa, "messaging", d.clone(), 3);
    assert_eq!(open["overall"], "OK", "{open}");
    // A deadline that catches a call waiting on the frozen Redis, not a latency figure.
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(a.metric(fell_back).await >= before + 3.0);
    redis.thaw();
    eventually("Redis decides again", 500, || async {
        call(pa, "messaging", d.clone(), 1)["overall"] == "OVER_LIMIT"
    })
    .await;
}

/// A roomy per-tenant rule: one tenant's descriptor is decided hundreds of times a second.
const BULK: &str = "domain: bulk
descriptors:
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 1000000
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_descriptor_in_redis_is_decided_from_a_leased_slice() {
    let redis = RedisServer::start();
    let (_t, port) = start(&[("bulk.yaml", BULK)], &fleet(&redis.url())).await;
    let d = json!([[["tenant", "acme"]]]);
    assert_eq!(call(port, "bulk", d.clone(), 1)["overall"], "OK");
    let before = redis.script_calls();
    let answer = call(port, "bulk", d.clone(), 600);
    assert_eq!(answer["overall"], "OK", "{answer}");
    let calls = redis.script_calls() - before;
    // Exact, this is 600 calls. Leased (`lease: auto`, the default on a Redis store), a
    // hot descriptor takes slices of about 100 ms of its rate, renewed in the background:
    // the calls before it turns hot (8 in a 400 ms window) and one per renewal.
    assert!(calls < 200, "{calls} script calls for 600 decisions");
}

#[tokio::test]
async fn detailed_metric_keeps_the_heaviest_descriptors_for_the_admin_api() {
    let admin = free_port();
    let dir = tempfile::tempdir().unwrap();
    write_rls(dir.path(), &[("wildcard.yaml", WILDCARD)]);
    let port = free_port();
    let text = config(port, "").replace(
        "  rls: ",
        &format!("  admin: \"127.0.0.1:{admin}\"\n  rls: "),
    );
    let _t = Tollgate::start_in(dir, &text, |_| {}).await;
    eventually("the rate limit service accepts", 250, || async {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    call(port, "example9", json!([[["key1", "heavy"]]]), 12);
    call(port, "example9", json!([[["key1", "light"]]]), 1);
    let url = format!("http://127.0.0.1:{admin}/limits/_rls/example9.key1/top");
    let top: Value = common::client()
        .get(&url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(top["by_admitted"][0]["key"], "key1_heavy", "{top}");
    assert_eq!(top["by_admitted"][0]["admitted"], 10, "{top}");
    assert_eq!(top["by_rejected"][0]["key"], "key1_heavy", "{top}");
    // A rule without detailed_metric keeps none.
    let url = format!("http://127.0.0.1:{admin}/limits/_rls/example9.files_files%2F%2A/top");
    let status = common::client().get(&url).send().await.unwrap().status();
    assert_eq!(status, 404);
}

#[tokio::test]
async fn hostile_input_is_refused_and_the_service_keeps_answering() {
    let (_t, port) = start(&[("messaging.yaml", MESSAGING)], "").await;
    // domain = 0xff 0xfe: not UTF-8.
    let bad_utf8 = "0a02fffe";
    // A domain announced as 128 KiB: past the 64 KiB message bound.
    // 4 000 descriptors (40 KB, within the message bound), and one of 2 000 entries.
    let many = vec![json!([["k", "1"]]); 4_000];
    let wide = vec![json!(["k", "1"]); 2_000];
    let steps = json!([
        {"raw": bad_utf8},
        {"raw": "ffffff"},
        {"raw": "0a808008", "pad": 128 * 1024},
        {"silent": 60},
        {"call": {"domain": "messaging", "descriptors": [[["to_number", "1"]]]}},
        {"call": {"domain": "messaging", "descriptors": many}},
        {"call": {"domain": "messaging", "descriptors": [wide]}},
        {"call": {"domain": "messaging", "descriptors": [[["to_number", "1"]]]}},
    ]);
    let out = run(port, steps);
    // Undecodable protobuf: INTERNAL from the codec, as grpc-go (envoyproxy/ratelimit)
    // answers it too.
    assert_eq!(out[0]["error"], "INTERNAL", "{out:?}");
    assert_eq!(out[1]["error"], "INTERNAL", "{out:?}");
    assert_eq!(out[2]["error"], "OUT_OF_RANGE", "{out:?}");
    // A call whose request never comes is ended by the server's call timeout (5 s), long
    // before the client's own 60 s.
    assert_ne!(out[3]["error"], "DEADLINE_EXCEEDED", "{out:?}");
    assert!(out[3]["seconds"].as_f64().unwrap() < 50.0, "{out:?}");
    assert_eq!(out[4]["statuses"][0]["limit"], 100, "{out:?}");
    // Past the descriptor and entry bounds: INVALID_ARGUMENT, nothing counted.
    assert_eq!(out[5]["error"], "INVALID_ARGUMENT", "{out:?}");
    assert!(
        out[5]["details"]
            .as_str()
            .unwrap()
            .contains("4000 descriptors"),
        "{out:?}"
    );
    assert_eq!(out[6]["error"], "INVALID_ARGUMENT", "{out:?}");
    assert_eq!(out[7]["statuses"][0]["remaining"], 98, "{out:?}");
}

#[tokio::test]
async fn local_counts_survive_a_restart_in_the_snapshot() {
    let extra = "stores:\n  local: { snapshot: limits.snap, every: 1h }\n";
    let (mut t, port) = start(&[("messaging.yaml", MESSAGING)], extra).await;
    let d = json!([[["to_number", "1"]]]);
    assert_eq!(
        call(port, "messaging", d.clone(), 3)["statuses"][0]["remaining"],
        97
    );
    // SIGTERM writes the snapshot; the next process loads it.
    t.signal(libc::SIGTERM);
    assert!(t.wait_exit().await.success());
    t.restart().await;
    assert!(t.log_text().contains("restored 1 keys"), "{}", t.log_text());
    eventually("the rate limit service accepts again", 250, || async {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    assert_eq!(
        call(port, "messaging", d, 1)["statuses"][0]["remaining"],
        96
    );
}

/// A rule of 2 a second, so that a window's boundary comes every second; `k` is counted,
/// `probe` only reads the time to the boundary.
const BURST: &str = "domain: burst
descriptors:
  - key: k
    rate_limit:
      unit: second
      requests_per_unit: 2
";

/// Just before a second's boundary: 3 calls of `k`; then, just after it, 3 more. Returns
/// the answers: the boundary wait, the 3 before, the crossing, the 3 after. A machine too
/// loaded to make the 3 calls before the boundary, or the first after it within half a
/// second, gets another try (up to 5, each with its own key).
fn across_a_boundary(port: u16) -> Vec<Value> {
    let to_boundary = |a: &Value| {
        let reset = code_and_reset(a).1;
        reset - reset.floor()
    };
    let mut out = Vec::new();
    for attempt in 0..5 {
        let probe = json!({"domain": "burst", "descriptors": [[["k", "probe"]]]});
        let k = json!({"domain": "burst", "descriptors": [[["k", format!("x{attempt}")]]]});
        let once = json!({"call": k});
        out = run(
            port,
            json!([
                {"before_boundary": probe, "within": 0.45},
                once, once, once,
                {"after_boundary": probe},
                once, once, once,
            ]),
        );
        // The probe and the 3 calls in one window: their times to the boundary never rise
        // (a probe answered 1 ms before it, with the calls landing after it, is a miss).
        let before: Vec<f64> = out[0..4].iter().map(to_boundary).collect();
        let in_time = before.windows(2).all(|w| w[1] <= w[0]) && to_boundary(&out[5]) > 0.5;
        if in_time {
            return out;
        }
    }
    out
}

fn code_and_reset(answer: &Value) -> (String, f64) {
    let s = &answer["statuses"][0];
    (
        s["code"].as_str().unwrap_or("none").to_string(),
        s["reset"].as_f64().unwrap_or(-1.0),
    )
}

/// The answers of [`across_a_boundary`] under a fixed window: a full quota on each side,
/// `duration_until_reset` counting down to the boundary.
fn assert_fixed(out: &[Value], what: &str) {
    let codes: Vec<String> = out.iter().map(|a| code_and_reset(a).0).collect();
    assert_eq!(codes[1..4], ["OK", "OK", "OVER_LIMIT"], "{what}: {out:?}");
    assert_eq!(
        codes[5..8],
        ["OK", "OK", "OVER_LIMIT"],
        "{what}: the new window's full quota: {out:?}"
    );
    // Before the boundary the reset is what is left of the second (under 0.45 s); after
    // it, nearly a whole second, and it only counts down.
    let resets: Vec<f64> = out.iter().map(|a| code_and_reset(a).1).collect();
    let before = out[0]["to_boundary"].as_f64().unwrap();
    assert!(resets[1] <= before && resets[1] > 0.0, "{what}: {out:?}");
    assert!(
        resets[1..4].windows(2).all(|w| w[1] <= w[0]),
        "{what}: {out:?}"
    );
    assert!(resets[5] > 0.5 && resets[5] <= 1.0, "{what}: {out:?}");
    assert!(
        resets[5..8].windows(2).all(|w| w[1] <= w[0]),
        "{what}: {out:?}"
    );
}

/// `window: fixed` (local, in Redis, and in the fallback of a frozen Redis): a full quota
/// on each side of the boundary (the documented double burst), `duration_until_reset`
/// counting down to the boundary. The default sliding window: the calls before the
/// boundary still weigh after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_resets_at_the_unit_boundary_and_a_sliding_one_does_not() {
    let mut redis = RedisServer::start();
    let fixed_redis = format!("  window: fixed\n{}", fleet(&redis.url()));
    for extra in ["  window: fixed\n", fixed_redis.as_str()] {
        let (_t, port) = start(&[("burst.yaml", BURST)], extra).await;
        assert_fixed(&across_a_boundary(port), extra);
    }
    // Redis frozen, `fallback: local`: the fallback counts the same fixed windows.
    let fallback = fixed_redis.replace("fallback: allow", "fallback: local");
    let (t, port) = start(&[("burst.yaml", BURST)], &fallback).await;
    redis.freeze();
    // Calls time out until the breaker opens; from then on the fallback answers at once.
    let probe = json!([[["k", "warm-up"]]]);
    eventually("the breaker opens", 100, || async {
        call(port, "burst", probe.clone(), 1);
        t.metric("tollgate_store_up{store=\"fleet\"}").await == 0.0
    })
    .await;
    let fell_back = "tollgate_store_fallback_decisions_total{store=\"fleet\"}";
    assert_fixed(&across_a_boundary(port), "fallback");
    assert!(t.metric(fell_back).await >= 6.0);
    redis.thaw();

    let (_t, port) = start(&[("burst.yaml", BURST)], "").await;
    let out = across_a_boundary(port);
    let codes: Vec<String> = out.iter().map(|a| code_and_reset(a).0).collect();
    assert_eq!(codes[1..4], ["OK", "OK", "OVER_LIMIT"], "{out:?}");
    // Just after the boundary the two calls still weigh nearly 2: no room (room for one
    // comes only half a second in).
    assert_eq!(codes[5], "OVER_LIMIT", "sliding: {out:?}");
    // A sliding window empties a whole unit after the boundary: the reset exceeds 1 s.
    assert!(code_and_reset(&out[1]).1 > 1.0, "{out:?}");
}

/// `server.rls: {addr, tls: true}`: grpcio with `ssl_channel_credentials` (the test
/// certificate as its root) calls `ShouldRateLimit` over TLS; a plaintext client against
/// the same port gets no answer.
#[tokio::test]
async fn tls_on_the_service_port_answers_grpcio_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    write_rls(dir.path(), &[("messaging.yaml", MESSAGING)]);
    let cert = common::certs::write(dir.path(), "rls", "localhost", &["localhost"], 30);
    let port = free_port();
    let tls = format!(
        "tls:\n  certificates:\n    - {{ cert: {}, key: {} }}\n  default: {}\n",
        cert.cert.display(),
        cert.key.display(),
        cert.cert.display()
    );
    let text = config(port, &tls).replace(
        &format!("  rls: \"127.0.0.1:{port}\""),
        &format!("  rls: {{ addr: \"127.0.0.1:{port}\", tls: true }}"),
    );
    assert!(text.contains("tls: true }"), "{text}");
    let _t = Tollgate::start_in(dir, &text, |_| {}).await;
    eventually("the rate limit service accepts", 250, || async {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    let steps = json!([
        {"call": {"domain": "messaging", "descriptors": [[["to_number", "1"]]]}, "repeat": 3},
        {"health": ""},
    ]);
    let run_tls = |steps: &Value| {
        Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(CLIENT)
            .arg(format!("127.0.0.1:{port}"))
            .arg(steps.to_string())
            .arg(&cert.cert)
            .output()
            .unwrap()
    };
    let out = run_tls(&steps);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["statuses"][0]["remaining"], 97, "{lines:?}");
    assert_eq!(lines[1]["status"], "SERVING", "{lines:?}");
    // Plaintext HTTP/2 against the TLS port: the handshake fails, no answer.
    let plain = run(
        port,
        json!([{"call": {"domain": "messaging", "descriptors": [[["to_number", "1"]]]}}]),
    );
    assert_eq!(plain[0]["error"], "UNAVAILABLE", "{plain:?}");
    // The count did not move for it.
    let again =
        run_tls(&json!([{"call": {"domain": "messaging", "descriptors": [[["to_number", "1"]]]}}]));
    let again: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["statuses"][0]["remaining"], 96, "{again}");
}

/// gRPC server reflection: a client with no protos lists the services, fetches the rate
/// limit service's files by reflection, builds a request from them and is answered.
#[tokio::test]
async fn reflection_lets_a_client_without_protos_call_the_service() {
    let (_t, port) = start(&[("messaging.yaml", MESSAGING)], "").await;
    let steps = json!([
        {"reflect": {"domain": "messaging", "descriptors": [[["to_number", "1"]]]}},
        {"call": {"domain": "messaging", "descriptors": [[["to_number", "1"]]]}},
    ]);
    let out = run(port, steps);
    let services = out[0]["services"].as_array().unwrap();
    for want in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "grpc.health.v1.Health",
    ] {
        assert!(services.iter().any(|s| s == want), "{want}: {out:?}");
    }
    assert_eq!(out[0]["overall"], "OK", "{out:?}");
    assert_eq!(out[0]["remaining"], json!([99]), "{out:?}");
    // The call built from reflected descriptors counted like any other.
    assert_eq!(out[1]["statuses"][0]["remaining"], 98, "{out:?}");
}

/// Three rules, each on its own descriptor key.
const TRIO: &str = "domain: trio
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: path
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: region
    rate_limit: { unit: hour, requests_per_unit: 100 }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shared_descriptors_of_one_call_cost_one_round_trip() {
    let redis = RedisServer::start();
    let relay = common::relay::Relay::start(([127, 0, 0, 1], redis.port()).into());
    // A budget roomy for a debug build on a busy machine (no fallback), no breaker trips,
    // no deny cache; every key is new (cold: no lease): every descriptor is a script call.
    let store = format!(
        "  store: fleet\nstores:\n  fleet:\n    kind: redis\n    url: {}\n    timeout: 1s\n    breaker: {{ failures: 1000, probe_every: 50ms }}\n    deny_cache: 0\n",
        relay.url()
    );
    let (_t, port) = start(&[("trio.yaml", TRIO)], &store).await;
    const CALLS: u64 = 10;
    let steps: Vec<Value> = (0..CALLS)
        .map(|i| {
            let d = json!([
                [["user", format!("u{i}")]],
                [["path", format!("/p{i}")]],
                [["region", format!("r{i}")]]
            ]);
            json!({"call": {"domain": "trio", "descriptors": d}, "repeat": 1})
        })
        .collect();
    let (turns, scripts) = (relay.turns(), redis.script_calls());
    let answers = run(port, Value::Array(steps));
    let (turns, scripts) = (relay.turns() - turns, redis.script_calls() - scripts);
    for answer in &answers {
        assert_eq!(codes(answer), ["OK", "OK", "OK"], "{answer}");
        for s in answer["statuses"].as_array().unwrap() {
            assert_eq!(s["remaining"], 99, "decided in Redis, once: {answer}");
        }
    }
    assert_eq!(scripts, 3 * CALLS, "every descriptor decided in Redis");
    assert_eq!(
        turns, CALLS,
        "one round trip per call, not one per descriptor ({scripts} script calls)"
    );
}
