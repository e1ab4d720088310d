//! A limit's own `match:` (the requests it applies to) and `path` conditions: read into the
//! model in normal form (a trailing `*` is a prefix), merged over a default as a whole,
//! refused with file:line:column where it cannot mean anything, and shown by
//! `check --print-effective`, which parses back to the same model.

use crate::config::effective::printed_back;
use crate::config::parse_str;
use crate::config::tests::errors::errors;
use crate::limits::{KeyPart, MatchValue, Matcher};

fn origin(limits: &str) -> String {
    format!("origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n    limits:\n{limits}")
}

fn path(value: MatchValue) -> Matcher {
    Matcher {
        part: KeyPart::Path,
        value,
    }
}

#[test]
fn a_limit_match_is_read_in_normal_form_and_prints_back() {
    let text = origin(
        "      login:\n        kind: rate\n        max: 5\n        per: 1m\n        match: { path: \"/./login\", method: POST }\n      api:\n        kind: rate\n        max: 50\n        per: 1s\n        match: { path: \"/api//v1/*\" }\n        overrides: [{ match: { path: \"/api/v1/%62ulk*\" }, max: 5 }]\n      all: { kind: rate, max: 500, per: 1s }\n",
    );
    let config = parse_str(&text, "t.yaml").unwrap().config;
    let limits = &config.origins[0].limits;
    assert_eq!(
        limits[0].scope,
        [
            path(MatchValue::Exact(b"/login".to_vec().into())),
            Matcher {
                part: KeyPart::Method,
                value: MatchValue::Exact(b"POST".to_vec().into()),
            },
        ]
    );
    assert_eq!(
        limits[1].scope,
        [path(MatchValue::Prefix(b"/api/v1/".to_vec().into()))]
    );
    assert_eq!(
        limits[1].overrides[0].matchers,
        [path(MatchValue::Prefix(b"/api/v1/bulk".to_vec().into()))]
    );
    assert!(limits[2].scope.is_empty());
    let yaml = printed_back(&config);
    assert!(yaml.contains("path: /api/v1/*"), "{yaml}");
}

#[test]
fn an_origin_replaces_a_defaults_match_as_a_whole() {
    let text = "defaults:\n  limits:\n    l: { kind: rate, max: 5, per: 1s, match: { path: /a, method: GET } }\norigins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n    limits:\n      l: { match: { path: \"/b/*\" } }\n  b:\n    hosts: [b.test]\n    upstreams: [\"127.0.0.1:1\"]\n";
    let config = parse_str(text, "t.yaml").unwrap().config;
    assert_eq!(
        config.origins[0].limits[0].scope,
        [path(MatchValue::Prefix(b"/b/".to_vec().into()))]
    );
    assert_eq!(config.origins[1].limits[0].scope.len(), 2);
}

#[test]
fn a_match_that_cannot_mean_anything_is_a_located_error() {
    let cases: &[(&str, &str)] = &[
        (
            &origin("      l: { kind: rate, max: 5, per: 1s, match: { path: \"api/*\" } }\n"),
            "t.yaml:6:56: origins.a.limits.l.match.path: `api/*` is not a path: a path starts with `/`, e.g. `/login`",
        ),
        (
            &origin("      l: { kind: rate, max: 5, per: 1s, match: {} }\n"),
            "t.yaml:6:48: origins.a.limits.l.match: `match` needs at least one condition, e.g. `{customer: bigco}`",
        ),
        (
            &origin("      l: { kind: rate, max: 5, per: 1s, match: { server_ip: 10.0.0.1 } }\n"),
            "t.yaml:6:50: origins.a.limits.l.match.server_ip: `server_ip` is only known to inflight limits (it is chosen after request-time limits run)",
        ),
        (
            &format!("{}resources:\n  r: {{ kind: rate, max: 2, per: 1s, match: {{ customer: x }} }}\n", origin("      l: { kind: rate, max: 5, per: 1s }\n")),
            "t.yaml:8:37: resources.r.match: a command names the resource it asks: `match` picks proxy requests; use `overrides` to treat domains differently",
        ),
    ];
    for (text, want) in cases {
        let got = errors(text);
        assert_eq!(
            got.first().map(String::as_str),
            Some(*want),
            "{text}\n{got:?}"
        );
    }
}
