//! The snapshot file's framing: magic, format version, header, checksum and end marker,
//! and the bounded little-endian reads and writes every part of the file is made of.
//!
//! ```text
//! file    = magic "TGSNAP\r\n"  version:u32  header  section*  0x00  checksum:u64  "TGSNAPOK"
//! header  = fingerprint:u64  written_at:u64  reason:u8  pid:u32  started_at:u64
//!           instance:str  tollgate_version:str
//! section = 0x01  (see `state.rs`)
//! str     = len:u32 bytes          (at most MAX_TEXT bytes)
//! ```
//!
//! Integers are little-endian; times are Unix nanoseconds. `checksum` is XXH3-64 of every
//! byte before it, so a flipped bit anywhere is caught; the end marker after it tells a
//! file cut short from a corrupt one. The layout is documented in `docs/architecture.md`
//! ("Snapshots"). Nothing read is trusted: every length is bounded before anything is
//! allocated for it, and a read past the end is an error, never a panic.

use std::io::{self, Read, Write};

use xxhash_rust::xxh3::Xxh3;

/// The first 8 bytes: the name, and a CR LF that a text-mode copy would mangle.
pub const MAGIC: &[u8; 8] = b"TGSNAP\r\n";

/// The last 8 bytes, after the checksum: present only if the whole file was written.
pub const END: &[u8; 8] = b"TGSNAPOK";

/// The format this build writes and reads.
pub const VERSION: u32 = 1;

/// The longest text (instance name, version, label) a file may hold.
pub const MAX_TEXT: u32 = 4096;

/// The longest identity or shape blob a file may hold.
pub const MAX_BLOB: u32 = 1 << 16;

/// Bytes of the trailer: checksum and end marker.
pub const TRAILER: u64 = 16;

/// Why a snapshot was written; a successor waiting at an upgrade looks for `Upgrade`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The periodic write (`every`).
    Periodic,
    /// At shutdown (SIGTERM, SIGINT).
    Shutdown,
    /// When an upgrade begins handing the listeners over: a promise that the `Upgrade`
    /// snapshot follows once this process stops accepting.
    Handover,
    /// The last write of a process that handed its listeners over, once it stopped
    /// accepting connections: what its successor loads.
    Upgrade,
}

impl Reason {
    fn code(self) -> u8 {
        match self {
            Reason::Periodic => 0,
            Reason::Shutdown => 1,
            Reason::Handover => 2,
            Reason::Upgrade => 3,
        }
    }

    fn of(code: u8) -> Option<Self> {
        [
            Reason::Periodic,
            Reason::Shutdown,
            Reason::Handover,
            Reason::Upgrade,
        ]
        .into_iter()
        .find(|r| r.code() == code)
    }

    /// The word the logs use.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Periodic => "periodic",
            Reason::Shutdown => "shutdown",
            Reason::Handover => "handover",
            Reason::Upgrade => "upgrade",
        }
    }
}

/// Who wrote a snapshot, when and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The writer's key-hash fingerprint: keys are only meaningful to a process whose
    /// hash gives the same values (see `docs/architecture.md`, "Keys and hashes").
    pub fingerprint: u64,
    /// When the file was written, Unix nanoseconds.
    pub written_at: u64,
    /// Why it was written.
    pub reason: Reason,
    /// The writer's process ID.
    pub pid: u32,
    /// When the writer started, Unix nanoseconds.
    pub started_at: u64,
    /// The writer's `server.instance` (or `host:pid`).
    pub instance: String,
    /// The writer's tollgate version.
    pub version: String,
}

/// Why a snapshot file cannot be used. Each names what is wrong; the caller adds the file.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// It could not be read.
    #[error("cannot read it: {0}")]
    Io(#[from] io::Error),
    /// It does not start with the magic.
    #[error("not a tollgate snapshot (no magic)")]
    NotSnapshot,
    /// Another format version.
    #[error("format version {0}, this build reads version {VERSION}")]
    Version(u32),
    /// It ends before its end marker: cut short (a crash while writing, a full disk, a
    /// partial copy).
    #[error("truncated ({0} bytes, no end marker)")]
    Truncated(u64),
    /// The checksum does not match the content.
    #[error("corrupt (checksum mismatch)")]
    Checksum,
    /// Its content does not parse although the checksum matched (a writer's bug).
    #[error("corrupt ({0})")]
    Corrupt(String),
    /// Written by a build whose key hash differs: its keys mean nothing here.
    #[error("foreign: written by a build whose key hash differs (fingerprint {theirs:016x}, ours {ours:016x}; another CPU or ahash version), so its keys cannot be matched")]
    Foreign {
        /// The file's fingerprint.
        theirs: u64,
        /// This process's.
        ours: u64,
    },
    /// Larger than anything the current config could have written, with room to spare.
    #[error("{size} bytes, more than the {max} bytes this config's tables could fill")]
    TooLarge {
        /// The file's size.
        size: u64,
        /// The bound.
        max: u64,
    },
}

/// A writer that checksums what it writes.
pub struct Sink<W: Write> {
    inner: W,
    hash: Xxh3,
    written: u64,
}

