//! Issue 10, item 6: local limit state survives a restart and an upgrade through
//! `stores.local.snapshot`. Drained buckets, full frequency caps and entered tiers come
//! back after SIGTERM, SIGINT and an upgrade (`--upgrade` + SIGQUIT), with the right
//! `Retry-After`; a bucket keeps refilling over the downtime; a corrupt, truncated or
//! foreign file is named in a warning and ignored; the file is rewritten every `every`;
//! an unwritable path is counted, never fatal.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{client, eventually, spawn, Tollgate, Upstream, SERVER};

/// The origins: one per kind, each keyed on `x-user`, each full after two requests.
fn config(up: SocketAddr, stores: &str) -> String {
    format!(
        r#"{SERVER}stores:
  local: {stores}
origins:
  slow:
    hosts: ["slow.test"]
    upstreams: ["{up}"]
    limits:
      hourly: {{ kind: token_bucket, key: ["header:x-user"], capacity: 2, refill: {{ amount: 2, every: 1h }} }}
  quick:
    hosts: ["quick.test"]
    upstreams: ["{up}"]
    limits:
      ten: {{ kind: token_bucket, key: ["header:x-user"], capacity: 2, refill: {{ amount: 2, every: 10s }} }}
  caps:
    hosts: ["caps.test"]
    upstreams: ["{up}"]
    limits:
      two_an_hour: {{ kind: sliding_log, key: ["header:x-user"], windows: [{{ max: 2, per: 1h }}] }}
  tiers:
    hosts: ["tiers.test"]
    upstreams: ["{up}"]
    limits:
      burst: {{ kind: tiered, key: ["header:x-user"], tiers: [{{ limit: 2, window: 1h, active: 1h, cooldown: 0s }}] }}
  rates:
    hosts: ["rates.test"]
    upstreams: ["{up}"]
    limits:
      per_hour: {{ kind: rate, key: ["header:x-user"], max: 2, per: 1h }}
"#
    )
}

/// One request: status, `Retry-After` (seconds, if any) and whether the response closes
/// its connection (a process that handed its listeners over says so on every response).
async fn get(t: &Tollgate, host: &str, user: &str) -> (u16, Option<u64>, bool) {
    let r = client()
        .get(t.url("/"))
        .header("host", host)
        .header("x-user", user)
        .send()
        .await
        .unwrap();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let close = r
        .headers()
        .get("connection")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    (r.status().as_u16(), retry, close)
}

/// Two requests admitted, the third rejected: the limit is full for `user`.
async fn fill(t: &Tollgate, host: &str, user: &str) {
    let statuses = [
        get(t, host, user).await.0,
        get(t, host, user).await.0,
        get(t, host, user).await.0,
    ];
    assert_eq!(statuses, [200, 200, 429], "{host} for {user}");
}

/// The limit of `host` still rejects `user`, with a `Retry-After` in `range` seconds.
async fn still_full(t: &Tollgate, host: &str, user: &str, range: std::ops::RangeInclusive<u64>) {
    let (status, retry, _) = get(t, host, user).await;
    assert_eq!(
        status,
        429,
        "{host} for {user} after the restart:\n{}",
        t.log_text()
    );
    let retry = retry.expect("Retry-After");
    assert!(
        range.contains(&retry),
        "{host}: Retry-After {retry}, expected {range:?}"
    );
}

