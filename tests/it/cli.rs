//! The command line: `tollgate check` exit codes and output, and the shipped example
//! config serving through its demo upstream (200, then 503 above the inflight max), with
//! the worked examples of docs/limits.md of tiers, concurrency and frequency caps.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::api;

use std::process::Command;

use common::{client, eventually, free_port, Tollgate};

fn check(text: &str, strict: bool) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.yaml");
    std::fs::write(&path, text).unwrap();
    let mut cmd = Command::new(common::binary());
    cmd.arg("check").arg("--config").arg(&path);
    if strict {
        cmd.arg("--strict");
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).replace(&path.display().to_string(), "FILE"),
        String::from_utf8_lossy(&out.stderr).replace(&path.display().to_string(), "FILE"),
    )
}

/// The shipped example config, with its segment file's path made absolute (the tests run
/// it from a temporary directory).
fn example() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    std::fs::read_to_string(format!("{root}/conf/tollgate.yaml"))
        .unwrap()
        .replace("file: segments/", &format!("file: {root}/conf/segments/"))
        .replace(
            " tls/localhost-TEST-ONLY",
            &format!(" {root}/conf/tls/localhost-TEST-ONLY"),
        )
}

/// The example config on free loopback ports (its listen and metrics as the harness's
/// placeholders, the admin API on a free port); returns it with the demo upstream's and the
/// limiter API's addresses.
fn example_on_free_ports() -> (String, String, u16) {
    let demo = format!("127.0.0.1:{}", free_port());
    let api = free_port();
    let text = example()
        .replace("127.0.0.1:8080", "{listen}")
        .replace("127.0.0.1:9100", "{metrics}")
        .replace("127.0.0.1:8081", &demo)
        .replace("127.0.0.1:9049", &format!("127.0.0.1:{api}"))
        .replace("127.0.0.1:9180", &format!("127.0.0.1:{}", free_port()))
        .replace("127.0.0.1:8443", &format!("127.0.0.1:{}", free_port()))
        .replace("127.0.0.1:8082", &format!("127.0.0.1:{}", free_port()));
    (text, demo, api)
}

/// The example config started on free ports, once its demo upstream accepts connections
/// too (the proxy may listen first: a request before would be a 502); returns it with the
/// limiter API's port.
async fn start_example() -> (Tollgate, u16) {
    let (text, demo, api) = example_on_free_ports();
    let t = Tollgate::start(&text).await;
    eventually("the demo upstream listens", 250, || async {
        std::net::TcpStream::connect(&demo).is_ok()
    })
    .await;
    (t, api)
}

const CLEAN: &str = r#"
origins:
  app:
    hosts: ["app.test"]
    upstreams: ["127.0.0.1:9"]
    limits:
      per_client: { kind: rate, max: 10, per: 1s }
"#;

#[test]
fn check_exit_codes() {
    let (code, out, _) = check(CLEAN, true);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok (1 origins, 1 limits, 0 warnings)"),
        "{out}"
    );

    let broken = CLEAN
        .replace("max: 10", "max: -1")
        .replace("per: 1s", "pre: 1s");
    let (code, _, err) = check(&broken, false);
    assert_eq!(code, 1);
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines.len() >= 3, "every error is reported:\n{err}");
    assert!(lines[0].starts_with("FILE:7:"), "{err}");
    assert!(err.contains("did you mean `per`"), "{err}");

    // Warnings only: 0 normally, 2 with --strict.
    let warned = CLEAN.replace(
        "per_client: { kind: rate, max: 10, per: 1s }",
        "tb: { kind: token_bucket, capacity: 100000, refill: { amount: 1, every: 1s } }",
    );
    let (code, _, err) = check(&warned, false);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("warning:"), "{err}");
    let (code, _, _) = check(&warned, true);
    assert_eq!(code, 2);

    let out = Command::new(common::binary())
        .args(["check", "--config", "/nonexistent/tollgate.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/tollgate.yaml"));
}

