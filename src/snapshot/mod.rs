//! Local limit state that survives a restart or an upgrade: `stores.local.snapshot`.
//!
//! [`Snapshots`] writes the in-process token buckets, rate windows, sliding logs and tiers
//! of the live runtime to one file ([`file`], format in [`format`], sections in [`state`])
//! every `stores.local.every`, at shutdown, and at an upgrade; a starting process loads it
//! into its fresh runtime before it serves. The writer runs as a Pingora background service
//! ([`service::SnapshotWriter`]) on its own runtime thread; the last write of a stopping
//! process is made by `main` once every service has stopped ([`Snapshots::after_run`]).
//!
//! **Upgrade ordering.** The old process gets SIGQUIT, hands its listeners over, keeps
//! accepting for Pingora's 5 s close window, then stops accepting. The new process, once it
//! has the listeners, does not start its services until the old one's final state is on
//! disk: the old one writes a `handover` snapshot when the handover begins (a promise that
//! the final one follows) and the `upgrade` snapshot the moment it stops accepting; the new
//! one waits for it ([`Snapshots::await_predecessor`]), loads it, and only then accepts.
//! Connections arriving meanwhile wait in the kernel's backlog, and all of them are served
//! by the old process until it stops. So no decision is counted twice (one process decides
//! at a time, and each load is into empty tables) and the only decisions lost are those
//! the old process makes after its final write: requests already read on connections it
//! accepted before it stopped. See "Snapshots" in `docs/architecture.md`.
//!
//! Nothing here is on the decision path: a write copies each table one set at a time.

pub mod file;
pub mod format;
pub mod service;
pub mod state;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGaugeVec, Opts};

use crate::limits::clock::nanos;
use crate::limits::{Clock, Fact, Facts, KeyPart, KeySpec, MonotonicClock};
use crate::metrics::{Metrics, MetricsError};
use crate::runtime::Runtime;
use crate::snapshot::format::{FormatError, Header, Reason};
use crate::snapshot::state::{KindCounts, SavedKind, TimeMap};

/// How long a new process waits, after receiving the listeners, for its predecessor's
/// `handover` snapshot before concluding that the predecessor writes none.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(2);

/// How long it then waits for the `upgrade` snapshot: Pingora's fixed 5 s close window,
/// plus time for the write.
pub const UPGRADE_WAIT: Duration = Duration::from_secs(15);

/// The smallest file size cap: a snapshot larger than its config's tables can fill is
/// refused only beyond four times that bound and at least this.
const MIN_CAP: u64 = 64 << 20;

/// The snapshot metrics, registered in tollgate's registry.
struct SnapshotMetrics {
    writes_ok: IntCounter,
    writes_error: IntCounter,
    last_success: Gauge,
    keys: IntGaugeVec,
    loads: IntCounterVec,
}

impl SnapshotMetrics {
    fn register(metrics: &Metrics) -> Result<Self, MetricsError> {
        let writes = IntCounterVec::new(
            Opts::new(
                "tollgate_snapshot_writes_total",
                "Local-state snapshot writes by result (ok, error).",
            ),
            &["result"],
        )?;
        let last_success = Gauge::new(
            "tollgate_snapshot_last_success_timestamp_seconds",
            "Unix time of the last local-state snapshot written.",
        )?;
        let keys = IntGaugeVec::new(
            Opts::new(
                "tollgate_snapshot_keys",
                "Keys in the last local-state snapshot written, by kind.",
            ),
            &["kind"],
        )?;
        let loads = IntCounterVec::new(
            Opts::new(
                "tollgate_snapshot_loads_total",
                "Local-state snapshot loads at start by result (restored, absent, refused).",
            ),
            &["result"],
        )?;
        for result in ["restored", "absent", "refused"] {
            loads.with_label_values(&[result]);
        }
        for kind in [
            SavedKind::TokenBucket,
            SavedKind::Rate,
            SavedKind::SlidingLog,
            SavedKind::Tiered,
        ] {
            keys.with_label_values(&[kind.name()]);
        }
        metrics.register_collector(Box::new(writes.clone()))?;
        metrics.register_collector(Box::new(last_success.clone()))?;
        metrics.register_collector(Box::new(keys.clone()))?;
        metrics.register_collector(Box::new(loads.clone()))?;
        Ok(Self {
            writes_ok: writes.with_label_values(&["ok"]),
            writes_error: writes.with_label_values(&["error"]),
            last_success,
            keys,
            loads,
        })
    }
}

