//! Customer segments: named sets of unsigned integer IDs, kept as roaring bitmaps and stored
//! in the portable roaring file formats, so that any roaring implementation (CRoaring, Java,
//! Go, roaring-rs) can write the files tollgate reads and read the files it writes.
//!
//! A segment answers one question on the request path: is this key part (a customer ID, a
//! header value) a member? [`Segment::contains_bytes`] parses the raw value as an ASCII
//! decimal `u64` (digits only: no sign, no whitespace; leading zeros allowed, as in
//! `u64::from_str`, so `007` is member 7), without allocating, then looks it up. A value that
//! is not such an integer is simply not a member. This module is pure: it knows nothing of
//! Pingora or of config types; the config names segments and says which key part they test.
//!
//! **In memory** a segment is a `roaring::RoaringTreemap`: a `BTreeMap` from the high 32 bits
//! of an ID to a 32-bit roaring bitmap of the low 32 bits. A 32-bit bitmap splits its values
//! by their high 16 bits into at most 65 536 containers, each an *array* (sorted `u16`s, up
//! to 4096 values, 2 bytes each), a *bitmap* (8 KiB, for more than 4096 values) or a *run*
//! container (`(start, length)` pairs, 4 bytes per run, for ranges). A lookup is a B-tree
//! probe, a binary search over containers, then a binary search or bit test inside one: no
//! allocation, no lock, no syscall.
//!
//! **File formats** (RoaringFormatSpec, all words little-endian):
//! - *32-bit portable*: a cookie, then per container its key and cardinality − 1 (`u16`
//!   each), then (see below) a `u32` byte offset per container counted from the cookie, then
//!   the containers: arrays as their `u16`s, bitmaps as 1024 `u64` words, runs as a `u16`
//!   run count and `(start, length − 1)` `u16` pairs. Cookie `12346` (`u32`) is followed by
//!   a `u32` container count, has no run containers, and always has offsets. Cookie `12347`
//!   (low `u16`) carries the container count − 1 in its high `u16`, is followed by one bit
//!   per container flagging run containers (`⌈n / 8⌉` bytes), and has offsets only when
//!   there are at least 4 containers.
//! - *64-bit portable* (the spec's 64-bit extension, as CRoaring's `Roaring64Map` and
//!   roaring-rs' `RoaringTreemap` write it): a `u64` bucket count, then per bucket, by
//!   increasing key, a `u32` key (the IDs' high 32 bits) and a 32-bit portable bitmap of the
//!   low 32 bits.
//!
//! **Which format.** [`Segment::write_to`] on a built segment writes the 32-bit format when
//! every ID is below 2³², since every roaring implementation reads it (cookie 12347 when
//! some container is smaller as runs, 12346 otherwise, as CRoaring's and Java's
//! `runOptimize` + portable serialization do), and the 64-bit format otherwise. On load, a
//! file whose first `u32` is 12346 or whose low `u16` is 12347 is read as 32-bit, anything
//! else as 64-bit. Both can start alike only when a 64-bit file has 12346 buckets, or 12347
//! plus a multiple of 65 536 (at least 150 kB of buckets, so a real possibility only with IDs
//! spread over the whole 64-bit space): a file that looks 32-bit but does not parse as such is
//! therefore tried as 64-bit before being refused. No file parses both ways: a 32-bit reading
//! of a 64-bit file either ends at byte 8 (an empty bitmap, leaving the buckets as trailing
//! bytes) or needs a bucket count above 2³².
//!
//! **Validation.** Files come from outside, so loading checks everything before the roaring
//! crate builds the set (and the crate checks again): cookie, container count ≤ 65 536,
//! strictly increasing container and bucket keys, every offset equal to where its container
//! really starts, arrays strictly increasing, bitmap popcount and run lengths equal to the
//! declared cardinality, runs inside `0..=65535`, sorted and neither overlapping nor touching
//! (no reference implementation writes touching runs, and roaring-rs refuses them), unused
//! run-flag bits zero, and nothing after the last container. Any failure is a [`FormatError`]
//! that says what was wrong and at which byte; no input panics (fuzzed with proptest). Empty
//! buckets in a 64-bit file (CRoaring can write them) are accepted and dropped.
//!
//! **Size bound.** [`Segment::load`] refuses files over [`MAX_FILE_BYTES`] (1 GiB, about
//! 500 M IDs in array containers), checked from the file's metadata before reading and again
//! while reading. Memory can exceed the file size: each container costs ~32 bytes of
//! bookkeeping plus its allocation, against as little as 10 bytes of file (a one-value
//! array), so a hostile 1 GiB file of one-value containers could take ~6 GiB. Segment files
//! are operator input, like the config; random IDs cost about as much in memory as on disk
//! (figures below).
//!
//! **Building.** [`build_from_ids`] reads one decimal ID per line (blank lines, `#` comments
//! and surrounding whitespace ignored, CRLF accepted), collects every bad line (the first
//! [`MAX_REPORTED_BAD_LINES`] with their line numbers, plus a count) and fails if there is
//! any, so no half-built segment ships. It holds all IDs in a `Vec<u64>` to sort them, so a
//! build transiently needs 8 bytes per input line on top of the result.
//! [`Segment::write_to`] writes a temporary file in the target's directory, fsyncs it and
//! renames it over the target, so a reader (a config reload) sees the old file or the new
//! one, never a partial one.
//!
//! **Measured** (`cargo bench --bench segments`; the 100 M row with
//! `TOLLGATE_SEGMENTS_100M=1`). Heap is the loaded segment's live heap counted as mimalloc's
//! usable block sizes (the proxy's allocator); times are CPU ns per lookup, throughput over a
//! stream of probes (half members, half uniform in `[0, 2 × max]`), *cold* = 2 M probes in
//! random order, *hot* = 1024 probes cycled. Taken on the shared 2-core VM at a load average
//! of 15 to 19 (other builds), so times are inflated: the yardstick, a `binary_search` over
//! the same IDs as a sorted `Vec<u64>` on the same probes, took 64 ns hot on 1 M IDs, which a
//! quiet machine does in about 20.
//!
//! ```text
//! set                    IDs    file bytes  heap MB  load ms  contains  contains_bytes   sorted Vec
//!                                                             cold ns   cold / hot ns   cold / hot ns
//! random 32-bit          1 M     2 524 296     5.34      5      265       362 / 114       310 / 64
//! random 32-bit         10 M    20 524 296    24.85     24      341       500 / 156       489 / 155
//! random 32-bit        100 M   200 524 296   217.64    183      674       981 / 331      1128 / 315
//! random in [0, 40 M)   10 M     5 010 208     6.28      7       66       105 / 37        629 / 175
//! random 64-bit          1 M    21 998 652    91.39    144      638       690 / 237       301 / 86
//! dense [0, n)           1 M           230     0.00      0       12        16 / 16        279 / 69
//! dense [0, n)          10 M         2 166     0.01      0       19        23 / 23        592 / 167
//! dense [0, n)         100 M        21 559     0.08      0       27        34 / 34       1200 / 546
//! ```
//!
//! - **Size.** Random 32-bit IDs take 2.0 to 2.5 bytes each on disk (array containers, plus
//!   16 bytes of header per container) and 2.2 to 2.5 in memory (per-container bookkeeping and
//!   allocator size classes): 10 M take 24.85 MB (23.7 MiB), inside the 25 MB target but with
//!   little to spare. Dense ranges are run containers: 100 M consecutive IDs in 21 kB. IDs
//!   spread over the whole 64-bit space cost ~22 bytes on disk and ~91 in memory each (one
//!   bucket per ID): segments keyed by 64-bit hashes or random 64-bit IDs are a poor fit.
//! - **Membership.** Dense and clustered sets meet the 50 ns target even on the loaded machine
//!   (16 to 37 ns). Large random sets do not: a lookup binary-searches up to 65 536
//!   containers, then an array, each a likely cache miss once the set is tens of MB, and it
//!   costs about what the sorted-Vec yardstick costs (memory-latency bound, not parsing: the
//!   decimal parse adds ~4 ns on dense sets). The figures above are throughput (independent
//!   lookups overlap); one lookup per request sees the full latency.

