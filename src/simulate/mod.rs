//! `tollgate simulate`: replays an access log through a config's limits in virtual time,
//! without a network, and reports what the limits would have done.
//!
//! - [`time`]: log timestamps → nanoseconds since the epoch.
//! - [`line`]: one line's request ([`line::Line`]) and the key parts it gives the limits.
//! - [`combined`], [`jsonl`]: the two log formats, parsed without per-line allocation.
//! - [`replay`]: the engine: a live [`crate::runtime::Runtime`] fed lines at their time.
//! - [`report`]: the counts as a human table or JSON, one config or two side by side.
//!
//! This module drives them: it reads the log through a large buffer, cuts lines with
//! `memchr` (a line longer than `max_line` is skipped as unparseable), parses each once,
//! clamps time so that it never goes backwards (a line older than the newest seen is
//! replayed at the newest time, and counted), and feeds every engine (two with
//! `--compare`). A bad line is counted, the first few kept with their line numbers; it is
//! never fatal.

pub mod combined;
pub mod jsonl;
pub mod line;
pub mod replay;
pub mod report;
pub mod time;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use crate::limits::Nanos;
use crate::simulate::line::Line;
use crate::simulate::replay::Engine;

/// How many unparseable lines are kept with their numbers and reasons.
pub const FIRST_BAD: usize = 10;

/// The read buffer: large, so that a line is almost always parsed in place.
const READ_BUFFER: usize = 1 << 20;

/// The log's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Decided by the log's first line: a JSON object is jsonl (tollgate's own access
    /// log, `server.access_log`, among others), anything else combined.
    #[default]
    Auto,
    /// nginx / Apache combined (or common, or vhost_combined).
    Combined,
    /// One JSON object per line.
    Jsonl,
}

/// Where a line's host comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HostFrom {
    /// The log's own host field (jsonl `host`, the vhost field of a combined line).
    Log,
    /// The request's `Host` header as logged (jsonl `headers.host` or `http_host`).
    Header,
}

/// What to replay and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The access log.
    pub log: PathBuf,
    /// Its format.
    pub format: Format,
    /// Where hosts come from.
    pub host_from: HostFrom,
    /// Lines longer than this many bytes are skipped as unparseable.
    pub max_line: usize,
}

/// Why a simulation could not run (a bad line never stops it).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The log cannot be opened or read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// `--origin` names no origin.
    #[error("--origin `{name}`: no such origin (the config has: {})", known.join(", "))]
    NoSuchOrigin {
        /// The name given.
        name: String,
        /// The config's origins.
        known: Vec<String>,
    },
    /// The runtime could not be built from the config.
    #[error("cannot build the config's limits: {0}")]
    Build(String),
}

/// One unparseable line.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BadLine {
    /// 1-based line number.
    pub line: u64,
    /// Why.
    pub reason: String,
}

/// What reading the log found, apart from the engines' counts.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Input {
    /// Lines read (blank ones included).
    pub lines: u64,
    /// Lines parsed and replayed.
    pub replayed: u64,
    /// Unparseable lines (overlong ones included).
    pub unparseable: u64,
    /// The first [`FIRST_BAD`] of them.
    pub first_unparseable: Vec<BadLine>,
    /// Lines whose time was before an earlier line's, replayed at that earlier time.
    pub clamped: u64,
    /// The first line's time (Unix nanoseconds).
    pub start: Option<Nanos>,
    /// The newest time seen.
    pub end: Option<Nanos>,
    /// The format read (`auto` resolved by the first line).
    pub format: Format,
}

impl Input {
    fn bad(&mut self, line: u64, reason: impl FnOnce() -> String) {
        self.unparseable += 1;
        if self.first_unparseable.len() < FIRST_BAD {
            self.first_unparseable.push(BadLine {
                line,
                reason: reason(),
            });
        }
    }
}

/// The format of a log that starts with `head`: jsonl when its first non-blank byte opens
/// a JSON object, combined otherwise.
pub fn detect(head: &[u8]) -> Format {
    match head.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Format::Jsonl,
        _ => Format::Combined,
    }
}

/// Reads the log and feeds every line to every engine. `progress` is called now and then
/// with the bytes and lines read so far.
pub fn replay(
    opts: &Options,
    engines: &mut [Engine],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Input, SimError> {
    let read_err = |source| SimError::Read {
        path: opts.log.clone(),
        source,
    };
    let file = File::open(&opts.log).map_err(read_err)?;
    let mut reader = BufReader::with_capacity(READ_BUFFER, file);
    let format = match opts.format {
        Format::Auto => detect(reader.fill_buf().map_err(read_err)?),
        known => known,
    };
    let mut input = Input {
        format,
        ..Input::default()
    };
    let mut feeder = Feeder {
        format,
        opts,
        engines,
        input: &mut input,
        newest: 0,
    };
    // A line split across two reads is assembled here; `skipping` while inside an overlong
    // line.
    let mut carry: Vec<u8> = Vec::new();
    let mut skipping = false;
    let mut bytes = 0u64;
    loop {
        let buf = reader.fill_buf().map_err(read_err)?;
        if buf.is_empty() {
            break;
        }
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', buf) {
            let piece = &buf[start..nl];
            start = nl + 1;
            if skipping {
                skipping = false;
                feeder.overlong();
            } else if carry.len() + piece.len() > opts.max_line {
                carry.clear();
                feeder.overlong();
            } else if carry.is_empty() {
                feeder.line(piece);
            } else {
                carry.extend_from_slice(piece);
                feeder.line(&carry);
                carry.clear();
            }
        }
        let rest = &buf[start..];
        if !skipping {
            if carry.len() + rest.len() > opts.max_line {
                carry.clear();
                skipping = true;
            } else {
                carry.extend_from_slice(rest);
            }
        }
        let n = buf.len();
        reader.consume(n);
        bytes += n as u64;
        progress(bytes, feeder.input.lines);
    }
    if skipping {
        feeder.overlong();
    } else if !carry.is_empty() {
        feeder.line(&carry);
    }
    Ok(input)
}

/// Parses lines and hands them to the engines.
struct Feeder<'a> {
    /// The log's format, `auto` resolved.
    format: Format,
    opts: &'a Options,
    engines: &'a mut [Engine],
    input: &'a mut Input,
    /// The newest time seen: no line is replayed before it.
    newest: Nanos,
}

impl Feeder<'_> {
    fn overlong(&mut self) {
        self.input.lines += 1;
        let max = self.opts.max_line;
        self.input
            .bad(self.input.lines, || format!("longer than {max} bytes"));
    }

    fn line(&mut self, text: &[u8]) {
        self.input.lines += 1;
        let number = self.input.lines;
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match self.format {
            Format::Combined | Format::Auto => match combined::parse(text) {
                Ok(line) => self.feed(&line),
                Err(why) => self.input.bad(number, || why.to_string()),
            },
            Format::Jsonl => {
                if let Err(why) = jsonl::with_line(text, |line| self.feed(line)) {
                    self.input.bad(number, || why.to_string());
                }
            }
        }
    }

    fn feed(&mut self, line: &Line<'_>) {
        self.input.replayed += 1;
        if self.input.start.is_none() {
            self.input.start = Some(line.time);
        }
        if line.time < self.newest {
            self.input.clamped += 1;
        } else {
            self.newest = line.time;
        }
        self.input.end = Some(self.newest);
        let host = match self.opts.host_from {
            HostFrom::Log => line.host,
            HostFrom::Header => line.header(b"host"),
        };
        for engine in self.engines.iter_mut() {
            engine.feed(line, host, self.newest);
        }
    }
}