#[test]
fn print_effective_is_a_config_that_checks_clean() {
    let with_default = format!(
        "defaults:\n  limits:\n    conc: {{ kind: inflight, max: 7 }}\n{}",
        CLEAN.replace("127.0.0.1:9\"]", "127.0.0.1:9\"]\n    customer: acme")
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.yaml");
    std::fs::write(&path, &with_default).unwrap();
    let out = Command::new(common::binary())
        .args(["check", "--print-effective", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let yaml = String::from_utf8(out.stdout).unwrap();
    // The default is merged into the origin, with every parameter explicit.
    assert!(yaml.contains("conc:\n        kind: inflight"), "{yaml}");
    assert!(yaml.contains("max: 7"), "{yaml}");
    assert!(yaml.contains("per_client:\n        kind: rate"), "{yaml}");
    assert!(!yaml.contains("defaults"), "{yaml}");
    let (code, out, err) = check(&yaml, true);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn check_resolves_upstream_names_as_a_start_would() {
    let text = CLEAN.replace("127.0.0.1:9", "no-such-host.invalid:80");
    let (code, _, err) = check(&text, false);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("origin `app`: upstream `no-such-host.invalid:80` does not resolve"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_read_the_same_in_check_and_in_the_log() {
    let warned = format!(
        "{}{}",
        common::SERVER,
        CLEAN.replace(
            "per_client: { kind: rate, max: 10, per: 1s }",
            "tb: { kind: token_bucket, capacity: 100000, refill: { amount: 1, every: 1s } }",
        )
    );
    let t = Tollgate::start(&warned).await;
    let (_, _, err) = check(
        &warned
            .replace("{listen}", &t.listen.to_string())
            .replace("{metrics}", &t.metrics.to_string()),
        false,
    );
    let from_check = err.lines().next().unwrap().replace("FILE", "");
    assert!(
        from_check.contains(": warning: refilling 1 every 1s"),
        "{err}"
    );
    let log = t.log_text();
    assert!(
        log.lines().any(|l| l.ends_with(&from_check)),
        "the log should carry `{from_check}`:\n{log}"
    );
}

#[test]
fn shipped_example_config_is_clean() {
    // Not a warning: an example should start clean.
    let (code, out, err) = check(&example(), true);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(err, "", "{err}");
    assert!(out.contains("0 warnings"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_config_serves_200_then_503_over_inflight_max() {
    let (t, _) = start_example().await;
    // It starts clean: nothing at warn or above in its log, once every service is up.
    eventually("the reloader is up", 1_500, || async {
        t.log_text().contains("config reloader ready")
    })
    .await;
    let log = t.log_text();
    assert!(
        !log.lines()
            .any(|l| l.contains(" WARN ") || l.contains(" ERROR ")),
        "{log}"
    );
    let get = |path: &'static str| client().get(t.url(path)).header("host", "localhost").send();
    let resp = get("/").await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("demo upstream"));

    let a = tokio::spawn(get("/?sleep=5s"));
    let b = tokio::spawn(get("/?sleep=5s"));
    eventually("two requests in flight", 200, || async {
        t.metric("tollgate_inflight_requests{origin=\"demo\"}")
            .await
            == 2.0
    })
    .await;
    let third = get("/").await.unwrap();
    assert_eq!(third.status(), 503);
    assert_eq!(a.await.unwrap().unwrap().status(), 200);
    assert_eq!(b.await.unwrap().unwrap().status(), 200);
}

#[test]
fn segment_build_and_info_round_trip_and_bad_lines_fail() {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, "# new customers\n7\n42\n\n4294967295\n42\n").unwrap();
    let out = dir.path().join("new.roaring");
    let built = Command::new(common::binary())
        .args(["segment", "build", "--from"])
        .arg(&ids)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(built.status.code(), Some(0), "{built:?}");
    let info = Command::new(common::binary())
        .args(["segment", "info"])
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert_eq!(info.status.code(), Some(0), "{info:?}");
    assert!(text.contains('3'), "cardinality 3: {text}");
    assert!(text.contains("4294967295"), "max: {text}");

    std::fs::write(&ids, "1\nseven\n3\n-4\n").unwrap();
    let bad = dir.path().join("bad.roaring");
    let refused = Command::new(common::binary())
        .args(["segment", "build", "--from"])
        .arg(&ids)
        .arg("--out")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("line 2") && err.contains("line 4"), "{err}");
    assert!(!bad.exists(), "nothing is written when a line is bad");
}

/// Sends `n` requests for `host` with `headers`, returning each status with the header
/// `show` (empty when absent).
async fn statuses(
    t: &Tollgate,
    host: &str,
    headers: &[(&str, &str)],
    n: usize,
    show: &str,
) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut req = client().get(t.url("/")).header("host", host);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        let value = resp
            .headers()
            .get(show)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        out.push((resp.status().as_u16(), value));
    }
    out
}

/// The worked examples of docs/limits.md, on the shipped config: what the guide prints is what
/// tollgate does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_config_worked_examples_behave_as_the_readme_says() {
    let (t, api) = start_example().await;

    // Burst tiers: three in tier 1, two more in tier 2, then 429 for 10 s.
    let tiers = statuses(&t, "search.localhost", &[], 6, "ratelimit-policy").await;
    let q3 = "\"search_tiers\";q=3;w=10".to_string();
    let q2 = "\"search_tiers\";q=2;w=10".to_string();
    assert_eq!(
        tiers,
        [
            (200, q3.clone()),
            (200, q3.clone()),
            (200, q3),
            (200, q2.clone()),
            (200, q2.clone()),
            (429, q2)
        ]
    );
    assert_eq!(
        t.metric(
            "tollgate_tier_entries_total{limit=\"search_tiers\",origin=\"search\",tier=\"2\"}"
        )
        .await,
        1.0
    );

    // Frequency caps: 3 a day for user 42, 1 a day for 1234, a member of new_users.
    let user = |id: &'static str| [("x-user-id", id)];
    let capped = statuses(&t, "notify.localhost", &user("42"), 4, "retry-after").await;
    let codes: Vec<u16> = capped.iter().map(|c| c.0).collect();
    assert_eq!(codes, [200, 200, 200, 429]);
    assert_eq!(capped[3].1, "86400");
    let new_user = statuses(&t, "notify.localhost", &user("1234"), 2, "retry-after").await;
    assert_eq!(new_user, [(200, String::new()), (429, "86400".to_string())]);

    // Concurrency: the trial group's one copy, and bigco's own max of 2.
    let hold = |customer: &'static str| {
        let req = client()
            .get(t.url("/?sleep=3s"))
            .header("host", "uploads.localhost")
            .header("x-customer-id", customer);
        tokio::spawn(req.send())
    };
    let trial_a = hold("trial-a");
    let big = [hold("bigco"), hold("bigco")];
    let held =
        "tollgate_concurrency_in_use{group=\"_all\",limit=\"upload_slots\",origin=\"uploads\"}";
    eventually("three copies held", 200, || async {
        t.metric(held).await == 3.0
    })
    .await;
    let trial =
        "tollgate_concurrency_in_use{group=\"trial\",limit=\"upload_slots\",origin=\"uploads\"}";
    assert_eq!(t.metric(trial).await, 1.0);
    // The maxes the alert compares them with: the group's and the global one.
    let max = |group: &str| {
        format!("tollgate_concurrency_max{{group=\"{group}\",limit=\"upload_slots\",origin=\"uploads\"}}")
    };
    assert_eq!(t.metric(&max("trial")).await, 1.0);
    assert_eq!(t.metric(&max("_all")).await, 10.0);
    let up = |customer: &'static str| {
        client()
            .get(t.url("/"))
            .header("host", "uploads.localhost")
            .header("x-customer-id", customer)
            .send()
    };
    assert_eq!(up("trial-b").await.unwrap().status(), 503);
    assert_eq!(up("bigco").await.unwrap().status(), 503);
    assert_eq!(up("smallco").await.unwrap().status(), 200);
    assert_eq!(trial_a.await.unwrap().unwrap().status(), 200);
    for b in big {
        assert_eq!(b.await.unwrap().unwrap().status(), 200);
    }
    eventually("copies given back", 200, || async {
        t.metric(held).await == 0.0
    })
    .await;

    // The limiter API's resources, as the example's comments say.
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{api}/"))
        .unwrap()
        .get_connection_with_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    let reduce = |con: &mut redis::Connection| -> i64 {
        redis::cmd("RL.REDUCE")
            .arg(&["TwoPerMin", "2", "60"])
            .query(con)
            .unwrap()
    };
    assert_eq!(
        [reduce(&mut con), reduce(&mut con), reduce(&mut con)],
        [2, 1, 0]
    );
    let granted = |con: &mut redis::Connection, args: &[&str]| -> i64 {
        let v: Vec<redis::Value> = redis::cmd(args[0]).arg(&args[1..]).query(con).unwrap();
        assert_eq!(v[0], redis::Value::BulkString(b"granted".to_vec()), "{v:?}");
        match v[1] {
            redis::Value::Int(n) => n,
            ref other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        granted(&mut con, &["CH.REQUEST", "logins", "alice", "3"]),
        3
    );
    assert_eq!(
        granted(
            &mut con,
            &["CH.REQUEST", "logins", "alice", "9", "MIN", "1"]
        ),
        7
    );
    assert_eq!(
        granted(
            &mut con,
            &["CH.RESERVE", "uploads", "smallco", "5", "MIN", "1"]
        ),
        3
    );
    assert_eq!(
        granted(
            &mut con,
            &["CH.RESERVE", "uploads", "trial-co", "3", "MIN", "1"]
        ),
        1
    );
    assert_eq!(
        granted(&mut con, &["CH.RESERVE", "uploads", "bigco", "3"]),
        3
    );
    assert_eq!(
        granted(&mut con, &["CH.RESERVE", "uploads", "hugeco", "3"]),
        3
    );
    assert_eq!(
        t.metric("tollgate_api_holds{resource=\"uploads\"}").await,
        10.0
    );
    let e = redis::cmd("CH.REQUEST")
        .arg(&["mailer", "alice", "1"])
        .query::<redis::Value>(&mut con)
        .unwrap_err();
    assert!(e.to_string().contains("unknown resource 'mailer'"), "{e}");
}

/// A reader that stops early (`tollgate segment info F | head -1`) closes the pipe; Rust's
/// `println!` turned that into a panic. Here the read end is closed before tollgate writes
/// anything: every subcommand that prints exits 0, without a panic.
#[test]
fn a_closed_stdout_is_no_panic() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, "1\n2\n3\n").unwrap();
    let segment = dir.path().join("s.roaring");
    common::build_segment(dir.path(), &[1, 2, 3], &segment);
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, CLEAN).unwrap();
    let built = dir.path().join("t.roaring");
    let runs: [Vec<&std::ffi::OsStr>; 4] = [
        vec!["segment".as_ref(), "info".as_ref(), segment.as_os_str()],
        vec!["schema".as_ref()],
        vec!["check".as_ref(), "--config".as_ref(), config.as_os_str()],
        vec![
            "segment".as_ref(),
            "build".as_ref(),
            "--from".as_ref(),
            ids.as_os_str(),
            "--out".as_ref(),
            built.as_os_str(),
        ],
    ];
    for args in runs {
        let mut child = Command::new(common::binary())
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("panicked"),
            "{args:?}: {}\n{err}",
            out.status
        );
    }
}