use std::fmt;
use std::fs::{File, Permissions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use roaring::{RoaringBitmap, RoaringTreemap};

use crate::files::Stamp;

/// The largest segment file [`Segment::load`] reads: 1 GiB. Far above any real segment
/// (100 M random IDs take 200 MB), low enough that a wrong path (a disk image, a log) fails
/// fast instead of filling memory.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// The longest line [`build_from_ids`] accepts, in bytes before trimming: a `u64` has at most
/// 20 digits, so a longer line is garbage (a binary file, a CSV row), reported without
/// buffering it whole.
pub const MAX_LINE_BYTES: usize = 256;

/// How many bad lines a [`BuildError`] lists; the rest are only counted, so a wrong file of
/// millions of lines gives a readable error, not millions of lines.
pub const MAX_REPORTED_BAD_LINES: usize = 100;

/// Cookie of a 32-bit portable bitmap without run containers (a whole `u32`).
const COOKIE_NO_RUNS: u32 = 12346;
/// Cookie of a 32-bit portable bitmap with run containers (the low `u16`).
const COOKIE_RUNS: u16 = 12347;
/// With cookie 12347, offsets are written only from this many containers on.
const NO_OFFSET_THRESHOLD: usize = 4;
/// The largest cardinality of an array container; above it a container is a bitmap.
const ARRAY_LIMIT: u32 = 4096;
/// A bitmap container: 2¹⁶ bits.
const BITMAP_BYTES: usize = 8192;
/// A 32-bit bitmap has at most one container per high 16 bits.
const MAX_CONTAINERS: usize = 1 << 16;
/// A 64-bit bitmap has at most one bucket per high 32 bits.
const MAX_BUCKETS: u64 = 1 << 32;

mod build;
mod format;
#[cfg(test)]
mod tests;

pub use build::{build_from_ids, BadLine, BadLines, BuildError, BuildReport, LineProblem};
use format::parse;

// ---------------------------------------------------------------------------------------
// Errors

/// Why a segment file could not be loaded or written. Every variant names the file, so the
/// config error an operator sees says which segment is wrong.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// The file does not exist.
    #[error("segment file {}: not found", .path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The file exists but could not be read (permissions, a directory, an I/O error).
    #[error("segment file {}: cannot read it: {source}", .path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The file is over [`MAX_FILE_BYTES`].
    #[error(
        "segment file {}: {size} bytes, over the {max}-byte limit for segment files \
         (is this the right file?)",
        .path.display()
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size, or the bytes read before giving up.
        size: u64,
        /// [`MAX_FILE_BYTES`].
        max: u64,
    },
    /// The file is not a valid portable roaring bitmap: corrupt, truncated, trailing bytes,
    /// or not a roaring file at all.
    #[error("segment file {}: not a valid roaring bitmap: {source}", .path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, and at which byte.
        source: FormatError,
    },
    /// The file could not be written (directory missing or read-only, disk full).
    #[error("segment file {}: cannot write it: {source}", .path.display())]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

