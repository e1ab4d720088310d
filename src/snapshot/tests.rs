//! Snapshots of a live runtime: every saved kind written and restored through Unix time
//! (with injected instants), state whose identity or shape changed skipped, held kinds not
//! saved, and the file's life at shutdown and upgrade.

use std::io::BufWriter;
use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::server::ExecutionPhase;

use crate::config::parse_str;
use crate::limits::{MonotonicClock, Nanos, NANOS_PER_SEC};
use crate::metrics::Metrics;
use crate::runtime::limiter::Limiter;
use crate::runtime::Runtime;
use crate::snapshot::format::{Reason, Sink, Source};
use crate::snapshot::state::{self, SavedKind, TimeMap};
use crate::snapshot::{file, Loaded, Snapshots};

const SEC: Nanos = NANOS_PER_SEC;
const MINUTE: Nanos = 60 * SEC;
/// The writer's clock and Unix time at its write: they differ, as two processes' do.
const T1: Nanos = 1_700_000_000 * SEC;
const W1: u64 = 1_700_000_500 * SEC;

const LIMITS: &str = r#"
      tb:
        kind: token_bucket
        key: [customer]
        capacity: 5
        refill: { amount: 1, every: 1s }
        overrides:
          - match: { customer: bigco }
            capacity: 50
      per_min: { kind: rate, key: [customer], max: 10, per: 1m }
      caps: { kind: sliding_log, key: [customer], windows: [{ max: 2, per: 1h }] }
      tiers:
        kind: tiered
        key: [customer]
        tiers:
          - { limit: 2, window: 1m, active: 10m, cooldown: 0s }
          - { limit: 3, window: 1m, active: 5m, cooldown: 1h }
      conc: { kind: concurrency, key: [customer], max: 3 }
      fly: { kind: inflight, max: 3 }
"#;

fn config_text(limits: &str, stores: &str) -> String {
    format!(
        "{stores}origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"127.0.0.1:9\"]\n    limits:{limits}"
    )
}

fn runtime(limits: &str) -> Runtime {
    let config = parse_str(&config_text(limits, ""), "t.yaml")
        .unwrap()
        .config;
    Runtime::build(Arc::new(config), None, &Metrics::new().unwrap())
        .unwrap()
        .0
}

/// Variant `variant` of the limit `name`.
fn limiter<'a>(rt: &'a Runtime, name: &str, variant: usize) -> &'a Limiter {
    let l = rt.origins[0].all_limits().find(|l| l.name == name).unwrap();
    &l.variants[variant].limiter
}

/// Drains what a test checks: key 1's bucket (4 of 5 tokens), the override's bucket, the
/// rate (7 events), the log (full) and the tiers (into tier 2), at T1.
fn drain(rt: &Runtime) {
    let Limiter::TokenBucket(tb) = limiter(rt, "tb", 0) else {
        panic!("tb")
    };
    assert!(tb.state.local().unwrap().acquire(1, 4, T1).allowed);
    let Limiter::TokenBucket(big) = limiter(rt, "tb", 1) else {
        panic!("override")
    };
    assert!(big.state.local().unwrap().acquire(1, 40, T1).allowed);
    let Limiter::Rate(rate) = limiter(rt, "per_min", 0) else {
        panic!("rate")
    };
    for _ in 0..7 {
        assert!(
            rate.state
                .local()
                .unwrap()
                .acquire(1, 10, 1, false, T1)
                .allowed
        );
    }
    let Limiter::SlidingLog(log) = limiter(rt, "caps", 0) else {
        panic!("log")
    };
    assert!(log.state.local().unwrap().acquire(1, 2, T1).allowed);
    let Limiter::Tiered(tiers) = limiter(rt, "tiers", 0) else {
        panic!("tiers")
    };
    for _ in 0..3 {
        assert!(tiers.state.local().unwrap().acquire(1, T1).verdict.allowed);
    }
    assert_eq!(tiers.state.local().unwrap().current_tier(1, T1), 2);
}

/// `rt` written at T1 (Unix time W1) into bytes.
fn write(rt: &Runtime) -> (Vec<u8>, state::KindCounts) {
    let mut sink = Sink::start(BufWriter::new(Vec::new())).unwrap();
    let counts = state::write_all(&mut sink, rt, &TimeMap::new(T1, W1)).unwrap();
    let (w, _) = sink.finish().unwrap();
    (w.into_inner().unwrap(), counts)
}

