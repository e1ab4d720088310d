//! Live reload: SIGHUP or a change of the config file on disk re-reads it, validates it
//! fully, and swaps it in atomically. An invalid file changes nothing.
//!
//! **Watching.** The file's *directory* is watched, not the file: editors that save by
//! writing a new file and renaming it over the old one replace the inode, which a watch on
//! the file itself would lose, and Kubernetes updates a mounted ConfigMap by swapping a
//! symlink in that directory. Any change in the directory wakes the reloader, which then
//! reads the file (following symlinks) and compares it with what it saw last: unrelated
//! changes cost one read of the config and nothing else.
//!
//! **Torn writes.** A file rewritten in place is briefly incomplete, and a prefix of a
//! config is often a valid config with origins or limits missing. Applying one would
//! answer 404 for the missing origins and drop the state of the missing limits. So a
//! file event is handled in three steps:
//!
//! 1. *Settle.* The file is read [`DEBOUNCE`] after the first event, then again every
//!    [`SETTLE`] until two reads in a row agree on inode, size, modification time and
//!    content (for at most [`MAX_SETTLE_READS`] reads).
//! 2. *Replaced or rewritten.* A new inode means the file was replaced whole (a rename,
//!    a ConfigMap symlink swap): it is complete and applies like any reload. The same
//!    inode means it was rewritten in place, and might be half-written.
//! 3. *Hold what looks partial.* An in-place rewrite is not applied automatically when,
//!    compared to the running config, it removes an origin, a host, an upstream, a limit
//!    or an override, or when it lost the final line break the running file had: what a
//!    cut-off file looks like. It is refused with a log line saying so (counted as a
//!    `failure`); the old config keeps serving, the completed file applies when it is
//!    written, and SIGHUP applies the file as it is, deliberately.
//!
//! **Start-up.** SIGHUP is listened for before the config is first read ([`Hangup`]), and
//! the directory watch, which starts only with the services, begins by reading the file
//! once more: neither a signal nor an edit made while the process starts is lost.
//!
//! **Segment, certificate and key files** live anywhere and are polled: each is compared
//! with the stamp of the version the running runtime loaded ([`crate::files::Stamp`], taken
//! before reading it), so a file replaced, moved over or rewritten in place is seen whatever
//! else happens in between; it is read once it stayed the same for one more poll.
//!
//! **Never dies.** A reload that fails or panics is counted in
//! `tollgate_config_reloads_total{result="failure"}` and logged; the panic is caught, and
//! the next edit or SIGHUP is handled as usual. Requests already running keep the
//! `Arc<Runtime>` they started with; limiter state carries over by identity (see
//! [`crate::runtime`]).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use notify::{RecursiveMode, Watcher};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;
use tokio::time::Instant;

use crate::config::{self, Config, ConfigError, Loaded};
use crate::files::Stamp;
use crate::metrics::Metrics;
use crate::runtime::{BuildError, Carried, Runtime};

/// How often segment files are checked for changes.
pub const SEGMENT_POLL: Duration = Duration::from_millis(500);

/// How long after a file event the file is first read: one save is usually several
/// events within a few milliseconds.
pub const DEBOUNCE: Duration = Duration::from_millis(150);

/// The pause between two reads of a changed file; it is applied once two reads in a row
/// agree.
pub const SETTLE: Duration = Duration::from_millis(300);

/// The most reads spent waiting for a changed file to settle (about 6 s); a file still
/// changing after them is read again at its next change.
pub const MAX_SETTLE_READS: u32 = 20;

/// The most removals a "looks partly written" message lists.
const MAX_LISTED: usize = 5;

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
    /// The file was rewritten in place and looks cut off (see the module doc).
    #[error("config reload held, the previous config keeps serving: {file} was rewritten in place and {why}; it looks like a partly written file, so it is not applied automatically. If it is complete, send SIGHUP to apply it as it is (or save it by renaming a new file over it)")]
    Partial {
        /// The file.
        file: String,
        /// What makes it look cut off.
        why: String,
    },
    /// Loading or building panicked. The panic was caught; nothing changed.
    #[error("config reload failed, the previous config keeps serving: the reload panicked: {0}")]
    Panicked(String),
}

