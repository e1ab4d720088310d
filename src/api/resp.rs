//! The request side of RESP: an incremental, bounded parser of commands.
//!
//! A client sends either a multibulk (`*N\r\n` then N times `$len\r\n<len bytes>\r\n`),
//! which every client library does in RESP2 and RESP3 alike, or an inline command (a line
//! of space-separated words with Redis's quoting, what people type into `redis-cli` or
//! telnet). Nothing else is a request, so the parser accepts exactly these two forms and
//! never recurses.
//!
//! [`Parser::parse`] consumes a command's bytes from the connection's buffer as they
//! arrive: each complete argument is copied out (into the parser's own reusable buffer)
//! and its bytes released at once, so a command split over many TCP writes costs one
//! header parse per argument, never a rescan from the command's start. Every length is
//! checked against its bound **when announced**, before a byte of payload is awaited:
//! `$536870912` is refused as soon as its header line is complete.

use std::fmt;

use bytes::{Buf, BytesMut};

use super::bounds::{MAX_ARGS, MAX_ARG_LEN, MAX_COMMAND_BYTES, MAX_INLINE_LEN};

/// A header line (`*N` or `$N`) is a sign and at most 19 digits; 32 bytes before its CRLF
/// is plenty, and more is garbage.
const MAX_HEADER_LEN: usize = 32;

/// Why a request cannot be parsed. The connection replies `-ERR <this>` and closes, as
/// Redis does: after a framing error the stream's boundaries are lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `*N` where N is not an integer.
    #[error("Protocol error: invalid multibulk length")]
    BadArgCount,
    /// `*N` with N above [`MAX_ARGS`] (or an inline line with more words).
    #[error("Protocol error: {0} arguments exceed the limit of {MAX_ARGS}")]
    TooManyArgs(u64),
    /// `$N` where N is not a non-negative integer.
    #[error("Protocol error: invalid bulk length")]
    BadBulkLen,
    /// `$N` with N above [`MAX_ARG_LEN`].
    #[error("Protocol error: bulk length {0} exceeds the limit of {MAX_ARG_LEN} bytes")]
    BulkTooLong(u64),
    /// A multibulk element that is not a bulk string.
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0).escape_default())]
    ExpectedBulk(u8),
    /// A bulk string whose payload is not followed by CRLF.
    #[error("Protocol error: bulk string not terminated by CRLF")]
    BadTerminator,
    /// A header line longer than any valid one, or ended by a lone CR.
    #[error("Protocol error: invalid header line")]
    BadHeader,
    /// An inline line longer than [`MAX_INLINE_LEN`].
    #[error("Protocol error: too big inline request")]
    InlineTooLong,
    /// An inline line whose quotes do not close.
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// A command whose arguments add up to more than [`MAX_COMMAND_BYTES`].
    #[error("Protocol error: command exceeds {MAX_COMMAND_BYTES} bytes")]
    CommandTooLong,
}

/// An incremental parser of one connection's commands, reusing its buffers.
#[derive(Debug, Default)]
pub struct Parser {
    /// The current command's arguments, concatenated.
    data: Vec<u8>,
    /// Each argument's `(start, end)` in `data`.
    args: Vec<(usize, usize)>,
    /// Bulk strings still expected by the multibulk being parsed; 0 between commands.
    pending: usize,
}

/// The arguments of a parsed command; argument 0 is the command's name.
#[derive(Clone, Copy)]
pub struct Args<'a> {
    data: &'a [u8],
    args: &'a [(usize, usize)],
}

impl Parser {
    /// A parser between commands, with small buffers.
    pub fn new() -> Self {
        Self {
            data: Vec::with_capacity(256),
            args: Vec::with_capacity(8),
            pending: 0,
        }
    }

