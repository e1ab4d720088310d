//! `resources:` and `api.store`: the limiter API's part of the config.

use crate::config::tests::errors::errors;
use crate::config::{parse_str, Cost, Kind, LimitParams, Mode};
use crate::limits::{KeyPart, MatchValue};

/// A minimal origin (lines 1-4); cases append sections from line 5.
const BASE: &str = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";

fn first_error(tail: &str) -> String {
    let text = format!("{BASE}{tail}");
    errors(&text)
        .into_iter()
        .next()
        .unwrap_or_else(|| "(parsed)".to_string())
}

#[test]
fn resources_are_limits_keyed_by_the_domain() {
    let text = format!(
        "{BASE}stores:\n  shared: {{kind: redis, url: \"redis://127.0.0.1:1/0\"}}\napi:\n  store: shared\n  allow_unconfigured: true\nsegments:\n  vips: {{file: /dev/null, of: customer}}\nresources:\n  logins: {{kind: token_bucket, capacity: 10, refill: {{amount: 1, every: 1h}}, store: shared}}\n  uploads:\n    kind: concurrency\n    max: 5\n    global: 100\n    groups:\n      - {{name: big, members: {{customer: [bigco]}}, max: 40}}\n      - {{name: vip, members: {{segment: vips}}, max: 8}}\n    overrides:\n      - {{match: {{customer: bigco}}, max: 20}}\n      - {{match: {{segment: vips}}, mode: shadow}}\n  search: {{kind: rate, key: [\"const:all\"], max: 100, per: 1s}}\n  off: {{kind: rate, max: 1, per: 1s, mode: off}}\n"
    );
    let config = parse_str(&text, "t.yaml").unwrap().config;
    assert_eq!(config.api.store.as_deref(), Some("shared"));
    assert!(config.api.allow_unconfigured);
    let names: Vec<&str> = config.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["logins", "uploads", "search"],
        "mode: off removes one"
    );
    let logins = &config.resources[0];
    assert_eq!(
        logins.key.parts(),
        [KeyPart::Customer],
        "the default key is the domain"
    );
    assert_eq!(logins.store.as_deref(), Some("shared"));
    assert!(matches!(
        logins.params,
        LimitParams::TokenBucket {
            cost: Cost::Fixed(1),
            ..
        }
    ));
    let uploads = &config.resources[1];
    assert_eq!(uploads.params.kind(), Kind::Concurrency);
    assert_eq!(uploads.overrides.len(), 2);
    assert_eq!(uploads.overrides[0].matchers[0].part, KeyPart::Customer);
    assert_eq!(
        uploads.overrides[1].matchers[0].value,
        MatchValue::Segment("vips".to_string())
    );
    assert_eq!(uploads.overrides[1].mode, Mode::Shadow);
    assert_eq!(
        config.resources[2].key.parts(),
        [KeyPart::Const("all".to_string())]
    );
    // The effective config prints them back, and parses to the same model.
    let yaml = crate::config::effective::printed_back(&config);
    assert!(yaml.contains("resources:") && !yaml.contains("headers: on_reject\n  uploads"));
}

#[test]
fn resource_mistakes_are_located_errors() {
    let cases: &[(&str, &str)] = &[
        (
            "resources:\n  r: {kind: inflight, max: 2}\n",
            "t.yaml:6:13: resources.r.kind: kind `inflight` estimates requests in flight through the proxy; a resource counts copies exactly with `kind: concurrency` (CH.RESERVE and CH.RELEASE), or a rate with `token_bucket`, `rate`, `tiered` or `sliding_log` (CH.REQUEST)",
        ),
        (
            "resources:\n  r: {kind: rate, key: [client_ip], max: 2, per: 1s}\n",
            "t.yaml:6:25: resources.r.key[0]: a resource sees only the command's domain, as `customer` (and `const:` text); `client_ip` has no value for limiter API callers",
        ),
        (
            "resources:\n  r:\n    kind: rate\n    max: 2\n    per: 1s\n    overrides:\n      - {match: {header:x-tier: gold}, max: 5}\n",
            "t.yaml:11:18: resources.r.overrides[0].match.header:x-tier: a resource sees only the command's domain, as `customer` (and `const:` text); `header:x-tier` has no value for limiter API callers",
        ),
        (
            "resources:\n  r:\n    kind: concurrency\n    max: 2\n    groups:\n      - {name: g, members: {client_ip: [1.2.3.4]}, max: 5}\n",
            "t.yaml:10:16: resources.r.groups[0].name: a resource sees only the command's domain, as `customer` (and `const:` text); `client_ip` has no value for limiter API callers",
        ),
        (
            "segments:\n  s: {file: /dev/null, of: client_ip}\nresources:\n  r:\n    kind: rate\n    max: 2\n    per: 1s\n    overrides:\n      - {match: {segment: s}, max: 5}\n",
            "t.yaml:13:27: resources.r.overrides[0].match.segment: segment `s` holds values of `client_ip`; a resource matches only the command's domain, so its segments need `of: customer`",
        ),
        (
            "resources:\n  r: {kind: token_bucket, capacity: 5, refill: {amount: 1, every: 1s}, cost: 2}\n",
            "t.yaml:6:72: resources.r.cost: a command's cost is its `copies`; `cost` is not a field of a resource",
        ),
        (
            "resources:\n  r: {kind: rate, max: 2, per: 1s, headers: always}\n",
            "t.yaml:6:36: resources.r.headers: `headers` has no meaning for a resource: API replies carry the limits",
        ),
        (
            "resources:\n  _unconfigured: {kind: rate, max: 2, per: 1s}\n",
            "t.yaml:6:3: resources._unconfigured: `_unconfigured` is the name unconfigured resources are counted under; pick another",
        ),
        (
            "resources:\n  r: {kind: rate, max: 2, pr: 1s}\n",
            "t.yaml:6:27: resources.r.pr: unknown key `pr`; did you mean `per`?",
        ),
        (
            "resources:\n  r: {kind: rate, max: 2, per: 1s, store: shard}\n",
            "t.yaml:6:43: resources.r.store: unknown store `shard`: no Redis store is configured under `stores:`",
        ),
        (
            "resources:\n  r: {kind: rate, max: -2, per: 1s}\n",
            "t.yaml:6:24: resources.r.max: must be at least 1, found -2",
        ),
        (
            "resources: [a, b]\n",
            "t.yaml:5:12: resources: expected a mapping, found a list",
        ),
        (
            "api:\n  store: shard\n",
            "t.yaml:6:10: api.store: unknown store `shard`: no Redis store is configured under `stores:`",
        ),
        (
            "stores:\n  shared: {kind: redis, url: \"redis://127.0.0.1:1/0\"}\napi:\n  store: sharde\n",
            "t.yaml:8:10: api.store: unknown store `sharde`; did you mean `shared`?",
        ),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|(tail, want)| {
            let got = first_error(tail);
            (got != *want).then(|| format!("{tail}\n  got:  {got}\n  want: {want}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_api_origin_name_is_reserved() {
    let text = "origins:\n  _api:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";
    assert_eq!(
        errors(text),
        ["t.yaml:2:3: origins._api: origin name `_api` is taken by the limiter API's resources (their metrics label); pick another"]
    );
}

#[test]
fn api_store_local_is_the_default() {
    let text = format!("{BASE}api:\n  store: local\n");
    assert_eq!(parse_str(&text, "t.yaml").unwrap().config.api.store, None);
}
