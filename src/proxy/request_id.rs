//! The request ID (`X-Request-Id`): kept from a trusted proxy when it is well formed,
//! generated otherwise, sent upstream, returned to the client, and named in the access
//! log and in a rejection's problem+json body, so that a customer's complaint can be
//! matched to one line.
//!
//! A generated ID is a UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random
//! bits, so IDs sort by time and cannot be guessed. The random bits come from the OS
//! (`getrandom`) through a per-thread pool of [`POOL`] bytes: one system call per few
//! hundred requests, no lock.

use std::cell::RefCell;

use http::HeaderMap;

/// The header.
pub const HEADER: &str = "x-request-id";

/// The longest ID kept from a trusted proxy; a longer one is replaced.
pub const MAX_LEN: usize = 128;

/// Random bytes fetched from the OS at once, per thread.
const POOL: usize = 4096;

/// One request's ID, inline (no allocation): ASCII token characters only.
#[derive(Clone, Copy)]
pub struct RequestId {
    len: u8,
    /// Whether it is the request's own `X-Request-Id`, kept from a trusted proxy.
    kept: bool,
    buf: [u8; MAX_LEN],
}

impl Default for RequestId {
    fn default() -> Self {
        Self {
            len: 0,
            kept: false,
            buf: [0; MAX_LEN],
        }
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RequestId {
    /// The ID as text (empty before one is set).
    pub fn as_str(&self) -> &str {
        // Only token characters (ASCII) are ever stored.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or_default()
    }

    /// Whether the ID is the request's one `X-Request-Id` line, kept from a trusted proxy:
    /// the request already carries it upstream as it is.
    pub fn kept(&self) -> bool {
        self.kept
    }

    /// Whether no ID was set yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `value` if it is 1 to [`MAX_LEN`] RFC 9110 token characters.
    pub fn parse(value: &[u8]) -> Option<RequestId> {
        if value.is_empty() || value.len() > MAX_LEN || !value.iter().all(|&b| is_tchar(b)) {
            return None;
        }
        let mut id = RequestId {
            len: value.len() as u8,
            ..RequestId::default()
        };
        id.buf[..value.len()].copy_from_slice(value);
        Some(id)
    }

    /// The request's ID: the `X-Request-Id` of `headers` when the peer is `trusted` and it
    /// is well formed (exactly one), otherwise a new UUIDv7 for `unix_millis`.
    pub fn of(headers: &HeaderMap, trusted: bool, unix_millis: u64) -> RequestId {
        if trusted {
            let mut values = headers.get_all(HEADER).iter();
            if let (Some(v), None) = (values.next(), values.next()) {
                if let Some(id) = RequestId::parse(v.as_bytes()) {
                    return RequestId { kept: true, ..id };
                }
            }
        }
        RequestId::generate(unix_millis)
    }

    /// A new UUIDv7 for `unix_millis`.
    pub fn generate(unix_millis: u64) -> RequestId {
        let mut bytes = [0u8; 16];
        random(&mut bytes[6..]);
        bytes[..6].copy_from_slice(&unix_millis.to_be_bytes()[2..]);
        bytes[6] = 0x70 | (bytes[6] & 0x0f);
        bytes[8] = 0x80 | (bytes[8] & 0x3f);
        let mut id = RequestId {
            len: 36,
            ..RequestId::default()
        };
        // 8-4-4-4-12 hex digits: a dash before bytes 4, 6, 8 and 10.
        let mut at = 0;
        for (i, &b) in bytes.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                id.buf[at] = b'-';
                at += 1;
            }
            id.buf[at..at + 2].copy_from_slice(&HEX_PAIRS[usize::from(b)]);
            at += 2;
        }
        id
    }
}

/// Each byte's two lower-case hex digits, so that an ID is written a byte at a time.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut table = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = [HEX[b >> 4], HEX[b & 0x0f]];
        b += 1;
    }
    table
};

/// RFC 9110's `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

struct Pool {
    bytes: [u8; POOL],
    used: usize,
}

thread_local! {
    static RANDOM: RefCell<Pool> = const { RefCell::new(Pool { bytes: [0; POOL], used: POOL }) };
}

/// Fills `out` from this thread's pool of OS random bytes, refilling it when empty. If
/// the OS has none to give (it always has on Linux once booted), the time-seeded bytes of
/// a hash are used: the ID stays unique, only less unguessable.
fn random(out: &mut [u8]) {
    RANDOM.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.used + out.len() > POOL {
            if getrandom::fill(&mut pool.bytes).is_err() {
                let seed = ahash::RandomState::new();
                for (i, chunk) in pool.bytes.chunks_mut(8).enumerate() {
                    let v = seed.hash_one(i).to_le_bytes();
                    chunk.copy_from_slice(&v[..chunk.len()]);
                }
            }
            pool.used = 0;
        }
        let at = pool.used;
        out.copy_from_slice(&pool.bytes[at..at + out.len()]);
        pool.used += out.len();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_id_is_a_uuid_v7_in_time_order() {
        let a = RequestId::generate(1_795_784_701_123);
        let b = RequestId::generate(1_795_784_701_124);
        let s = a.as_str();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "7", "{s}");
        assert!(matches!(&s[19..20], "8" | "9" | "a" | "b"), "{s}");
        for (i, c) in s.char_indices() {
            match i {
                8 | 13 | 18 | 23 => assert_eq!(c, '-', "{s}"),
                _ => assert!(matches!(c, '0'..='9' | 'a'..='f'), "{s}"),
            }
        }
        let millis = format!("{:012x}", 1_795_784_701_123u64);
        assert_eq!(format!("{}{}", &s[..8], &s[9..13]), millis);
        assert!(a.as_str() < b.as_str());
        assert_ne!(
            RequestId::generate(1).as_str()[15..],
            RequestId::generate(1).as_str()[15..]
        );
    }

    #[test]
    fn a_trusted_id_is_kept_only_when_well_formed() {
        let mut h = HeaderMap::new();
        h.insert(HEADER, "abc-123".parse().unwrap());
        assert_eq!(RequestId::of(&h, true, 5).as_str(), "abc-123");
        assert!(RequestId::of(&h, true, 5).kept());
        assert_ne!(RequestId::of(&h, false, 5).as_str(), "abc-123");
        assert!(!RequestId::of(&h, false, 5).kept());
        h.append(HEADER, "def-456".parse().unwrap());
        assert!(!RequestId::of(&h, true, 5).kept(), "two lines: replaced");
        h.insert(HEADER, "has space".parse().unwrap());
        assert_eq!(RequestId::of(&h, true, 5).as_str().len(), 36);
        h.insert(HEADER, "x".repeat(MAX_LEN + 1).parse().unwrap());
        assert_eq!(RequestId::of(&h, true, 5).as_str().len(), 36);
        h.insert(HEADER, "x".repeat(MAX_LEN).parse().unwrap());
        assert_eq!(RequestId::of(&h, true, 5).as_str().len(), MAX_LEN);
    }
}
