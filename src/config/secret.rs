//! Secrets: the files they are read from (`server.admin_token_file`, `api.password_file`,
//! a Redis store's `password_file`), their constant-time comparison, and the redaction of
//! a password written into a Redis URL.
//!
//! A secret never reaches a log line, an error message, `check` output or the admin API:
//! [`Secret`]'s `Debug` names only its file, messages about a bad file name the file and
//! never its contents, and [`redact_url`] replaces the password of every URL tollgate
//! prints (`check --print-effective`, `GET /config`, errors) with [`REDACTED`].

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::config::report::Report;
use crate::config::yaml::Node;

/// What a password written into a URL is replaced with when the URL is printed. The
/// printed config stays a valid config (it parses, and names the same Redis), but a store
/// whose URL carries its password connects with `REDACTED` if that text is fed back:
/// keep the password in a `password_file` to print a config that runs as it is.
pub const REDACTED: &str = "REDACTED";

/// The longest secret file accepted: a token or a password is short, and the file is read
/// whole at load.
const MAX_SECRET_BYTES: u64 = 4096;

/// A secret read from a file at load. Its `Debug` form names only the file, so the
/// secret never reaches a log line or `check` output.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Secret {
    /// The file it was read from, as resolved (relative to the config file's directory).
    pub file: PathBuf,
    /// The secret, trimmed of surrounding whitespace; never empty, printable ASCII.
    pub value: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({}, redacted)", self.file.display())
    }
}

impl Secret {
    /// Whether `given` is the secret. Constant time in the bytes of both: every byte is
    /// read whatever they hold (the time depends on the lengths only), so a client cannot
    /// find the secret byte by byte.
    pub fn matches(&self, given: &[u8]) -> bool {
        constant_time_eq(given, self.value.as_bytes())
    }
}

/// Whether `a == b`, reading every byte of both whatever they hold.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

/// Reads the secret of field `path` from the file `name` (relative to the config file
/// `file`'s directory): the whole file, trimmed. An unreadable, empty, oversized or
/// non-printable file is an error at the field, `what` naming it ("the admin token"); the
/// message names the file, never its contents. `sent_as` says how clients send it, for the
/// message about characters.
pub(crate) fn read(
    r: &mut Report,
    v: &Node,
    path: &str,
    file: &str,
    name: &str,
    (what, sent_as): (&str, &str),
) -> Option<Secret> {
    let base = Path::new(file).parent().unwrap_or_else(|| Path::new(""));
    let at = base.join(name);
    let shown = at.display();
    let read = crate::files::open_regular(&at).and_then(|f| {
        let mut text = String::new();
        f.take(MAX_SECRET_BYTES + 1).read_to_string(&mut text)?;
        Ok(text)
    });
    let message = match read {
        Err(e) => format!("cannot read {what} file `{shown}`: {e}"),
        Ok(text) if text.len() as u64 > MAX_SECRET_BYTES => {
            format!("{what} file `{shown}` is longer than {MAX_SECRET_BYTES} bytes")
        }
        Ok(text) if text.trim().is_empty() => {
            format!(
                "{what} file `{shown}` is empty: write one into it (e.g. `openssl rand -hex 32`)"
            )
        }
        Ok(text) if !text.trim().bytes().all(|b| b.is_ascii_graphic()) => format!(
            "{what} in `{shown}` must be printable ASCII without spaces (it is sent as {sent_as})"
        ),
        Ok(text) => {
            return Some(Secret {
                file: at.clone(),
                value: text.trim().to_string(),
            })
        }
    };
    r.error(v.pos, path, message);
    None
}

/// `url` with the password of its user info (`redis://user:PASSWORD@host`) and a `pass`
/// query parameter (`unix:///run/redis.sock?pass=PASSWORD`, as the Redis client reads
/// it) replaced by [`REDACTED`]; unchanged when it carries none (or does not parse: it is
/// then shown as written, which a URL the config refused never is, since the config
/// reports a bad URL through this function too).
pub fn redact_url(url: &str) -> Cow<'_, str> {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return Cow::Borrowed(url);
    };
    let mut changed = false;
    if parsed.password().is_some() && parsed.set_password(Some(REDACTED)).is_ok() {
        changed = true;
    }
    if parsed.query_pairs().any(|(k, _)| k == "pass") {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "pass" { REDACTED.into() } else { v };
                (k.into_owned(), v.into_owned())
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
        changed = true;
    }
    if changed {
        Cow::Owned(parsed.into())
    } else {
        Cow::Borrowed(url)
    }
}

