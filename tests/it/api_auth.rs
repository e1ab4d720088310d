//! The limiter API's password (issue 19, item 11), through the real binary: redis-py with
//! `password=` (its `AUTH`) and with a wrong one, `redis-cli -a`, redis-rs over RESP2
//! (`AUTH`) and RESP3 (`HELLO 3 AUTH default ...`), raw RESP for what an unauthenticated
//! connection may send, a reload that changes the password, and a server without one
//! (Redis's `nopass` default user).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::api;

use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use api::exchange_until;
use common::{api_config, eventually, python, start_api, Tollgate};

const PASSWORD: &str = "c0rrect-h0rse";

/// A tollgate whose API asks for [`PASSWORD`] (from a file beside the test), its port,
/// and the file.
async fn start_with_password() -> (Tollgate, u16, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("api.password");
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let tail = format!("api:\n  password_file: \"{}\"\n", file.display());
    let (t, port) = start_api("", &tail).await;
    // The file is read at load, and again at each reload: keep it.
    std::mem::forget(dir);
    (t, port, file)
}

fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn send(s: &mut TcpStream, request: &str, suffix: &str) -> String {
    String::from_utf8(exchange_until(s, request.as_bytes(), suffix.as_bytes())).unwrap()
}

const PY_AUTH: &str = r#"
import sys, redis
port, password = int(sys.argv[1]), sys.argv[2]
r = redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=10)
print("with password", r.execute_command("RL.REDUCE", "k", "2", "60"))
print("ping", r.ping())
for name, kwargs in (("wrong", {"password": "nope"}), ("none", {})):
    try:
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=10, **kwargs).execute_command(
            "RL.REDUCE", "k", "2", "60"
        )
        print(name, "allowed")
    except (redis.exceptions.AuthenticationError, redis.ResponseError) as e:
        print(name, type(e).__name__, e)
