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
mod handover;
mod metrics;
pub mod service;
pub mod state;

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::limits::clock::nanos;
use crate::limits::{Clock, Fact, Facts, KeyPart, KeySpec, MonotonicClock};
use crate::metrics::{Metrics, MetricsError};
use crate::runtime::Runtime;
use crate::snapshot::format::{FormatError, Header, Reason};
use crate::snapshot::metrics::SnapshotMetrics;
use crate::snapshot::state::{KindCounts, SavedKind, TimeMap};

pub use handover::{HANDOVER_WAIT, UPGRADE_WAIT};

/// The smallest file size cap: a snapshot larger than its config's tables can fill is
/// refused only beyond four times that bound and at least this.
const MIN_CAP: u64 = 64 << 20;

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
