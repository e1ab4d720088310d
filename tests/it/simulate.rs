//! `tollgate simulate`, run as the binary: replayed counts checked against an independent
//! model of the limits (token buckets computed here, second by second), both log formats,
//! `--json`, `--compare`, unparseable and overlong lines with their numbers, time going
//! backwards, the origin of lines without a host, shared stores simulated locally, and the
//! errors a missing file gives.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// 2026-09-21T14:13:20Z: the pattern's second 0.
const T0: u64 = 1_790_000_000;
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Unix seconds as the common log format's time, by the textbook civil-from-days
/// conversion (the simulator parses it with the inverse).
fn clf(t: u64) -> String {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{d:02}/{}/{y}:{:02}:{:02}:{:02} +0000",
        MONTHS[(m - 1) as usize],
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Requests of the heavy client A in second `s`: a repeating pattern of bursts and pauses.
fn a_at(s: u64) -> u64 {
    [0, 3, 1, 7, 0, 0, 2, 9, 4, 1][(s % 10) as usize]
}

/// Client B: one request every other second, never limited.
fn b_at(s: u64) -> u64 {
    u64::from(s.is_multiple_of(2))
}

const SECONDS: u64 = 120;
const A: &str = "203.0.113.10";
const B: &str = "198.51.100.20";

/// The requests of the pattern, in time order: (second, client).
fn pattern() -> Vec<(u64, &'static str)> {
    let mut out = Vec::new();
    for s in 0..SECONDS {
        for _ in 0..b_at(s) {
            out.push((s, B));
        }
        for _ in 0..a_at(s) {
            out.push((s, A));
        }
    }
    out
}

fn combined_log(reqs: &[(u64, &str)]) -> String {
    reqs.iter()
        .map(|(s, ip)| {
            format!(
                "{ip} - - [{}] \"GET /items?id={s} HTTP/1.1\" 200 512 \"-\" \"test-agent/1.0\"\n",
                clf(T0 + s)
            )
        })
        .collect()
}

fn jsonl_log(reqs: &[(u64, &str)]) -> String {
    reqs.iter()
        .enumerate()
        .map(|(i, (s, ip))| {
            // Alternate the two time spellings and the two client-IP fields.
            if i % 2 == 0 {
                format!(
                    "{{\"time\":{},\"remote_addr\":\"{ip}\",\"method\":\"GET\",\"path\":\"/items\",\"status\":200}}\n",
                    T0 + s
                )
            } else {
                format!(
                    "{{\"time\":\"{}\",\"client_ip\":\"{ip}\",\"request\":\"GET /items?x HTTP/1.1\"}}\n",
                    clf(T0 + s)
                )
            }
        })
        .collect()
}

/// What one token bucket (capacity `c`, one token a second) decides for one client,
/// computed independently: whole-second arrivals, so refills are `seconds elapsed`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Model {
    allowed: u64,
    rejected: u64,
}

fn bucket_model(c: u64, arrivals: impl Iterator<Item = u64>) -> Model {
    let mut m = Model::default();
    let (mut tokens, mut last) = (c, 0);
    for t in arrivals {
        tokens = (tokens + (t - last)).min(c);
        last = t;
        if tokens >= 1 {
            tokens -= 1;
            m.allowed += 1;
        } else {
            m.rejected += 1;
        }
    }
    m
}

/// A token bucket with discrete refills of one token every `every` seconds, as
/// documented: a full bucket restarts its refill clock.
struct Bucket {
    capacity: u64,
    every: u64,
    tokens: u64,
    last: Option<u64>,
}

impl Bucket {
    fn new(capacity: u64, every: u64) -> Bucket {
        Bucket {
            capacity,
            every,
            tokens: capacity,
            last: None,
        }
    }

    fn take(&mut self, t: u64) -> bool {
        let last = self.last.unwrap_or(t);
        let n = (t - last) / self.every;
        self.tokens = (self.tokens + n).min(self.capacity);
        self.last = Some(if self.tokens == self.capacity {
            t
        } else {
            last + n * self.every
        });
        let ok = self.tokens >= 1;
        if ok {
            self.tokens -= 1;
        }
        ok
    }
}

fn a_arrivals() -> impl Iterator<Item = u64> {
    (0..SECONDS).flat_map(|s| std::iter::repeat_n(s, a_at(s) as usize))
}