/// Seconds since the Unix epoch, for the last-success gauge.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One read of the config file: which file it was, its size and modification time as
/// the file system reported them, and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Device and inode (following symlinks): a new inode is a file replaced whole.
    pub inode: (u64, u64),
    /// The size reported before reading.
    pub len: u64,
    /// The modification time reported before reading.
    pub modified: Option<SystemTime>,
    /// The content, at most one byte more than a config may have.
    pub bytes: Vec<u8>,
}

impl Snapshot {
    /// Reads `path` (following symlinks; a regular file only, never blocking on a FIFO:
    /// [`crate::files`]). A file longer than a config may be is read only one byte past the
    /// bound, for the size error.
    pub fn read(path: &Path) -> std::io::Result<Snapshot> {
        use std::os::unix::fs::MetadataExt;
        let file = crate::files::open_regular(path)?;
        let meta = file.metadata()?;
        let limit = u64::try_from(config::MAX_FILE_BYTES).unwrap_or(u64::MAX);
        let mut bytes = Vec::new();
        file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
        Ok(Snapshot {
            inode: (meta.dev(), meta.ino()),
            len: meta.len(),
            modified: meta.modified().ok(),
            bytes,
        })
    }

    /// Parses the bytes, naming `path` in diagnostics.
    pub fn parse(&self, path: &Path) -> Result<Loaded, ConfigError> {
        config::parse_bytes(&self.bytes, &path.display().to_string())
    }

    fn ends_with_newline(&self) -> bool {
        self.bytes.last() == Some(&b'\n')
    }
}

/// How the text being reloaded reached the file, which decides how much it is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// SIGHUP: the operator says the file is ready. Applied as it is.
    Signal,
    /// A new file took the old one's place (rename, symlink swap): complete by
    /// construction. Applied as it is.
    Replaced,
    /// The same file rewritten in place: held when it looks cut off.
    InPlace {
        /// Whether the running config's file ended with a line break.
        had_final_newline: bool,
    },
}

/// Server settings that only a restart or a graceful upgrade can change.
fn restart_only_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let (s, n) = (&old.server, &new.server);
    [
        ("api.max_keys", old.api.max_keys != new.api.max_keys),
        ("server.listen", s.listen != n.listen),
        ("server.metrics", s.metrics != n.metrics),
        ("server.threads", s.threads != n.threads),
        ("server.grace_period", s.grace_period != n.grace_period),
        ("server.demo_upstream", s.demo_upstream != n.demo_upstream),
        ("server.limiter_api", s.limiter_api != n.limiter_api),
        ("server.admin", s.admin != n.admin),
        ("server.instance", s.instance != n.instance),
        ("server.access_log", s.access_log != n.access_log),
    ]
    .into_iter()
    .filter_map(|(name, changed)| changed.then_some(name))
    .collect()
}

