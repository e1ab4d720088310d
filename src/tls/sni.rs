//! SNI: which certificate serves a name. Each certificate serves the DNS names in its own
//! SAN; a name is served by the certificate naming it exactly, else by one naming the
//! wildcard of its parent (`*.example.com` serves `a.example.com`, never
//! `example.com` nor `a.b.example.com`, as RFC 6125 matches), else by the default.
//! Among certificates naming the same pattern, the first in the config wins.
//!
//! A lookup lower-cases the name into a stack buffer and does at most two hash lookups: no
//! allocation per handshake.

use std::collections::HashMap;

/// The longest DNS name (RFC 1035): a longer SNI cannot match anything.
const MAX_NAME: usize = 253;

/// Names to certificate indexes.
#[derive(Debug, Default, Clone)]
pub struct SniTable {
    /// `www.example.com` → certificate.
    exact: HashMap<Box<str>, usize, ahash::RandomState>,
    /// `example.com` (from `*.example.com`) → certificate.
    wildcard: HashMap<Box<str>, usize, ahash::RandomState>,
    /// The certificate for no SNI or an unknown name; `None` refuses the handshake.
    default: Option<usize>,
}

impl SniTable {
    /// A table serving `default` when nothing matches.
    pub fn new(default: Option<usize>) -> Self {
        Self {
            default,
            ..Self::default()
        }
    }

    /// Records that certificate `index` serves `pattern` (a SAN DNS name, any case); the
    /// first certificate to claim a pattern keeps it.
    pub fn insert(&mut self, pattern: &str, index: usize) {
        let lower = pattern.trim_end_matches('.').to_ascii_lowercase();
        match lower.strip_prefix("*.") {
            Some(parent) if !parent.is_empty() => {
                self.wildcard.entry(parent.into()).or_insert(index);
            }
            _ => {
                self.exact.entry(lower.into_boxed_str()).or_insert(index);
            }
        }
    }

    /// The certificate serving `name` (the client's SNI, `None` when it sent none).
    pub fn pick(&self, name: Option<&str>) -> Option<usize> {
        let Some(name) = name else {
            return self.default;
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        if name.is_empty() || name.len() > MAX_NAME {
            return self.default;
        }
        let mut buf = [0u8; MAX_NAME];
        let lower = &mut buf[..name.len()];
        lower.copy_from_slice(name.as_bytes());
        lower.make_ascii_lowercase();
        let Ok(lower) = std::str::from_utf8(lower) else {
            return self.default;
        };
        if let Some(&i) = self.exact.get(lower) {
            return Some(i);
        }
        let parent = lower
            .split_once('.')
            .filter(|(label, parent)| !label.is_empty() && !parent.is_empty());
        parent
            .and_then(|(_, p)| self.wildcard.get(p).copied())
            .or(self.default)
    }
}

/// Whether a certificate naming `pattern` serves requests for the configured host `host`
/// (either may be a wildcard): for `check`'s "names no routed host" warning.
pub fn serves(pattern: &str, host: &str) -> bool {
    let pattern = pattern.trim_end_matches('.').to_ascii_lowercase();
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if pattern == host {
        return true;
    }
    match (pattern.strip_prefix("*."), host.strip_prefix("*.")) {
        // `*.example.com` serves `a.example.com`.
        (Some(parent), None) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == parent),
        // A host pattern `*.example.com` is served in part by `a.example.com`.
        (None, Some(parent)) => pattern
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == parent),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> SniTable {
        let mut t = SniTable::new(Some(9));
        t.insert("www.example.com", 0);
        t.insert("*.example.com", 1);
        t.insert("EXAMPLE.com", 2);
        t.insert("*.example.com", 3);
        t.insert("api.example.com.", 4);
        t
    }

    #[test]
    fn exact_beats_wildcard_beats_default() {
        let t = table();
        assert_eq!(t.pick(Some("www.example.com")), Some(0));
        assert_eq!(t.pick(Some("WWW.Example.COM.")), Some(0));
        assert_eq!(
            t.pick(Some("shop.example.com")),
            Some(1),
            "first claim wins"
        );
        assert_eq!(t.pick(Some("api.example.com")), Some(4));
        assert_eq!(t.pick(Some("example.com")), Some(2));
        assert_eq!(t.pick(Some("a.b.example.com")), Some(9), "one label only");
        assert_eq!(t.pick(Some("other.test")), Some(9));
        assert_eq!(t.pick(None), Some(9));
        assert_eq!(t.pick(Some("")), Some(9));
        assert_eq!(t.pick(Some(&"a".repeat(300))), Some(9));
    }

    #[test]
    fn without_a_default_an_unknown_name_has_no_certificate() {
        let mut t = SniTable::new(None);
        t.insert("*.example.com", 0);
        assert_eq!(t.pick(Some("x.example.com")), Some(0));
        assert_eq!(t.pick(Some(".example.com")), None);
        assert_eq!(t.pick(Some("example.com")), None);
        assert_eq!(t.pick(None), None);
    }

    #[test]
    fn serves_matches_both_ways() {
        assert!(serves("*.example.com", "shop.example.com"));
        assert!(serves("shop.example.com", "*.example.com"));
        assert!(serves("*.example.com", "*.example.com"));
        assert!(serves("Shop.Example.com", "shop.example.com"));
        assert!(!serves("*.example.com", "example.com"));
        assert!(!serves("*.example.com", "a.b.example.com"));
        assert!(!serves("other.test", "shop.example.com"));
    }
}
