//! The request path as limits see it: one spelling per path, so that a client cannot
//! step around a limit keyed on (or matching) the path by writing it another way its
//! upstream reads as the same.
//!
//! `GET //login`, `GET /./login`, `GET /a/../login` and `GET /%6Cogin` all reach the same
//! handler behind nginx or most application servers, but are four different byte strings:
//! a limit keyed on the raw path would give each its own count, and an override matching
//! `path: /login` would miss three of them. [`normalize`] maps them to `/login`:
//!
//! 1. **Percent-decoding of unreserved characters** (RFC 3986 §6.2.2.2: `ALPHA`, `DIGIT`,
//!    `-`, `.`, `_`, `~`): `%6C` is `l`. Every other escape keeps its meaning and only its
//!    hex digits are upper-cased (§6.2.2.1: `%2f` and `%2F` are one escape), so an escaped
//!    `/` never becomes a separator; a `%` not followed by two hex digits is left as is.
//! 2. **Dot segments removed** (§5.2.4, after the decoding, so `%2E%2E` is `..`): `.` is
//!    dropped, `..` drops the segment before it and never climbs above the root.
//! 3. **Repeated slashes merged**, as nginx's `merge_slashes` (on by default) and Envoy's
//!    `merge_slashes` do: an empty segment names nothing.
//!
//! A path that is already normal (most requests: no `%`, no `//`, no dot segment) is
//! returned borrowed, after one pass over its bytes and no allocation; only a path that
//! changes is copied. The result is idempotent: `normalize(normalize(p)) == normalize(p)`
//! (a property test checks it). Case is kept: paths are case-sensitive (§6.2.2.1). A path
//! that does not start with `/` (`OPTIONS *`) is kept whole. What reaches the upstream is
//! the request as the client sent it: this is only the limits' view.

use std::borrow::Cow;

/// The normal form of `path` (module doc): borrowed when `path` already is normal.
pub fn normalize(path: &[u8]) -> Cow<'_, [u8]> {
    if is_normal(path) {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(rewrite(path))
    }
}

/// Whether [`normalize`] would return `path` unchanged: one pass over its bytes, no
/// allocation.
pub fn is_normal(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return true;
    }
    let at = |k: usize| path.get(k).copied();
    for (i, &b) in path.iter().enumerate() {
        match b {
            // An escape changes if it names an unreserved byte or is not upper-case.
            b'%' => match escaped(path, i) {
                Some(byte) if unreserved(byte) || path[i + 1..i + 3] != hex_pair(byte) => {
                    return false;
                }
                _ => {}
            },
            // After a `/`: `//` (an empty segment; a trailing one is `/a/`, which ends
            // here), or `/.` or `/..` as a whole segment.
            b'/' => match (at(i + 1), at(i + 2), at(i + 3)) {
                (Some(b'/'), _, _)
                | (Some(b'.'), None | Some(b'/'), _)
                | (Some(b'.'), Some(b'.'), None | Some(b'/')) => return false,
                _ => {}
            },
            _ => {}
        }
    }
    true
}

/// The byte `%XY` at `at` escapes, if `XY` are two hex digits.
fn escaped(path: &[u8], at: usize) -> Option<u8> {
    let hi = hex_value(*path.get(at + 1)?)?;
    let lo = hex_value(*path.get(at + 2)?)?;
    Some((hi << 4) | lo)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `byte`'s escape in upper-case hex, without the `%`.
fn hex_pair(byte: u8) -> [u8; 2] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    [HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]
}