/// What is wrong in bytes that should be a portable roaring bitmap. Offsets count from the
/// start of the file, so an operator can look at the byte with `xxd`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The bytes end before the structure their headers declare.
    #[error("truncated: {what} ({needed} bytes) should start at byte {offset}, but the data has {left} bytes left")]
    Truncated {
        /// Where the missing part starts.
        offset: usize,
        /// What was expected there.
        what: &'static str,
        /// How many bytes it needs.
        needed: usize,
        /// How many were left.
        left: usize,
    },
    /// The first word is neither a 32-bit cookie nor a plausible 64-bit bucket count.
    #[error(
        "not a roaring bitmap: the first 4 bytes are {first:#010x}, neither a 32-bit portable \
         cookie (12346 or 12347) nor the start of a 64-bit bucket count (at most 2^32)"
    )]
    NotRoaring {
        /// The first 4 bytes, little-endian.
        first: u32,
    },
    /// A header or container breaks a rule of the format.
    #[error("at byte {offset}: {problem}")]
    Invalid {
        /// Where the offending header or container starts.
        offset: usize,
        /// The rule broken, with the values found.
        problem: String,
    },
    /// A complete bitmap is followed by more bytes: a concatenation, an append, or a wrong
    /// count in a header.
    #[error("trailing bytes: the bitmap ends at byte {offset}, but {extra} more bytes follow")]
    TrailingBytes {
        /// Where the bitmap ends.
        offset: usize,
        /// How many bytes follow it.
        extra: usize,
    },
}