/// What `new` no longer has that `old` had: origins, hosts, upstreams, limits, overrides
/// (by their `match`) and resources, each named. A file cut short loses exactly such things,
/// always at its end.
pub fn removals(old: &Config, new: &Config) -> Vec<String> {
    let mut gone = Vec::new();
    let new_origins: HashMap<&str, &config::Origin> =
        new.origins.iter().map(|o| (o.name.as_str(), o)).collect();
    for o in &old.origins {
        let Some(n) = new_origins.get(o.name.as_str()) else {
            gone.push(format!("origin `{}`", o.name));
            continue;
        };
        let hosts: HashSet<&String> = n.hosts.iter().collect();
        for h in o.hosts.iter().filter(|h| !hosts.contains(h)) {
            gone.push(format!("host `{h}` of origin `{}`", o.name));
        }
        let upstreams: HashSet<&config::Upstream> = n.upstreams.iter().collect();
        for u in o.upstreams.iter().filter(|u| !upstreams.contains(u)) {
            gone.push(format!("upstream `{u}` of origin `{}`", o.name));
        }
        let limits: HashMap<&str, &config::Limit> =
            n.limits.iter().map(|l| (l.name.as_str(), l)).collect();
        for l in &o.limits {
            let Some(nl) = limits.get(l.name.as_str()) else {
                gone.push(format!("limit `{}` of origin `{}`", l.name, o.name));
                continue;
            };
            let lost = l
                .overrides
                .iter()
                .filter(|ov| !nl.overrides.iter().any(|x| x.matchers == ov.matchers))
                .count();
            if lost > 0 {
                gone.push(format!(
                    "{lost} override(s) of limit `{}` of origin `{}`",
                    l.name, o.name
                ));
            }
        }
    }
    let resources: HashSet<&str> = new.resources.iter().map(|r| r.name.as_str()).collect();
    for r in old
        .resources
        .iter()
        .filter(|r| !resources.contains(r.name.as_str()))
    {
        gone.push(format!("resource `{}`", r.name));
    }
    gone
}

