//! Limits read the request path in its normal form (escapes of unreserved bytes decoded,
//! dot segments removed, slashes merged), through the real proxy with curl: another
//! spelling of a path meets the same count, the same override and the same `match:`, while
//! the upstream still receives the path as the client sent it. A limit's own `match:`
//! picks the requests it applies to (a path, a prefix, a method); the rest pass it,
//! counted as `skipped`.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;

use common::{Tollgate, Upstream, SERVER};

/// The status of a GET of `path` sent exactly as written (`--path-as-is`), and the path
/// the upstream saw (empty when the request did not reach it).
fn get(t: &Tollgate, path: &str) -> (u16, String) {
    send(t, "GET", path)
}

/// [`get`] with another method.
fn send(t: &Tollgate, method: &str, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--path-as-is",
            "-X",
            method,
            "-D",
            "-",
            "-o",
            "/dev/null",
        ])
        .args(["-H", "Host: app.test", "--max-time", "10"])
        .arg(t.url(path))
        .output()
        .expect("curl");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let status = (text.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let seen = (text.lines())
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.eq_ignore_ascii_case("x-seen-path"))
        .map_or(String::new(), |(_, v)| v.trim().to_string());
    (status, seen)
}

fn config(up: &Upstream, limits: &str) -> String {
    format!(
        "{SERVER}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{}\"]\n    limits:\n{limits}",
        up.addr
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_path_meets_one_count() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      per_path: { kind: rate, key: [path], max: 1, per: 1h }\n";
    let t = Tollgate::start(&config(&up, limits)).await;
    tokio::task::block_in_place(|| {
        assert_eq!(get(&t, "/login"), (200, "/login".to_string()));
        for spelling in [
            "//login",
            "/./login",
            "/a/../login",
            "/%6Cogin",
            "/%6cogin/.",
        ] {
            let (status, _) = get(&t, spelling);
            // `/login/.` is `/login/`: another path (a trailing slash is kept).
            let want = if spelling.ends_with("/.") { 200 } else { 429 };
            assert_eq!(status, want, "{spelling}");
        }
        // The upstream gets the path as sent: only the limits read the normal form.
        assert_eq!(get(&t, "/b/../fresh"), (200, "/b/../fresh".to_string()));
        assert_eq!(get(&t, "//fresh").0, 429);
        // An escaped slash is data, not a separator: its own path.
        assert_eq!(get(&t, "/login%2F..").0, 200);
    });
    assert_eq!(up.requests(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_on_a_path_holds_for_its_other_spellings() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      per_client:
        kind: rate
        key: [client_ip]
        max: 100
        per: 1h
        overrides: [{ match: { path: \"/api//login\" }, max: 1 }]
";
    let t = Tollgate::start(&config(&up, limits)).await;
    tokio::task::block_in_place(|| {
        // The condition is written with a doubled slash: it names `/api/login`.
        assert_eq!(get(&t, "/api/login").0, 200);
        assert_eq!(get(&t, "/api/./login").0, 429);
        assert_eq!(get(&t, "//api/%6Cogin").0, 429);
        // Other paths are the base variant's.
        assert_eq!(get(&t, "/api/logout").0, 200);
        assert_eq!(get(&t, "/").0, 200);
    });
    assert_eq!(up.requests(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_applies_only_to_the_requests_its_match_picks() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      login:
        kind: rate
        max: 1
        per: 1h
        match: { path: /login, method: POST }
      api:
        kind: token_bucket
        capacity: 2
        refill: { amount: 1, every: 1h }
        match: { path: \"/api/*\" }
";
    let t = Tollgate::start(&config(&up, limits)).await;
    tokio::task::block_in_place(|| {
        assert_eq!(send(&t, "POST", "/login").0, 200);
        // Another spelling of the path: picked, over the limit.
        assert_eq!(send(&t, "POST", "//login").0, 429);
        // Another method, another path: not picked, never limited.
        for _ in 0..3 {
            assert_eq!(send(&t, "GET", "/login").0, 200);
            assert_eq!(send(&t, "POST", "/logout").0, 200);
        }
        // Everything below /api/ shares the bucket of two; /api itself is not below it.
        assert_eq!(get(&t, "/api/a").0, 200);
        assert_eq!(get(&t, "/api/b/c").0, 200);
        assert_eq!(get(&t, "/x/../api/a").0, 429);
        assert_eq!(get(&t, "/api").0, 200);
    });
    assert_eq!(up.requests(), 10);
    // Requests a limit's match did not pick are counted as skipped (the request `login`
    // rejected never reached `api`).
    let skipped = |limit: &str, kind: &str| {
        format!("tollgate_limit_decisions_total{{decision=\"skipped\",kind=\"{kind}\",limit=\"{limit}\",origin=\"app\"}}")
    };
    t.wait_metric(&skipped("login", "rate"), 10.0).await;
    t.wait_metric(&skipped("api", "token_bucket"), 8.0).await;
}