fn config(capacity: u64) -> String {
    format!(
        r#"
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["127.0.0.1:9"]
    limits:
      per_client:
        kind: token_bucket
        key: [client_ip]
        capacity: {capacity}
        refill: {{ amount: 1, every: 1s }}
"#
    )
}

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().unwrap())
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

fn simulate(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String, String) {
    let mut cmd = Command::new(common::binary());
    cmd.arg("simulate");
    for a in args {
        cmd.arg(a);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Value {
    let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = args.to_vec();
    all.push(&"--json");
    let (code, out, err) = simulate(&all);
    assert_eq!(code, 0, "stderr: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn limit<'a>(report: &'a Value, origin: &str, name: &str) -> &'a Value {
    report["origins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == origin)
        .and_then(|o| {
            o["limits"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["name"] == name)
        })
        .unwrap_or_else(|| panic!("no limit {origin}/{name} in {report:#}"))
}

/// Checks a one-config report of the pattern against the model.
fn assert_matches_model(report: &Value, capacity: u64) {
    let model = bucket_model(capacity, a_arrivals());
    let b_total: u64 = (0..SECONDS).map(b_at).sum();
    let l = limit(report, "app", "per_client");
    assert!(model.rejected > 0, "the pattern must exceed the bucket");
    assert_eq!(l["allowed"], model.allowed + b_total, "{l:#}");
    assert_eq!(l["rejected"], model.rejected, "{l:#}");
    assert_eq!(l["shadow_rejected"], 0);
    // Every rejection is client A's, retried within the second a refill takes.
    let top = l["top_rejected"].as_array().unwrap();
    assert_eq!(top.len(), 1, "{l:#}");
    assert_eq!(top[0]["key"], format!("client_ip={A}"));
    assert_eq!(top[0]["count"], model.rejected);
    assert_eq!(
        l["retry_after"],
        serde_json::json!([{"seconds": "1", "count": model.rejected}])
    );
    let peak = (0..SECONDS).map(|s| a_at(s) + b_at(s)).max().unwrap();
    let origin = &report["origins"][0];
    assert_eq!(origin["peak_rps"], peak);
    assert_eq!(origin["requests"], model.allowed + model.rejected + b_total);
    assert_eq!(report["input"]["unparseable"], 0);
    assert_eq!(report["input"]["clamped"], 0);
}

#[test]
fn combined_log_matches_an_independent_token_bucket_model() {
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", &config(5));
    let log = dir.file("access.log", &combined_log(&pattern()));
    let report = json(&[&"--config", &cfg, &"--log", &log]);
    assert_matches_model(&report, 5);
    assert_eq!(report["start"], "2026-09-21T14:13:20Z");
    // The table for people carries the same numbers.
    let (code, table, _) = simulate(&[&"--config", &cfg, &"--log", &log]);
    assert_eq!(code, 0);
    let model = bucket_model(5, a_arrivals());
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with("per_client ") && l.contains("token_bucket"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.split_whitespace()
            .any(|w| w == model.rejected.to_string()),
        "{row}"
    );
}

#[test]
fn jsonl_log_gives_the_same_answer() {
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", &config(5));
    let log = dir.file("access.jsonl", &jsonl_log(&pattern()));
    let report = json(&[&"--config", &cfg, &"--log", &log, &"--format", &"jsonl"]);
    assert_eq!(report["format"], "jsonl");
    assert_matches_model(&report, 5);
}

#[test]
fn compare_replays_one_log_through_two_configs() {
    let dir = Dir::new();
    let old = dir.file("old.yaml", &config(5));
    let new = dir.file("new.yaml", &config(12));
    let log = dir.file("access.log", &combined_log(&pattern()));
    let both = json(&[&"--log", &log, &"--compare", &old, &new]);
    assert_matches_model(&both["old"], 5);
    assert_matches_model(&both["new"], 12);
    assert_ne!(
        both["old"]["origins"][0]["limits"][0]["rejected"],
        both["new"]["origins"][0]["limits"][0]["rejected"],
        "the pattern must tell the two capacities apart"
    );
    let (code, table, err) = simulate(&[&"--log", &log, &"--compare", &old, &new]);
    assert_eq!(code, 0, "{err}");
    let (o, n) = (
        bucket_model(5, a_arrivals()).rejected,
        bucket_model(12, a_arrivals()).rejected,
    );
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with("per_client"))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[3..5], [o.to_string(), n.to_string()], "{table}");
}

#[test]
fn shadow_limit_counts_what_it_would_reject_and_is_refunded() {
    // A shadow bucket (capacity 8, a token every 2 s) before the enforced one: the shadow
    // limit lets everything through, and gives back its token when the enforced limit
    // rejects the request (no-burn).
    let text = config(5).replace(
        "    limits:\n",
        "    limits:\n      probe: { kind: token_bucket, key: [client_ip], mode: shadow, capacity: 8, refill: { amount: 1, every: 2s } }\n",
    );
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", &text);
    let log = dir.file("access.log", &combined_log(&pattern()));
    let report = json(&[&"--config", &cfg, &"--log", &log]);
    // The model: both buckets of client A, the shadow one refunded on an enforced rejection.
    let (mut shadow_b, mut enforced) = (Bucket::new(8, 2), Bucket::new(5, 1));
    let (mut shadow, mut s_allowed, mut refunded, mut rejected) = (0, 0, 0, 0);
    for t in a_arrivals() {
        let s_ok = shadow_b.take(t);
        if !s_ok {
            shadow += 1;
        }
        if enforced.take(t) {
            s_allowed += u64::from(s_ok);
        } else {
            rejected += 1;
            if s_ok {
                shadow_b.tokens += 1;
                refunded += 1;
            }
        }
    }
    let b_total: u64 = (0..SECONDS).map(b_at).sum();
    let probe = limit(&report, "app", "probe");
    assert_eq!(probe["mode"], "shadow");
    assert_eq!(probe["shadow_rejected"], shadow, "{probe:#}");
    assert_eq!(probe["refunded"], refunded, "{probe:#}");
    assert_eq!(probe["allowed"], s_allowed + b_total, "{probe:#}");
    assert_eq!(limit(&report, "app", "per_client")["rejected"], rejected);
    assert!(shadow > 0 && refunded > 0, "{shadow} {refunded}");
}

#[test]
fn unparseable_overlong_and_backward_lines_are_counted_with_numbers() {
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", &config(1000));
    let good = |s: u64| combined_log(&[(s, A)]);
    let mut text = String::new();
    text += &good(10); // 1
    text += &good(11); // 2
    text += "this is not a log line\n"; // 3
    text += &good(12); // 4
    text += &format!("{}\n", "x".repeat(5000)); // 5: overlong (--max-line 4096)
    text += "\n"; // 6: blank, skipped silently
    text += &good(13); // 7
    text += &good(5); // 8: goes back in time: replayed at second 13
    text += "10.0.0.1 - - [21/Sep/2026:14:13:20 +0000] \"-\" 400 0 \"-\" \"-\"\n"; // 9
    text += &"y".repeat(3 << 20); // 10: 3 MiB, longer than the read buffer
    text += "\n";
    // Many good lines after, crossing read-buffer boundaries.
    for s in 0..30_000u64 {
        text += &good(14 + s / 100);
    }
    text += good(400).trim_end(); // the last line has no newline
    let log = dir.file("access.log", &text);
    let report = json(&[&"--config", &cfg, &"--log", &log, &"--max-line", &"4096"]);
    let input = &report["input"];
    assert_eq!(input["unparseable"], 4, "{input:#}");
    let numbers: Vec<u64> = input["first_unparseable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["line"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [3, 5, 9, 10], "{input:#}");
    assert!(input["first_unparseable"][1]["reason"]
        .as_str()
        .unwrap()
        .contains("longer than 4096 bytes"));
    assert_eq!(input["clamped"], 1);
    assert_eq!(input["lines"], 10 + 30_000 + 1);
    assert_eq!(input["replayed"], 6 + 30_000);
    assert_eq!(report["origins"][0]["requests"], 6 + 30_000);
    assert_eq!(report["end"], "2026-09-21T14:20:00Z");
    // The table names the lines too.
    let (code, table, _) = simulate(&[&"--config", &cfg, &"--log", &log, &"--max-line", &"4096"]);
    assert_eq!(code, 0);
    assert!(table.contains("line 3: "), "{table}");
    assert!(table.contains("line 10: longer than 4096 bytes"), "{table}");
}

const TWO_ORIGINS: &str = r#"
origins:
  a:
    hosts: ["a.test"]
    upstreams: ["127.0.0.1:9"]
    limits:
      global: { kind: rate, key: ["const:all"], max: 1000, per: 1s }
  b:
    hosts: ["b.test", "www.b.test"]
    upstreams: ["127.0.0.1:9"]
    limits:
      by_host: { kind: token_bucket, key: [host], capacity: 3, refill: { amount: 1, every: 1h } }
"#;

#[test]
fn lines_without_a_host_go_to_origin_or_are_counted() {
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", TWO_ORIGINS);
    let reqs: Vec<(u64, &str)> = (0..10).map(|s| (s, A)).collect();
    let log = dir.file("access.log", &combined_log(&reqs));
    // Two origins and no --origin: nowhere to send them.
    let report = json(&[&"--config", &cfg, &"--log", &log]);
    assert_eq!(report["hostless"], 10);
    assert_eq!(report["origins"][0]["requests"], 0);
    assert_eq!(report["origins"][1]["requests"], 0);
    // --origin b: all ten to b, whose host key is b's first host.
    let report = json(&[&"--config", &cfg, &"--log", &log, &"--origin", &"b"]);
    assert_eq!(report["hostless"], 0);
    assert_eq!(report["origins"][1]["requests"], 10);
    let l = limit(&report, "b", "by_host");
    assert_eq!(
        (l["allowed"].as_u64(), l["rejected"].as_u64()),
        (Some(3), Some(7))
    );
    assert_eq!(l["top_rejected"][0]["key"], "host=b.test");
    // An unknown origin is an error that lists the known ones.
    let (code, _, err) = simulate(&[&"--config", &cfg, &"--log", &log, &"--origin", &"c"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--origin `c`") && err.contains("a, b"),
        "{err}"
    );
}

#[test]
fn hosts_route_lines_from_the_log_or_the_host_header() {
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", TWO_ORIGINS);
    let mut text = String::new();
    for (i, host) in [
        "a.test",
        "WWW.B.test:8443",
        "b.test",
        "nope.test",
        "b.test.",
    ]
    .iter()
    .enumerate()
    {
        text += &format!(
            "{{\"ts\":{},\"remote_addr\":\"{A}\",\"host\":\"{host}\",\"method\":\"GET\",\"path\":\"/\",\"headers\":{{\"Host\":\"a.test\"}}}}\n",
            T0 + i as u64
        );
    }
    let log = dir.file("access.jsonl", &text);
    let report = json(&[&"--config", &cfg, &"--log", &log, &"--format", &"jsonl"]);
    assert_eq!(report["origins"][0]["requests"], 1);
    assert_eq!(report["origins"][1]["requests"], 3);
    assert_eq!(report["unrouted"], 1);
    let report = json(&[
        &"--config",
        &cfg,
        &"--log",
        &log,
        &"--format",
        &"jsonl",
        &"--host-from",
        &"header",
    ]);
    assert_eq!(report["origins"][0]["requests"], 5);
    assert_eq!(report["unrouted"], 0);
}

#[test]
fn shared_store_limits_are_simulated_locally_and_say_so() {
    let dir = Dir::new();
    // The store is never contacted: nothing listens on port 1.
    let text = config(5)
        .replace(
            "origins:",
            "stores:\n  fleet: { kind: redis, url: \"redis://127.0.0.1:1\" }\norigins:",
        )
        .replace(
            "        key: [client_ip]\n",
            "        key: [client_ip]\n        store: fleet\n",
        );
    let cfg = dir.file("c.yaml", &text);
    let log = dir.file("access.log", &combined_log(&pattern()));
    let report = json(&[&"--config", &cfg, &"--log", &log]);
    assert_matches_model(&report, 5);
    let notes = report["notes"].to_string();
    assert!(notes.contains("simulated as a local limit"), "{notes}");
    let (_, table, _) = simulate(&[&"--config", &cfg, &"--log", &log]);
    assert!(
        table.contains("note: origin `app`, limit `per_client`: on store `fleet`"),
        "{table}"
    );
}

#[test]
fn missing_files_are_clear_errors() {
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", &config(5));
    let missing = dir.0.path().join("no-such.log");
    let (code, out, err) = simulate(&[&"--config", &cfg, &"--log", &missing]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let log = dir.file("access.log", &combined_log(&pattern()));
    let no_cfg = dir.0.path().join("no-such.yaml");
    let (code, _, err) = simulate(&[&"--config", &no_cfg, &"--log", &log]);
    assert_eq!(code, 1);
    assert!(err.contains(&no_cfg.display().to_string()), "{err}");
}

#[test]
fn progress_goes_to_stderr_only_when_asked() {
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", &config(5));
    let log = dir.file("access.log", &combined_log(&pattern()));
    let lines = pattern().len();
    // stderr is a pipe here, not a terminal: quiet unless --progress.
    let (code, _, err) = simulate(&[&"--config", &cfg, &"--log", &log]);
    assert_eq!(code, 0);
    assert!(err.is_empty(), "{err}");
    let (code, out, err) = simulate(&[&"--config", &cfg, &"--log", &log, &"--progress", &"--json"]);
    assert_eq!(code, 0);
    assert!(
        err.contains(&format!("simulate: {lines} lines, done")),
        "{err}"
    );
    // stdout stays the report alone.
    let _: Value = serde_json::from_str(&out).unwrap();
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/simulate")
        .join(name)
}

#[test]
fn generated_fixtures_parse_completely_in_both_formats() {
    // scripts/gen-access-log.py --lines 400 --seed 7 --format vhost / jsonl.
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/simulate.yaml");
    for (file, format) in [("access.log", "combined"), ("access.jsonl", "jsonl")] {
        let log = fixture(file);
        let report = json(&[&"--config", &cfg, &"--log", &log, &"--format", &format]);
        assert_eq!(report["input"]["lines"], 400, "{file}");
        assert_eq!(report["input"]["unparseable"], 0, "{file}: {report:#}");
        assert_eq!(report["unrouted"], 0);
        assert_eq!(report["origins"][0]["requests"], 400, "{file}");
        for l in report["origins"][0]["limits"].as_array().unwrap() {
            let decided: u64 = [
                "allowed",
                "rejected",
                "refunded",
                "shadow_rejected",
                "skipped",
            ]
            .iter()
            .map(|k| l[k].as_u64().unwrap())
            .sum();
            assert!(decided <= 400, "{l:#}");
        }
    }
    // The customer: jsonl lines carry the customer header (server.customer_header), combined
    // lines do not, so their customer is the origin's default (its name).
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/simulate.yaml");
    let text = std::fs::read_to_string(cfg)
        .unwrap()
        .replace("max: 300, per: 1s", "max: 2, per: 1s");
    let dir = Dir::new();
    let cfg = dir.file("c.yaml", &text);
    let keys = |file: &str, format: &str| -> Vec<String> {
        let log = fixture(file);
        let report = json(&[
            &"--config",
            &cfg,
            &"--log",
            &log,
            &"--format",
            &format,
            &"--top",
            &"50",
        ]);
        let l = limit(&report, "shop", "per_customer");
        l["top_rejected"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["key"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(keys("access.log", "combined"), ["customer=shop"]);
    let keys = keys("access.jsonl", "jsonl");
    assert!(
        keys.iter().any(|k| k.starts_with("customer=cust-")),
        "{keys:?}"
    );
    assert!(
        keys.iter()
            .all(|k| k.starts_with("customer=cust-") || k == "customer=shop"),
        "{keys:?}"
    );
}

/// A replay reads the path in the normal form the proxy's limits read (escapes of
/// unreserved bytes decoded, dot segments removed, slashes merged): four spellings of
/// `/login` meet one count of 1, and `/login/` is another path.
#[test]
fn a_replay_reads_paths_as_the_proxy_does() {
    let dir = Dir::new();
    let cfg = dir.file(
        "c.yaml",
        "origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"127.0.0.1:9\"]\n    limits:\n      per_path: { kind: rate, key: [path], max: 1, per: 1h }\n",
    );
    let lines: String = [
        "/login",
        "//login",
        "/a/../login?x=1",
        "/%6Cogin",
        "/login/",
    ]
    .iter()
    .map(|p| format!("{A} - - [{}] \"GET {p} HTTP/1.1\" 200 5\n", clf(T0)))
    .collect();
    let log = dir.file("access.log", &lines);
    let report = json(&[&"--config", &cfg, &"--log", &log]);
    let l = limit(&report, "app", "per_path");
    assert_eq!(
        (&l["allowed"], &l["rejected"]),
        (&2.into(), &3.into()),
        "{l:#}"
    );
    let top = &l["top_rejected"][0];
    assert_eq!(
        (&top["key"], &top["count"]),
        (&"path=/login".into(), &3.into())
    );
}