/// A redacted form of a URL that may not parse (a config error quotes what was written):
/// [`redact_url`] when it parses, else everything between `://` and the last `@` (where a
/// password would be) replaced.
pub(crate) fn redact_written(url: &str) -> Cow<'_, str> {
    if url::Url::parse(url).is_ok() {
        return redact_url(url);
    }
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme + 3 => {
            // `user:password`: the user is kept; without a colon, the whole user info.
            let info = &url[scheme + 3..at];
            let user = info.split_once(':').map_or("", |(user, _)| user);
            let colon = if info.contains(':') { ":" } else { "" };
            Cow::Owned(format!(
                "{}{user}{colon}{REDACTED}{}",
                &url[..scheme + 3],
                &url[at..]
            ))
        }
        _ => Cow::Borrowed(url),
    }
}

/// Whether `url` carries a password (in its user info or a `pass` query parameter).
pub(crate) fn has_password(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| {
        u.password().is_some_and(|p| !p.is_empty()) || u.query_pairs().any(|(k, _)| k == "pass")
    })
}

/// `url` with `password` in it, where the Redis client reads it: the user info of a
/// `redis://` or `rediss://` URL (percent-encoded), the `pass` query parameter of a unix
/// socket's. `None` if the URL does not parse.
pub fn with_password(url: &str, password: &str) -> Option<String> {
    let mut parsed = url::Url::parse(url).ok()?;
    if matches!(parsed.scheme(), "redis" | "rediss") {
        parsed.set_password(Some(password)).ok()?;
    } else {
        parsed.query_pairs_mut().append_pair("pass", password);
    }
    Some(parsed.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_in_constant_time() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
        let s = Secret {
            file: "pw".into(),
            value: "s3cret".into(),
        };
        assert!(s.matches(b"s3cret"));
        assert!(!s.matches(b"s3cre"));
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn passwords_in_urls_are_redacted_and_the_rest_kept() {
        let cases = [
            (
                "redis://:secret@127.0.0.1:6379/0",
                "redis://:REDACTED@127.0.0.1:6379/0",
            ),
            ("redis://user:secret@h:1", "redis://user:REDACTED@h:1"),
            (
                "rediss://default:p%40ss@h/2",
                "rediss://default:REDACTED@h/2",
            ),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://user@h:1", "redis://user@h:1"),
            (
                "unix:///run/redis.sock?db=1&pass=secret",
                "unix:///run/redis.sock?db=1&pass=REDACTED",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
            // The redacted URL is still one the Redis client takes (this build's client
            // speaks plain TCP only).
            if want.starts_with("redis://") {
                assert!(redis::IntoConnectionInfo::into_connection_info(want).is_ok());
            }
        }
        assert_eq!(
            redact_written("redis://:secret@[::1:6379"),
            "redis://:REDACTED@[::1:6379"
        );
        assert_eq!(
            redact_written("redis://u:secret@h:port"),
            "redis://u:REDACTED@h:port"
        );
        assert_eq!(
            redact_written("redis://odd@h:port"),
            "redis://REDACTED@h:port"
        );
        assert!(has_password("redis://:x@h"));
        assert!(has_password("unix:///s?pass=x"));
        assert!(!has_password("redis://u@h"));
    }

    #[test]
    fn a_password_goes_where_the_redis_client_reads_it() {
        use redis::IntoConnectionInfo;
        for (url, pw) in [
            ("redis://127.0.0.1:6379/0", "p@ss:w/rd%"),
            ("unix:///tmp/r.sock", "p&ss="),
        ] {
            let with = with_password(url, pw).unwrap();
            if url.starts_with("unix:") && !cfg!(unix) {
                continue;
            }
            let info = with.as_str().into_connection_info().unwrap();
            assert_eq!(info.redis_settings().password(), Some(pw), "{with}");
        }
    }
}
