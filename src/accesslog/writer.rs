//! The access log's writer thread: every [`FLUSH_EVERY`] it takes what the shards hold,
//! orders the records by time, formats them and writes them in one large write. It
//! reopens the file when asked (SIGUSR1, as nginx does) and when the path no longer names
//! the file it has open (logrotate's `create` mode moved it away), checked every
//! [`CHECK_EVERY`]; with `copytruncate`, appending simply continues at the new end.
//!
//! A write that fails (a full disk) loses that batch: its lines are counted as dropped
//! and a warning is logged at most once per [`CHECK_EVERY`]. A write that blocks (a pipe
//! nobody reads) blocks only this thread: the shards fill and further lines are dropped.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::accesslog::record::Record;
use crate::accesslog::{format, AccessLog};
use crate::config::{AccessLogFormat, AccessLogPath};

/// How often the shards are drained.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// How often the path is checked for a moved file.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Where lines go.
pub enum Output {
    /// Standard output.
    Stdout,
    /// A file opened for appending, with the identity it had when opened.
    File {
        /// The configured path.
        path: PathBuf,
        /// The open file.
        file: File,
        /// Its device and inode.
        id: (u64, u64),
    },
}

/// Why the access log cannot be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the access log `{path}`: {source}")]
pub struct OpenError {
    /// The file.
    pub path: String,
    /// What went wrong.
    pub source: io::Error,
}

fn open_file(path: &Path) -> io::Result<(File, (u64, u64))> {
    let file = OpenOptions::new().append(true).create(true).open(path)?;
    let meta = file.metadata()?;
    Ok((file, (meta.dev(), meta.ino())))
}

impl Output {
    /// Opens what `path` names (a file is created if missing, appended to).
    pub fn open(path: &AccessLogPath) -> Result<Output, OpenError> {
        match path {
            AccessLogPath::Stdout => Ok(Output::Stdout),
            AccessLogPath::File(p) => {
                let (file, id) = open_file(p).map_err(|source| OpenError {
                    path: p.display().to_string(),
                    source,
                })?;
                Ok(Output::File {
                    path: p.clone(),
                    file,
                    id,
                })
            }
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Output::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(bytes)?;
                out.flush()
            }
            Output::File { file, .. } => file.write_all(bytes),
        }
    }

    /// Whether the path now names another file than the one open (or none).
    fn moved(&self) -> bool {
        match self {
            Output::Stdout => false,
            Output::File { path, id, .. } => match std::fs::metadata(path) {
                Ok(meta) => (meta.dev(), meta.ino()) != *id,
                Err(_) => true,
            },
        }
    }

    /// Opens the path again; on failure the old file stays.
    fn reopen(&mut self) -> io::Result<()> {
        if let Output::File { path, file, id } = self {
            let (new, new_id) = open_file(path)?;
            *file = new;
            *id = new_id;
        }
        Ok(())
    }
}

/// The running writer: what stops it.
pub struct Handle {
    log: Arc<AccessLog>,
    thread: JoinHandle<()>,
    done: mpsc::Receiver<()>,
}

impl Handle {
    /// Asks the writer to write what is left and stop, and waits for it at most
    /// `deadline`.
    pub fn finish(self, deadline: Duration) {
        self.log.stop.store(true, Ordering::Relaxed);
        self.thread.thread().unpark();
        if self.done.recv_timeout(deadline).is_err() {
            log::warn!("the access log writer did not finish in {deadline:?}; lines may be lost");
        }
    }
}

/// Starts the writer thread for `log`, writing to `out`.
pub fn spawn(log: Arc<AccessLog>, out: Output) -> io::Result<Handle> {
    let (tx, done) = mpsc::channel();
    let writer_log = log.clone();
    let thread = std::thread::Builder::new()
        .name("access-log".into())
        .spawn(move || {
            run(&writer_log, out);
            let _ = tx.send(());
        })?;
    Ok(Handle { log, thread, done })
}

/// The writer's loop.
fn run(log: &AccessLog, mut out: Output) {
    let mut spares = vec![Vec::new(); log.shards.len()];
    let mut text = Vec::with_capacity(1 << 20);
    let mut last_check = Instant::now();
    let mut last_warning: Option<Instant> = None;
    loop {
        std::thread::park_timeout(FLUSH_EVERY);
        let stopping = log.stop.load(Ordering::Relaxed);
        let reopen = log.reopen.swap(false, Ordering::Relaxed);
        if reopen || last_check.elapsed() >= CHECK_EVERY {
            last_check = Instant::now();
            if reopen || out.moved() {
                if let Err(e) = out.reopen() {
                    warn(&mut last_warning, || {
                        format!("cannot reopen the access log: {e}; still writing the old file")
                    });
                }
            }
        }
        log.take(&mut spares);
        let lines = render(log, &spares, &mut text);
        if lines > 0 {
            if let Err(e) = out.write(&text) {
                log.count_dropped(lines);
                warn(&mut last_warning, || {
                    format!("cannot write the access log: {e}; {lines} lines dropped")
                });
            }
        }
        if stopping {
            return;
        }
    }
}

/// Formats every record of `batches` into `text` (cleared first), oldest first; returns
/// how many lines.
fn render(log: &AccessLog, batches: &[Vec<u8>], text: &mut Vec<u8>) -> u64 {
    text.clear();
    let mut records: Vec<Record<'_>> = Vec::new();
    for batch in batches {
        let mut rest = batch.as_slice();
        while let Some((rec, next)) = Record::decode(rest) {
            records.push(rec);
            rest = next;
        }
    }
    // Shards are drained one after another: put their lines back in time order.
    records.sort_by_key(|r| r.time);
    for rec in &records {
        match log.format() {
            AccessLogFormat::Json => format::json(rec, text),
            AccessLogFormat::Combined => format::combined(rec, text),
        }
    }
    records.len() as u64
}

fn warn(last: &mut Option<Instant>, message: impl FnOnce() -> String) {
    if last.is_none_or(|t| t.elapsed() >= CHECK_EVERY) {
        *last = Some(Instant::now());
        log::warn!("{}", message());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accesslog::tests::conf;
    use crate::config::{AccessLogOnly, AccessLogPath};

    #[test]
    fn lines_reach_the_file_and_follow_a_move() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let mut c = conf(AccessLogOnly::All);
        c.path = AccessLogPath::File(path.clone());
        let counter = prometheus::IntCounter::new("d", "d").unwrap();
        let log = Arc::new(AccessLog::new(c.clone(), counter));
        let out = Output::open(&c.path).unwrap();
        let handle = spawn(log.clone(), out).unwrap();
        let rec = |t| Record {
            time: t,
            method: b"GET",
            ..Record::default()
        };
        log.push(&rec(2));
        log.push(&rec(1));
        let deadline = Instant::now() + Duration::from_secs(30);
        let lines = |p: &Path| {
            std::fs::read_to_string(p)
                .map(|t| t.lines().count())
                .unwrap_or(0)
        };
        while lines(&path) < 2 {
            assert!(Instant::now() < deadline, "lines never written");
            std::thread::yield_now();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\"time\":\"1970-01-01T00:00:00.000000Z\""));
        let moved = dir.path().join("access.log.1");
        std::fs::rename(&path, &moved).unwrap();
        log.request_reopen();
        log.push(&rec(3));
        handle.finish(Duration::from_secs(30));
        assert_eq!(lines(&moved), 2);
        assert_eq!(lines(&path), 1, "the new file has the new line");
    }
}
