//! The files an operator names, as the running binary meets them:
//!
//! - segment files beside the config reload however they are replaced (`tollgate segment
//!   build --out`, `mv`, a rewrite in place), even while a snapshot is written into the
//!   same directory every 100 ms (each directory event used to reset the segment stamps
//!   before the next poll could confirm the change, so none ever applied);
//! - `check` refuses a corrupt segment file, as `run` does;
//! - a FIFO as the config, a segment or the snapshot never blocks: `check` and `run`
//!   refuse it at once (the snapshot: a warning, tollgate starts empty), and a running
//!   reloader that meets one stays responsive to the next edit, SIGHUP and SIGTERM;
//! - the reloader's start-up races: an edit made after the config was read but before the
//!   directory was watched is applied, and a SIGHUP sent as early as the first log line is
//!   applied, not fatal.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    binary, build_segment, client, eventually, free_port, spawn, Tollgate, Upstream, SERVER,
};

/// Generous bound for anything the reloader does (it polls segments every 500 ms and waits
/// 300 ms for a changed file to settle), on a loaded machine.
const TRIES: usize = 1_500;

/// Runs `cmd` to completion, failing the test if it takes more than 20 s (a blocked open
/// would hang it for ever).
fn finishes(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after 20 s (blocked?): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// The config of these tests: users in the segment `blocked` (a file beside the config)
/// get a bucket of 0, everyone else 1 000.
fn config(up: std::net::SocketAddr, extra: &str) -> String {
    format!(
        r#"{SERVER}segments:
  blocked: {{ file: blocked.roaring, of: "header:x-user-id" }}
{extra}origins:
  app:
    hosts: ["app.test"]
    upstreams: ["{up}"]
    limits:
      gate:
        kind: token_bucket
        key: [header:x-user-id]
        capacity: 1000
        refill: {{ amount: 1000, every: 1s }}
        overrides:
          - match: {{ segment: blocked }}
            capacity: 0
"#
    )
}

async fn status(t: &Tollgate, user: &str) -> u16 {
    client()
        .get(t.url("/"))
        .header("host", "app.test")
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Waits until `user` is blocked (429) and `other` is not.
async fn blocks(t: &Tollgate, user: &str, other: &str, how: &str) {
    eventually(
        &format!("{how}: {user} blocked, {other} served"),
        TRIES,
        || async { status(t, user).await == 429 && status(t, other).await == 200 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_beside_the_config_reload_however_they_are_replaced() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let segment = dir.path().join("blocked.roaring");
    build_segment(dir.path(), &[7], &segment);
    // A snapshot written into the config's directory ten times a second: a steady stream of
    // directory events.
    let snapshot = "stores:\n  local: { snapshot: state.snap, every: 100ms }\n";
    let t = Tollgate::start_in(dir, &config(up.addr, snapshot), |_| {}).await;
    blocks(&t, "7", "8", "at start").await;
    eventually("a snapshot is written", TRIES, || async {
        t.dir.path().join("state.snap").exists()
    })
    .await;

    // `tollgate segment build --out`: a new file renamed over the old one.
    build_segment(t.dir.path(), &[8], &segment);
    blocks(&t, "8", "7", "segment build --out").await;

    // `mv` of a file built elsewhere in the directory.
    let next = t.dir.path().join("next.roaring");
    build_segment(t.dir.path(), &[9], &next);
    std::fs::rename(&next, &segment).unwrap();
    blocks(&t, "9", "8", "mv").await;

    // Rewritten in place (same inode).
    let elsewhere = tempfile::tempdir().unwrap();
    let built = elsewhere.path().join("b.roaring");
    build_segment(elsewhere.path(), &[10], &built);
    std::fs::write(&segment, std::fs::read(&built).unwrap()).unwrap();
    blocks(&t, "10", "9", "rewritten in place").await;
    assert!(
        t.log_text()
            .contains("config reloaded (segment file changed)"),
        "{}",
        t.log_text()
    );
}

#[test]
fn check_refuses_a_corrupt_segment_file_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("blocked.roaring"), b"not a roaring bitmap").unwrap();
    let text = config("127.0.0.1:9".parse().unwrap(), "")
        .replace("{listen}", &format!("127.0.0.1:{}", free_port()))
        .replace("{metrics}", &format!("127.0.0.1:{}", free_port()));
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, text).unwrap();
    let check = finishes(
        Command::new(binary())
            .arg("check")
            .arg("--config")
            .arg(&path),
    );
    let err = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(1), "{err}");
    assert!(
        err.contains("segment `blocked`") && err.contains("not a valid roaring bitmap"),
        "{err}"
    );
    let run = finishes(
        Command::new(binary())
            .args(["run", "--config"])
            .arg(&path)
            .arg("--upgrade-sock")
            .arg(dir.path().join("u.sock")),
    );
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(err.contains("not a valid roaring bitmap"), "{err}");
}