// ---------------------------------------------------------------------------------------
// The segment

/// Which portable format a segment was read from, or will be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentFormat {
    /// The 32-bit portable format (cookie 12346 or 12347): every ID is below 2³².
    Portable32,
    /// The 64-bit extension: a bucket count, then a `u32` key and a 32-bit bitmap per bucket.
    Portable64,
}

impl SegmentFormat {
    /// The format a set with this largest ID is written in: 32-bit whenever it can hold the
    /// set, because every roaring implementation reads it, 64-bit otherwise.
    pub fn for_max(max: Option<u64>) -> SegmentFormat {
        match max {
            Some(max) if max > u64::from(u32::MAX) => SegmentFormat::Portable64,
            _ => SegmentFormat::Portable32,
        }
    }
}

impl fmt::Display for SegmentFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SegmentFormat::Portable32 => "roaring 32-bit portable",
            SegmentFormat::Portable64 => "roaring 64-bit portable (buckets of 32-bit bitmaps)",
        })
    }
}

/// A set of `u64` IDs, loaded from a portable roaring file or built from a list, tested on
/// the request path with [`Segment::contains_bytes`].
///
/// Immutable once made: a changed file is a new `Segment`, swapped in whole with the config
/// on reload, so lookups never contend with updates.
#[derive(Debug, Clone)]
pub struct Segment {
    ids: RoaringTreemap,
    /// Invariant: `Portable32` only if every ID is below 2³².
    format: SegmentFormat,
    /// Size of the file it was loaded from, or of what [`Segment::write_to`] writes.
    bytes: u64,
    /// The version of the file it was loaded from, stamped before reading it.
    stamp: Option<Stamp>,
}

