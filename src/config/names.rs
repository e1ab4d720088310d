//! Names as written in a config: origin and limit names (which become metrics labels) and
//! key parts (which `key:` lists and `match:` conditions both use).
//!
//! It sits below [`super::limit`] and [`super::overrides`], which both read key parts, so
//! that neither has to import the other.

use crate::config::bounds::MAX_KEY_PART_BYTES;
use crate::config::report::{Pos, Report};
use crate::config::suggest;
use crate::limits::key::KeyPartError;
use crate::limits::KeyPart;

/// Whether `name` can be a metrics label and a policy name: `[A-Za-z0-9_-]+`.
pub(crate) fn is_label(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The message for a name that is not a label; `what` is `origin` or `limit`.
pub(crate) fn label_message(what: &str, name: &str) -> String {
    format!(
        "{what} name `{name}` may only contain letters, digits, `_` and `-` (it is a metrics label)"
    )
}

/// Parses a key part written at `pos`, with a suggestion for a misspelt one.
pub(crate) fn key_part(r: &mut Report, text: &str, pos: Pos, path: &str) -> Option<KeyPart> {
    if text.len() > MAX_KEY_PART_BYTES {
        let message = format!(
            "a key part may be at most {MAX_KEY_PART_BYTES} bytes, this one is {}",
            text.len()
        );
        r.error(pos, path, message);
        return None;
    }
    match KeyPart::parse(text) {
        Ok(part) => Some(part),
        Err(err) => {
            r.error(pos, path, key_part_message(text, &err));
            None
        }
    }
}

fn key_part_message(text: &str, err: &KeyPartError) -> String {
    if let KeyPartError::Unknown(_) = err {
        let suggestion = match text.split_once(':') {
            Some((prefix, rest)) => {
                suggest::closest(prefix, &["header", "const"]).map(|p| format!("{p}:{rest}"))
            }
            None => suggest::closest(text, KeyPart::plain_names()).map(str::to_string),
        };
        if let Some(s) = suggestion {
            return format!("unknown key part `{text}`; did you mean `{s}`?");
        }
    }
    err.to_string()
}
