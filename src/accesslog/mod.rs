//! The access log (`server.access_log`): one line per request, written off the request
//! path (see `docs/access-log.md` and `docs/architecture.md`).
//!
//! - [`record`]: one request's fields ([`Record`]) and their compact binary form.
//! - [`format`]: a record as a json or a combined line.
//! - [`writer`]: the writer thread: drains the shards, formats, writes in large writes,
//!   reopens the file when it is moved or on SIGUSR1.
//!
//! This module owns the buffer between them: [`AccessLog`], a few shards, each a
//! byte buffer behind its own mutex. A request encodes its record into its thread's shard
//! (a memcpy: no formatting, no allocation once the shard's buffer has grown, no syscall);
//! the only other party to that mutex is the writer, which holds it for a pointer swap.
//! A shard that would grow past its bound refuses the line: the line is dropped and
//! counted (`tollgate_access_log_dropped_total`), and the request never waits on the disk.

pub mod format;
pub mod record;
pub mod writer;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use prometheus::IntCounter;

use crate::config::{AccessLog as Conf, AccessLogFormat, AccessLogOnly};
pub use record::{Protocol, Record};

/// The bytes all shards may hold together: at 200 bytes a record, ten thousand requests,
/// about 200 ms of a busy instance's traffic if the disk stops.
pub const BUFFER_BYTES: usize = 2 << 20;

/// One shard: encoded records waiting for the writer, padded to its own cache lines.
#[repr(align(128))]
struct Shard {
    buf: Mutex<Vec<u8>>,
}

/// The access log's buffer and settings, shared by every request and the writer.
pub struct AccessLog {
    conf: Conf,
    shards: Box<[Shard]>,
    /// The most bytes one shard holds.
    shard_bytes: usize,
    /// `tollgate_access_log_dropped_total`.
    dropped: IntCounter,
    /// Set by SIGUSR1: the writer reopens the file.
    reopen: AtomicBool,
    /// Set at shutdown: the writer drains what is left and stops.
    stop: AtomicBool,
}

/// The next shard a thread is given; each thread keeps its own.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard (`usize::MAX` until first use).
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

impl AccessLog {
    /// A log with `conf`'s settings, whose dropped lines count on `dropped`. Shards: two
    /// per CPU (at least four), so that worker threads almost never share one.
    pub fn new(conf: Conf, dropped: IntCounter) -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let n = (2 * cpus).clamp(4, 64);
        let shards = (0..n)
            .map(|_| Shard {
                buf: Mutex::new(Vec::new()),
            })
            .collect();
        Self {
            conf,
            shards,
            shard_bytes: BUFFER_BYTES / n,
            dropped,
            reopen: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    /// The settings.
    pub fn conf(&self) -> &Conf {
        &self.conf
    }

    /// Whether a request with `status` (0: none sent), rejected by a limit or not, gets a
    /// line (`only`).
    pub fn wants(&self, status: u16, rejected: bool) -> bool {
        match self.conf.only {
            AccessLogOnly::All => true,
            AccessLogOnly::Rejected => rejected,
            AccessLogOnly::Errors => status == 0 || status >= 400,
        }
    }

    /// Queues `rec`'s line for the writer, or drops and counts it when its shard is full.
    /// Never blocks on I/O.
    pub fn push(&self, rec: &Record<'_>) {
        let index = SHARD.with(|s| {
            let mut i = s.get();
            if i == usize::MAX {
                i = NEXT_SHARD.fetch_add(1, Ordering::Relaxed);
                s.set(i);
            }
            i
        }) % self.shards.len();
        let mut buf = self.shards[index].buf.lock();
        let before = buf.len();
        if before >= self.shard_bytes {
            drop(buf);
            self.dropped.inc();
            return;
        }
        rec.encode(&mut buf);
        if buf.len() > self.shard_bytes {
            buf.truncate(before);
            drop(buf);
            self.dropped.inc();
        }
    }

    /// Moves every shard's records into `spares` (one buffer per shard, swapped in and
    /// out so that both sides keep their capacity).
    fn take(&self, spares: &mut [Vec<u8>]) {
        for (shard, spare) in self.shards.iter().zip(spares.iter_mut()) {
            spare.clear();
            std::mem::swap(&mut *shard.buf.lock(), spare);
        }
    }

    /// The line format.
    fn format(&self) -> AccessLogFormat {
        self.conf.format
    }

    /// Asks the writer to reopen the file (SIGUSR1).
    pub fn request_reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    fn count_dropped(&self, n: u64) {
        self.dropped.inc_by(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AccessLogPath;

    pub(crate) fn conf(only: AccessLogOnly) -> Conf {
        Conf {
            path: AccessLogPath::Stdout,
            format: AccessLogFormat::Json,
            only,
            query: false,
            headers: vec![],
        }
    }

    #[test]
    fn only_picks_the_requests() {
        let c = IntCounter::new("d", "d").unwrap();
        let all = AccessLog::new(conf(AccessLogOnly::All), c.clone());
        assert!(all.wants(200, false));
        let rejected = AccessLog::new(conf(AccessLogOnly::Rejected), c.clone());
        assert!(rejected.wants(429, true) && !rejected.wants(429, false));
        let errors = AccessLog::new(conf(AccessLogOnly::Errors), c);
        assert!(errors.wants(502, false) && errors.wants(0, false) && !errors.wants(304, false));
    }

    #[test]
    fn a_full_buffer_drops_and_counts() {
        let c = IntCounter::new("d", "d").unwrap();
        let log = AccessLog::new(conf(AccessLogOnly::All), c.clone());
        let path = vec![b'p'; 4000];
        let rec = Record {
            path: &path,
            ..Record::default()
        };
        // One thread: one shard, which holds shard_bytes.
        let fits = log.shard_bytes / 4000;
        for _ in 0..fits + 10 {
            log.push(&rec);
        }
        assert!(c.get() >= 10, "dropped {}", c.get());
        let mut spares = vec![Vec::new(); log.shards.len()];
        log.take(&mut spares);
        let held: usize = spares.iter().map(Vec::len).sum();
        assert!(held <= log.shard_bytes);
        let before = c.get();
        log.push(&rec);
        assert_eq!(c.get(), before, "room again once drained");
    }
}
