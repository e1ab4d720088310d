//! The systemd unit `conf/systemd/tollgate.service` and its supervisor
//! `conf/systemd/tollgate-supervise`: `systemd-analyze verify` accepts the unit (systemd is
//! required: `make test` installs it), every tollgate flag the unit and the supervisor
//! pass is one `tollgate` takes, and the supervisor does what the unit relies on, run here
//! as systemd would run it: SIGHUP reloads, SIGUSR2 upgrades with no failed request while
//! it stays the main process, a failed upgrade leaves the old process serving, SIGTERM
//! stops everything.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{binary, client, free_port, sample, Upstream, SERVER};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn unit() -> String {
    std::fs::read_to_string(format!("{ROOT}/conf/systemd/tollgate.service")).unwrap()
}

fn supervisor() -> String {
    format!("{ROOT}/conf/systemd/tollgate-supervise")
}

/// The unit's `Exec*=` command lines, split on spaces (the unit quotes nothing).
fn exec_lines(unit: &str) -> Vec<(String, Vec<String>)> {
    unit.lines()
        .filter(|l| l.starts_with("Exec"))
        .map(|l| {
            let (key, value) = l.split_once('=').unwrap();
            let words = value.split_whitespace().map(str::to_string).collect();
            (key.to_string(), words)
        })
        .collect()
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    let dir = tempfile::tempdir().unwrap();
    // The unit's install paths, pointed at this build: verify checks that they exist.
    let text = unit()
        .replace("/usr/local/lib/tollgate/tollgate-supervise", &supervisor())
        .replace("/usr/local/bin/tollgate", binary());
    let path = dir.path().join("tollgate.service");
    std::fs::write(&path, text).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze must be installed (scripts/deps.sh installs systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
    // A misspelt directive is reported: the check can fail.
    std::fs::write(&path, format!("{}\nProtectSystm=strict\n", unit())).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).trim().is_empty());
}

