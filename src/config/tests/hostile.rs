//! Hostile configs: sizes that would exhaust memory, counts that would make every request
//! or reload slow, numbers that overflow, bytes that are not text, and inputs large enough
//! that a quadratic parser would not finish within the suite's timeout.

use super::errors::errors;
use crate::config::{load, parse_bytes, parse_str};

/// A minimal valid origin `a`; lines 1-4.
const BASE: &str = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";

/// `BASE` with one limit `l` whose body starts on line 7.
fn limit(body: &str) -> String {
    format!("{BASE}    limits:\n      l:\n{body}")
}

const BUCKET: &str =
    "        kind: token_bucket\n        capacity: 5\n        refill: {amount: 1, every: 1s}\n";

fn first(text: &str) -> String {
    errors(text)
        .into_iter()
        .next()
        .unwrap_or_else(|| "<accepted>".to_string())
}

#[test]
fn max_keys_has_an_upper_bound() {
    for huge in ["18446744073709551615", "1000000000000", "16777217"] {
        assert_eq!(
            first(&limit(&format!("{BUCKET}        max_keys: {huge}\n"))),
            format!("t.yaml:10:19: origins.a.limits.l.max_keys: too large: must be at most 16777216, found {huge}")
        );
    }
    assert_eq!(
        first(&limit(&format!("{BUCKET}        max_keys: 16777216\n"))),
        "<accepted>"
    );
}

#[test]
fn overflowing_numbers_are_too_large_not_too_small() {
    assert_eq!(
        first(&limit("        kind: rate\n        max: 99999999999999999999999\n        per: 1s\n")),
        "t.yaml:8:14: origins.a.limits.l.max: too large: must be at most 18446744073709551615, found 99999999999999999999999"
    );
    assert_eq!(
        first(&limit("        kind: rate\n        max: 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF\n        per: 1s\n")),
        "t.yaml:8:14: origins.a.limits.l.max: too large: must be at most 18446744073709551615, found 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF"
    );
    assert_eq!(
        first(&limit("        kind: rate\n        max: 5\n        per: 99999999999999999999999s\n")),
        "t.yaml:9:14: origins.a.limits.l.per: duration `99999999999999999999999s` is too large: must be at most 1d"
    );
    // Below the range is still "at least".
    assert_eq!(
        first(&limit(
            "        kind: rate\n        max: -99999999999999999999999\n        per: 1s\n"
        )),
        "t.yaml:8:14: origins.a.limits.l.max: must be at least 1, found -99999999999999999999999"
    );
}

#[test]
fn a_sketch_has_at_most_16_m_counters() {
    let sketch = |s: &str| {
        limit(&format!(
            "        kind: inflight\n        max: 5\n        sketch: {s}\n"
        ))
    };
    assert_eq!(
        first(&sketch("{hashes: 16, slots: 16777216}")),
        "t.yaml:9:37: origins.a.limits.l.sketch.slots: a sketch of 16 hashes × 16777216 slots has 268435456 counters (2.0 GiB); at most 16777216 counters (128.0 MiB) are allowed: lower `slots` or `hashes`"
    );
    // The default 4 hashes count too.
    assert!(first(&sketch("{slots: 16777216}")).contains("4 hashes × 16777216 slots"));
    assert_eq!(first(&sketch("{hashes: 16, slots: 1048576}")), "<accepted>");
    assert_eq!(first(&sketch("{hashes: 1, slots: 16777216}")), "<accepted>");
}

#[test]
fn total_limiter_state_is_capped_and_the_costliest_settings_named() {
    // One default of 400 MiB in each of 11 origins: 4.3 GiB.
    let mut text = String::from(
        "defaults:\n  limits:\n    t:\n      kind: token_bucket\n      capacity: 5\n      refill: {amount: 1, every: 1s}\n      max_keys: 16777216\norigins:\n",
    );
    for i in 0..11 {
        text.push_str(&format!(
            "  o{i}:\n    hosts: [o{i}.test]\n    upstreams: [\"127.0.0.1:1\"]\n"
        ));
    }
    assert_eq!(
        errors(&text),
        ["t.yaml:7:17: defaults.limits.t.max_keys: the limiters' state would take 4.3 GiB, above the ceiling of 4.0 GiB; the costliest: `defaults.limits.t.max_keys` (11 states, 4.3 GiB). Lower `max_keys` or `sketch`, or use fewer overrides or origins"]
    );
    // Ten origins fit (3.9 GiB).
    let ten = text.replace(
        "  o10:\n    hosts: [o10.test]\n    upstreams: [\"127.0.0.1:1\"]\n",
        "",
    );
    assert_eq!(errors(&ten), Vec::<String>::new());

    // Overrides each have their own state; the origin's own limit is named too.
    let mut one = limit(&format!(
        "{BUCKET}        max_keys: 16777216\n        overrides:\n"
    ));
    for i in 0..10 {
        one.push_str(&format!("          - match: {{customer: c{i}}}\n"));
    }
    one.push_str("      r:\n        kind: rate\n        max: 5\n        per: 1s\n");
    let got = errors(&one);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("t.yaml:10:19: origins.a.limits.l.max_keys: the limiters' state would take 4.3 GiB")
            && got[0].contains("`origins.a.limits.l.max_keys` (11 states, 4.3 GiB), `origins.a.limits.r` (1 state, 3.1 MiB)"),
        "{got:?}"
    );
}