    /// Parses the next command from `buf`, consuming its bytes.
    ///
    /// `Ok(true)`: a command is ready in [`Parser::args`], valid until the next call.
    /// `Ok(false)`: `buf` holds no complete command yet (what it holds of one has been
    /// consumed or waits there); read more and call again. Empty commands (`*0`, blank
    /// lines) are skipped.
    pub fn parse(&mut self, buf: &mut BytesMut) -> Result<bool, ProtocolError> {
        loop {
            if self.pending == 0 {
                let Some(&first) = buf.first() else {
                    return Ok(false);
                };
                self.start_command();
                if first != b'*' {
                    match self.inline(buf)? {
                        Some(true) => return Ok(true),
                        // A blank line: skipped.
                        Some(false) => continue,
                        None => return Ok(false),
                    }
                }
                let Some((value, next)) = header(buf)? else {
                    return Ok(false);
                };
                let count = parse_int(value).ok_or(ProtocolError::BadArgCount)?;
                buf.advance(next);
                if count <= 0 {
                    continue;
                }
                if count as u64 > MAX_ARGS as u64 {
                    return Err(ProtocolError::TooManyArgs(count as u64));
                }
                self.pending = count as usize;
            }
            let Some(&first) = buf.first() else {
                return Ok(false);
            };
            if first != b'$' {
                return Err(ProtocolError::ExpectedBulk(first));
            }
            let Some((value, start)) = header(buf)? else {
                return Ok(false);
            };
            let len = parse_int(value).ok_or(ProtocolError::BadBulkLen)?;
            let len = u64::try_from(len).map_err(|_| ProtocolError::BadBulkLen)?;
            if len > MAX_ARG_LEN as u64 {
                return Err(ProtocolError::BulkTooLong(len));
            }
            let len = len as usize;
            if self.data.len() + len > MAX_COMMAND_BYTES {
                return Err(ProtocolError::CommandTooLong);
            }
            let end = start + len;
            if buf.len() < end + 2 {
                return Ok(false);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(ProtocolError::BadTerminator);
            }
            let at = self.data.len();
            self.data.extend_from_slice(&buf[start..end]);
            self.args.push((at, at + len));
            buf.advance(end + 2);
            self.pending -= 1;
            if self.pending == 0 {
                return Ok(true);
            }
        }
    }

    /// The arguments of the command [`Parser::parse`] returned.
    pub fn args(&self) -> Args<'_> {
        Args {
            data: &self.data,
            args: &self.args,
        }
    }

    /// Clears the previous command, giving back memory a large one took.
    fn start_command(&mut self) {
        self.data.clear();
        self.args.clear();
        if self.data.capacity() > 64 * 1024 {
            self.data.shrink_to(4096);
        }
        if self.args.capacity() > 64 {
            self.args.shrink_to(8);
        }
    }

    /// Parses an inline command: one line, words split as `redis-cli` and Redis do.
    /// `Some(true)`: a command; `Some(false)`: a blank line; `None`: no full line yet.
    fn inline(&mut self, buf: &mut BytesMut) -> Result<Option<bool>, ProtocolError> {
        let window = &buf[..buf.len().min(MAX_INLINE_LEN + 1)];
        let Some(newline) = window.iter().position(|&b| b == b'\n') else {
            if buf.len() > MAX_INLINE_LEN {
                return Err(ProtocolError::InlineTooLong);
            }
            return Ok(None);
        };
        let line = &buf[..newline];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        split_inline(line, &mut self.data, &mut self.args)?;
        buf.advance(newline + 1);
        if self.args.len() > MAX_ARGS {
            return Err(ProtocolError::TooManyArgs(self.args.len() as u64));
        }
        Ok(Some(!self.args.is_empty()))
    }
}

/// A header line at the start of `buf` (after its type byte): its value, and the offset
/// just past its CRLF. `None` until the CRLF has arrived.
fn header(buf: &[u8]) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let window = &buf[..buf.len().min(MAX_HEADER_LEN + 2)];
    match window.iter().position(|&b| b == b'\r') {
        Some(cr) if cr + 1 < buf.len() => {
            if buf[cr + 1] != b'\n' {
                return Err(ProtocolError::BadHeader);
            }
            Ok(Some((&buf[1..cr], cr + 2)))
        }
        Some(_) => Ok(None),
        None if buf.len() > MAX_HEADER_LEN => Err(ProtocolError::BadHeader),
        None => Ok(None),
    }
}

/// A decimal `i64` with an optional `-`, nothing else (no `+`, no spaces, no overflow).
fn parse_int(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if negative { -value } else { value })
}

/// Whether `b` separates inline arguments (`isspace`, and NUL).
fn blank(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t' | 0x0b | 0x0c | 0)
}

/// The index after the closing quote at `i`, which must end its argument: a blank or the
/// line's end follows it.
fn closed(line: &[u8], i: usize) -> Result<usize, ProtocolError> {
    if line.get(i + 1).is_some_and(|&n| !blank(n)) {
        return Err(ProtocolError::UnbalancedQuotes);
    }
    Ok(i + 1)
}

