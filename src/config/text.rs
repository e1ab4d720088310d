//! Bytes to config text: size, encoding and characters are checked before any YAML is
//! read, each problem located by line and column.
//!
//! A config is UTF-8 text of at most [`MAX_FILE_BYTES`]. A leading UTF-8 byte-order mark
//! (which some Windows editors write) is dropped. Control characters other than tab, line
//! feed and carriage return are refused: the YAML scanner would stop at a NUL and read
//! the text before it as the whole file, so a stray NUL could silently drop every origin
//! written after it. Columns count characters, as the YAML reader's do.

use crate::config::report::Pos;

/// The largest config file read: far above any real config (the shipped example is 5 KiB),
/// small enough that reading and parsing it stays a matter of seconds.
pub const MAX_FILE_BYTES: usize = 16 << 20;

/// At most this many encoding or character problems are listed; the last one says how
/// many more there are.
const MAX_REPORTED: usize = 10;

/// The pseudo field path of problems with the text itself.
pub(crate) const PATH: &str = "(text)";

/// The UTF-8 encoding of U+FEFF, the byte-order mark.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// A problem with the text: where, and what.
pub(crate) type TextProblem = (Pos, String);

/// The size problem of a text of `len` bytes, if it is too large.
pub(crate) fn size(len: usize) -> Option<TextProblem> {
    (len > MAX_FILE_BYTES).then(|| {
        (
            Pos { line: 1, col: 1 },
            format!(
                "the file is {} bytes; a config may be at most {MAX_FILE_BYTES} bytes (16 MiB)",
                len
            ),
        )
    })
}

/// `bytes` as UTF-8 text without a leading byte-order mark, or every encoding problem
/// (at most [`MAX_REPORTED`]), located.
pub(crate) fn decode(bytes: &[u8]) -> Result<&str, Vec<TextProblem>> {
    let bytes = bytes.strip_prefix(UTF8_BOM).unwrap_or(bytes);
    if let Ok(text) = std::str::from_utf8(bytes) {
        return Ok(text);
    }
    let start = Pos { line: 1, col: 1 };
    if bytes.starts_with(b"\xFF\xFE") || bytes.starts_with(b"\xFE\xFF") {
        let message =
            "the file is UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8";
        return Err(vec![(start, message.to_string())]);
    }
    let mut problems = Vec::new();
    let mut at = Cursor::default();
    let mut more = 0usize;
    for chunk in bytes.utf8_chunks() {
        at.advance(chunk.valid());
        let invalid = chunk.invalid();
        if invalid.is_empty() {
            continue;
        }
        if problems.len() < MAX_REPORTED {
            let shown: Vec<String> = invalid.iter().map(|b| format!("0x{b:02X}")).collect();
            problems.push((
                at.pos(),
                format!(
                    "invalid UTF-8 (byte {}); a config must be UTF-8 text",
                    shown.join(" ")
                ),
            ));
        } else {
            more += 1;
        }
        // An invalid sequence takes one column, as its replacement character would.
        at.col += 1;
    }
    note_more(&mut problems, more, "invalid UTF-8 sequences");
    Err(problems)
}

/// Drops a leading byte-order mark from text that was decoded elsewhere.
pub(crate) fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{FEFF}').unwrap_or(text)
}

/// Every control character other than tab, line feed and carriage return (at most
/// [`MAX_REPORTED`] are listed), located.
pub(crate) fn control_characters(text: &str) -> Vec<TextProblem> {
    let mut problems = Vec::new();
    let mut more = 0usize;
    let mut at = Cursor::default();
    for c in text.chars() {
        if c.is_control() && !matches!(c, '\t' | '\n' | '\r') {
            if problems.len() < MAX_REPORTED {
                let name = match name(c) {
                    Some(name) => format!(" ({name})"),
                    None => String::new(),
                };
                problems.push((
                    at.pos(),
                    format!(
                        "control character U+{:04X}{name} is not allowed; tab, line feed and carriage return are the only control characters a config may contain",
                        u32::from(c)
                    ),
                ));
            } else {
                more += 1;
            }
        }
        at.step(c);
    }
    note_more(&mut problems, more, "control characters");
    problems
}

/// The common name of a control character, for messages.
fn name(c: char) -> Option<&'static str> {
    Some(match c {
        '\0' => "NUL",
        '\u{7}' => "BEL",
        '\u{8}' => "backspace",
        '\u{B}' => "vertical tab",
        '\u{C}' => "form feed",
        '\u{1B}' => "ESC",
        '\u{7F}' => "DEL",
        '\u{85}' => "NEL",
        _ => return None,
    })
}

fn note_more(problems: &mut [TextProblem], more: usize, what: &str) {
    if let (Some(last), true) = (problems.last_mut(), more > 0) {
        last.1.push_str(&format!(" ({more} more {what} follow)"));
    }
}

/// A running line and column (both 0-based here).
#[derive(Debug, Default)]
struct Cursor {
    line: usize,
    col: usize,
}

impl Cursor {
    fn step(&mut self, c: char) {
        if c == '\n' {
            self.line += 1;
            self.col = 0;
        } else {
            self.col += 1;
        }
    }

    fn advance(&mut self, text: &str) {
        text.chars().for_each(|c| self.step(c));
    }

    fn pos(&self) -> Pos {
        Pos {
            line: self.line + 1,
            col: self.col + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(line: usize, col: usize) -> Pos {
        Pos { line, col }
    }

    #[test]
    fn a_utf8_bom_is_dropped() {
        assert_eq!(decode(b"\xEF\xBB\xBFa: 1\n"), Ok("a: 1\n"));
        assert_eq!(strip_bom("\u{FEFF}a: 1\n"), "a: 1\n");
        assert_eq!(strip_bom("a: \u{FEFF}"), "a: \u{FEFF}");
    }

    #[test]
    fn invalid_utf8_is_located() {
        let problems = decode(b"a: 1\nbb: \xC3\xA9\xFF x\xFE\n").unwrap_err();
        assert_eq!(
            problems,
            [
                (
                    pos(2, 6),
                    "invalid UTF-8 (byte 0xFF); a config must be UTF-8 text".to_string()
                ),
                (
                    pos(2, 9),
                    "invalid UTF-8 (byte 0xFE); a config must be UTF-8 text".to_string()
                ),
            ]
        );
    }

    #[test]
    fn utf16_is_named() {
        let problems = decode(b"\xFF\xFEo\0r\0").unwrap_err();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].1.contains("UTF-16"), "{problems:?}");
    }

    #[test]
    fn control_characters_are_located_and_capped() {
        assert!(control_characters("a:\tb\r\nc: d\n").is_empty());
        let problems = control_characters("a: 1\n  b\0: 2\n\u{1B}\u{85}");
        let at: Vec<Pos> = problems.iter().map(|p| p.0).collect();
        assert_eq!(at, [pos(2, 4), pos(3, 1), pos(3, 2)]);
        assert!(problems[0]
            .1
            .starts_with("control character U+0000 (NUL) is not allowed"));
        assert!(problems[2].1.starts_with("control character U+0085 (NEL)"));

        let many = control_characters(&"\0".repeat(25));
        assert_eq!(many.len(), MAX_REPORTED);
        assert!(many[9].1.ends_with("(15 more control characters follow)"));
    }

    #[test]
    fn size_is_bounded() {
        assert_eq!(size(MAX_FILE_BYTES), None);
        assert!(size(MAX_FILE_BYTES + 1).is_some());
    }
}