#[test]
fn counts_are_bounded() {
    let parts = vec!["const:x"; 17].join(", ");
    assert_eq!(
        first(&limit(&format!(
            "        kind: rate\n        max: 5\n        per: 1s\n        key: [{parts}]\n"
        ))),
        "t.yaml:10:14: origins.a.limits.l.key: 17 key parts; at most 16 are allowed"
    );
    assert_eq!(
        first(&limit(&format!("        kind: rate\n        max: 5\n        per: 1s\n        key: [\"const:{}\"]\n", "x".repeat(300)))),
        "t.yaml:10:15: origins.a.limits.l.key[0]: a key part may be at most 256 bytes, this one is 306"
    );
    let conditions: Vec<String> = (0..17).map(|i| format!("header:h{i}: v")).collect();
    assert_eq!(
        first(&limit(&format!(
            "        kind: rate\n        max: 5\n        per: 1s\n        overrides:\n          - match: {{{}}}\n",
            conditions.join(", ")
        ))),
        "t.yaml:11:20: origins.a.limits.l.overrides[0].match: 17 conditions; at most 16 are allowed"
    );
    let mut overrides =
        limit("        kind: rate\n        max: 5\n        per: 1s\n        overrides:\n");
    for i in 0..1001 {
        overrides.push_str(&format!("          - match: {{customer: c{i}}}\n"));
    }
    assert_eq!(
        first(&overrides),
        "t.yaml:11:11: origins.a.limits.l.overrides: 1001 overrides; at most 1000 are allowed"
    );

    let many =
        |n: usize, item: &dyn Fn(usize) -> String| (0..n).map(item).collect::<Vec<_>>().join(", ");
    let hosts = format!(
        "origins:\n  a:\n    hosts: [{}]\n    upstreams: [\"127.0.0.1:1\"]\n",
        many(1001, &|i| format!("h{i}.test"))
    );
    assert_eq!(
        first(&hosts),
        "t.yaml:3:12: origins.a.hosts: 1001 host names; at most 1000 are allowed"
    );
    let upstreams = format!(
        "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [{}]\n",
        many(1001, &|i| format!("\"10.0.{}.{}:80\"", i / 250, i % 250))
    );
    assert_eq!(
        first(&upstreams),
        "t.yaml:4:16: origins.a.upstreams: 1001 upstreams; at most 1000 are allowed"
    );

    // Wildcards are counted across origins; the first one beyond the bound is located.
    let mut wild = String::from("origins:\n");
    for o in 0..3 {
        wild.push_str(&format!(
            "  o{o}:\n    hosts: [{}]\n    upstreams: [\"127.0.0.1:1\"]\n",
            many(400, &|i| format!("\"*.w{i}.o{o}.test\""))
        ));
    }
    let got = errors(&wild);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("t.yaml:9:")
            && got[0].contains("origins.o2.hosts[200]: more than 1000 wildcard hosts"),
        "{got:?}"
    );

    let mut origins = String::from("origins:\n");
    for i in 0..10_001 {
        origins.push_str(&format!(
            "  o{i}: {{hosts: [o{i}.test], upstreams: [\"127.0.0.1:1\"]}}\n"
        ));
    }
    assert_eq!(
        first(&origins),
        "t.yaml:2:3: origins: 10001 origins; at most 10000 are allowed"
    );
}