/// Why text that arrived `how` looks cut off compared to the running `old` config, if it
/// does.
fn looks_partial(how: Arrival, snapshot: &Snapshot, old: &Config, new: &Config) -> Option<String> {
    let Arrival::InPlace { had_final_newline } = how else {
        return None;
    };
    let gone = removals(old, new);
    if !gone.is_empty() {
        let mut listed = gone
            .iter()
            .take(MAX_LISTED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if gone.len() > MAX_LISTED {
            listed.push_str(&format!(" and {} more", gone.len() - MAX_LISTED));
        }
        return Some(format!("the new text removes {listed}"));
    }
    if had_final_newline && !snapshot.ends_with_newline() {
        return Some("the new text does not end with a line break, as the running one did".into());
    }
    None
}

/// Builds the runtime for `snapshot` on top of the current one and swaps it in, unless
/// it arrived in place and looks cut off. Panics are caught and returned as errors.
/// Counts the attempt in `tollgate_config_reloads_total{result}`.
pub fn apply(
    path: &Path,
    snapshot: &Snapshot,
    how: Arrival,
    runtime: &ArcSwap<Runtime>,
    metrics: &Metrics,
) -> Result<Carried, ReloadError> {
    attempt(metrics, || {
        #[cfg(test)]
        tests::fault(snapshot);
        let loaded = snapshot.parse(path)?;
        let current = runtime.load_full();
        if let Some(why) = looks_partial(how, snapshot, &current.config, &loaded.config) {
            return Err(ReloadError::Partial {
                file: path.display().to_string(),
                why,
            });
        }
        for warning in &loaded.warnings {
            log::warn!("{warning}");
        }
        let pinned = restart_only_changes(&current.config, &loaded.config);
        if !pinned.is_empty() {
            log::warn!(
                "{} changed but cannot be applied live; the old values stay until a restart or a graceful upgrade (`tollgate run --upgrade` then SIGQUIT to the old process)",
                pinned.join(", ")
            );
        }
        let (new, carried) = Runtime::build(Arc::new(loaded.config), Some(&current), metrics)?;
        runtime.store(Arc::new(new));
        Ok(carried)
    })
}

/// Reads `path` and applies it as SIGHUP does.
pub fn reload(
    path: &Path,
    runtime: &ArcSwap<Runtime>,
    metrics: &Metrics,
) -> Result<Carried, ReloadError> {
    match Snapshot::read(path) {
        Ok(snapshot) => apply(path, &snapshot, Arrival::Signal, runtime, metrics),
        Err(source) => attempt(metrics, || {
            Err(ConfigError::Read {
                file: path.display().to_string(),
                source,
            }
            .into())
        }),
    }
}

/// Runs one reload attempt, catching a panic as a failure, and counts the outcome.
fn attempt(
    metrics: &Metrics,
    f: impl FnOnce() -> Result<Carried, ReloadError>,
) -> Result<Carried, ReloadError> {
    // Nothing is shared until the final `store`, so a panic leaves no half-made state
    // behind: unwinding out of `f` is safe to treat as a failed attempt.
    let result = catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|payload| Err(ReloadError::Panicked(panic_message(payload.as_ref()))));
    let outcome = if result.is_ok() { "success" } else { "failure" };
    metrics
        .config_reloads_total
        .with_label_values(&[outcome])
        .inc();
    if result.is_ok() {
        metrics.config_last_reload_success.set(unix_now());
    }
    result
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// A changed file being waited on until two reads agree.
#[derive(Debug)]
struct Settling {
    /// When to read next.
    due: Instant,
    /// The previous read, if any.
    last: Option<Snapshot>,
    /// Reads so far.
    reads: u32,
}

/// What the reloader knows of the file.
#[derive(Debug, Default)]
struct Seen {
    /// The last read acted on (applied, refused or held): an identical read is no change.
    last: Option<Snapshot>,
    /// The inode of the file the running config came from.
    inode: Option<(u64, u64)>,
    /// Whether the running config's file ended with a line break.
    final_newline: bool,
}

impl Seen {
    fn of(snapshot: &Snapshot) -> Seen {
        Seen {
            last: Some(snapshot.clone()),
            inode: Some(snapshot.inode),
            final_newline: snapshot.ends_with_newline(),
        }
    }
}

/// The background service that waits for SIGHUP or file changes.
pub struct Reloader {
    path: PathBuf,
    runtime: Arc<ArcSwap<Runtime>>,
    metrics: Arc<Metrics>,
    /// The read the running config was loaded from.
    initial: Option<Snapshot>,
    /// SIGHUP, listened for since before the config was read; taken when the service
    /// starts.
    hangup: parking_lot::Mutex<Option<Hangup>>,
}

impl Reloader {
    /// Watches `path` and reloads into `runtime`. `initial` is the read the running
    /// config came from (its inode tells an in-place rewrite from a replacement);
    /// `hangup`, SIGHUP listened for since before that read (`None`: listen from the
    /// service's start).
    pub fn new(
        path: PathBuf,
        runtime: Arc<ArcSwap<Runtime>>,
        metrics: Arc<Metrics>,
        initial: Option<Snapshot>,
        hangup: Option<Hangup>,
    ) -> Self {
        Self {
            path,
            runtime,
            metrics,
            initial,
            hangup: parking_lot::Mutex::new(hangup),
        }
    }

    fn log(&self, why: &str, result: Result<Carried, ReloadError>) {
        match result {
            Ok(c) => log::info!(
                "config reloaded ({why}) from {}: {} limit states kept, {} fresh, {} dropped",
                self.path.display(),
                c.kept,
                c.fresh,
                c.dropped
            ),
            Err(e @ ReloadError::Partial { .. }) => log::warn!("{e}"),
            Err(e) => log::error!("{e}"),
        }
    }

    /// The segment files, then the certificate and key files, then the ratelimit files of
    /// `rls.config_dir`, as they are on disk now, in
    /// config order, if any differs from the version the running runtime loaded (its
    /// [`Segment::stamp`](crate::segments::Segment::stamp), its TLS store's stamps): a
    /// replaced, rewritten, removed or new file. `None` when every one is as loaded. A
    /// certificate rotated on disk reloads like a segment.
    fn changed_files(&self) -> Option<Vec<Option<Stamp>>> {
        let rt = self.runtime.load();
        let files = (rt.config.segments.iter())
            .map(|s| s.file.as_path())
            .chain(crate::tls::files(&rt.config.tls));
        // The ratelimit files of `rls.config_dir` as listed now: a file added or removed
        // changes the list's length, one replaced or rewritten its stamp.
        let rls_now = rt
            .config
            .rls
            .config_dir
            .as_deref()
            .map_or_else(Vec::new, |dir| {
                crate::config::rls::list_files(dir).unwrap_or_default()
            });
        let rls_loaded = &rt.config.rls.files;
        let now: Vec<Option<Stamp>> = files
            .map(Stamp::read)
            .chain(rls_now.iter().map(|p| Stamp::read(p)))
            .collect();
        let certs = rt.tls.as_ref().map_or(&[][..], |t| t.stamps());
        let loaded = (rt.config.segments.iter())
            .map(|s| rt.segments.get(&s.name).and_then(|set| set.stamp()))
            .chain(certs.iter().copied())
            .chain(rls_loaded.iter().map(|(_, stamp)| *stamp));
        let mut loaded = loaded.chain(std::iter::repeat(None));
        let same = rls_now.len() == rls_loaded.len()
            && rls_now.iter().zip(rls_loaded).all(|(a, (b, _))| a == b)
            && now.iter().all(|now| loaded.next() == Some(*now));
        (!same).then_some(now)
    }

    /// SIGHUP (or a changed segment file, `why` says which): read once and apply as it is.
    fn on_signal(&self, seen: &mut Seen, why: &str) {
        match Snapshot::read(&self.path) {
            Ok(snapshot) => {
                let result = apply(
                    &self.path,
                    &snapshot,
                    Arrival::Signal,
                    &self.runtime,
                    &self.metrics,
                );
                if result.is_ok() {
                    *seen = Seen::of(&snapshot);
                } else {
                    seen.last = Some(snapshot);
                }
                self.log(why, result);
            }
            Err(e) => self.log(why, reload_read_error(&self.path, e, &self.metrics)),
        }
    }

    /// One read of a changed file. Returns whether to keep settling.
    fn settle_step(&self, settling: &mut Settling, seen: &mut Seen) -> bool {
        let snapshot = match Snapshot::read(&self.path) {
            Ok(s) => s,
            Err(e) => {
                // Gone or unreadable: wait for it to come back, unless that persists.
                settling.reads += 1;
                if settling.reads >= MAX_SETTLE_READS {
                    self.log(
                        "file changed",
                        reload_read_error(&self.path, e, &self.metrics),
                    );
                    return false;
                }
                settling.last = None;
                settling.due = Instant::now() + SETTLE;
                return true;
            }
        };
        settling.reads += 1;
        let first = settling.last.is_none() && settling.reads == 1;
        if first && seen.last.as_ref() == Some(&snapshot) {
            // Something else in the directory changed.
            return false;
        }
        if settling.last.as_ref() != Some(&snapshot) {
            if settling.reads >= MAX_SETTLE_READS {
                log::warn!(
                    "{} is still changing after {} reads {} ms apart; it will be read again at its next change",
                    self.path.display(),
                    settling.reads,
                    SETTLE.as_millis()
                );
                seen.last = Some(snapshot);
                return false;
            }
            settling.last = Some(snapshot);
            settling.due = Instant::now() + SETTLE;
            return true;
        }
        // Two reads agree: the file has settled.
        let how = if seen.inode == Some(snapshot.inode) {
            Arrival::InPlace {
                had_final_newline: seen.final_newline,
            }
        } else {
            Arrival::Replaced
        };
        let result = apply(&self.path, &snapshot, how, &self.runtime, &self.metrics);
        if result.is_ok() {
            *seen = Seen::of(&snapshot);
        } else {
            seen.last = Some(snapshot);
        }
        self.log("file changed", result);
        false
    }

    /// Starts watching the config file's directory; any change in it is sent on `tx`.
    fn watch(
        &self,
        tx: tokio::sync::mpsc::Sender<()>,
    ) -> notify::Result<notify::RecommendedWatcher> {
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                if !event.kind.is_access() {
                    // A full channel already holds a pending wake-up.
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

/// Counts and returns a read failure.
fn reload_read_error(
    path: &Path,
    source: std::io::Error,
    metrics: &Metrics,
) -> Result<Carried, ReloadError> {
    attempt(metrics, || {
        Err(ConfigError::Read {
            file: path.display().to_string(),
            source,
        }
        .into())
    })
}

#[async_trait]
impl BackgroundService for Reloader {
    /// Ready once SIGHUP is handled and the directory is watched: an edit made after
    /// that is seen.
    async fn start_with_ready_notifier(
        &self,
        mut shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let mut hup = match self.hangup.lock().take() {
            Some(h) => Some(h),
            None => match Hangup::listen() {
                Ok(h) => Some(h),
                Err(e) => {
                    log::error!("cannot listen for SIGHUP, reload on signal is off: {e}");
                    None
                }
            },
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
        log::info!(
            "config reloader ready: SIGHUP or a change to {} reloads it",
            self.path.display()
        );
        ready.notify_ready();
        let mut seen = self.initial.as_ref().map(Seen::of).unwrap_or_default();
        // The file was read before the directory was watched: an edit made in between
        // raised no event, so it is read once more now, as after an event (a file that
        // has not changed since costs one read).
        let mut settling = Some(Settling {
            due: Instant::now(),
            last: None,
            reads: 0,
        });
        // Segment files live anywhere, so they are polled (a few stat calls a second, off
        // the request path) against the version the running runtime loaded: a file that
        // differs, and then stays the same for one more poll (so a half-written one is not
        // read), reloads the config as SIGHUP would. A version whose reload failed (a
        // corrupt file) is not tried again until it changes.
        let mut pending: Option<Vec<Option<Stamp>>> = None;
        let mut tried: Option<Vec<Option<Stamp>>> = None;
        let mut poll = tokio::time::interval(SEGMENT_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let due = settling.as_ref().map(|s| s.due);
            tokio::select! {
                _ = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                    settling = None;
                    self.on_signal(&mut seen, "SIGHUP");
                }
                Some(()) = rx.recv() => {
                    if settling.is_none() {
                        settling = Some(Settling { due: Instant::now() + DEBOUNCE, last: None, reads: 0 });
                    }
                }
                _ = async { match due { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    if let Some(mut s) = settling.take() {
                        if self.settle_step(&mut s, &mut seen) {
                            settling = Some(s);
                        }
                    }
                }
                _ = poll.tick() => {
                    match self.changed_files() {
                        None => pending = None,
                        Some(now) if pending.as_ref() == Some(&now) => {
                            pending = None;
                            if tried.as_ref() != Some(&now) {
                                tried = Some(now);
                                self.on_signal(&mut seen, "segment file changed");
                            }
                        }
                        Some(now) => pending = Some(now),
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
    }
}

/// SIGHUP, listened for from the moment [`Hangup::listen`] is called.
///
/// SIGHUP's default action ends the process, and a signal that arrives before anything
/// listens for it is lost. So the server calls [`Hangup::listen`] first thing, before it
/// reads the config, and hands the listener to the [`Reloader`], which services start
/// much later (on a loaded machine, after the proxy already answers): a SIGHUP sent at any
/// point after that is applied once the reloader runs.
pub struct Hangup(tokio::signal::unix::Signal);

impl Hangup {
    /// Registers the SIGHUP handler now and starts recording deliveries. Works outside any
    /// runtime: tokio's handler is process-wide and stays installed, and the listener is
    /// a channel any runtime's signal driver feeds.
    pub fn listen() -> std::io::Result<Hangup> {
        use tokio::signal::unix::{signal, SignalKind};
        if tokio::runtime::Handle::try_current().is_ok() {
            return Ok(Hangup(signal(SignalKind::hangup())?));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let _in = rt.enter();
        Ok(Hangup(signal(SignalKind::hangup())?))
    }

    /// Waits for the next SIGHUP (several before a wait are one).
    pub async fn recv(&mut self) -> Option<()> {
        self.0.recv().await
    }
}

#[cfg(test)]
mod tests;
