//! "Did you mean ...?": the closest known name to a misspelt one.
//!
//! Every unknown key, kind, mode or key part goes through [`unknown`], so all such
//! messages share one shape: a suggestion when a known name is close, the full list
//! otherwise.

/// Names longer than this get no suggestion (every known name is far shorter).
const MAX_COMPARED: usize = 64;

/// The known name closest to `found`, when it is close enough to be a likely typo:
/// normalized Damerau-Levenshtein similarity of at least 0.7, or at most two edits that
/// leave more than half of the word intact.
///
/// A name of more than [`MAX_COMPARED`] bytes is never close to a known one, and comparing
/// it would cost its length times each candidate's: it gets no suggestion.
pub(crate) fn closest<'a>(found: &str, known: &[&'a str]) -> Option<&'a str> {
    if found.len() > MAX_COMPARED {
        return None;
    }
    let found_lower = found.to_ascii_lowercase();
    let mut best: Option<(usize, f64, &'a str)> = None;
    for &candidate in known {
        let distance = strsim::damerau_levenshtein(&found_lower, candidate);
        let longest = found_lower.chars().count().max(candidate.chars().count());
        // strsim's normalized similarity, without computing the distance a second time.
        let similarity = if longest == 0 {
            1.0
        } else {
            1.0 - distance as f64 / longest as f64
        };
        let close = similarity >= 0.7 || (distance <= 2 && distance * 2 < longest);
        if close && best.is_none_or(|(d, s, _)| distance < d || (distance == d && similarity > s)) {
            best = Some((distance, similarity, candidate));
        }
    }
    best.map(|(_, _, name)| name)
}

/// The message for an unknown `what` (key, kind, mode, ...): `unknown key `capcity`; did
/// you mean `capacity`?`, or the list of known names when none is close.
pub(crate) fn unknown(what: &str, found: &str, known: &[&str]) -> String {
    match closest(found, known) {
        Some(name) => format!("unknown {what} `{found}`; did you mean `{name}`?"),
        None => format!(
            "unknown {what} `{found}`; expected one of {}",
            known.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let known = ["capacity", "max", "per", "kind", "key", "refill"];
        assert_eq!(closest("capcity", &known), Some("capacity"));
        assert_eq!(closest("cpacity", &known), Some("capacity"));
        assert_eq!(closest("mx", &known), Some("max"));
        assert_eq!(closest("pre", &known), Some("per"));
        assert_eq!(closest("Kind", &known), Some("kind"));
        assert_eq!(closest("a", &known), None);
        assert_eq!(closest("zzzzzz", &known), None);
        assert_eq!(closest(&"capacity".repeat(100), &known), None);
        assert_eq!(
            unknown("kind", "zzz", &["rate", "inflight"]),
            "unknown kind `zzz`; expected one of rate, inflight"
        );
    }
}
