//! Host routing: which origin serves a request's host.
//!
//! Exact names win over `*.suffix` wildcards; among wildcards the longest suffix wins, so
//! `*.api.example.com` beats `*.example.com`. A wildcard matches one or more labels in
//! front of its suffix, never the bare suffix itself (as in nginx's `server_name`).

use std::collections::HashMap;

/// Host → origin index.
#[derive(Debug, Default)]
pub struct Router {
    exact: HashMap<String, usize>,
    /// `(".example.com", origin)`, longest suffix first.
    wildcards: Vec<(String, usize)>,
}

impl Router {
    /// Builds the table from each origin's host patterns (already lower-cased and checked
    /// for duplicates by the config).
    pub fn new<'a>(origins: impl IntoIterator<Item = (usize, &'a [String])>) -> Self {
        let mut router = Router::default();
        for (index, hosts) in origins {
            for host in hosts {
                match host.strip_prefix('*') {
                    Some(suffix) => router.wildcards.push((suffix.to_string(), index)),
                    None => {
                        router.exact.insert(host.clone(), index);
                    }
                }
            }
        }
        router
            .wildcards
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        router
    }

    /// The origin for a lower-cased host.
    pub fn route(&self, host: &str) -> Option<usize> {
        if let Some(&index) = self.exact.get(host) {
            return Some(index);
        }
        self.wildcards
            .iter()
            .find(|(suffix, _)| host.len() > suffix.len() && host.ends_with(suffix.as_str()))
            .map(|&(_, index)| index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router {
        let a = vec!["shop.example.com".to_string(), "*.example.com".to_string()];
        let b = vec!["*.api.example.com".to_string()];
        Router::new([(0, a.as_slice()), (1, b.as_slice())])
    }

    #[test]
    fn exact_beats_wildcard_and_longest_suffix_wins() {
        let r = router();
        assert_eq!(r.route("shop.example.com"), Some(0));
        assert_eq!(r.route("www.example.com"), Some(0));
        assert_eq!(r.route("v1.api.example.com"), Some(1));
        assert_eq!(
            r.route("example.com"),
            None,
            "bare suffix is not a wildcard match"
        );
        assert_eq!(r.route("other.org"), None);
    }
}