impl<W: Write> Sink<W> {
    /// Starts a file: the magic and the format version.
    pub fn start(inner: W) -> io::Result<Self> {
        let mut sink = Self {
            inner,
            hash: Xxh3::new(),
            written: 0,
        };
        sink.raw(MAGIC)?;
        sink.u32(VERSION)?;
        Ok(sink)
    }

    fn raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hash.update(bytes);
        self.written += bytes.len() as u64;
        self.inner.write_all(bytes)
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) -> io::Result<()> {
        self.raw(&[v])
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> io::Result<()> {
        self.raw(&v.to_le_bytes())
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> io::Result<()> {
        self.raw(&v.to_le_bytes())
    }

    /// Length-prefixed bytes (the reader refuses more than its bound).
    pub fn bytes(&mut self, v: &[u8]) -> io::Result<()> {
        let len = u32::try_from(v.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "blob over 4 GiB"))?;
        self.u32(len)?;
        self.raw(v)
    }

    /// Length-prefixed text, cut to [`MAX_TEXT`] bytes.
    pub fn text(&mut self, v: &str) -> io::Result<()> {
        self.bytes(clip(v))
    }

    /// The header, after the magic and version.
    pub fn header(&mut self, h: &Header) -> io::Result<()> {
        self.u64(h.fingerprint)?;
        self.u64(h.written_at)?;
        self.u8(h.reason.code())?;
        self.u32(h.pid)?;
        self.u64(h.started_at)?;
        self.text(&h.instance)?;
        self.text(&h.version)
    }

    /// Ends the file (the section list's end, checksum, end marker) and returns the
    /// writer and the bytes written.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        self.u8(0)?;
        let sum = self.hash.digest();
        self.inner.write_all(&sum.to_le_bytes())?;
        self.inner.write_all(END)?;
        Ok((self.inner, self.written + TRAILER))
    }
}

/// `text` cut to [`MAX_TEXT`] bytes at a character boundary.
fn clip(text: &str) -> &[u8] {
    let mut end = text.len().min(MAX_TEXT as usize);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text.as_bytes()[..end]
}

/// A reader of the checked content (between the magic and the trailer) with bounded
/// lengths. Reading past the content is [`FormatError::Corrupt`].
pub struct Source<R: Read> {
    inner: R,
}

impl<R: Read> Source<R> {
    /// Reads `inner`, which must end where the content ends.
    pub fn new(inner: R) -> Self {
        Self { inner }
    }

    fn exact(&mut self, buf: &mut [u8]) -> Result<(), FormatError> {
        self.inner.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => corrupt("runs past its end"),
            _ => FormatError::Io(e),
        })
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, FormatError> {
        let mut b = [0; 1];
        self.exact(&mut b)?;
        Ok(b[0])
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, FormatError> {
        let mut b = [0; 4];
        self.exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, FormatError> {
        let mut b = [0; 8];
        self.exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Length-prefixed bytes of at most `max`.
    pub fn bytes(&mut self, max: u32, what: &str) -> Result<Vec<u8>, FormatError> {
        let len = self.u32()?;
        if len > max {
            return Err(corrupt(&format!("{what} of {len} bytes, at most {max}")));
        }
        let mut v = vec![0; len as usize];
        self.exact(&mut v)?;
        Ok(v)
    }

    /// Length-prefixed UTF-8 text of at most [`MAX_TEXT`] bytes (invalid bytes replaced).
    pub fn text(&mut self, what: &str) -> Result<String, FormatError> {
        let v = self.bytes(MAX_TEXT, what)?;
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// Skips `n` bytes without keeping them.
    pub fn skip(&mut self, n: u64) -> Result<(), FormatError> {
        let copied = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())?;
        if copied < n {
            return Err(corrupt("runs past its end"));
        }
        Ok(())
    }

    /// The header, after the magic and version.
    pub fn header(&mut self) -> Result<Header, FormatError> {
        Ok(Header {
            fingerprint: self.u64()?,
            written_at: self.u64()?,
            reason: Reason::of(self.u8()?).ok_or_else(|| corrupt("unknown reason"))?,
            pid: self.u32()?,
            started_at: self.u64()?,
            instance: self.text("instance")?,
            version: self.text("version")?,
        })
    }
}

/// A [`FormatError::Corrupt`] saying `what`.
pub fn corrupt(what: &str) -> FormatError {
    FormatError::Corrupt(what.to_string())
}

/// Checks the start of a file (magic and version) from its first 12 bytes.
pub fn check_start(start: &[u8]) -> Result<(), FormatError> {
    if start.len() < MAGIC.len() || &start[..MAGIC.len()] != MAGIC {
        return Err(FormatError::NotSnapshot);
    }
    let version = start
        .get(8..12)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(FormatError::NotSnapshot)?;
    if version != VERSION {
        return Err(FormatError::Version(version));
    }
    Ok(())
}

/// XXH3-64 of everything `r` yields, streamed in 64 KiB reads.
pub fn checksum<R: Read>(mut r: R) -> io::Result<u64> {
    let mut hash = Xxh3::new();
    let mut buf = vec![0; 1 << 16];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(hash.digest());
        }
        hash.update(&buf[..n]);
    }
}