/// `tollgate SUBCOMMAND --help`.
fn help(subcommand: &str) -> String {
    let out = Command::new(binary())
        .args([subcommand, "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "tollgate {subcommand} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_unit_and_the_supervisor_pass_only_real_flags() {
    let lines = exec_lines(&unit());
    let keys: Vec<&str> = lines.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        keys.contains(&"ExecStart") && keys.contains(&"ExecReload"),
        "{keys:?}"
    );
    let mut checked = 0;
    for (key, words) in &lines {
        let (subcommand, args) = match words[0].as_str() {
            "/usr/local/lib/tollgate/tollgate-supervise" => ("run", &words[1..]),
            "/usr/local/bin/tollgate" => (words[1].as_str(), &words[2..]),
            "/bin/kill" => {
                assert_eq!(words[1..], ["-HUP", "$MAINPID"], "{key}");
                continue;
            }
            other => panic!("{key} runs an unexpected command {other}"),
        };
        let help = help(subcommand);
        for flag in args.iter().filter(|a| a.starts_with('-')) {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{key}: `tollgate {subcommand}` has no {flag}:\n{help}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 3);
    // The flags the supervisor adds itself.
    let script = std::fs::read_to_string(supervisor()).unwrap();
    let run = help("run");
    for flag in ["--upgrade-sock", "--upgrade"] {
        assert!(
            script.contains(flag) && run.contains(&format!("{flag} ")),
            "{flag}"
        );
    }
}

/// The `tollgate` processes whose parent is `parent`.
fn tollgate_children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some((head, tail)) = stat.rsplit_once(") ") else {
            continue;
        };
        let ppid = tail.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok());
        if head.ends_with("(tollgate") && ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

fn signal(pid: u32, sig: i32) {
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// Polls `cond` every 50 ms, up to `tries` times.
async fn until(what: &str, tries: usize, mut cond: impl FnMut() -> bool) {
    for _ in 0..tries.max(600) {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_reloads_upgrades_and_stops_tollgate() {
    supervise(false).await;
}

/// Started with SIGHUP ignored (under `nohup`, as a shell script or a CI runner may start
/// it), the supervisor still reloads on SIGHUP: a shell cannot trap a signal ignored at its
/// start, so it starts itself again with its signals at their defaults. Before that, this
/// SIGHUP was dropped without a word and no reload ever happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_reloads_even_when_started_with_sighup_ignored() {
    supervise(true).await;
}

/// Runs the supervisor (under `nohup` if `ignoring_hup`) through a reload, an upgrade and a
/// stop.
async fn supervise(ignoring_hup: bool) {
    let up = Upstream::start("127.0.0.1", "up").await;
    let dir = tempfile::tempdir().unwrap();
    let (listen, metrics) = (free_port(), free_port());
    let config = format!(
        "{SERVER}origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"{}\"]\n",
        up.addr
    )
    .replace("{listen}", &format!("127.0.0.1:{listen}"))
    .replace("{metrics}", &format!("127.0.0.1:{metrics}"));
    let config_path = dir.path().join("tollgate.yaml");
    std::fs::write(&config_path, &config).unwrap();
    let mut sup = if ignoring_hup {
        let mut c = Command::new("nohup");
        c.arg(supervisor());
        c
    } else {
        Command::new(supervisor())
    };
    let mut sup = sup
        .arg("--config")
        .arg(&config_path)
        .env("TOLLGATE_BIN", binary())
        .env("TOLLGATE_UPGRADE_SOCK", dir.path().join("upgrade.sock"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let stderr = sup.stderr.take().unwrap();
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    let pid = sup.id();
    let http = client();
    let get = || {
        let http = http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{listen}/"))
                .header("host", "app.test")
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    let scrape = || async move {
        reqwest::get(format!("http://127.0.0.1:{metrics}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let mut ready = false;
    for _ in 0..1_500 {
        if get().await == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready, "tollgate never served:\n{}", log.lock().unwrap());
    let first = tollgate_children(pid);
    assert_eq!(first.len(), 1, "{first:?}");

    // SIGHUP: a reload, in the same process.
    signal(pid, libc::SIGHUP);
    let mut reloaded = false;
    for _ in 0..1_500 {
        let text = scrape().await;
        if sample(&text, "tollgate_config_reloads_total{result=\"success\"}") == 1.0 {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reloaded, "no reload:\n{}", log.lock().unwrap());
    assert_eq!(tollgate_children(pid), first);

    // SIGUSR2: a new process takes over, the old one drains and exits; the supervisor
    // stays, and no request fails meanwhile.
    signal(pid, libc::SIGUSR2);
    let mut failed = Vec::new();
    let mut upgraded = false;
    for _ in 0..1_500 {
        let status = get().await;
        if status != 200 {
            failed.push(status);
        }
        let now = tollgate_children(pid);
        if now.len() == 1 && now != first {
            upgraded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(upgraded, "no upgrade:\n{}", log.lock().unwrap());
    assert!(failed.is_empty(), "{failed:?}\n{}", log.lock().unwrap());
    assert_eq!(get().await, 200);
    let second = tollgate_children(pid);
    assert!(
        sup.try_wait().unwrap().is_none(),
        "the supervisor (the main PID) exited"
    );

    // A failed upgrade (the new process refuses the config) leaves the old one serving.
    std::fs::write(&config_path, "origins: {}\n").unwrap();
    signal(pid, libc::SIGUSR2);
    until("the upgrade is abandoned", 400, || {
        log.lock().unwrap().contains("upgrade abandoned")
    })
    .await;
    assert_eq!(tollgate_children(pid), second);
    assert_eq!(get().await, 200);

    // SIGTERM: tollgate stops, then the supervisor.
    signal(pid, libc::SIGTERM);
    until("the supervisor exits", 400, || {
        sup.try_wait().unwrap().is_some()
    })
    .await;
    assert!(tollgate_children(pid).is_empty());
    assert!(!Path::new(&format!("/proc/{}", second[0])).exists());
}