#[test]
fn a_fifo_as_the_config_or_a_segment_is_refused_at_once_by_check_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.yaml");
    mkfifo(&fifo);
    let run = |config: &Path| {
        finishes(
            Command::new(binary())
                .args(["run", "--config"])
                .arg(config)
                .arg("--upgrade-sock")
                .arg(dir.path().join("u.sock")),
        )
    };
    let check = |config: &Path| {
        finishes(
            Command::new(binary())
                .arg("check")
                .arg("--config")
                .arg(config),
        )
    };
    for out in [check(&fifo), run(&fifo)] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("a FIFO (named pipe), not a regular file"),
            "{err}"
        );
    }
    // A segment that is a FIFO.
    mkfifo(&dir.path().join("blocked.roaring"));
    let text = config("127.0.0.1:9".parse().unwrap(), "")
        .replace("{listen}", &format!("127.0.0.1:{}", free_port()))
        .replace("{metrics}", &format!("127.0.0.1:{}", free_port()));
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, text).unwrap();
    for out in [check(&path), run(&path)] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("segment file") && err.contains("FIFO"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifos_never_wedge_the_running_process() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let segment = dir.path().join("blocked.roaring");
    build_segment(dir.path(), &[7], &segment);
    // The snapshot path is a FIFO: refused with a warning, tollgate starts empty.
    mkfifo(&dir.path().join("state.snap"));
    let snapshot = "stores:\n  local: { snapshot: state.snap, every: 100ms }\n";
    let mut t = Tollgate::start_in(dir, &config(up.addr, snapshot), |_| {}).await;
    blocks(&t, "7", "8", "at start").await;
    eventually("the snapshot FIFO is refused", TRIES, || async {
        t.log_text().contains("ignored, starting with empty limits")
            && t.log_text().contains("not a regular file")
    })
    .await;
    let reloads = |result: &'static str| {
        let series = format!("tollgate_config_reloads_total{{result=\"{result}\"}}");
        let t = &t;
        async move { t.metric(&series).await }
    };

    // A segment replaced by a FIFO: the reload fails, the old segment keeps serving.
    std::fs::remove_file(&segment).unwrap();
    mkfifo(&segment);
    eventually("the FIFO segment is refused", TRIES, || async {
        reloads("failure").await >= 1.0
    })
    .await;
    assert_eq!(status(&t, "7").await, 429);
    // A real file again: applied.
    std::fs::remove_file(&segment).unwrap();
    build_segment(t.dir.path(), &[8], &segment);
    blocks(&t, "8", "7", "the segment is a file again").await;

    // The config replaced by a FIFO: refused, and the reloader still reads the next save.
    let path = t.config_path.clone();
    let fifo = t.dir.path().join("fifo");
    mkfifo(&fifo);
    std::fs::rename(&fifo, &path).unwrap();
    let failures = reloads("failure").await;
    eventually("the FIFO config is refused", TRIES, || async {
        reloads("failure").await > failures
    })
    .await;
    let successes = reloads("success").await;
    let text = config(up.addr, snapshot)
        .replace("{listen}", &t.listen.to_string())
        .replace("{metrics}", &t.metrics.to_string())
        .replace("capacity: 0", "capacity: 1");
    let tmp = t.dir.path().join("next.yaml");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    eventually("the next save applies", TRIES, || async {
        reloads("success").await > successes
    })
    .await;
    // SIGHUP still applies, and SIGTERM still stops it.
    let successes = reloads("success").await;
    t.signal(libc::SIGHUP);
    eventually("SIGHUP applies", TRIES, || async {
        reloads("success").await > successes
    })
    .await;
    t.signal(libc::SIGTERM);
    let status = t.wait_exit().await;
    assert!(status.success(), "{status}\n{}", t.log_text());
    assert!(
        t.log_text().contains("is not replaced"),
        "the snapshot writer leaves the FIFO alone:\n{}",
        t.log_text()
    );
}