print("untouched", r.execute_command("RL.GET", "k", "2", "60"))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_logs_in_with_the_password_and_not_without() {
    let (t, port, _) = start_with_password().await;
    let out = python(PY_AUTH, &[&port.to_string(), PASSWORD]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "with password 2",
            "ping True",
            // (redis-py 4.3 raises WRONGPASS as a plain ResponseError, code and all.)
            "wrong ResponseError WRONGPASS invalid username-password pair or user is disabled.",
            "none AuthenticationError Authentication required.",
            "untouched 1",
        ],
        "{out}"
    );
    // The password is in no log line, a wrong one is (once, without it).
    let log = t.log_text();
    assert!(!log.contains(PASSWORD), "{log}");
    assert!(
        log.contains("limiter API: wrong credentials from 127.0.0.1"),
        "{log}"
    );
    assert!(!log.contains("nope"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_with_a_and_redis_rs_over_resp2_and_resp3() {
    let (_t, port, _) = start_with_password().await;
    let cli = |password: &str| {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-a", password, "--no-auth-warning"])
            .args(["RL.REDUCE", "cli", "3", "60"])
            .output()
            .expect("redis-cli (Debian's redis-tools; scripts/deps.sh installs it)");
        (
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )
    };
    assert_eq!(cli(PASSWORD).0, "3");
    let (out, err) = cli("wrong");
    assert_eq!(
        err,
        "AUTH failed: WRONGPASS invalid username-password pair or user is disabled."
    );
    assert_eq!(out, "NOAUTH Authentication required.");
    for url in [
        format!("redis://:{PASSWORD}@127.0.0.1:{port}/"),
        format!("redis://default:{PASSWORD}@127.0.0.1:{port}/?protocol=resp3"),
    ] {
        let mut con = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(10))
            .unwrap();
        let n: i64 = redis::cmd("RL.REDUCE")
            .arg("rs")
            .arg(5)
            .arg(60)
            .query(&mut con)
            .unwrap();
        assert!(n == 5 || n == 4, "{url}: {n}");
    }
    let wrong = format!("redis://default:nope@127.0.0.1:{port}/?protocol=resp3");
    let err = redis::Client::open(wrong.as_str())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(10))
        .err()
        .expect("a wrong password is refused");
    assert!(err.to_string().contains("WRONGPASS"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_connection_may_only_log_in_ping_and_quit() {
    let (_t, port, _) = start_with_password().await;
    let mut s = raw(port);
    let got = send(
        &mut s,
        "PING\r\nRL.REDUCE k 2 60\r\nCLIENT ID\r\nMULTI\r\nINFO\r\nCOMMAND COUNT\r\nHELLO 3\r\nAUTH nope\r\nAUTH bob c0rrect-h0rse\r\nHELLO 3 AUTH default nope\r\nPING\r\n",
        "disabled.\r\n+PONG\r\n",
    );
    let noauth = "-NOAUTH Authentication required.\r\n";
    let wrongpass = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    assert_eq!(
        got,
        format!(
            "+PONG\r\n{}-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n{}+PONG\r\n",
            noauth.repeat(5),
            wrongpass.repeat(3)
        )
    );
    // HELLO 2 AUTH logs in (and stays in RESP2); a later wrong AUTH logs nobody out.
    let got = send(
        &mut s,
        &format!("HELLO 2 AUTH default {PASSWORD}\r\nAUTH wrong\r\nRL.REDUCE k 2 60\r\n"),
        ":2\r\n",
    );
    assert!(got.starts_with("*14\r\n$6\r\nserver\r\n"), "{got}");
    assert!(got.ends_with(&format!("{wrongpass}:2\r\n")), "{got}");
    // AUTH with the password alone, on another connection; then QUIT.
    let mut s = raw(port);
    let got = send(
        &mut s,
        &format!("AUTH {PASSWORD}\r\nRL.GET k 2 60\r\nQUIT\r\n"),
        "+OK\r\n:1\r\n+OK\r\n",
    );
    assert_eq!(got, "+OK\r\n:1\r\n+OK\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_password_for_the_next_login() {
    let (t, port, file) = start_with_password().await;
    // A SIGHUP before the reloader listens would be missed.
    eventually("the reloader is ready", 500, || async {
        t.log_text().contains("config reloader ready")
    })
    .await;
    let mut before = raw(port);
    send(&mut before, &format!("AUTH {PASSWORD}\r\n"), "+OK\r\n");
    let mut unauthenticated = raw(port);
    send(&mut unauthenticated, "PING\r\n", "+PONG\r\n");
    std::fs::write(&file, "n3w-pass\n").unwrap();
    let tail = format!("api:\n  password_file: \"{}\"\n", file.display());
    t.write_config(&api_config(port, "", &tail));
    let series = "tollgate_config_reloads_total{result=\"success\"}";
    t.signal(libc::SIGHUP);
    eventually("the reload is applied", 500, || async {
        t.metric(series).await >= 1.0
    })
    .await;
    // Logged in before: still. Never logged in: the new password, not the old.
    assert_eq!(send(&mut before, "RL.GET r 2 60\r\n", "\r\n"), ":2\r\n");
    let got = send(
        &mut unauthenticated,
        &format!("AUTH {PASSWORD}\r\nAUTH n3w-pass\r\nRL.GET r 2 60\r\n"),
        ":2\r\n",
    );
    assert!(got.starts_with("-WRONGPASS"), "{got}");
    assert!(got.ends_with("+OK\r\n:2\r\n"), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_password_the_default_user_takes_any_and_others_are_refused() {
    let (_t, port) = start_api("", "").await;
    let mut s = raw(port);
    let got = send(
        &mut s,
        "AUTH pw\r\nHELLO 3 AUTH bob pw\r\nAUTH default anything\r\nHELLO 2 AUTH default x\r\n",
        "modules\r\n*0\r\n",
    );
    assert!(got.starts_with("-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n*14\r\n"), "{got}");
}