fn snapshot_path(t: &Tollgate) -> PathBuf {
    t.dir.path().join("state.snap")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_limits_survive_sigterm_and_sigint_and_keep_refilling_meanwhile() {
    let up = Upstream::start("127.0.0.1", "up").await;
    // A relative path: next to the config file.
    let mut t = Tollgate::start(&config(up.addr, r#"{ snapshot: "state.snap", every: 1h }"#)).await;
    assert_eq!(
        t.metric("tollgate_snapshot_loads_total{result=\"absent\"}")
            .await,
        1.0
    );
    for host in ["slow.test", "caps.test", "tiers.test", "rates.test"] {
        fill(&t, host, "a").await;
    }
    let before_quick = Instant::now();
    fill(&t, "quick.test", "a").await;
    let drained = Instant::now();

    t.signal(libc::SIGTERM);
    assert!(t.wait_exit().await.success());
    assert!(snapshot_path(&t).exists(), "written at shutdown");
    assert!(
        t.log_text()
            .contains("keys (token_bucket 2, rate 1, sliding_log 1, tiered 1)"),
        "{}",
        t.log_text()
    );

    t.restart().await;
    let log = t.log_text();
    assert!(log.contains("restored 5 keys"), "{log}");
    assert!(log.contains("from the shutdown snapshot"), "{log}");
    assert_eq!(
        t.metric("tollgate_snapshot_loads_total{result=\"restored\"}")
            .await,
        1.0
    );
    // An hour's bucket, log and tier: about an hour to wait.
    for host in ["slow.test", "caps.test", "tiers.test"] {
        still_full(&t, host, "a", 3_000..=3_600).await;
    }
    // The rate counts the hour's period and weighs the previous one: at least half an hour.
    still_full(&t, "rates.test", "a", 1_800..=5_400).await;
    // The quick bucket refills 10 s after it was drained: what is left of them, by the
    // test's own clock (the decisions happened between these instants).
    let (inner, outer) = (drained.elapsed(), before_quick.elapsed());
    assert!(outer < Duration::from_secs(9), "the restart took {outer:?}");
    let (status, retry, _) = get(&t, "quick.test", "a").await;
    assert_eq!(status, 429, "still drained after the restart");
    let retry = retry.unwrap();
    let lo = 10 - outer.as_secs() - 1;
    let hi = 10 - inner.as_secs();
    assert!(
        (lo..=hi).contains(&retry),
        "Retry-After {retry}, expected {lo}..={hi}"
    );
    // Another user, drained in this process, then SIGINT: it exits at once and still writes.
    fill(&t, "caps.test", "b").await;
    t.signal(libc::SIGINT);
    assert!(t.wait_exit().await.success());

    // Past the quick bucket's refill, a restart finds it full again: it kept refilling
    // while no process ran.
    while drained.elapsed() < Duration::from_millis(10_300) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t.restart().await;
    assert_eq!(get(&t, "quick.test", "a").await.0, 200);
    assert_eq!(get(&t, "quick.test", "a").await.0, 200);
    still_full(&t, "caps.test", "b", 3_000..=3_600).await;
    still_full(&t, "slow.test", "a", 3_000..=3_600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_carries_the_state_including_the_old_process_last_decisions() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let mut t = Tollgate::start(&config(up.addr, r#"{ snapshot: "state.snap", every: 1h }"#)).await;
    fill(&t, "slow.test", "a").await;
    fill(&t, "tiers.test", "a").await;

    let sock = t.upgrade_sock();
    let new = spawn(&t.config_path, &sock, true);
    eventually(
        "the new process listens on the upgrade socket",
        500,
        || async { sock.exists() },
    )
    .await;
    // Three connections the old process accepts now: it decides what comes on them, and
    // sending on them wastes none of the 5 s it keeps accepting after SIGQUIT (Pingora's
    // fixed window, which a loaded machine could otherwise spend on connecting).
    let mut conns = Vec::new();
    for _ in 0..3 {
        let s = tokio::net::TcpStream::connect(t.listen).await.unwrap();
        conns.push(tokio::io::BufReader::new(s));
    }
    t.signal(libc::SIGQUIT);
    eventually("the handover began", 500, || async {
        t.log_text().contains("handover)")
    })
    .await;
    // The new process waits for the old one's final state, so these are decided by the
    // old one (it says `Connection: close` once it hands over) ...
    let request = b"GET / HTTP/1.1\r\nHost: slow.test\r\nx-user: b\r\n\r\n";
    let answers = conns.into_iter().map(|mut c| {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            c.get_mut().write_all(request).await.unwrap();
            common::raw::read_response(&mut c).await.unwrap()
        })
    });
    let mut statuses = Vec::new();
    for a in answers.collect::<Vec<_>>() {
        let r = a.await.unwrap();
        assert!(r.closes(), "decided by the old process: {r:?}");
        statuses.push(r.status);
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 429]);
    assert!(t.wait_exit().await.success());
    assert!(t.log_text().contains("(upgrade)"), "{}", t.log_text());
    t.replace_child(new).await;
    // ... and carried over with everything before them.
    still_full(&t, "slow.test", "a", 3_000..=3_600).await;
    still_full(&t, "slow.test", "b", 3_000..=3_600).await;
    still_full(&t, "tiers.test", "a", 3_000..=3_600).await;
    let log = t.log_text();
    assert!(log.contains("from the upgrade snapshot"), "{log}");
    assert!(log.contains("restored 3 keys"), "{log}");
    // The new process serves fresh keys and writes from now on.
    fill(&t, "slow.test", "c").await;
    t.signal(libc::SIGTERM);
    assert!(t.wait_exit().await.success());
    t.restart().await;
    still_full(&t, "slow.test", "c", 3_000..=3_600).await;
}

/// A copy of `good` with its key-hash fingerprint changed and the checksum redone: a
/// well-formed file from a build that hashes keys differently.
fn foreign(good: &[u8]) -> Vec<u8> {
    let mut bytes = good.to_vec();
    // After the magic (8 bytes) and the version (4): the fingerprint, then at the end the
    // checksum of everything before it and the end marker (docs/architecture.md).
    bytes[12] ^= 0xff;
    let end = bytes.len() - 16;
    let sum = xxhash_rust::xxh3::xxh3_64(&bytes[..end]);
    bytes[end..end + 8].copy_from_slice(&sum.to_le_bytes());
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_truncated_or_foreign_snapshot_is_named_and_ignored() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let mut t = Tollgate::start(&config(up.addr, r#"{ snapshot: "state.snap", every: 1h }"#)).await;
    fill(&t, "slow.test", "a").await;
    t.signal(libc::SIGTERM);
    assert!(t.wait_exit().await.success());
    let path = snapshot_path(&t);
    let good = std::fs::read(&path).unwrap();

    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x10;
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("corrupt", flipped, "corrupt (checksum mismatch)"),
        ("truncated", good[..good.len() - 7].to_vec(), "truncated ("),
        (
            "foreign",
            foreign(&good),
            "foreign: written by a build whose key hash differs",
        ),
        (
            "not a snapshot",
            b"key: value\n".to_vec(),
            "not a tollgate snapshot",
        ),
    ];
    for (what, bytes, reason) in cases {
        std::fs::write(&path, &bytes).unwrap();
        t.restart().await;
        let warning = format!(
            "snapshot {}: ignored, starting with empty limits: {reason}",
            path.display()
        );
        let log = t.log_text();
        let line = log.lines().find(|l| l.contains(&warning));
        let line = line.unwrap_or_else(|| panic!("{what}: no `{warning}` in\n{log}"));
        assert!(line.contains("WARN"), "{what}: not a warning: {line}");
        assert_eq!(
            t.metric("tollgate_snapshot_loads_total{result=\"refused\"}")
                .await,
            1.0,
            "{what}"
        );
        // Fresh state: the drained bucket is full again.
        assert_eq!(get(&t, "slow.test", "a").await.0, 200, "{what}");
        t.child.kill().unwrap();
        t.wait_exit().await;
    }
    // The good file still restores (the cases above were refused, not misread).
    std::fs::write(&path, &good).unwrap();
    t.restart().await;
    still_full(&t, "slow.test", "a", 3_000..=3_600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_is_rewritten_every_period_with_the_traffic() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let t = Tollgate::start(&config(
        up.addr,
        r#"{ snapshot: "state.snap", every: 200ms }"#,
    ))
    .await;
    let path = snapshot_path(&t);
    fill(&t, "slow.test", "a").await;
    // A write after the traffic holds its key.
    let mut first = Vec::new();
    eventually("a periodic write with the drained bucket", 250, || {
        let bytes = std::fs::read(&path).unwrap_or_default();
        let holds = bytes.len() > 200 && bytes != first;
        first = bytes;
        async move { holds }
    })
    .await;
    let first = std::fs::read(&path).unwrap();
    fill(&t, "caps.test", "a").await;
    eventually("the next write holds the new state", 250, || {
        let grown = std::fs::read(&path).is_ok_and(|b| b.len() > first.len());
        async move { grown }
    })
    .await;
    // The file is renamed into place before the write is counted and its keys gauged.
    eventually("two writes are counted", 1_500, || async {
        t.metric("tollgate_snapshot_writes_total{result=\"ok\"}")
            .await
            >= 2.0
            && t.metric("tollgate_snapshot_keys{kind=\"sliding_log\"}")
                .await
                == 1.0
    })
    .await;
    assert_eq!(
        t.metric("tollgate_snapshot_writes_total{result=\"error\"}")
            .await,
        0.0
    );
    assert_eq!(
        t.metric("tollgate_snapshot_keys{kind=\"sliding_log\"}")
            .await,
        1.0
    );
    assert!(
        t.metric("tollgate_snapshot_last_success_timestamp_seconds")
            .await
            > 1.6e9
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_path_is_logged_and_counted_and_tollgate_serves() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let mut t = Tollgate::start(&config(
        up.addr,
        r#"{ snapshot: "no/such/dir/state.snap", every: 200ms }"#,
    ))
    .await;
    fill(&t, "slow.test", "a").await;
    eventually("a failed write is counted", 250, || async {
        t.metric("tollgate_snapshot_writes_total{result=\"error\"}")
            .await
            >= 2.0
    })
    .await;
    let log = t.log_text();
    assert!(
        log.contains("state.snap: cannot write it (periodic)"),
        "{log}"
    );
    assert_eq!(
        log.matches("cannot write it (periodic)").count(),
        1,
        "logged once a minute"
    );
    assert_eq!(get(&t, "slow.test", "b").await.0, 200);
    t.signal(libc::SIGTERM);
    assert!(t.wait_exit().await.success());
    assert!(t.log_text().contains("cannot write it (shutdown)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_turns_snapshots_on_and_moves_them_live() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let off = config(up.addr, "{}");
    let t = Tollgate::start(&off).await;
    fill(&t, "slow.test", "a").await;
    let first = t.dir.path().join("first.snap");
    let second = t.dir.path().join("second.snap");
    t.write_config(&config(
        up.addr,
        r#"{ snapshot: "first.snap", every: 200ms }"#,
    ));
    eventually("a reload turns the snapshot on", 250, || async {
        first.exists()
    })
    .await;
    assert!(
        std::fs::read(&first).unwrap().len() > 200,
        "with the drained bucket"
    );
    t.write_config(&config(
        up.addr,
        r#"{ snapshot: "second.snap", every: 200ms }"#,
    ));
    // The bucket's state, carried over the reloads, is in the new file too.
    eventually("a reload moves it", 250, || async {
        std::fs::read(&second).is_ok_and(|b| b.len() > 200)
    })
    .await;
    t.write_config(&off);
    eventually("a reload turns it off", 250, || async {
        t.metric("tollgate_config_reloads_total{result=\"success\"}")
            .await
            >= 3.0
    })
    .await;
    // A write the writer began under the old config may still finish after the reload:
    // let one period and more pass before taking the count (still on, it would write
    // about five more times in the second wait).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let written = t
        .metric("tollgate_snapshot_writes_total{result=\"ok\"}")
        .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        t.metric("tollgate_snapshot_writes_total{result=\"ok\"}")
            .await,
        written,
        "no write once it is off"
    );
}