/// Splits an inline line into arguments with Redis's rules (`sdssplitargs`): words
/// separated by blanks; `"..."` with `\n \r \t \b \a \\ \" \xHH` escapes; `'...'` with
/// `\'`; a closing quote must be followed by a blank or the end of the line.
fn split_inline(
    line: &[u8],
    data: &mut Vec<u8>,
    args: &mut Vec<(usize, usize)>,
) -> Result<(), ProtocolError> {
    let mut i = 0;
    loop {
        while i < line.len() && blank(line[i]) {
            i += 1;
        }
        if i == line.len() {
            return Ok(());
        }
        let start = data.len();
        // The quote the argument is inside, if any.
        let mut quote = None;
        loop {
            let c = line.get(i).copied();
            if let Some(q) = quote {
                let c = c.ok_or(ProtocolError::UnbalancedQuotes)?;
                let escape = if q == b'"' {
                    double_quoted_escape(line, i)
                } else {
                    single_quoted_escape(line, i)
                };
                if let Some((byte, len)) = escape {
                    data.push(byte);
                    i += len;
                } else if c == q {
                    i = closed(line, i)?;
                    break;
                } else {
                    data.push(c);
                    i += 1;
                }
            } else {
                match c {
                    None => break,
                    Some(c) if blank(c) => break,
                    Some(q @ (b'"' | b'\'')) => quote = Some(q),
                    Some(c) => data.push(c),
                }
                i += 1;
            }
        }
        if data.len() > MAX_COMMAND_BYTES {
            return Err(ProtocolError::CommandTooLong);
        }
        args.push((start, data.len()));
    }
}

/// The escape at `line[i]` inside double quotes, if one starts there: `\xHH`, `\n`, `\r`,
/// `\t`, `\b`, `\a`, or a backslash before any other byte (that byte); the byte it
/// stands for and its length.
fn double_quoted_escape(line: &[u8], i: usize) -> Option<(u8, usize)> {
    if line.get(i) != Some(&b'\\') || i + 1 >= line.len() {
        return None;
    }
    let hex = |j: usize| line.get(j).and_then(|&h| (h as char).to_digit(16));
    if line[i + 1] == b'x' {
        if let (Some(hi), Some(lo)) = (hex(i + 2), hex(i + 3)) {
            return Some(((hi * 16 + lo) as u8, 4));
        }
    }
    let byte = match line[i + 1] {
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'b' => 0x08,
        b'a' => 0x07,
        other => other,
    };
    Some((byte, 2))
}

/// The escape at `line[i]` inside single quotes, if one starts there: only `\'`.
fn single_quoted_escape(line: &[u8], i: usize) -> Option<(u8, usize)> {
    (line.get(i) == Some(&b'\\') && line.get(i + 1) == Some(&b'\'')).then_some((b'\'', 2))
}

impl<'a> Args<'a> {
    /// The arguments `args` (each a `(start, end)` range of `data`) of a command kept
    /// elsewhere than in a parser: a transaction's queue. Every range must lie in `data`.
    pub(crate) fn from_parts(data: &'a [u8], args: &'a [(usize, usize)]) -> Self {
        Self { data, args }
    }

    /// The number of arguments, the command's name included.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether there is no argument (never true for a parsed command).
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// Argument `i` (0 is the command's name).
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        self.args.get(i).map(|&(s, e)| &self.data[s..e])
    }

    /// Argument `i`, or an empty slice past the end.
    pub fn at(&self, i: usize) -> &'a [u8] {
        self.get(i).unwrap_or_default()
    }

    /// The arguments from `i` on.
    pub fn iter_from(&self, i: usize) -> impl Iterator<Item = &'a [u8]> + 'a {
        let data = self.data;
        self.args
            .get(i..)
            .unwrap_or_default()
            .iter()
            .map(move |&(s, e)| &data[s..e])
    }
}

