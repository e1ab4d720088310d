//! The roaring portable formats, read and validated: every length, offset, cardinality and
//! sort order of a file is checked before the `roaring` crate deserializes it, so a hostile
//! or truncated file is a clear [`FormatError`], never a panic or an unbounded allocation.

use roaring::{RoaringBitmap, RoaringTreemap};

use super::*;

/// Parses a whole file: 32-bit if its cookie says so (falling back to 64-bit, see the
/// module doc), 64-bit otherwise.
pub(super) fn parse(bytes: &[u8]) -> Result<(RoaringTreemap, SegmentFormat), FormatError> {
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
