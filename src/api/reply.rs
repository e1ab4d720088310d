//! The reply side of RESP: writing RESP2 or RESP3 replies into a connection's output
//! buffer.
//!
//! The replies a limiter sends are few and flat (integers, simple and bulk strings,
//! errors, arrays, and maps for `HELLO` and `COMMAND DOCS`), so they are written straight
//! into the buffer, with no intermediate frame and no allocation. The two protocols differ
//! only in maps (RESP3 `%n`; RESP2 a flat array of `2n` items) and nulls (RESP3 `_`;
//! RESP2 `$-1`).

use std::fmt::{self, Write as _};

use bytes::{BufMut, BytesMut};

/// A writer of replies in the connection's protocol.
pub struct Reply<'a> {
    buf: &'a mut BytesMut,
    resp3: bool,
}

impl<'a> Reply<'a> {
    /// Replies into `buf`, in RESP3 if `resp3`, else RESP2.
    pub fn new(buf: &'a mut BytesMut, resp3: bool) -> Self {
        Self { buf, resp3 }
    }

    /// Whether replies are RESP3.
    pub fn resp3(&self) -> bool {
        self.resp3
    }

    /// Switches the protocol of the replies that follow (`HELLO` answers in the protocol it
    /// switches to).
    pub fn set_resp3(&mut self, resp3: bool) {
        self.resp3 = resp3;
    }

    /// `+OK`.
    pub fn ok(&mut self) {
        self.buf.put_slice(b"+OK\r\n");
    }

    /// A simple string; CR and LF (which would end it early) become spaces.
    pub fn simple(&mut self, text: &str) {
        self.buf.put_u8(b'+');
        self.line(format_args!("{text}"));
    }

    /// An error. `message` starts with its code (`ERR ...`, `NOPROTO ...`), as clients
    /// parse it; CR and LF become spaces, so a client's bytes quoted in it can never forge
    /// a reply.
    pub fn error(&mut self, message: fmt::Arguments<'_>) {
        self.buf.put_u8(b'-');
        self.line(message);
    }

    /// An integer.
    pub fn int(&mut self, value: i64) {
        self.buf.put_u8(b':');
        self.buf
            .put_slice(itoa::Buffer::new().format(value).as_bytes());
        self.buf.put_slice(b"\r\n");
    }

    /// A bulk string.
    pub fn bulk(&mut self, bytes: &[u8]) {
        self.header(b'$', bytes.len());
        self.buf.put_slice(bytes);
        self.buf.put_slice(b"\r\n");
    }

    /// The null reply.
    pub fn null(&mut self) {
        self.buf
            .put_slice(if self.resp3 { b"_\r\n" } else { b"$-1\r\n" });
    }

    /// The header of an array of `len` replies, which must follow.
    pub fn array(&mut self, len: usize) {
        self.header(b'*', len);
    }

    /// The header of a map of `len` pairs; each key and value must follow. RESP2 has no
    /// maps: it gets a flat array of `2·len` items, as Redis sends.
    pub fn map(&mut self, len: usize) {
        if self.resp3 {
            self.header(b'%', len);
        } else {
            self.header(b'*', len * 2);
        }
    }

    /// A map key or a short text, as a bulk string.
    pub fn text(&mut self, text: &str) {
        self.bulk(text.as_bytes());
    }

    fn header(&mut self, kind: u8, len: usize) {
        self.buf.put_u8(kind);
        self.buf
            .put_slice(itoa::Buffer::new().format(len).as_bytes());
        self.buf.put_slice(b"\r\n");
    }

    /// Writes `args` with CR and LF replaced, then CRLF.
    fn line(&mut self, args: fmt::Arguments<'_>) {
        struct OneLine<'b>(&'b mut BytesMut);
        impl fmt::Write for OneLine<'_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                for piece in s.split_inclusive(['\r', '\n']) {
                    match piece.strip_suffix(['\r', '\n']) {
                        Some(head) => {
                            self.0.put_slice(head.as_bytes());
                            self.0.put_u8(b' ');
                        }
                        None => self.0.put_slice(piece.as_bytes()),
                    }
                }
                Ok(())
            }
        }
        // Writing into memory cannot fail.
        let _ = OneLine(self.buf).write_fmt(args);
        self.buf.put_slice(b"\r\n");
    }
}

/// A client's bytes quoted in an error message: lossy UTF-8, at most 128 characters, as
/// Redis quotes unknown commands.
pub struct Quoted<'a>(pub &'a [u8]);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = String::from_utf8_lossy(&self.0[..self.0.len().min(128)]);
        f.write_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(resp3: bool, f: impl FnOnce(&mut Reply<'_>)) -> String {
        let mut buf = BytesMut::new();
        f(&mut Reply::new(&mut buf, resp3));
        String::from_utf8(buf.to_vec()).unwrap()
    }

    #[test]
    fn writes_each_kind_in_both_protocols() {
        let all = |r: &mut Reply<'_>| {
            r.ok();
            r.int(-42);
            r.bulk(b"a\r\nb");
            r.null();
            r.map(1);
            r.text("proto");
            r.int(2);
            r.array(0);
            r.simple("PONG");
        };
        assert_eq!(
            written(false, all),
            "+OK\r\n:-42\r\n$4\r\na\r\nb\r\n$-1\r\n*2\r\n$5\r\nproto\r\n:2\r\n*0\r\n+PONG\r\n"
        );
        assert_eq!(
            written(true, all),
            "+OK\r\n:-42\r\n$4\r\na\r\nb\r\n_\r\n%1\r\n$5\r\nproto\r\n:2\r\n*0\r\n+PONG\r\n"
        );
    }

    #[test]
    fn errors_cannot_be_forged_by_quoted_bytes() {
        let evil = b"x\r\n+OK\r\n";
        let out = written(false, |r| {
            r.error(format_args!("ERR unknown command '{}'", Quoted(evil)))
        });
        assert_eq!(out, "-ERR unknown command 'x  +OK  '\r\n");
        let long = [b'a'; 300];
        let out = written(false, |r| r.error(format_args!("ERR '{}'", Quoted(&long))));
        assert_eq!(out.len(), "-ERR ''\r\n".len() + 128);
    }
}