impl fmt::Debug for Args<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter_from(0).map(String::from_utf8_lossy))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` to a parser in chunks of `chunk` bytes; returns the commands parsed,
    /// or the first error.
    fn parse_chunked(input: &[u8], chunk: usize) -> Result<Vec<Vec<String>>, ProtocolError> {
        let mut p = Parser::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk.max(1)) {
            buf.extend_from_slice(piece);
            while p.parse(&mut buf)? {
                out.push(
                    p.args()
                        .iter_from(0)
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect(),
                );
            }
        }
        Ok(out)
    }

    fn parse(input: &[u8]) -> Result<Vec<Vec<String>>, ProtocolError> {
        parse_chunked(input, input.len())
    }

    /// Asserts that `input` parses to the commands `want` however it is split into chunks.
    fn parses_in_any_chunks(input: &[u8], want: &[&[&str]]) {
        let want: Vec<Vec<String>> = want
            .iter()
            .map(|c| c.iter().map(|s| s.to_string()).collect())
            .collect();
        for chunk in 1..=input.len() {
            assert_eq!(parse_chunked(input, chunk).unwrap(), want, "chunk {chunk}");
        }
    }

    #[test]
    fn multibulk_pipelined_and_split_anywhere() {
        let input = b"*1\r\n$4\r\nPING\r\n*3\r\n$9\r\nRL.REDUCE\r\n$0\r\n\r\n$2\r\n\r\n\r\n*0\r\n*-1\r\n*2\r\n$4\r\nECHO\r\n$3\r\na b\r\n";
        parses_in_any_chunks(
            input,
            &[&["PING"], &["RL.REDUCE", "", "\r\n"], &["ECHO", "a b"]],
        );
    }

    #[test]
    fn bytes_are_consumed_as_arguments_complete() {
        let mut p = Parser::new();
        let mut buf = BytesMut::from(&b"*2\r\n$4\r\nECHO\r\n$10\r\n01234"[..]);
        assert!(!p.parse(&mut buf).unwrap());
        assert_eq!(
            &buf[..],
            b"$10\r\n01234",
            "only the incomplete argument waits"
        );
        buf.extend_from_slice(b"56789\r\n");
        assert!(p.parse(&mut buf).unwrap());
        assert_eq!(p.args().at(1), b"0123456789");
        assert!(buf.is_empty());
    }

    #[test]
    fn inline_commands_with_quotes() {
        let input = b"PING\r\n\r\n  set  \"a b\\x41\\n\" 'it\\'s'  \nECHO \"\\\"q\\\"\"\r\n";
        parses_in_any_chunks(
            input,
            &[&["PING"], &["set", "a bA\n", "it's"], &["ECHO", "\"q\""]],
        );
        for bad in [&b"ECHO \"abc\r\n"[..], b"ECHO 'abc\n", b"ECHO \"a\"b\n"] {
            assert_eq!(parse(bad), Err(ProtocolError::UnbalancedQuotes));
        }
    }

    #[test]
    fn lengths_are_refused_when_announced() {
        // The header alone is enough: no payload is awaited.
        assert_eq!(
            parse(b"*2\r\n$4\r\nECHO\r\n$536870912\r\n"),
            Err(ProtocolError::BulkTooLong(536_870_912))
        );
        assert_eq!(parse(b"*1025\r\n"), Err(ProtocolError::TooManyArgs(1025)));
        assert_eq!(
            parse(b"*99999999999999999999\r\n"),
            Err(ProtocolError::BadArgCount)
        );
        assert_eq!(parse(b"*1\r\n$-1\r\n"), Err(ProtocolError::BadBulkLen));
        assert_eq!(parse(b"*1\r\n$x\r\n"), Err(ProtocolError::BadBulkLen));
        assert_eq!(
            parse(b"*1\r\n:1\r\n"),
            Err(ProtocolError::ExpectedBulk(b':'))
        );
        assert_eq!(
            parse(b"*1\r\n$1\r\nab\r\n"),
            Err(ProtocolError::BadTerminator)
        );
        assert_eq!(
            parse(b"*1\r\n*1\r\n"),
            Err(ProtocolError::ExpectedBulk(b'*'))
        );
        assert_eq!(parse(b"*1\rx"), Err(ProtocolError::BadHeader));
        assert_eq!(parse(&[b'*'; 40]), Err(ProtocolError::BadHeader));
        assert_eq!(parse(b"*+1\r\n"), Err(ProtocolError::BadArgCount));
        // An inline line without a newline is refused past its bound, not before.
        let long = vec![b'a'; MAX_INLINE_LEN];
        assert_eq!(parse(&long), Ok(vec![]));
        let longer = vec![b'a'; MAX_INLINE_LEN + 1];
        assert_eq!(parse(&longer), Err(ProtocolError::InlineTooLong));
        // A command's total size is bounded.
        let arg = vec![b'x'; MAX_ARG_LEN];
        let mut big = format!("*{}\r\n", MAX_ARGS).into_bytes();
        for _ in 0..MAX_ARGS {
            big.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            big.extend_from_slice(&arg);
            big.extend_from_slice(b"\r\n");
        }
        assert_eq!(parse(&big), Err(ProtocolError::CommandTooLong));
        let messages = [
            ProtocolError::BulkTooLong(536_870_912).to_string(),
            ProtocolError::ExpectedBulk(b'\r').to_string(),
        ];
        assert_eq!(
            messages,
            [
                "Protocol error: bulk length 536870912 exceeds the limit of 65536 bytes",
                "Protocol error: expected '$', got '\\r'"
            ]
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_recursion() {
        let input = b"*1\r\n".repeat(200_000);
        assert_eq!(parse(&input), Err(ProtocolError::ExpectedBulk(b'*')));
    }

    #[test]
    fn big_commands_give_their_memory_back() {
        let mut p = Parser::new();
        let arg = vec![b'x'; MAX_ARG_LEN];
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"*3\r\n$4\r\nECHO\r\n");
        for _ in 0..2 {
            buf.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            buf.extend_from_slice(&arg);
            buf.extend_from_slice(b"\r\n");
        }
        buf.extend_from_slice(b"PING\r\n");
        assert!(p.parse(&mut buf).unwrap());
        assert_eq!(p.args().len(), 3);
        assert!(p.parse(&mut buf).unwrap());
        assert!(p.data.capacity() <= 64 * 1024, "{}", p.data.capacity());
    }

    #[test]
    fn parse_int_is_strict() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"1 ",
            b"9223372036854775808",
            b"1e3",
        ] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }
}
