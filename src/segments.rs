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
use std::io::{self, BufRead, BufWriter, Read, Write};
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

// ---------------------------------------------------------------------------------------
// Building from a list of IDs

/// What [`build_from_ids`] read, for the CLI to print.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BuildReport {
    /// Lines read.
    pub lines: u64,
    /// Distinct IDs in the segment.
    pub ids: u64,
    /// ID lines that repeated an earlier ID (harmless, but a sign of a sloppy export).
    pub duplicates: u64,
    /// Blank and comment-only lines.
    pub skipped: u64,
}

impl fmt::Display for BuildReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} lines: {} distinct ids, {} duplicate ids ignored, {} blank or comment lines",
            self.lines, self.ids, self.duplicates, self.skipped
        )
    }
}

/// Why a line is not an ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineProblem {
    /// Something other than ASCII digits.
    NotDecimal,
    /// Digits, but above `u64::MAX`.
    TooLarge,
    /// Longer than [`MAX_LINE_BYTES`].
    TooLong,
}

impl fmt::Display for LineProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineProblem::NotDecimal => f.write_str("not an unsigned decimal integer"),
            LineProblem::TooLarge => write!(f, "above the largest 64-bit ID {}", u64::MAX),
            LineProblem::TooLong => write!(f, "longer than {MAX_LINE_BYTES} bytes"),
        }
    }
}

/// One bad line of an ID list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// 1-based line number.
    pub line: u64,
    /// The line as read (comment and whitespace removed), cut to 40 characters, invalid
    /// UTF-8 replaced.
    pub text: String,
    /// What is wrong with it.
    pub problem: LineProblem,
}

/// The bad lines of an ID list: the first [`MAX_REPORTED_BAD_LINES`], and how many in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLines {
    /// The first bad lines, in file order.
    pub shown: Vec<BadLine>,
    /// All bad lines, shown or not.
    pub total: u64,
}

impl fmt::Display for BadLines {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.total == 1 { "" } else { "s" };
        write!(
            f,
            "{} bad line{s} in the ID list, so no segment was built:",
            self.total
        )?;
        for bad in &self.shown {
            write!(f, "\n  line {}: {:?}: {}", bad.line, bad.text, bad.problem)?;
        }
        let hidden = self.total - self.shown.len() as u64;
        if hidden > 0 {
            write!(f, "\n  ... and {hidden} more")?;
        }
        Ok(())
    }
}

/// Why [`build_from_ids`] made no segment.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The list could not be read.
    #[error("cannot read the ID list after line {line}: {source}")]
    Read {
        /// The last line read completely.
        line: u64,
        /// What the OS said.
        source: io::Error,
    },
    /// Some lines are not IDs.
    #[error("{0}")]
    BadLines(BadLines),
}

/// Builds a segment from a list of IDs, one per line: decimal `u64`s as [`parse_id`] reads
/// them, with surrounding whitespace (and CR of CRLF) ignored, blank lines and `#` comments
/// (whole-line or after an ID) skipped. Every other line is bad: all are counted, the first
/// [`MAX_REPORTED_BAD_LINES`] are reported with their line numbers, and any bad line fails
/// the build, because a segment missing IDs would silently treat customers as outsiders.
pub fn build_from_ids<R: BufRead>(mut reader: R) -> Result<(Segment, BuildReport), BuildError> {
    let mut report = BuildReport::default();
    let mut bad = BadLines {
        shown: Vec::new(),
        total: 0,
    };
    let mut ids: Vec<u64> = Vec::new();
    let mut line = Vec::with_capacity(MAX_LINE_BYTES + 1);
    loop {
        let lines = report.lines;
        let read_error = |source| BuildError::Read {
            line: lines,
            source,
        };
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(read_error)?;
        if n == 0 {
            break;
        }
        report.lines += 1;
        if line.last() == Some(&b'\n') {
            line.pop();
        } else if line.len() > MAX_LINE_BYTES {
            skip_line(&mut reader).map_err(read_error)?;
            note_bad(&mut bad, report.lines, &line, LineProblem::TooLong);
            continue;
        }
        let text = match line.iter().position(|&c| c == b'#') {
            Some(hash) => &line[..hash],
            None => &line[..],
        };
        let text = text.trim_ascii();
        if text.is_empty() {
            report.skipped += 1;
            continue;
        }
        match parse_id(text) {
            Some(id) => ids.push(id),
            None if text.iter().all(u8::is_ascii_digit) => {
                note_bad(&mut bad, report.lines, text, LineProblem::TooLarge)
            }
            None => note_bad(&mut bad, report.lines, text, LineProblem::NotDecimal),
        }
    }
    if bad.total > 0 {
        return Err(BuildError::BadLines(bad));
    }
    let id_lines = ids.len() as u64;
    ids.sort_unstable();
    ids.dedup();
    report.ids = ids.len() as u64;
    report.duplicates = id_lines - report.ids;
    Ok((Segment::from_sorted_unique(&ids), report))
}