/// `bytes` loaded into `rt` by a process whose clock reads `mono` at Unix time `wall`.
fn load(bytes: &[u8], rt: &Runtime, mono: Nanos, wall: u64) -> state::LoadReport {
    // After the magic and version (12 bytes), no header: the sections.
    let mut src = Source::new(&bytes[12..]);
    state::read_all(&mut src, Some(rt), &TimeMap::new(mono, wall), mono).unwrap()
}

#[test]
fn every_saved_kind_comes_back_and_time_passes_over_the_downtime() {
    let old = runtime(LIMITS);
    drain(&old);
    let (bytes, written) = write(&old);
    assert_eq!(written.get(SavedKind::TokenBucket), 2);
    assert_eq!(written.total(), 5, "inflight and concurrency are not saved");

    // Restored 3 s after the write by a process whose clock reads 1 000 s less.
    let new = runtime(LIMITS);
    let t2 = T1 - 1_000 * SEC + 3 * SEC;
    let report = load(&bytes, &new, t2, W1 + 3 * SEC);
    assert_eq!(report.restored, written);
    assert_eq!(
        (report.skipped_sections, report.empty, report.no_room),
        (0, 0, 0)
    );

    let Limiter::TokenBucket(tb) = limiter(&new, "tb", 0) else {
        panic!("tb")
    };
    assert_eq!(
        tb.state.local().unwrap().tokens(1, t2),
        4,
        "1 left, plus 3 s of 1 a second"
    );
    let Limiter::TokenBucket(big) = limiter(&new, "tb", 1) else {
        panic!("override")
    };
    assert_eq!(
        big.state.local().unwrap().tokens(1, t2),
        13,
        "the override's own bucket"
    );
    let Limiter::Rate(rate) = limiter(&new, "per_min", 0) else {
        panic!("rate")
    };
    assert!(rate.state.local().unwrap().estimate(1, t2) >= 7.0);
    let Limiter::SlidingLog(log) = limiter(&new, "caps", 0) else {
        panic!("log")
    };
    let v = log.state.local().unwrap().acquire(1, 1, t2);
    assert!(!v.allowed, "two an hour, both taken");
    let hour_left = 60 * MINUTE - 3 * SEC;
    assert!(
        v.retry_after >= hour_left
            && v.retry_after < hour_left + log.state.local().unwrap().resolution()
    );
    let Limiter::Tiered(tiers) = limiter(&new, "tiers", 0) else {
        panic!("tiers")
    };
    assert_eq!(
        tiers.state.local().unwrap().current_tier(1, t2),
        2,
        "still in tier 2"
    );
}

#[test]
fn state_whose_identity_or_shape_changed_is_skipped() {
    let old = runtime(LIMITS);
    drain(&old);
    let (bytes, _) = write(&old);
    // The bucket's capacity changed (another shape), the rate is renamed (another
    // identity), the log's key changed; the tiers are as they were.
    let changed = LIMITS
        .replace("capacity: 5\n", "capacity: 6\n")
        .replace("per_min:", "per_minute:")
        .replace(
            "caps: { kind: sliding_log, key: [customer]",
            "caps: { kind: sliding_log, key: [client_ip]",
        );
    let new = runtime(&changed);
    let report = load(&bytes, &new, T1, W1);
    assert_eq!(report.skipped_sections, 3);
    assert_eq!(report.skipped_keys, 3);
    assert_eq!(
        report.restored.get(SavedKind::TokenBucket),
        1,
        "the override"
    );
    assert_eq!(report.restored.get(SavedKind::Tiered), 1);
    let Limiter::TokenBucket(tb) = limiter(&new, "tb", 0) else {
        panic!("tb")
    };
    assert_eq!(tb.state.local().unwrap().tokens(1, T1), 6, "fresh");
    // Long after, everything is empty by now: nothing restored, nothing lost.
    let later = runtime(LIMITS);
    let report = load(&bytes, &later, T1, W1 + 3 * 3_600 * SEC);
    assert_eq!(report.restored.total(), 0);
    assert_eq!(report.empty, 5);
}

/// A runtime whose config writes its snapshot to `path` (100 ms apart).
fn with_snapshot(path: &std::path::Path, metrics: &Metrics) -> Arc<ArcSwap<Runtime>> {
    let stores = format!(
        "stores:\n  local: {{ snapshot: \"{}\", every: 100ms }}\n",
        path.display()
    );
    let config = parse_str(&config_text(LIMITS, &stores), "t.yaml")
        .unwrap()
        .config;
    let rt = Runtime::build(Arc::new(config), None, metrics).unwrap().0;
    Arc::new(ArcSwap::from_pointee(rt))
}