/// The reloader used to start watching only once the services started, after the config
/// was read: an edit in between raised no event and was never applied. A graceful upgrade
/// makes that window as long as the test needs: the new process reads its config, then
/// waits for the old one's listeners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_made_while_the_process_starts_is_applied() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let base = format!(
        "{SERVER}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{}\"]\n",
        up.addr
    );
    let mut old = Tollgate::start(&base).await;
    let sock = old.upgrade_sock();
    let new = spawn(&old.config_path, &sock, true);
    eventually(
        "the new process waits on the upgrade socket",
        TRIES,
        || async { sock.exists() },
    )
    .await;
    // The new process has read the config; now it gains an origin, in place.
    old.write_config(&format!(
        "{base}  more:\n    hosts: [\"more.test\"]\n    upstreams: [\"{}\"]\n",
        up.addr
    ));
    old.signal(libc::SIGQUIT);
    let status = old.wait_exit().await;
    assert!(status.success(), "{status}");
    old.replace_child(new).await;
    eventually("the new process applies the edit", TRIES, || async {
        let r = client()
            .get(old.url("/"))
            .header("host", "more.test")
            .send()
            .await;
        r.is_ok_and(|r| r.status() == 200)
    })
    .await;
}

/// SIGHUP used to be listened for only once the reloader service ran, after the proxy
/// could already answer: a SIGHUP before that ended the process (its default action).
/// Now it is listened for before the config is read, and applied once the reloader runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_as_early_as_the_first_log_line_is_applied() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let (listen, metrics) = (free_port(), free_port());
    let text = format!(
        "{SERVER}origins:\n  app:\n    hosts: [\"app.test\"]\n    upstreams: [\"{}\"]\n",
        up.addr
    )
    .replace("{listen}", &format!("127.0.0.1:{listen}"))
    .replace("{metrics}", &format!("127.0.0.1:{metrics}"));
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, text).unwrap();
    let mut child = spawn(&path, &dir.path().join("u.sock"), false);
    // The first line tollgate writes (it reads its config first).
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut first).unwrap();
    unsafe {
        libc::kill(child.id() as i32, libc::SIGHUP);
    }
    let mut t = Tollgate {
        child,
        dir,
        config_path: path,
        listen: format!("127.0.0.1:{listen}").parse().unwrap(),
        metrics: format!("127.0.0.1:{metrics}").parse().unwrap(),
        log: Default::default(),
        log_closed: Default::default(),
    };
    // Keep reading its log, so that it never blocks on a full pipe.
    let log = t.log.clone();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(stderr).map_while(Result::ok) {
            log.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    t.wait_ready().await;
    eventually("the early SIGHUP is applied", TRIES, || async {
        t.metric("tollgate_config_reloads_total{result=\"success\"}")
            .await
            == 1.0
    })
    .await;
    assert!(t.child.try_wait().unwrap().is_none(), "first line: {first}");
}