/// Consumes the rest of an over-long line, up to and including its `\n`, without
/// buffering it.
fn skip_line<R: BufRead>(reader: &mut R) -> io::Result<()> {
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&c| c == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                return Ok(());
            }
            None => {
                let len = buf.len();
                reader.consume(len);
            }
        }
    }
}

fn note_bad(bad: &mut BadLines, line: u64, text: &[u8], problem: LineProblem) {
    bad.total += 1;
    if bad.shown.len() < MAX_REPORTED_BAD_LINES {
        let text = String::from_utf8_lossy(text);
        let mut shown: String = text.chars().take(40).collect();
        if shown.len() < text.len() {
            shown.push('…');
        }
        bad.shown.push(BadLine {
            line,
            text: shown,
            problem,
        });
    }
}

// ---------------------------------------------------------------------------------------
// Parsing and validation

/// Parses a whole file: 32-bit if its cookie says so (falling back to 64-bit, see the
/// module doc), 64-bit otherwise.
fn parse(bytes: &[u8]) -> Result<(RoaringTreemap, SegmentFormat), FormatError> {
    let first = Reader::new(bytes, 0).u32("the cookie or bucket count")?;
    if first == COOKIE_NO_RUNS || first as u16 == COOKIE_RUNS {
        match parse32(bytes) {
            Ok(ids) => Ok((ids, SegmentFormat::Portable32)),
            Err(e) => match parse64(bytes) {
                Ok(ids) => Ok((ids, SegmentFormat::Portable64)),
                Err(_) => Err(e),
            },
        }
    } else {
        Ok((parse64(bytes)?, SegmentFormat::Portable64))
    }
}

fn parse32(bytes: &[u8]) -> Result<RoaringTreemap, FormatError> {
    let end = validate32(bytes, 0)?;
    if end != bytes.len() {
        return Err(FormatError::TrailingBytes {
            offset: end,
            extra: bytes.len() - end,
        });
    }
    let bitmap = deserialize32(bytes, 0, end)?;
    Ok(RoaringTreemap::from_bitmaps(
        (!bitmap.is_empty()).then_some((0, bitmap)),
    ))
}

fn parse64(bytes: &[u8]) -> Result<RoaringTreemap, FormatError> {
    let mut r = Reader::new(bytes, 0);
    let count = r.u64("the bucket count")?;
    if count > MAX_BUCKETS {
        return Err(FormatError::NotRoaring {
            first: count as u32,
        });
    }
    // Not preallocated from `count`: a bucket takes at least 12 bytes, so the loop below
    // fails on truncation long before a lying count could matter.
    let mut buckets = Vec::new();
    let mut prev_key: Option<u32> = None;
    for _ in 0..count {
        let at = r.pos;
        let key = r.u32("a bucket key")?;
        if let Some(prev) = prev_key.filter(|&prev| key <= prev) {
            return Err(invalid(
                at,
                format!("bucket keys not increasing: {key} after {prev}"),
            ));
        }
        prev_key = Some(key);
        let end = validate32(bytes, r.pos)?;
        let bitmap = deserialize32(bytes, r.pos, end)?;
        r.pos = end;
        if !bitmap.is_empty() {
            buckets.push((key, bitmap));
        }
    }
    if r.pos != bytes.len() {
        return Err(FormatError::TrailingBytes {
            offset: r.pos,
            extra: bytes.len() - r.pos,
        });
    }
    Ok(RoaringTreemap::from_bitmaps(buckets))
}

/// Builds the bitmap of `bytes[start..end]`, already validated; the crate's own checks
/// remain as a second line of defence.
fn deserialize32(bytes: &[u8], start: usize, end: usize) -> Result<RoaringBitmap, FormatError> {
    RoaringBitmap::deserialize_from(&bytes[start..end])
        .map_err(|e| invalid(start, format!("refused by the roaring library: {e}")))
}

