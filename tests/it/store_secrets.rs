//! A Redis store's password (issue 19, item 19) never shows: not in `check
//! --print-effective`, nor in `check`'s errors, nor in the admin API's `GET /config`, nor in
//! the log; a URL's password prints as `REDACTED`, and a store may read its password from a
//! `password_file` instead, logging in to a real `redis-server` that asks for one.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::redis as harness;

use std::net::TcpStream;
use std::process::Command;

use common::{client, eventually, Tollgate, SERVER};
use harness::RedisServer;

const SECRET: &str = "hunter2-s3cret";

const ORIGIN: &str = "origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"127.0.0.1:1\"]\n";

/// `tollgate check [--print-effective]` of `config` written to a file in `dir`: exit code,
/// stdout, stderr.
fn check(dir: &std::path::Path, config: &str, print: bool) -> (i32, String, String) {
    let path = dir.join("t.yaml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(common::binary());
    cmd.arg("check");
    if print {
        cmd.arg("--print-effective");
    }
    let out = cmd.arg("--config").arg(&path).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_prints_a_valid_config_with_the_password_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "stores:\n  shared:\n    url: \"redis://:{SECRET}@127.0.0.1:6379/0\"\n  cluster:\n    cluster: true\n    urls: [\"redis://default:{SECRET}@127.0.0.1:7000\"]\n{ORIGIN}"
    );
    let (code, out, err) = check(dir.path(), &config, true);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains(SECRET) && !err.contains(SECRET), "{out}{err}");
    assert!(
        out.contains("url: redis://:REDACTED@127.0.0.1:6379/0"),
        "{out}"
    );
    assert!(
        out.contains("- redis://default:REDACTED@127.0.0.1:7000"),
        "{out}"
    );
    // What it printed is itself a valid config.
    let (code, again, err) = check(dir.path(), &out, false);
    assert_eq!(code, 0, "{again}{err}");
    // A refused URL is quoted without its password.
    let bad = format!(
        "stores:\n  shared:\n    url: \"redis://:{SECRET}@127.0.0.1:notaport/0\"\n{ORIGIN}"
    );
    let (code, out, err) = check(dir.path(), &bad, false);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("stores.shared.url"), "{err}");
    assert!(
        err.contains("redis://:REDACTED@127.0.0.1:notaport/0"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
    // A password in the URL and in a file: which one? Refused.
    std::fs::write(dir.path().join("pw"), "x\n").unwrap();
    let both = format!("stores:\n  shared:\n    url: \"redis://:{SECRET}@127.0.0.1:6379/0\"\n    password_file: pw\n{ORIGIN}");
    let (code, _, err) = check(dir.path(), &both, false);
    assert_eq!(code, 1);
    assert!(
        err.contains("in `password_file` or in the URL, not both"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_log_in_and_neither_the_admin_api_nor_the_log_shows_the_password() {
    let redis = RedisServer::start();
    redis.cmd(&["CONFIG", "SET", "requirepass", SECRET]);
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("redis.password");
    std::fs::write(&pw, format!("{SECRET}\n")).unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let port = redis.port();
    let config = format!(
        "{SERVER}  admin: \"{admin}\"\nstores:\n  inline:\n    url: \"redis://:{SECRET}@127.0.0.1:{port}/0\"\n  filed:\n    url: \"redis://127.0.0.1:{port}/0\"\n    password_file: \"{}\"\n  wrong:\n    url: \"redis://:not-it@127.0.0.1:{port}/0\"\n{ORIGIN}",
        pw.display()
    );
    let t = Tollgate::start(&config).await;
    // Both stores with the password log in; the one with a wrong password stays down.
    t.wait_metric("tollgate_store_up{store=\"inline\"}", 1.0)
        .await;
    t.wait_metric("tollgate_store_up{store=\"filed\"}", 1.0)
        .await;
    eventually("the wrong password is refused and logged", 500, || async {
        t.log_text().contains("store wrong: probe failed")
    })
    .await;
    eventually("the admin API answers", 250, || async {
        TcpStream::connect(admin).is_ok()
    })
    .await;
    let shown = client()
        .get(format!("http://{admin}/config"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!shown.contains(SECRET), "{shown}");
    assert!(
        shown.contains(&format!("url: redis://:REDACTED@127.0.0.1:{port}/0")),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("password_file: {}", pw.display())),
        "{shown}"
    );
    let log = t.log_text();
    assert!(!log.contains(SECRET) && !log.contains("not-it"), "{log}");
}