impl Segment {
    /// Reads a segment file in either portable format (see the module doc for how they are
    /// told apart), refusing files over [`MAX_FILE_BYTES`] and any malformed content.
    ///
    /// Every error names `path`. Reading is one `read` of the whole file, then validation,
    /// then construction; nothing is kept if any step fails.
    pub fn load(path: impl AsRef<Path>) -> Result<Segment, SegmentError> {
        let path = path.as_ref();
        let unreadable = |source| SegmentError::Unreadable {
            path: path.to_path_buf(),
            source,
        };
        let too_large = |size| SegmentError::TooLarge {
            path: path.to_path_buf(),
            size,
            max: MAX_FILE_BYTES,
        };
        let file = crate::files::open_regular(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => SegmentError::Missing {
                path: path.to_path_buf(),
            },
            _ => unreadable(e),
        })?;
        let meta = file.metadata().map_err(unreadable)?;
        if meta.len() > MAX_FILE_BYTES {
            return Err(too_large(meta.len()));
        }
        // The file may grow between `metadata` and `read`: read at most one byte past the
        // limit, so a growing file is refused, not read without end.
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(too_large(bytes.len() as u64));
        }
        let mut segment = Segment::from_bytes(&bytes).map_err(|source| SegmentError::Corrupt {
            path: path.to_path_buf(),
            source,
        })?;
        segment.stamp = Some(Stamp::of(&meta));
        Ok(segment)
    }

    /// The version of the file this segment was loaded from ([`Segment::load`]; `None`
    /// for one built in memory): the reloader compares it with the file on disk to see
    /// that the file changed.
    pub fn stamp(&self) -> Option<Stamp> {
        self.stamp
    }

    /// Parses the bytes of a portable roaring file (32- or 64-bit, told apart as the module
    /// doc says), refusing anything malformed, truncated or followed by extra bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Segment, FormatError> {
        let (ids, format) = parse(bytes)?;
        Ok(Segment {
            ids,
            format,
            bytes: bytes.len() as u64,
            stamp: None,
        })
    }

    /// Builds a segment from IDs in any order, duplicates allowed, compacting dense ranges
    /// into run containers where that is smaller. It will be written in the 32-bit format
    /// if every ID is below 2³², the 64-bit one otherwise.
    pub fn from_ids<I: IntoIterator<Item = u64>>(ids: I) -> Segment {
        let mut ids: Vec<u64> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        Segment::from_sorted_unique(&ids)
    }

    /// [`Segment::from_ids`] for IDs already sorted and without duplicates.
    fn from_sorted_unique(ids: &[u64]) -> Segment {
        let set = match RoaringTreemap::from_sorted_iter(ids.iter().copied()) {
            Ok(set) => set,
            // Unreachable for sorted unique input; insert one by one rather than lose IDs.
            Err(_) => ids.iter().copied().collect(),
        };
        Segment::from_treemap(set)
    }

    /// Wraps a set built with the roaring crate's own API (ranges, set operations),
    /// compacting it like [`Segment::from_ids`] does and choosing the format the same way.
    pub fn from_treemap(mut ids: RoaringTreemap) -> Segment {
        // Run containers where smaller; also drops empty buckets.
        ids.optimize();
        let format = SegmentFormat::for_max(ids.max());
        let mut segment = Segment {
            ids,
            format,
            bytes: 0,
            stamp: None,
        };
        segment.bytes = segment.serialized_size();
        segment
    }

    /// Whether `id` is a member. A B-tree probe on the high 32 bits, then the roaring
    /// lookup: no allocation, no lock.
    #[inline]
    pub fn contains(&self, id: u64) -> bool {
        self.ids.contains(id)
    }

    /// Whether a raw key part (a header value, a customer ID) is a member: it must be an
    /// ASCII decimal `u64` (see [`parse_id`]); anything else is not a member. This is the
    /// request-path test: no allocation, no UTF-8 check, no lock.
    #[inline]
    pub fn contains_bytes(&self, value: &[u8]) -> bool {
        parse_id(value).is_some_and(|id| self.contains(id))
    }

    /// Number of IDs.
    pub fn len(&self) -> u64 {
        self.ids.len()
    }

    /// Whether there is no ID at all (an empty segment matches nothing; legal, if odd).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The format the segment was loaded from, or will be written in.
    pub fn format(&self) -> SegmentFormat {
        self.format
    }

    /// The IDs, for callers that need more than membership (iteration, set operations).
    pub fn ids(&self) -> &RoaringTreemap {
        &self.ids
    }

    /// The summary `tollgate segment info FILE` prints.
    pub fn info(&self) -> SegmentInfo {
        let mut containers = ContainerCounts::default();
        let mut buckets = 0;
        for (_, bitmap) in self.ids.bitmaps() {
            buckets += 1;
            let stats = bitmap.statistics();
            containers.array += u64::from(stats.n_array_containers);
            containers.bitmap += u64::from(stats.n_bitset_containers);
            containers.run += u64::from(stats.n_run_containers);
        }
        SegmentInfo {
            cardinality: self.ids.len(),
            bytes: self.bytes,
            min: self.ids.min(),
            max: self.ids.max(),
            format: self.format,
            buckets,
            containers,
        }
    }

    /// Writes the portable serialization in [`Segment::format`] to `w` (the bytes
    /// [`Segment::write_to`] puts in a file).
    pub fn serialize_into<W: Write>(&self, w: W) -> io::Result<()> {
        match self.format {
            SegmentFormat::Portable32 => match self.ids.bitmaps().next() {
                Some((_, bitmap)) => bitmap.serialize_into(w),
                None => RoaringBitmap::new().serialize_into(w),
            },
            SegmentFormat::Portable64 => self.ids.serialize_into(w),
        }
    }

    /// The portable serialization, in memory (for tests and for callers that ship bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.serialized_size() as usize);
        // Writing into a Vec cannot fail.
        let _ = self.serialize_into(&mut out);
        out
    }

    /// Size of [`Segment::serialize_into`]'s output.
    fn serialized_size(&self) -> u64 {
        let size = match self.format {
            SegmentFormat::Portable32 => match self.ids.bitmaps().next() {
                Some((_, bitmap)) => bitmap.serialized_size(),
                None => RoaringBitmap::new().serialized_size(),
            },
            SegmentFormat::Portable64 => self.ids.serialized_size(),
        };
        size as u64
    }

    /// Writes the segment to `path` atomically: a temporary file (mode 0644) in the same
    /// directory, flushed and fsynced, renamed over `path`, then the directory fsynced. A
    /// reader sees the old file or the new one, never a partial one; on error the
    /// temporary file is removed and `path` is untouched. Returns the bytes written.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<u64, SegmentError> {
        let path = path.as_ref();
        let unwritable = |source| SegmentError::Unwritable {
            path: path.to_path_buf(),
            source,
        };
        let Some(name) = path.file_name() else {
            return Err(unwritable(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a file name",
            )));
        };
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{}.", name.to_string_lossy()))
            .suffix(".tmp")
            .permissions(Permissions::from_mode(0o644))
            .tempfile_in(dir)
            .map_err(unwritable)?;
        let mut w = BufWriter::with_capacity(1 << 16, tmp.as_file_mut());
        self.serialize_into(&mut w).map_err(unwritable)?;
        w.flush().map_err(unwritable)?;
        drop(w);
        tmp.as_file().sync_all().map_err(unwritable)?;
        tmp.persist(path).map_err(|e| unwritable(e.error))?;
        // Make the rename itself durable.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(unwritable)?;
        Ok(self.bytes)
    }
}