/// Checks the 32-bit portable bitmap starting at `bytes[start]` against every rule of the
/// format and returns where it ends. Offsets in errors are absolute.
fn validate32(bytes: &[u8], start: usize) -> Result<usize, FormatError> {
    let mut r = Reader::new(bytes, start);
    let cookie = r.u32("a cookie")?;
    let (size, run_flags) = if cookie == COOKIE_NO_RUNS {
        let size = r.u32("the container count")? as usize;
        if size > MAX_CONTAINERS {
            return Err(invalid(
                start + 4,
                format!("{size} containers, over the {MAX_CONTAINERS} a 32-bit bitmap can have"),
            ));
        }
        (size, None)
    } else if cookie as u16 == COOKIE_RUNS {
        let size = (cookie >> 16) as usize + 1;
        let flags = r.take(size.div_ceil(8), "the run-container flags")?;
        let used = size % 8;
        if used != 0 && flags.last().is_some_and(|&last| last >> used != 0) {
            return Err(invalid(
                r.pos - 1,
                "run-container flags set past the last container",
            ));
        }
        (size, Some(flags))
    } else {
        return Err(invalid(
            start,
            format!("unknown cookie {cookie:#010x} (a 32-bit bitmap starts with 12346 or 12347)"),
        ));
    };
    let has_offsets = run_flags.is_none() || size >= NO_OFFSET_THRESHOLD;

    let descriptions_at = r.pos;
    let descriptions = r.take(4 * size, "the descriptive header")?;
    let offsets_at = r.pos;
    let offsets = if has_offsets {
        Some(r.take(4 * size, "the offset header")?)
    } else {
        None
    };

    let mut prev_key: Option<u16> = None;
    for i in 0..size {
        let key = le16(descriptions, 4 * i);
        let cardinality = u32::from(le16(descriptions, 4 * i + 2)) + 1;
        if let Some(prev) = prev_key.filter(|&prev| key <= prev) {
            return Err(invalid(
                descriptions_at + 4 * i,
                format!("container keys not increasing: {key} after {prev}"),
            ));
        }
        prev_key = Some(key);

        let relative = r.pos - start;
        if let Some(offsets) = offsets {
            let claimed = le32(offsets, 4 * i);
            if claimed as usize != relative {
                return Err(invalid(
                    offsets_at + 4 * i,
                    format!(
                        "container {i} (key {key}) should start at byte {claimed} of its \
                         bitmap, but starts at byte {relative}"
                    ),
                ));
            }
        }
        let is_run = run_flags.is_some_and(|flags| flags[i / 8] >> (i % 8) & 1 == 1);
        if is_run {
            validate_runs(&mut r, key, cardinality)?;
        } else if cardinality <= ARRAY_LIMIT {
            validate_array(&mut r, key, cardinality)?;
        } else {
            validate_bitmap(&mut r, key, cardinality)?;
        }
    }
    Ok(r.pos)
}

fn validate_runs(r: &mut Reader<'_>, key: u16, cardinality: u32) -> Result<(), FormatError> {
    let at = r.pos;
    let count = r.u16("a run count")? as usize;
    if count == 0 {
        return Err(invalid(
            at,
            format!("run container (key {key}) with no runs"),
        ));
    }
    let runs = r.take(4 * count, "runs")?;
    let mut total: u32 = 0;
    let mut min_start: u32 = 0;
    for j in 0..count {
        let start = u32::from(le16(runs, 4 * j));
        let last = start + u32::from(le16(runs, 4 * j + 2));
        if last > 0xFFFF {
            return Err(invalid(
                at,
                format!("run container (key {key}): run {start}..={last} passes 65535"),
            ));
        }
        if start < min_start {
            return Err(invalid(
                at,
                format!(
                    "run container (key {key}): run {start}..={last} overlaps, touches or \
                     precedes the one before"
                ),
            ));
        }
        min_start = last + 2;
        total += last - start + 1;
    }
    if total != cardinality {
        return Err(invalid(
            at,
            format!(
                "run container (key {key}) holds {total} values, its header says {cardinality}"
            ),
        ));
    }
    Ok(())
}

fn validate_array(r: &mut Reader<'_>, key: u16, cardinality: u32) -> Result<(), FormatError> {
    let at = r.pos;
    let values = r.take(2 * cardinality as usize, "an array container")?;
    let mut prev: Option<u16> = None;
    for j in 0..cardinality as usize {
        let value = le16(values, 2 * j);
        if let Some(prev) = prev.filter(|&prev| value <= prev) {
            return Err(invalid(
                at,
                format!("array container (key {key}) not increasing: {value} after {prev}"),
            ));
        }
        prev = Some(value);
    }
    Ok(())
}

fn validate_bitmap(r: &mut Reader<'_>, key: u16, cardinality: u32) -> Result<(), FormatError> {
    let at = r.pos;
    let words = r.take(BITMAP_BYTES, "a bitmap container")?;
    let ones: u32 = words.iter().map(|b| b.count_ones()).sum();
    if ones != cardinality {
        return Err(invalid(
            at,
            format!(
                "bitmap container (key {key}) has {ones} bits set, its header says {cardinality}"
            ),
        ));
    }
    Ok(())
}

fn invalid(offset: usize, problem: impl Into<String>) -> FormatError {
    FormatError::Invalid {
        offset,
        problem: problem.into(),
    }
}

/// The little-endian `u16` at `bytes[i..i + 2]`; callers index within slices they took
/// with the right length.
fn le16(bytes: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([bytes[i], bytes[i + 1]])
}

fn le32(bytes: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]])
}