fn loads(metrics: &Metrics, result: &str) -> u64 {
    let text = String::from_utf8(metrics.encode()).unwrap();
    let series = format!("tollgate_snapshot_loads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.parse().unwrap())
}

#[test]
fn a_file_written_by_one_process_is_loaded_by_the_next_unless_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.snap");
    let clock = MonotonicClock::from_unix_epoch();

    let metrics = Metrics::new().unwrap();
    let rt = with_snapshot(&path, &metrics);
    let snaps = Snapshots::new(rt.clone(), clock, &metrics).unwrap();
    assert_eq!(snaps.load(), Loaded::Absent);
    assert_eq!(loads(&metrics, "absent"), 1);
    let live = rt.load_full();
    let Limiter::TokenBucket(tb) = limiter(&live, "tb", 0) else {
        panic!("tb")
    };
    use crate::limits::Clock;
    assert!(tb.state.local().unwrap().acquire(9, 5, clock.now()).allowed);
    assert!(snaps.write(Reason::Periodic));
    let text = String::from_utf8(metrics.encode()).unwrap();
    assert!(
        text.contains("tollgate_snapshot_writes_total{result=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_snapshot_keys{kind=\"token_bucket\"} 1"),
        "{text}"
    );

    let next = || {
        let metrics = Metrics::new().unwrap();
        let rt = with_snapshot(&path, &metrics);
        let snaps = Snapshots::new(rt.clone(), clock, &metrics).unwrap();
        (metrics, rt, snaps)
    };
    let (metrics2, rt2, snaps2) = next();
    let Loaded::Restored(counts) = snaps2.load() else {
        panic!("restored")
    };
    assert_eq!(counts.get(SavedKind::TokenBucket), 1);
    assert_eq!(loads(&metrics2, "restored"), 1);
    let live = rt2.load_full();
    let Limiter::TokenBucket(tb) = limiter(&live, "tb", 0) else {
        panic!("tb")
    };
    assert!(
        !tb.state.local().unwrap().acquire(9, 5, clock.now()).allowed,
        "still drained"
    );

    // One flipped byte: refused, and the next process starts empty.
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let (metrics3, rt3, snaps3) = next();
    assert_eq!(snaps3.load(), Loaded::Refused);
    assert_eq!(loads(&metrics3, "refused"), 1);
    let live = rt3.load_full();
    let Limiter::TokenBucket(tb) = limiter(&live, "tb", 0) else {
        panic!("tb")
    };
    assert!(
        tb.state.local().unwrap().acquire(9, 5, clock.now()).allowed,
        "fresh"
    );

    // An unwritable path is counted, not fatal.
    let (metrics4, _rt4, _) = next();
    let bad = Snapshots::new(
        with_snapshot(&dir.path().join("no/such/dir"), &metrics4),
        clock,
        &Metrics::new().unwrap(),
    )
    .unwrap();
    assert!(!bad.write(Reason::Periodic));
}

#[test]
fn a_process_is_alive_until_it_exits_and_is_reaped() {
    assert!(super::handover::alive(std::process::id()));
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert!(!super::handover::alive(pid), "reaped");
}

#[test]
fn after_an_upgrade_the_old_process_writes_once_then_leaves_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.snap");
    let clock = MonotonicClock::from_unix_epoch();
    let metrics = Metrics::new().unwrap();
    let snaps = Snapshots::new(with_snapshot(&path, &metrics), clock, &metrics).unwrap();

    // A shutdown without a handover writes a `shutdown` snapshot at exit.
    let (tx, mut rx) = tokio::sync::broadcast::channel(16);
    tx.send(ExecutionPhase::GracefulTerminate).unwrap();
    snaps.after_run(&mut rx);
    assert_eq!(file::peek(&path).unwrap().reason, Reason::Shutdown);

    // A handover whose upgrade snapshot the writer service did not get to write: written
    // at exit, then never again.
    tx.send(ExecutionPhase::GracefulUpgradeTransferringFds)
        .unwrap();
    snaps.after_run(&mut rx);
    let h = file::peek(&path).unwrap();
    assert_eq!((h.reason, h.pid), (Reason::Upgrade, std::process::id()));
    assert!(snaps.handed_over());
    assert!(
        !snaps.write(Reason::Periodic),
        "the successor owns the file"
    );
    snaps.after_run(&mut rx);
    assert_eq!(
        file::peek(&path).unwrap(),
        h,
        "nothing written after the handover"
    );
}
