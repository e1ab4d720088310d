//! Building a segment from a list of IDs, one per line: the `tollgate segment build` CLI's
//! reader, with bounded lines and a bounded report of the lines it refused.

use std::fmt;
use std::io::{self, BufRead};

use super::*;

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