/// Who this process is, as written into every snapshot.
struct Writer {
    instance: String,
    pid: u32,
    started_at: u64,
}

/// The failing state of the writes, for logging a run of failures once a minute.
#[derive(Default)]
struct Failing {
    since: Option<Instant>,
    logged: Option<Instant>,
}

/// What loading the snapshot at start found.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// No `stores.local.snapshot` configured.
    Off,
    /// No file at the path.
    Absent,
    /// The file was refused (logged); the process starts with empty limits.
    Refused,
    /// Restored: keys per kind.
    Restored(KindCounts),
}

/// The snapshot writer and loader of one process.
pub struct Snapshots {
    runtime: Arc<ArcSwap<Runtime>>,
    clock: MonotonicClock,
    metrics: SnapshotMetrics,
    writer: Writer,
    fingerprint: u64,
    /// Held for a whole write: writes never interleave, and the last one started is the
    /// last one renamed into place.
    writing: Mutex<Failing>,
    /// Set once this process has written its `upgrade` snapshot: its successor owns the
    /// file from then on, and nothing more is written here.
    handed_over: AtomicBool,
    /// When the listeners began to be handed over, if they did.
    handover_at: Mutex<Option<Instant>>,
}

impl Snapshots {
    /// The snapshots of the runtime `runtime` decides with, on `clock` (the proxy's clock),
    /// registering their metrics in `metrics`.
    pub fn new(
        runtime: Arc<ArcSwap<Runtime>>,
        clock: MonotonicClock,
        metrics: &Metrics,
    ) -> Result<Arc<Self>, MetricsError> {
        let instance = runtime
            .load()
            .config
            .server
            .instance
            .clone()
            .unwrap_or_else(crate::store::default_instance);
        Ok(Arc::new(Self {
            runtime,
            clock,
            metrics: SnapshotMetrics::register(metrics)?,
            writer: Writer {
                instance,
                pid: std::process::id(),
                started_at: unix_nanos(),
            },
            fingerprint: fingerprint(),
            writing: Mutex::new(Failing::default()),
            handed_over: AtomicBool::new(false),
            handover_at: Mutex::new(None),
        }))
    }

    /// The configured path, if any (a reload changes it live).
    pub fn path(&self) -> Option<PathBuf> {
        self.runtime.load().config.local_store.snapshot.clone()
    }

    /// The configured interval (a reload changes it live).
    pub fn every(&self) -> Duration {
        self.runtime.load().config.local_store.every
    }

    /// Records that the listeners are being handed over to a successor (SIGQUIT).
    pub fn mark_handover(&self) {
        self.handover_at.lock().get_or_insert_with(Instant::now);
    }