/// Parses an ID the way segments compare key parts: ASCII digits only (no sign, no
/// whitespace, no `_`), at least one, value at most `u64::MAX`; leading zeros are allowed.
/// `None` otherwise. No allocation; cost is about a nanosecond per digit.
#[inline]
pub fn parse_id(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    let mut id: u64 = 0;
    for &c in value {
        let digit = c.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        id = id.checked_mul(10)?.checked_add(u64::from(digit))?;
    }
    Some(id)
}

// ---------------------------------------------------------------------------------------
// Info

/// How many containers of each kind a segment has: arrays for sparse IDs, bitmaps for
/// dense ones, runs for ranges. Tells an operator why a file is the size it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerCounts {
    /// Array containers (at most 4096 sorted `u16`s).
    pub array: u64,
    /// Bitmap containers (8 KiB each).
    pub bitmap: u64,
    /// Run containers (4 bytes per run).
    pub run: u64,
}

/// A segment's summary: what `tollgate segment info FILE` prints (through `Display`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Number of IDs.
    pub cardinality: u64,
    /// Size of the file it was loaded from, or of its serialization if built.
    pub bytes: u64,
    /// Smallest ID, if any.
    pub min: Option<u64>,
    /// Largest ID, if any.
    pub max: Option<u64>,
    /// The file format.
    pub format: SegmentFormat,
    /// Distinct high 32 bits among the IDs (1 for any non-empty 32-bit segment).
    pub buckets: u64,
    /// Containers by kind.
    pub containers: ContainerCounts,
}

impl fmt::Display for SegmentInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        let c = self.containers;
        writeln!(f, "format:      {}", self.format)?;
        writeln!(f, "ids:         {}", self.cardinality)?;
        writeln!(f, "min:         {}", opt(self.min))?;
        writeln!(f, "max:         {}", opt(self.max))?;
        write!(f, "bytes:       {}", self.bytes)?;
        if self.cardinality > 0 {
            write!(
                f,
                " ({:.2} per id)",
                self.bytes as f64 / self.cardinality as f64
            )?;
        }
        writeln!(f)?;
        writeln!(f, "buckets:     {} (distinct high 32 bits)", self.buckets)?;
        write!(
            f,
            "containers:  {} ({} array, {} bitmap, {} run)",
            c.array + c.bitmap + c.run,
            c.array,
            c.bitmap,
            c.run
        )
    }
}
