//! The snapshot writer: a Pingora background service (its own runtime thread, started
//! after a daemon forks) that writes the snapshot every `stores.local.every` and at the
//! moments of Pingora's execution phases that matter:
//!
//! | moment | write |
//! |---|---|
//! | every `every` (read live from the config, checked at least once a second) | `periodic` |
//! | SIGQUIT: the listeners are being handed over | `handover` (the successor now waits for the next) |
//! | the process stops accepting after a handover (Pingora's shutdown, 5 s later) | `upgrade`, then never again |
//! | SIGTERM: the process stops accepting | `shutdown` (and `main` writes once more at exit) |
//!
//! A write is blocking file I/O on this service's own runtime thread, which nothing else
//! uses; the decision path never waits for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::server::{ExecutionPhase, ShutdownWatch};
use pingora::services::background::BackgroundService;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::snapshot::format::Reason;
use crate::snapshot::Snapshots;

/// The longest the writer sleeps before looking at the config again, so that a reload
/// that shortens `every` or sets a path takes effect within a second.
const RECHECK: Duration = Duration::from_secs(1);

/// The snapshot writer service.
pub struct SnapshotWriter {
    snapshots: Arc<Snapshots>,
    phases: Mutex<Option<broadcast::Receiver<ExecutionPhase>>>,
}

impl SnapshotWriter {
    /// A writer of `snapshots`, following the server's execution `phases`.
    pub fn new(snapshots: Arc<Snapshots>, phases: broadcast::Receiver<ExecutionPhase>) -> Self {
        Self {
            snapshots,
            phases: Mutex::new(Some(phases)),
        }
    }
}

/// Why the writer stops.
enum Stop {
    /// The process stopped accepting (graceful shutdown, or the end of an upgrade's close
    /// window).
    Accepting,
    /// The server is going down without a graceful shutdown (SIGINT): `main` writes.
    Quick,
}

#[async_trait]
impl BackgroundService for SnapshotWriter {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(mut phases) = self.phases.lock().take() else {
            return;
        };
        let mut handing_over = false;
        let mut last = Instant::now();
        let stop = loop {
            let due = last + self.snapshots.every();
            let wake = due.min(Instant::now() + RECHECK);
            tokio::select! {
                phase = phases.recv() => match phase {
                    Ok(ExecutionPhase::GracefulUpgradeTransferringFds) => {
                        handing_over = true;
                        self.snapshots.mark_handover();
                        self.snapshots.write(Reason::Handover);
                    }
                    Ok(ExecutionPhase::ShutdownStarted) => break Stop::Quick,
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break Stop::Quick,
                },
                _ = shutdown.wait_for(|stopping| *stopping) => break Stop::Accepting,
                () = tokio::time::sleep_until(wake.into()) => {
                    if Instant::now() >= last + self.snapshots.every() {
                        self.snapshots.write(Reason::Periodic);
                        last = Instant::now();
                    }
                }
            }
        };
        match (handing_over, stop) {
            // The successor is waiting for this one: write it now, not at exit.
            (true, _) => {
                self.snapshots.write(Reason::Upgrade);
            }
            // Insurance against being killed during the grace period; `main` writes the
            // last one once every request is done.
            (false, Stop::Accepting) => {
                self.snapshots.write(Reason::Shutdown);
            }
            (false, Stop::Quick) => {}
        }
    }
}
