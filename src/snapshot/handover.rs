//! The file's hand-over between two processes at an upgrade: the new process waits for
//! its predecessor's final state before it loads ([`Snapshots::await_predecessor`]), and a
//! stopping process writes its last snapshot, or leaves the file to its successor
//! ([`Snapshots::after_run`]). The ordering is in `docs/architecture.md` ("Snapshots").

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::snapshot::file;
use crate::snapshot::format::{Header, Reason};
use crate::snapshot::Snapshots;

/// How long a new process waits, after receiving the listeners, for its predecessor's
/// `handover` snapshot before concluding that the predecessor writes none.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(2);

/// How long it then waits for the `upgrade` snapshot: Pingora's fixed 5 s close window,
/// plus time for the write.
pub const UPGRADE_WAIT: Duration = Duration::from_secs(15);

impl Snapshots {
    /// Records that the listeners are being handed over to a successor (SIGQUIT).
    pub fn mark_handover(&self) {
        self.handover_at.lock().get_or_insert_with(Instant::now);
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
pub(super) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // `pid (comm) STATE ...`: the state follows the last `)`.
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    })
}