/// A bounds-checked cursor: every read that would pass the end is a
/// [`FormatError::Truncated`], never a panic.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], pos: usize) -> Self {
        Reader { bytes, pos }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FormatError> {
        let left = self.bytes.len().saturating_sub(self.pos);
        if n > left {
            return Err(FormatError::Truncated {
                offset: self.pos,
                what,
                needed: n,
                left,
            });
        }
        let slice = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, FormatError> {
        Ok(le16(self.take(2, what)?, 0))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, FormatError> {
        Ok(le32(self.take(4, what)?, 0))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, FormatError> {
        let b = self.take(8, what)?;
        Ok(u64::from(le32(b, 0)) | u64::from(le32(b, 4)) << 32)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    /// Hex bytes, one field per line, anything after `|` a comment.
    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s
            .lines()
            .flat_map(|line| line.split('|').next().unwrap_or("").bytes())
            .filter(u8::is_ascii_hexdigit)
            .collect();
        assert_eq!(digits.len() % 2, 0, "odd number of hex digits");
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/segments")
            .join(name)
    }

    fn members(segment: &Segment) -> Vec<u64> {
        segment.ids().iter().collect()
    }

    /// The spec's encoding of `ids`, hand-written in `expected`, must be what the fixture
    /// file holds, what `load` reads back as `ids`, and exactly what `build` writes.
    fn check_spec_fixture(name: &str, expected: &[u8], ids: &[u64], format: SegmentFormat) {
        let path = fixture(name);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            expected,
            "{name} is not the hand-written hex"
        );
        let loaded = Segment::load(&path).unwrap();
        assert_eq!(members(&loaded), ids);
        assert_eq!(loaded.format(), format);
        assert_eq!(loaded.info().bytes, expected.len() as u64);
        let built = Segment::from_ids(ids.iter().copied());
        assert_eq!(built.format(), format);
        assert_eq!(
            built.to_bytes(),
            expected,
            "build does not write the spec's encoding"
        );
        assert_eq!(built.info().bytes, expected.len() as u64);
    }

    const ARRAY_HEX: &str = "
        3a300000 | cookie 12346: no run containers
        02000000 | 2 containers
        0000 0200 | container 0: key 0, cardinality 3 - 1
        0100 0000 | container 1: key 1, cardinality 1 - 1
        18000000 | offset of container 0: 24 = 4 + 4 + 2 * 8
        1e000000 | offset of container 1: 24 + 3 * 2
        0100 0500 e803 | array: 1, 5, 1000
        0300 | array: 3 (the ID 65536 + 3)";

    #[test]
    fn reads_and_writes_the_spec_array_encoding() {
        check_spec_fixture(
            "array.roaring",
            &hex(ARRAY_HEX),
            &[1, 5, 1000, 65539],
            SegmentFormat::Portable32,
        );
    }

    /// Key 3, the even numbers of [0, 10000): 5000 > 4096 values, so a bitmap container.
    fn bitmap_bytes() -> Vec<u8> {
        let mut bytes = hex("
            3a300000 | cookie 12346
            01000000 | 1 container
            0300 8713 | key 3, cardinality 5000 - 1 = 0x1387
            10000000 | offset 16");
        // Word j holds values 64j..64j+63, bit i for value 64j + i: evens are 0x5555...
        for _ in 0..156 {
            bytes.extend(hex("5555555555555555"));
        }
        bytes.extend(hex("5555000000000000")); // 9984..=9998: 8 evens, bits 0..=14
        bytes.extend(std::iter::repeat_n(0u8, 867 * 8)); // 156 + 1 + 867 = 1024 words
        bytes
    }

    #[test]
    fn reads_and_writes_the_spec_bitmap_encoding() {
        let ids: Vec<u64> = (0..5000).map(|k| 3 * 65536 + 2 * k).collect();
        check_spec_fixture(
            "bitmap.roaring",
            &bitmap_bytes(),
            &ids,
            SegmentFormat::Portable32,
        );
    }

    const RUNS_HEX: &str = "
        3b300100 | cookie 12347, 2 containers - 1 in the high 16 bits
        01 | run flags: container 0 is a run container
        0000 6e00 | key 0, cardinality 111 - 1
        0200 0000 | key 2, cardinality 1 - 1
                  | no offsets: fewer than 4 containers
        0200 | 2 runs
        0a00 0a00 | 10, 10 more: 10..=20
        6400 6300 | 100, 99 more: 100..=199
        0700 | array: 7 (the ID 2 * 65536 + 7)";

    #[test]
    fn reads_and_writes_the_spec_run_encoding() {
        let mut ids: Vec<u64> = (10..=20).chain(100..=199).collect();
        ids.push(2 * 65536 + 7);
        check_spec_fixture(
            "runs.roaring",
            &hex(RUNS_HEX),
            &ids,
            SegmentFormat::Portable32,
        );
    }

    const RUNS_OFFSETS_HEX: &str = "
        3b300300 | cookie 12347, 4 containers - 1
        09 | run flags: containers 0 and 3
        0000 6300 | key 0, cardinality 100 - 1
        0100 0000 | key 1, cardinality 1 - 1
        0200 0000 | key 2, cardinality 1 - 1
        0300 ffff | key 3, cardinality 65536 - 1
        25000000 | offsets, 4 containers or more: 37 = 4 + 1 + 4 * 8
        2b000000 | 43 = 37 + 2 + 4
        2d000000 | 45
        2f000000 | 47
        0100 0000 6300 | 1 run: 0..=99
        0100 | array: 1
        0200 | array: 2
        0100 0000 ffff | 1 run: 0..=65535";

    #[test]
    fn reads_and_writes_the_spec_run_encoding_with_offsets() {
        let mut ids: Vec<u64> = (0..100).collect();
        ids.extend([65536 + 1, 2 * 65536 + 2]);
        ids.extend(3 * 65536..4 * 65536);
        check_spec_fixture(
            "runs_offsets.roaring",
            &hex(RUNS_OFFSETS_HEX),
            &ids,
            SegmentFormat::Portable32,
        );
    }

    const WIDE64_HEX: &str = "
        0300000000000000 | 3 buckets (u64)
        00000000 | bucket key 0
        3a300000 01000000 0000 0000 10000000 0700 | 32-bit bitmap {7}
        01000000 | bucket key 1
        3a300000 01000000 0000 0000 10000000 0700 | {7}
        05000000 | bucket key 5
        3a300000 01000000 0000 0200 10000000 0000 0100 0200 | {0, 1, 2}: array, as
                 | runs would be no smaller (2 + 4 bytes)";

    #[test]
    fn reads_and_writes_the_64_bit_extension() {
        let ids = [7, (1 << 32) | 7, 5 << 32, (5 << 32) | 1, (5 << 32) | 2];
        check_spec_fixture(
            "wide64.roaring",
            &hex(WIDE64_HEX),
            &ids,
            SegmentFormat::Portable64,
        );
    }

    #[test]
    fn writes_32_bit_whenever_every_id_fits() {
        assert_eq!(
            Segment::from_ids([u64::from(u32::MAX)]).format(),
            SegmentFormat::Portable32
        );
        assert_eq!(
            Segment::from_ids([1 << 32]).format(),
            SegmentFormat::Portable64
        );
        assert_eq!(
            Segment::from_ids([0, u64::MAX]).format(),
            SegmentFormat::Portable64
        );
        let empty = Segment::from_ids([]);
        assert_eq!(empty.to_bytes(), hex("3a300000 00000000"));
        let loaded = Segment::from_bytes(&empty.to_bytes()).unwrap();
        assert!(loaded.is_empty());
        assert_eq!(loaded.format(), SegmentFormat::Portable32);
        assert!(!loaded.contains(0));
    }

    #[test]
    fn a_64_bit_file_that_starts_like_a_32_bit_cookie_still_loads() {
        // 12346 buckets: the bucket count's first 4 bytes are cookie 12346.
        let ids: Vec<u64> = (0..12346u64).map(|k| k << 32 | k).collect();
        let bytes = Segment::from_ids(ids.iter().copied()).to_bytes();
        assert_eq!(bytes[..8], hex("3a300000 00000000")[..]);
        let loaded = Segment::from_bytes(&bytes).unwrap();
        assert_eq!(loaded.format(), SegmentFormat::Portable64);
        assert_eq!(members(&loaded), ids);
    }

    #[test]
    fn round_trip_build_write_load() {
        let dir = tempfile::tempdir().unwrap();
        let input = "# VIPs\n42\n7\n\n 1000000 \r\n4294967296 # a 64-bit one\n7\n";
        let (built, report) = build_from_ids(input.as_bytes()).unwrap();
        assert_eq!(
            report,
            BuildReport {
                lines: 7,
                ids: 4,
                duplicates: 1,
                skipped: 2
            }
        );
        let path = dir.path().join("vip.roaring");
        let written = built.write_to(&path).unwrap();
        assert_eq!(written, std::fs::metadata(&path).unwrap().len());
        let loaded = Segment::load(&path).unwrap();
        assert_eq!(members(&loaded), [7, 42, 1_000_000, 1 << 32]);
        assert_eq!(loaded.format(), SegmentFormat::Portable64);
        assert_eq!(loaded.info(), built.info());

        // Overwriting replaces the file and leaves no temporary file behind.
        let smaller = Segment::from_ids([3]);
        smaller.write_to(&path).unwrap();
        assert_eq!(members(&Segment::load(&path).unwrap()), [3]);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["vip.roaring"]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode & 0o444,
            0o444,
            "mode {mode:o}: other users (the proxy) must read it"
        );
    }

    #[test]
    fn writing_into_a_missing_directory_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope/vip.roaring");
        let err = Segment::from_ids([1]).write_to(&path).unwrap_err();
        assert!(matches!(err, SegmentError::Unwritable { .. }), "{err:?}");
        assert!(err.to_string().contains("nope/vip.roaring"), "{err}");
    }

    #[test]
    fn membership_of_integer_and_non_integer_values() {
        let segment = Segment::from_ids([0, 7, 42, 1 << 40, u64::MAX]);
        for member in [
            "0",
            "7",
            "42",
            "007",
            "1099511627776",
            "18446744073709551615",
        ] {
            assert!(segment.contains_bytes(member.as_bytes()), "{member:?}");
        }
        for outsider in [
            "",
            "8",
            "-7",
            "+7",
            " 7",
            "7 ",
            "7\n",
            "4 2",
            "42.0",
            "0x2a",
            "4_2",
            "abc",
            "٧",
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            assert!(!segment.contains_bytes(outsider.as_bytes()), "{outsider:?}");
        }
        assert!(!segment.contains_bytes(&[b'4', 0xff]));
        assert!(segment.contains(u64::MAX) && segment.contains(1 << 40) && !segment.contains(1));
    }

    fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn corrupt_error(bytes: &[u8]) -> FormatError {
        let dir = tempfile::tempdir().unwrap();
        let path = write_file(dir.path(), "bad.roaring", bytes);
        match Segment::load(&path) {
            Err(err @ SegmentError::Corrupt { .. }) => {
                let message = err.to_string();
                assert!(message.contains(&*path.to_string_lossy()), "{message}");
                let SegmentError::Corrupt { source, .. } = err else {
                    unreachable!()
                };
                source
            }
            other => panic!("expected a Corrupt error, got {other:?}"),
        }
    }

    #[test]
    fn missing_unreadable_and_too_large_files_are_refused_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.roaring");
        let err = Segment::load(&missing).unwrap_err();
        assert!(matches!(err, SegmentError::Missing { .. }), "{err:?}");
        assert!(
            err.to_string().contains("missing.roaring") && err.to_string().contains("not found")
        );

        let err = Segment::load(dir.path()).unwrap_err();
        assert!(matches!(err, SegmentError::Unreadable { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&*dir.path().to_string_lossy()),
            "{err}"
        );

        // A sparse file: no gigabyte is written, and none is read.
        let huge = dir.path().join("huge.roaring");
        File::create(&huge)
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let err = Segment::load(&huge).unwrap_err();
        assert!(matches!(err, SegmentError::TooLarge { size, .. } if size == MAX_FILE_BYTES + 1));
        assert!(err.to_string().contains("huge.roaring"), "{err}");
    }

    #[test]
    fn corrupt_truncated_and_trailing_files_are_refused() {
        let good = hex(RUNS_OFFSETS_HEX);
        assert!(matches!(
            corrupt_error(b""),
            FormatError::Truncated { offset: 0, .. }
        ));
        assert!(matches!(
            corrupt_error(b"customer_id\n42\n"),
            FormatError::NotRoaring { first: 0x7473_7563 }
        ));
        assert!(matches!(
            corrupt_error(&good[..good.len() - 1]),
            FormatError::Truncated { what: "runs", .. }
        ));
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            corrupt_error(&trailing),
            FormatError::TrailingBytes {
                offset: 53,
                extra: 1
            }
        );
        let mut wide_trailing = hex(WIDE64_HEX);
        wide_trailing.extend([1, 2, 3]);
        assert_eq!(
            corrupt_error(&wide_trailing),
            FormatError::TrailingBytes {
                offset: 78,
                extra: 3
            }
        );
        // The message an operator reads says what and where.
        let message = corrupt_error(&good[..40]).to_string();
        assert!(
            message.contains("truncated") && message.contains("byte 39"),
            "{message}"
        );
    }

    /// `good` with bytes from `at` replaced by `patch`.
    fn patched(good: &[u8], at: usize, patch: &str) -> Vec<u8> {
        let mut bytes = good.to_vec();
        let patch = hex(patch);
        bytes[at..at + patch.len()].copy_from_slice(&patch);
        bytes
    }

    fn problem(bytes: &[u8]) -> String {
        match Segment::from_bytes(bytes) {
            Err(FormatError::Invalid { problem, .. }) => problem,
            other => panic!("expected an Invalid error, got {other:?}"),
        }
    }

    #[test]
    fn every_rule_of_the_format_is_checked() {
        let array = hex(ARRAY_HEX);
        let runs = hex(RUNS_OFFSETS_HEX);
        let wide = hex(WIDE64_HEX);
        let cases: [(Vec<u8>, &str); 12] = [
            (patched(&array, 16, "19000000"), "should start at byte 25"),
            (
                patched(&array, 12, "0000"),
                "keys not increasing: 0 after 0",
            ),
            (
                patched(&array, 24, "0500 0100"),
                "not increasing: 1 after 5",
            ),
            (
                patched(&array, 24, "0100 0100"),
                "not increasing: 1 after 1",
            ),
            (patched(&array, 4, "01000100"), "65537 containers"),
            (
                patched(&runs, 37, "0100 0000 6400"),
                "holds 101 values, its header says 100",
            ),
            (patched(&runs, 47, "0100 0100 ffff"), "passes 65535"),
            (patched(&runs, 37, "0000"), "with no runs"),
            (patched(&runs, 4, "19"), "flags set past the last container"),
            (
                patched(&bitmap_bytes(), 16, "57"),
                "has 5001 bits set, its header says 5000",
            ),
            (
                patched(&wide, 30, "00000000"),
                "bucket keys not increasing: 0 after 0",
            ),
            (patched(&wide, 34, "3c300000"), "unknown cookie 0x0000303c"),
        ];
        for (bytes, expected) in cases {
            let problem = problem(&bytes);
            assert!(
                problem.contains(expected),
                "{problem:?} should say {expected:?}"
            );
        }
        // Touching runs (10..=20 then 21..=30): one run really, refused.
        let touching = hex("3b300000 01 0000 1400 | 1 run container, 21 values
                            0200 0a00 0a00 1500 0900 | 10..=20, 21..=30");
        assert!(problem(&touching).contains("overlaps, touches"));
        let unsorted = hex("3b300000 01 0000 0100 0200 0a00 0000 0500 0000 | runs 10, 5");
        assert!(problem(&unsorted).contains("precedes"));
    }

    #[test]
    fn empty_buckets_in_a_64_bit_file_are_accepted_and_dropped() {
        let bytes = hex("
            0200000000000000 | 2 buckets
            00000000 3a300000 00000000 | key 0: an empty bitmap
            09000000 3a300000 01000000 0000 0000 10000000 0100 | key 9: {1}");
        let segment = Segment::from_bytes(&bytes).unwrap();
        assert_eq!(members(&segment), [9 << 32 | 1]);
        assert_eq!(segment.info().buckets, 1);
    }

    #[test]
    fn build_reports_every_bad_line_with_its_number() {
        let input = b"1\nabc\n2\n-3\n18446744073709551616\n4 5\n\xff\n# fine\n";
        let Err(BuildError::BadLines(bad)) = build_from_ids(&input[..]) else {
            panic!("bad lines must fail the build");
        };
        assert_eq!(bad.total, 5);
        let lines: Vec<(u64, &str, LineProblem)> = bad
            .shown
            .iter()
            .map(|b| (b.line, b.text.as_str(), b.problem))
            .collect();
        assert_eq!(
            lines,
            [
                (2, "abc", LineProblem::NotDecimal),
                (4, "-3", LineProblem::NotDecimal),
                (5, "18446744073709551616", LineProblem::TooLarge),
                (6, "4 5", LineProblem::NotDecimal),
                (7, "\u{fffd}", LineProblem::NotDecimal),
            ]
        );
        let message = BuildError::BadLines(bad).to_string();
        assert!(message.starts_with("5 bad lines in the ID list, so no segment was built:"));
        assert!(
            message.contains("line 5: \"18446744073709551616\": above the largest"),
            "{message}"
        );
    }

    #[test]
    fn build_bounds_the_bad_lines_it_lists_and_the_lines_it_buffers() {
        let mut input = String::new();
        for i in 0..250 {
            input.push_str(&format!("id{i}\n"));
        }
        input.push_str(&"9".repeat(MAX_LINE_BYTES * 10));
        input.push_str("\n12\n");
        let Err(BuildError::BadLines(bad)) = build_from_ids(input.as_bytes()) else {
            panic!("bad lines must fail the build");
        };
        assert_eq!(bad.total, 251);
        assert_eq!(bad.shown.len(), MAX_REPORTED_BAD_LINES);
        assert_eq!(bad.shown[99].line, 100);
        assert!(bad.to_string().ends_with("... and 151 more"), "{bad}");

        // An over-long line is reported, its rest skipped, and the next line read.
        let input = format!("1\n{}\n2\n", "7".repeat(MAX_LINE_BYTES + 1));
        let Err(BuildError::BadLines(bad)) = build_from_ids(input.as_bytes()) else {
            panic!("a long line must fail the build");
        };
        assert_eq!(bad.total, 1);
        assert_eq!(
            (bad.shown[0].line, bad.shown[0].problem),
            (2, LineProblem::TooLong)
        );
        assert!(bad.shown[0].text.ends_with('…'));
        // At the limit is fine (leading zeros).
        let input = format!("{}42\n", "0".repeat(MAX_LINE_BYTES - 2));
        let (segment, _) = build_from_ids(input.as_bytes()).unwrap();
        assert_eq!(members(&segment), [42]);
    }

    #[test]
    fn build_reports_read_errors() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let err = build_from_ids(io::BufReader::new(Failing)).unwrap_err();
        assert!(matches!(err, BuildError::Read { line: 0, .. }), "{err:?}");
        assert!(err.to_string().contains("disk on fire"));
    }

    #[test]
    fn info_summarises_a_segment() {
        let segment = Segment::from_bytes(&hex(RUNS_OFFSETS_HEX)).unwrap();
        let info = segment.info();
        assert_eq!(
            info,
            SegmentInfo {
                cardinality: 100 + 2 + 65536,
                bytes: 53,
                min: Some(0),
                max: Some(4 * 65536 - 1),
                format: SegmentFormat::Portable32,
                buckets: 1,
                containers: ContainerCounts {
                    array: 2,
                    bitmap: 0,
                    run: 2
                },
            }
        );
        let text = info.to_string();
        for line in [
            "format:      roaring 32-bit portable",
            "ids:         65638",
            "min:         0",
            "max:         262143",
            "bytes:       53 (0.00 per id)",
            "buckets:     1 (distinct high 32 bits)",
            "containers:  4 (2 array, 0 bitmap, 2 run)",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in\n{text}"
            );
        }
        let empty = Segment::from_ids([]).info().to_string();
        assert!(
            empty.contains("min:         -\n") && empty.contains("bytes:       8\n"),
            "{empty}"
        );
    }

    /// IDs that exercise every container kind and both formats: clustered runs, sparse
    /// values, dense blocks, and a few 64-bit ones.
    fn arb_ids() -> impl Strategy<Value = Vec<u64>> {
        let small = prop_oneof![
            (0u64..300_000),
            (0u64..u64::from(u32::MAX)),
            (0u64..8).prop_map(|k| k << 32 | 5),
            any::<u64>(),
        ];
        let ranges = (0u64..400_000, 1u64..9000).prop_map(|(s, n)| (s..s + n).collect::<Vec<_>>());
        (
            prop::collection::vec(small, 0..300),
            prop::collection::vec(ranges, 0..3),
        )
            .prop_map(|(mut ids, ranges)| {
                ids.extend(ranges.into_iter().flatten());
                ids
            })
    }

    /// `u64::from_str`, minus the `+` it accepts.
    fn reference_parse(value: &[u8]) -> Option<u64> {
        let text = std::str::from_utf8(value).ok()?;
        if text.starts_with('+') {
            return None;
        }
        text.parse().ok()
    }

    proptest! {
        // Debug builds of roaring are slow on the 9000-ID ranges: 64 cases keep each
        // property near a second.
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn membership_matches_a_set(ids in arb_ids(), probes in prop::collection::vec(any::<u64>(), 0..50)) {
            let segment = Segment::from_ids(ids.iter().copied());
            let model: BTreeSet<u64> = ids.iter().copied().collect();
            prop_assert_eq!(segment.len(), model.len() as u64);
            for id in ids.iter().chain(&probes).copied().chain(probes.iter().map(|p| p % 400_000)) {
                prop_assert_eq!(segment.contains(id), model.contains(&id));
                prop_assert_eq!(segment.contains_bytes(id.to_string().as_bytes()), model.contains(&id));
            }
        }

        #[test]
        fn round_trips_through_bytes(ids in arb_ids()) {
            let built = Segment::from_ids(ids.iter().copied());
            let bytes = built.to_bytes();
            prop_assert_eq!(bytes.len() as u64, built.info().bytes);
            let loaded = Segment::from_bytes(&bytes).unwrap();
            prop_assert_eq!(loaded.ids(), built.ids());
            prop_assert_eq!(loaded.format(), SegmentFormat::for_max(built.ids().max()));
            prop_assert_eq!(loaded.to_bytes(), bytes);
        }

        #[test]
        fn truncations_and_trailing_bytes_are_refused(
            ids in arb_ids(),
            cut in any::<prop::sample::Index>(),
            extra in prop::collection::vec(any::<u8>(), 1..16),
        ) {
            let bytes = Segment::from_ids(ids).to_bytes();
            let cut = cut.index(bytes.len());
            prop_assert!(Segment::from_bytes(&bytes[..cut]).is_err(), "prefix of {} bytes", cut);
            let mut longer = bytes.clone();
            longer.extend(&extra);
            prop_assert!(Segment::from_bytes(&longer).is_err());
        }

        #[test]
        fn corrupted_valid_files_never_panic(
            ids in arb_ids(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
            headed in any::<bool>(),
        ) {
            let mut bytes = Segment::from_ids(ids).to_bytes();
            let reach = if headed { bytes.len().min(64) } else { bytes.len() };
            for (at, mask) in flips {
                bytes[at.index(reach)] ^= mask;
            }
            if let Ok(segment) = Segment::from_bytes(&bytes) {
                // A flip can turn one valid set into another; the result must be coherent.
                let again = Segment::from_bytes(&segment.to_bytes()).unwrap();
                prop_assert_eq!(again.ids(), segment.ids());
            }
        }
    }

    proptest! {
        // Cheap properties: many cases.
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn parse_id_matches_the_standard_parser(
            value in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..24),
                "[0-9]{0,22}".prop_map(String::into_bytes),
                "[-+ 0-9]{0,6}".prop_map(String::into_bytes),
            ]
        ) {
            prop_assert_eq!(parse_id(&value), reference_parse(&value));
        }

        #[test]
        fn random_bytes_never_panic(
            head in prop::sample::select(vec![
                "",
                "3a300000 01000000 | 12346, 1 container",
                "3a300000 03000000 | 12346, 3 containers",
                "3b300000 | 12347, 1 container",
                "3b300400 | 12347, 5 containers",
                "0100000000000000 00000000 3a300000 01000000 | 1 bucket, 1 container",
                "0200000000000000 00000000 3b300100 | 2 buckets, 12347",
            ]),
            tail in prop::collection::vec(any::<u8>(), 0..256),
        ) {
            // A valid start, then random bytes, so that fuzzing reaches past the cookie.
            let mut bytes = hex(head);
            bytes.extend(tail);
            // Random bytes can be valid (eight zero bytes are an empty 64-bit bitmap); if so
            // they must read as what they encode.
            if let Ok(segment) = Segment::from_bytes(&bytes) {
                let again = Segment::from_bytes(&segment.to_bytes()).unwrap();
                prop_assert_eq!(again.ids(), segment.ids());
            }
        }
    }
}