/// Item 21 of the adversarial run: `check` passed 9 990 origins that took 3.75 GB to
/// start and said nothing of memory. Now it prints an estimate, which must be within a
/// factor of 2 of what the started binary holds, for generated configs: many origins with
/// no limits (the per-origin cost), and with an inflight limit (its 256 KiB sketch) and a
/// rate limit each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_memory_estimate_is_within_twice_what_the_process_holds() {
    let defaults = "defaults:\n  limits:\n    busy: { kind: inflight, max: 1000 }\n    per_ip: { kind: rate, max: 10, per: 1s, max_keys: 2000 }\n";
    for (origins, defaults) in [(3_000, ""), (1_500, defaults)] {
        let mut text = format!("{}{defaults}origins:\n", common::SERVER);
        for i in 0..origins {
            text.push_str(&format!(
                "  o{i}:\n    hosts: [\"o{i}.test\"]\n    upstreams: [\"127.0.0.1:9\"]\n"
            ));
        }
        let t = Tollgate::start(&text).await;
        let out = Command::new(common::binary())
            .args(["check", "--config"])
            .arg(&t.config_path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let estimate = stdout
            .split("about ")
            .nth(1)
            .and_then(|rest| rest.split(" of memory").next())
            .unwrap_or_else(|| panic!("no estimate in {stdout}"));
        let (value, unit) = estimate.split_once(' ').unwrap();
        let scale = match unit {
            "KiB" => 1u64 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            other => panic!("unit {other}"),
        };
        let estimate_kib = (value.parse::<f64>().unwrap() * scale as f64 / 1024.0) as u64;
        eventually("every service started", 1_500, || async {
            t.log_text().contains("config reloader ready")
        })
        .await;
        let rss = api::rss_kib_of(t.child.id());
        assert!(
            rss <= 2 * estimate_kib && estimate_kib <= 2 * rss,
            "{origins} origins: estimate {estimate_kib} KiB, resident {rss} KiB"
        );
    }
}