    /// Whether this process has handed the file over to its successor.
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::SeqCst)
    }

    /// Writes a snapshot now, if one is configured and the file was not handed over;
    /// returns whether one was written. A failure is logged (a run of failures once a
    /// minute) and counted, never fatal.
    pub fn write(&self, reason: Reason) -> bool {
        let mut failing = self.writing.lock();
        if self.handed_over() {
            return false;
        }
        let rt = self.runtime.load_full();
        let Some(path) = rt.config.local_store.snapshot.clone() else {
            return false;
        };
        let started = Instant::now();
        let map = TimeMap::new(self.clock.now(), unix_nanos());
        let header = Header {
            fingerprint: self.fingerprint,
            written_at: unix_nanos(),
            reason,
            pid: self.writer.pid,
            started_at: self.writer.started_at,
            instance: self.writer.instance.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let written = file::write(&path, &header, |sink| state::write_all(sink, &rt, &map));
        drop(rt);
        match written {
            Ok((counts, bytes)) => {
                self.metrics.writes_ok.inc();
                self.metrics
                    .last_success
                    .set(header.written_at as f64 / 1e9);
                for kind in [
                    SavedKind::TokenBucket,
                    SavedKind::Rate,
                    SavedKind::SlidingLog,
                    SavedKind::Tiered,
                ] {
                    let n = i64::try_from(counts.get(kind)).unwrap_or(i64::MAX);
                    self.metrics.keys.with_label_values(&[kind.name()]).set(n);
                }
                let level = if reason == Reason::Periodic && failing.since.is_none() {
                    log::Level::Debug
                } else {
                    log::Level::Info
                };
                log::log!(
                    level,
                    "snapshot {}: wrote {} keys ({}), {bytes} bytes in {:?} ({})",
                    path.display(),
                    counts.total(),
                    counts.describe(),
                    started.elapsed(),
                    reason.name()
                );
                *failing = Failing::default();
                if reason == Reason::Upgrade {
                    self.handed_over.store(true, Ordering::SeqCst);
                }
                true
            }
            Err(e) => {
                self.metrics.writes_error.inc();
                let now = Instant::now();
                let since = *failing.since.get_or_insert(now);
                let quiet = failing
                    .logged
                    .is_some_and(|at| now.duration_since(at) < Duration::from_secs(60));
                if !quiet || reason != Reason::Periodic {
                    failing.logged = Some(now);
                    log::warn!(
                        "snapshot {}: cannot write it ({}): {e}; limits keep working, and their state will not survive a restart until a write succeeds (failing for {:?})",
                        path.display(),
                        reason.name(),
                        now.duration_since(since)
                    );
                }
                false
            }
        }
    }

    /// Loads the configured snapshot into the runtime, which must not have served yet (its
    /// tables are empty). A refused file is logged as a warning naming it and why; the
    /// process then starts with empty limits.
    pub fn load(&self) -> Loaded {
        let rt = self.runtime.load_full();
        let Some(path) = rt.config.local_store.snapshot.clone() else {
            return Loaded::Off;
        };
        let cap = state::max_bytes(&rt).saturating_mul(4).max(MIN_CAP);
        let refused = |why: &dyn std::fmt::Display| {
            self.metrics.loads.with_label_values(&["refused"]).inc();
            log::warn!(
                "snapshot {}: ignored, starting with empty limits: {why}",
                path.display()
            );
            Loaded::Refused
        };
        let mut opened = match file::open(&path, cap, self.fingerprint) {
            Ok(Some(o)) => o,
            Ok(None) => {
                self.metrics.loads.with_label_values(&["absent"]).inc();
                log::info!(
                    "snapshot {}: none yet, starting with empty limits",
                    path.display()
                );
                return Loaded::Absent;
            }
            Err(e) => return refused(&e),
        };
        let map = TimeMap::new(self.clock.now(), unix_nanos());
        let now = self.clock.now();
        // A first read parses every section without restoring anything, so that a file
        // that checksums but does not parse (a writer's bug) is refused whole, never half
        // restored; the second restores.
        let mut read = |rt: Option<&Runtime>| -> Result<state::LoadReport, FormatError> {
            state::read_all(&mut opened.sections()?, rt, &map, now)
        };
        if let Err(e) = read(None) {
            return refused(&e);
        }
        let report = match read(Some(&rt)) {
            Ok(r) => r,
            Err(e) => return refused(&e),
        };
        self.metrics.loads.with_label_values(&["restored"]).inc();
        let h = &opened.header;
        let age = Duration::from_nanos(unix_nanos().saturating_sub(h.written_at));
        log::info!(
            "snapshot {}: restored {} keys ({}) from the {} snapshot of {} (pid {}, tollgate {}) written {:.1?} ago, {} bytes; {} keys equal to new by now, {} without room; skipped {} states no longer in the config ({} keys)",
            path.display(),
            report.restored.total(),
            report.restored.describe(),
            h.reason.name(),
            h.instance,
            h.pid,
            h.version,
            age,
            opened.size,
            report.empty,
            report.no_room,
            report.skipped_sections,
            report.skipped_keys
        );
        Loaded::Restored(report.restored)
    }

    /// In a process started with `--upgrade`, once it holds the listeners: waits until
    /// the predecessor's `upgrade` snapshot is on disk (see the module doc), so that
    /// [`Snapshots::load`] reads the state of the predecessor's last decision. `since` is
    /// this process's start (Unix ns): only files written after it count. Bounded: at most
    /// [`HANDOVER_WAIT`] for a predecessor that writes none, and [`UPGRADE_WAIT`] more for
    /// one that promised it (less if it dies); then the file is loaded as it is, with a
    /// warning.
    pub fn await_predecessor(&self, since: u64) {
        let Some(path) = self.path() else {
            return;
        };
        let fresh = |h: &Header| h.written_at >= since && h.pid != self.writer.pid;
        let Some(promise) = poll(&path, HANDOVER_WAIT, |h| {
            fresh(h) && matches!(h.reason, Reason::Handover | Reason::Upgrade)
        }) else {
            log::warn!(
                "snapshot {}: the previous process wrote no handover snapshot within {HANDOVER_WAIT:?} (it may not write snapshots, or to another path): loading the file as it is",
                path.display()
            );
            return;
        };
        if promise.reason == Reason::Upgrade {
            return;
        }
        log::info!(
            "snapshot {}: waiting for the final state of pid {}, written when it stops accepting",
            path.display(),
            promise.pid
        );
        let deadline = Instant::now() + UPGRADE_WAIT;
        loop {
            let h = file::peek(&path);
            if h.as_ref().is_some_and(|h| {
                h.reason == Reason::Upgrade
                    && h.pid == promise.pid
                    && h.written_at >= promise.written_at
            }) {
                return;
            }
            let why = if !alive(promise.pid) {
                "exited without writing its final snapshot"
            } else if Instant::now() >= deadline {
                "wrote no final snapshot in time"
            } else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            log::warn!(
                "snapshot {}: the previous process (pid {}) {why}: loading its handover snapshot; its decisions since are not carried over",
                path.display(),
                promise.pid
            );
            return;
        }
    }

    /// Called once the server has stopped (every service's runtime is down, so no decision
    /// is being made): writes the last snapshot, unless this process handed the file over
    /// to a successor. `phases` is a receiver of Pingora's execution phases subscribed before
    /// the server ran: a phase of the listeners being handed over means an upgrade, even if
    /// the writer service never saw it.
    ///
    /// After an upgrade whose `upgrade` snapshot the service did not get to write (its
    /// runtime was stopped first), it is written here, as long as the successor still waits
    /// for it; later, the successor may have loaded what it found and be writing its own
    /// state, which a late write would overwrite, so nothing is written.
    pub fn after_run(
        &self,
        phases: &mut tokio::sync::broadcast::Receiver<pingora::server::ExecutionPhase>,
    ) {
        use pingora::server::ExecutionPhase;
        use tokio::sync::broadcast::error::TryRecvError;
        loop {
            match phases.try_recv() {
                Ok(ExecutionPhase::GracefulUpgradeTransferringFds)
                | Ok(ExecutionPhase::GracefulUpgradeCloseTimeout) => self.mark_handover(),
                Ok(_) | Err(TryRecvError::Lagged(_)) => {}
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        let handover = *self.handover_at.lock();
        let Some(began) = handover else {
            self.write(Reason::Shutdown);
            return;
        };
        // Waits for a write the service may still be making.
        drop(self.writing.lock());
        if self.handed_over() {
            return;
        }
        // The successor waits HANDOVER_WAIT + UPGRADE_WAIT from about `began`; stay well
        // inside that.
        if began.elapsed() + Duration::from_secs(3) < HANDOVER_WAIT + UPGRADE_WAIT {
            self.write(Reason::Upgrade);
        } else {
            log::warn!("snapshot: the listeners were handed over but the upgrade snapshot was not written in time; leaving the file to the new process");
        }
        self.handed_over.store(true, Ordering::SeqCst);
    }
}

/// Polls the header of `path` every 20 ms for up to `wait` until `ok` holds.
fn poll(path: &Path, wait: Duration, ok: impl Fn(&Header) -> bool) -> Option<Header> {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(h) = file::peek(path).filter(|h| ok(h)) {
            return Some(h);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` still runs (Linux: it has a `/proc` entry and is not a zombie),
/// so that a successor stops waiting for a predecessor that died.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // `pid (comm) STATE ...`: the state follows the last `)`.
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    })
}

/// Unix time in nanoseconds (0 before 1970).
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, nanos)
}

/// The key hash's fingerprint: the in-process hash (ahash, fixed seeds) of a fixed probe
/// key. Two processes with equal fingerprints hash every key alike (same ahash version and
/// the same CPU features); a file with another one is foreign (see "Keys and hashes" in
/// `docs/architecture.md`).
pub fn fingerprint() -> u64 {
    struct Probe;
    impl Facts for Probe {
        fn fact<'a>(&'a self, part: &'a KeyPart) -> Option<Fact<'a>> {
            Some(match part {
                KeyPart::ClientIp => Fact::Ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))),
                KeyPart::Const(text) => Fact::Bytes(text.as_bytes()),
                _ => Fact::Bytes(b"tollgate snapshot fingerprint probe"),
            })
        }
    }
    let spec = KeySpec::new(vec![
        KeyPart::ClientIp,
        KeyPart::Header("x-probe".to_string()),
        KeyPart::Const("0123456789abcdef".repeat(4)),
    ]);
    spec.hash(&Probe).unwrap_or(0)
}

#[cfg(test)]
mod tests;