#[test]
fn limits_per_origin_are_bounded() {
    let limits = |n: usize| -> String {
        (0..n)
            .map(|i| format!("      l{i}: {{kind: rate, max: 5, per: 1s}}\n"))
            .collect()
    };
    let own = format!("{BASE}    limits:\n{}", limits(65));
    assert_eq!(
        errors(&own),
        ["t.yaml:2:3: origins.a: origin `a` runs 65 limits (defaults included); at most 64 are allowed"]
    );
    assert_eq!(
        errors(&format!("{BASE}    limits:\n{}", limits(64))),
        Vec::<String>::new()
    );

    // Defaults count in every origin; too many defaults are reported once, at the defaults.
    let defaults = format!(
        "defaults:\n  limits:\n{}{BASE}",
        limits(65).replace("      ", "    ")
    );
    assert_eq!(
        errors(&defaults),
        ["t.yaml:2:3: defaults.limits: 65 default limits; at most 64 are allowed"]
    );
    let mixed = format!(
        "defaults:\n  limits:\n{}{BASE}    limits:\n      own: {{kind: rate, max: 5, per: 1s}}\n",
        limits(64).replace("      ", "    ")
    );
    assert_eq!(
        errors(&mixed),
        ["t.yaml:68:3: origins.a: origin `a` runs 65 limits (defaults included); at most 64 are allowed"]
    );
}

#[test]
fn a_nul_byte_is_refused_not_read_as_the_end() {
    let text = format!("{BASE}\0  b:\n    hosts: [b.test]\n    upstreams: [\"127.0.0.1:1\"]\n");
    assert_eq!(
        errors(&text),
        ["t.yaml:5:1: (text): control character U+0000 (NUL) is not allowed; tab, line feed and carriage return are the only control characters a config may contain"]
    );
    let escape = BASE.replace("a.test", "a\u{1b}.test");
    assert!(first(&escape).starts_with("t.yaml:3:14: (text): control character U+001B (ESC)"));
    // Tabs inside values, CRLF line ends: fine.
    assert_eq!(
        errors(&format!("{BASE}    customer: \"a\tb\"\r\n")),
        Vec::<String>::new()
    );
}

#[test]
fn a_bom_is_dropped_and_bad_encodings_are_located() {
    let with_bom = format!("\u{FEFF}{BASE}");
    assert_eq!(errors(&with_bom), Vec::<String>::new());
    let bytes = [b"\xEF\xBB\xBF".as_slice(), BASE.as_bytes()].concat();
    assert!(parse_bytes(&bytes, "t.yaml").is_ok());

    let bad = BASE.replace("a.test", "a\u{e9}.test").into_bytes();
    let mut bad = bad;
    let at = bad.iter().position(|&b| b == 0xC3).unwrap();
    bad[at + 1] = b'x'; // \xC3 followed by ASCII: an invalid sequence
    let err = parse_bytes(&bad, "t.yaml").unwrap_err().to_string();
    assert_eq!(
        err,
        "t.yaml:3:14: (text): invalid UTF-8 (byte 0xC3); a config must be UTF-8 text"
    );

    // Through `load`, as `check` and every reload read it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, &bad).unwrap();
    let file = path.display().to_string();
    assert_eq!(
        load(&path).unwrap_err().to_string(),
        format!("{file}:3:14: (text): invalid UTF-8 (byte 0xC3); a config must be UTF-8 text")
    );
    std::fs::write(&path, &bytes).unwrap();
    assert!(load(&path).is_ok());
}

#[test]
fn a_file_over_16_mib_is_refused_unread() {
    let mut text = String::from(BASE);
    text.push_str(&"#".repeat(16 << 20));
    let err = parse_str(&text, "t.yaml").unwrap_err().to_string();
    assert_eq!(
        err,
        format!("t.yaml:1:1: (text): the file is {} bytes; a config may be at most 16777216 bytes (16 MiB)", text.len())
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    std::fs::write(&path, &text).unwrap();
    let err = load(&path).unwrap_err().to_string();
    // `load` reads one byte past the bound, not the whole file.
    assert!(err.contains("the file is 16777217 bytes"), "{err}");
}

/// 100 000 unknown keys in one mapping: each is reported once. With a duplicate check that
/// scans the keys before it, this input took 20 s in release and minutes in debug; the
/// suite's timeout is the guard, nothing here is timed.
#[test]
fn a_mapping_of_100k_keys_is_read_in_linear_time() {
    let mut text = String::from(BASE);
    for i in 0..100_000 {
        text.push_str(&format!("    k{i}: 1\n"));
    }
    text.push_str("    k5: 2\n");
    let got = errors(&text);
    assert_eq!(got.len(), 100_001);
    assert_eq!(
        got[0],
        "t.yaml:5:5: origins.a.k0: unknown key `k0`; expected one of hosts, upstreams, tls, sni, tls_verify, customer, connect_timeout, read_timeout, upstream_protocol, limits"
    );
    assert_eq!(
        got[100_000],
        "t.yaml:100005:5: origins.a.k5: duplicate key `k5` (first defined at line 10)"
    );
}