/// RFC 3986's `unreserved`: the bytes whose escapes mean the byte itself.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The normal form of a path that starts with `/` (the slow path of [`normalize`]).
fn rewrite(path: &[u8]) -> Vec<u8> {
    // Step 1: unreserved escapes decoded, the others upper-cased.
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        match (path[i], escaped(path, i)) {
            (b'%', Some(byte)) if unreserved(byte) => {
                decoded.push(byte);
                i += 3;
            }
            (b'%', Some(byte)) => {
                decoded.push(b'%');
                decoded.extend_from_slice(&hex_pair(byte));
                i += 3;
            }
            (b, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    // Steps 2 and 3: segments kept on a stack; `.` and empty ones dropped, `..` pops. A
    // path ending in any of those (or in `/`) keeps one slash at its end.
    let mut out: Vec<u8> = Vec::with_capacity(decoded.len());
    let mut ends_in_slash = false;
    for segment in decoded[1..].split(|&b| b == b'/') {
        match segment {
            b"" | b"." => ends_in_slash = true,
            b".." => {
                let cut = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(cut);
                ends_in_slash = true;
            }
            name => {
                out.push(b'/');
                out.extend_from_slice(name);
                ends_in_slash = false;
            }
        }
    }
    if ends_in_slash || out.is_empty() {
        out.push(b'/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(p: &str) -> String {
        String::from_utf8(normalize(p.as_bytes()).into_owned()).unwrap()
    }

    #[test]
    fn spellings_of_one_path_become_one() {
        for p in [
            "/login",
            "//login",
            "/./login",
            "/a/../login",
            "/%6Cogin",
            "/%6cogin",
            "///a/b/../../login",
            "/%2E/login",
            "/%2e%2E/login",
            "/../login",
        ] {
            assert_eq!(norm(p), "/login", "{p}");
        }
    }

    #[test]
    fn trailing_slashes_and_dot_segments_follow_rfc_3986() {
        assert_eq!(norm("/"), "/");
        assert_eq!(norm("//"), "/");
        assert_eq!(norm("/a/"), "/a/");
        assert_eq!(norm("/a//"), "/a/");
        assert_eq!(norm("/a/."), "/a/");
        assert_eq!(norm("/a/b/.."), "/a/");
        assert_eq!(norm("/a/b/../"), "/a/");
        assert_eq!(norm("/.."), "/");
        assert_eq!(norm("/a/.b/..c"), "/a/.b/..c");
    }

    #[test]
    fn reserved_escapes_keep_their_meaning() {
        // An escaped slash is data, not a separator: `/a%2F..` is one segment.
        assert_eq!(norm("/a%2fb"), "/a%2Fb");
        assert_eq!(norm("/a%2f../b"), "/a%2F../b");
        assert_eq!(norm("/%zz/%4"), "/%zz/%4");
        assert_eq!(norm("/%25"), "/%25");
        assert_eq!(norm("/caf%c3%a9"), "/caf%C3%A9");
    }

    #[test]
    fn a_normal_path_is_borrowed() {
        for p in [
            "/",
            "/login",
            "/a/b/",
            "/a%2Fb",
            "/%zz",
            "*",
            "",
            "/.well-known/x",
        ] {
            assert!(matches!(normalize(p.as_bytes()), Cow::Borrowed(_)), "{p}");
        }
        assert!(matches!(normalize(b"/a//b"), Cow::Owned(_)));
    }

    #[test]
    fn case_is_kept() {
        assert_eq!(norm("/Login/%7eA"), "/Login/~A");
    }

    proptest! {
        #[test]
        fn normalizing_is_idempotent_and_is_normal_agrees(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("/".to_string()),
                    Just(".".to_string()),
                    Just("..".to_string()),
                    Just("%2e".to_string()),
                    Just("%2F".to_string()),
                    Just("%6c".to_string()),
                    Just("%".to_string()),
                    "[a-z~]{1,3}",
                ],
                0..12,
            )
        ) {
            let path = format!("/{}", parts.concat());
            let once = normalize(path.as_bytes()).into_owned();
            let twice = normalize(&once).into_owned();
            prop_assert_eq!(&once, &twice);
            prop_assert!(is_normal(&once));
            prop_assert_eq!(is_normal(path.as_bytes()), once == path.as_bytes());
            prop_assert_eq!(once.first(), Some(&b'/'));
        }
    }
}
