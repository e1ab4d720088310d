//! Live reload: SIGHUP or a change of the config file on disk re-reads it, validates it
//! fully, and swaps it in atomically. An invalid file changes nothing.
//!
//! The file's *directory* is watched, not the file: editors that save by writing a new
//! file and renaming it over the old one replace the inode, which a watch on the file
//! itself would lose. Events are debounced so that one save is one reload. Requests
//! already running keep the `Arc<Runtime>` they started with; limiter state carries over
//! by identity (see [`crate::runtime`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use notify::{RecursiveMode, Watcher};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::config::{self, ConfigError, Server};
use crate::metrics::Metrics;
use crate::runtime::{BuildError, Carried, Runtime};

/// How long to wait after a file event for the editor to finish writing.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// Why a reload was refused. The old config keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file is unreadable or invalid; every problem is listed.
    #[error("config reload refused, the previous config keeps serving:\n{0}")]
    Config(#[from] ConfigError),
    /// The config is valid but its runtime could not be built (e.g. an upstream name
    /// stopped resolving).
    #[error("config reload refused, the previous config keeps serving: {0}")]
    Build(#[from] BuildError),
}

/// Seconds since the Unix epoch, for the last-success gauge.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Server settings that only a restart or a graceful upgrade can change.
fn restart_only_changes(old: &Server, new: &Server) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if old.listen != new.listen {
        changed.push("server.listen");
    }
    if old.metrics != new.metrics {
        changed.push("server.metrics");
    }
    if old.threads != new.threads {
        changed.push("server.threads");
    }
    if old.grace_period != new.grace_period {
        changed.push("server.grace_period");
    }
    if old.demo_upstream != new.demo_upstream {
        changed.push("server.demo_upstream");
    }
    changed
}

/// Loads `path`, builds its runtime on top of the current one, and swaps it in. Counts
/// the attempt in `tollgate_config_reloads_total{result}`.
pub fn reload(
    path: &Path,
    runtime: &ArcSwap<Runtime>,
    metrics: &Metrics,
) -> Result<Carried, ReloadError> {
    let result = try_reload(path, runtime, metrics);
    match &result {
        Ok(_) => {
            metrics
                .config_reloads_total
                .with_label_values(&["success"])
                .inc();
            metrics.config_last_reload_success.set(unix_now());
        }
        Err(_) => metrics
            .config_reloads_total
            .with_label_values(&["failure"])
            .inc(),
    }
    result
}

fn try_reload(
    path: &Path,
    runtime: &ArcSwap<Runtime>,
    metrics: &Metrics,
) -> Result<Carried, ReloadError> {
    let loaded = config::load(path)?;
    for warning in &loaded.warnings {
        log::warn!("{warning}");
    }
    let current = runtime.load_full();
    let pinned = restart_only_changes(&current.config.server, &loaded.config.server);
    if !pinned.is_empty() {
        log::warn!(
            "{} changed but cannot be applied live; the old values stay until a restart or a graceful upgrade (`tollgate run --upgrade` then SIGQUIT to the old process)",
            pinned.join(", ")
        );
    }
    let (new, carried) = Runtime::build(Arc::new(loaded.config), Some(&current), metrics)?;
    runtime.store(Arc::new(new));
    Ok(carried)
}

/// The background service that waits for SIGHUP or file changes.
pub struct Reloader {
    path: PathBuf,
    runtime: Arc<ArcSwap<Runtime>>,
    metrics: Arc<Metrics>,
}

impl Reloader {
    /// Watches `path` and reloads into `runtime`.
    pub fn new(path: PathBuf, runtime: Arc<ArcSwap<Runtime>>, metrics: Arc<Metrics>) -> Self {
        Self {
            path,
            runtime,
            metrics,
        }
    }

    fn reload_logged(&self, why: &str) {
        match reload(&self.path, &self.runtime, &self.metrics) {
            Ok(c) => log::info!(
                "config reloaded ({why}) from {}: {} limit states kept, {} fresh, {} dropped",
                self.path.display(),
                c.kept,
                c.fresh,
                c.dropped
            ),
            Err(e) => log::error!("{e}"),
        }
    }

    /// Starts watching the config file's directory; events for the file are sent on `tx`.
    fn watch(
        &self,
        tx: tokio::sync::mpsc::Sender<()>,
    ) -> notify::Result<notify::RecommendedWatcher> {
        let name = self.path.file_name().map(|n| n.to_os_string());
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                if event.kind.is_access() {
                    return;
                }
                if event
                    .paths
                    .iter()
                    .any(|p| p.file_name().map(|n| n.to_os_string()) == name)
                {
                    // A full channel already holds a pending reload.
                    let _ = tx.try_send(());
                }
            })?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        watcher.watch(&dir, RecursiveMode::NonRecursive)?;
        Ok(watcher)
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                log::error!("cannot listen for SIGHUP, reload on signal is off: {e}");
                None
            }
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let _watcher = match self.watch(tx) {
            Ok(w) => Some(w),
            Err(e) => {
                log::error!(
                    "cannot watch {} for changes, reload on save is off: {e}",
                    self.path.display()
                );
                None
            }
        };
        loop {
            tokio::select! {
                _ = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                    self.reload_logged("SIGHUP");
                }
                Some(()) = rx.recv() => {
                    tokio::time::sleep(DEBOUNCE).await;
                    while rx.try_recv().is_ok() {}
                    self.reload_logged("file changed");
                }
                _ = shutdown.changed() => break,
            }
        }
    }
}
