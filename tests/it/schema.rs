//! The config's JSON Schema: `conf/tollgate.schema.json` is exactly what `tollgate schema`
//! prints; the shipped configs and the test fixtures are valid under it, and known-bad
//! configs are refused by it as by the reader (`jsonschema`, YAML read by `serde_yaml`).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn validator() -> jsonschema::Validator {
    let text = std::fs::read_to_string(format!("{ROOT}/conf/tollgate.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

/// The schema's complaints about `yaml`, one line each.
fn schema_errors(v: &jsonschema::Validator, yaml: &str) -> Vec<String> {
    let doc: Value = serde_yaml::from_str(yaml).unwrap();
    v.iter_errors(&doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// The reader's verdict on `yaml`, as if it were the file `path` (relative paths in it
/// start next to it).
fn reader_accepts(yaml: &str, path: &Path) -> Result<(), String> {
    tollgate::config::parse_str(yaml, &path.display().to_string())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn the_committed_schema_is_what_tollgate_schema_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("schema")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read(format!("{ROOT}/conf/tollgate.schema.json")).unwrap();
    assert!(
        out.stdout == committed,
        "conf/tollgate.schema.json is out of date; regenerate it with\n\n    cargo run -- schema > conf/tollgate.schema.json\n"
    );
    // The file is a draft 2020-12 schema that a validator compiles.
    validator();
}

#[test]
fn the_shipped_configs_name_the_schema_and_are_valid_under_it() {
    let v = validator();
    for name in ["tollgate.yaml", "tollgate-fleet.yaml"] {
        let path = PathBuf::from(format!("{ROOT}/conf/{name}"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.lines().next(),
            Some("# yaml-language-server: $schema=tollgate.schema.json"),
            "{name} must start with the schema line, for editors"
        );
        reader_accepts(&text, &path).unwrap();
        assert_eq!(schema_errors(&v, &text), Vec::<String>::new(), "{name}");
    }
}

#[test]
fn the_fixture_configs_are_valid_under_the_schema_and_the_reader() {
    let v = validator();
    let dir = format!("{ROOT}/tests/fixtures/configs/good");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        reader_accepts(&text, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            schema_errors(&v, &text),
            Vec::<String>::new(),
            "{}",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 2, "no fixtures found in {dir}");
}

const ORIGIN: &str = "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n";

/// Configs the reader refuses, each with what is wrong: the schema must refuse them too.
const BAD: &[(&str, &str)] = &[
    ("unknown top-level key", "sever: {}\n"),
    ("unknown server key", "server:\n  max_conections: 5\n"),
    ("threads out of range", "server:\n  threads: 0\n"),
    ("too many threads", "server:\n  threads: 1025\n"),
    ("duration without unit", "server:\n  grace_period: 5\n"),
    ("not a duration", "server:\n  grace_period: soon\n"),
    ("bad listen address", "server:\n  listen: [\"localhost\"]\n"),
    ("empty listen", "server:\n  listen: []\n"),
    (
        "max_connections above its bound",
        "server:\n  max_connections: 1000001\n",
    ),
    ("api max_keys above MAX_KEYS", "api:\n  max_keys: 16777217\n"),
    ("unknown kind", "defaults:\n  limits:\n    l: {kind: leaky, max: 1}\n"),
    ("default without kind", "defaults:\n  limits:\n    l: {max: 1}\n"),
    (
        "rate without per",
        "defaults:\n  limits:\n    l: {kind: rate, max: 1}\n",
    ),
    (
        "a field of another kind",
        "defaults:\n  limits:\n    l: {kind: token_bucket, capacity: 1, refill: {amount: 1, every: 1s}, max: 5}\n",
    ),
    (
        "an override field of another kind",
        "defaults:\n  limits:\n    l:\n      kind: inflight\n      max: 5\n      overrides:\n        - {match: {customer: x}, per: 1s}\n",
    ),
    (
        "override without match",
        "defaults:\n  limits:\n    l:\n      kind: inflight\n      max: 5\n      overrides:\n        - {max: 1}\n",
    ),
    (
        "refill without every",
        "defaults:\n  limits:\n    l: {kind: token_bucket, capacity: 1, refill: {amount: 1}}\n",
    ),
    (
        "too many key parts",
        "defaults:\n  limits:\n    l: {kind: inflight, max: 1, key: [host, host, host, host, host, host, host, host, host, host, host, host, host, host, host, host, host]}\n",
    ),
    (
        "unknown key part",
        "defaults:\n  limits:\n    l: {kind: inflight, max: 1, key: [client_ipp]}\n",
    ),
    (
        "sketch slots below 16",
        "defaults:\n  limits:\n    l: {kind: inflight, max: 1, sketch: {slots: 8}}\n",
    ),
    (
        "max_keys above MAX_KEYS",
        "defaults:\n  limits:\n    l: {kind: rate, max: 1, per: 1s, max_keys: 16777217}\n",
    ),
    (
        "tier above MAX_LIMIT",
        "defaults:\n  limits:\n    l: {kind: tiered, tiers: [{limit: 1048577, window: 1s, active: 1s}]}\n",
    ),
    (
        "sliding log window per below 1s, no unit",
        "defaults:\n  limits:\n    l: {kind: sliding_log, windows: [{max: 1, per: 60}]}\n",
    ),
    (
        "limit name not a label",
        "defaults:\n  limits:\n    \"a b\": {kind: inflight, max: 1}\n",
    ),
    (
        "resource of kind inflight",
        "resources:\n  r: {kind: inflight, max: 1}\n",
    ),
    (
        "resource with cost",
        "resources:\n  r: {kind: token_bucket, capacity: 1, refill: {amount: 1, every: 1s}, cost: 2}\n",
    ),
    (
        "resource keyed by client_ip",
        "resources:\n  r: {kind: rate, max: 1, per: 1s, key: [client_ip]}\n",
    ),
    (
        "resource named _unconfigured",
        "resources:\n  _unconfigured: {kind: rate, max: 1, per: 1s}\n",
    ),
    (
        "redis urls without cluster",
        "stores:\n  s: {urls: [\"redis://127.0.0.1:1\"]}\n",
    ),
    ("redis url and urls", "stores:\n  s: {url: \"redis://a:1\", urls: [\"redis://a:1\"], cluster: true}\n"),
    ("not a redis url", "stores:\n  s: {url: \"http://a:1\"}\n"),
    ("redis store without url", "stores:\n  s: {timeout: 5ms}\n"),
    ("unknown local store key", "stores:\n  local: {snapshot: a.snap, every: 1s, evry: 1s}\n"),
    ("segment without of", "segments:\n  s: {file: a.roaring}\n"),
    ("segment of server_ip", "segments:\n  s: {file: a.roaring, of: server_ip}\n"),
];

#[test]
fn known_bad_configs_are_refused_by_the_schema_and_the_reader() {
    let v = validator();
    let path = Path::new("t.yaml");
    for (what, head) in BAD {
        let text = if head.starts_with("origins:") {
            head.to_string()
        } else {
            format!("{head}{ORIGIN}")
        };
        assert!(
            reader_accepts(&text, path).is_err(),
            "the reader takes `{what}`:\n{text}"
        );
        assert!(
            !schema_errors(&v, &text).is_empty(),
            "the schema takes `{what}`:\n{text}"
        );
    }
    for (what, text) in [
        ("no origins", "server: {}\n"),
        ("origin without upstreams", "origins:\n  a: {hosts: [a.test]}\n"),
        ("origin named _api", "origins:\n  _api: {hosts: [a.test], upstreams: [\"127.0.0.1:1\"]}\n"),
        ("unmatched with hosts", "defaults:\n  unmatched: {hosts: [b.test], upstreams: [\"127.0.0.1:1\"]}\norigins:\n  a: {hosts: [a.test], upstreams: [\"127.0.0.1:1\"]}\n"),
    ] {
        assert!(reader_accepts(text, path).is_err(), "the reader takes `{what}`");
        assert!(!schema_errors(&v, text).is_empty(), "the schema takes `{what}`");
    }
}

/// A minimal valid limit of `kind`, as YAML flow-mapping entries (one key, so that a large
/// bound stays within the memory budget).
fn minimal_limit(kind: &str) -> &'static str {
    match kind {
        "inflight" => "max: 1",
        "concurrency" => "max: 1, max_keys: 1",
        "rate" => "max: 1, per: 1s, max_keys: 1",
        "token_bucket" => "capacity: 10, refill: {amount: 1, every: 1s}, max_keys: 1",
        "tiered" => "tiers: [{limit: 1, window: 1s, active: 1s}], max_keys: 1",
        "sliding_log" => "windows: [{max: 1, per: 1s}], max_keys: 1",
        other => panic!("no minimal limit for kind {other}"),
    }
}

/// Every integer bound the schema states at a place where one value can be written alone
/// (server, api, a Redis store and its breaker, a default limit's fields and sketch) is
/// the reader's: the bound itself is accepted by both, one beyond it refused by both.
#[test]
fn numeric_bounds_agree_with_the_reader() {
    let v = validator();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{ROOT}/conf/tollgate.schema.json")).unwrap(),
    )
    .unwrap();
    let kinds: Vec<String> = schema["$defs"]["default_limit"]["allOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            rule["if"]["properties"]["kind"]["const"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    // A kind taking `field`, from the schema's own per-kind rules.
    let kind_for = |field: &str| -> String {
        let rules = schema["$defs"]["default_limit"]["allOf"]
            .as_array()
            .unwrap();
        kinds
            .iter()
            .zip(rules)
            .find(|(_, rule)| {
                rule["then"]["propertyNames"]["enum"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f == field)
            })
            .map(|(k, _)| k.clone())
            .unwrap()
    };
    type Wrap<'a> = Box<dyn Fn(&str, &str) -> String + 'a>;
    let places: Vec<(&str, Wrap)> = vec![
        (
            "/properties/server/properties",
            Box::new(|k, n| format!("server:\n  {k}: {n}\n")),
        ),
        (
            "/properties/api/properties",
            Box::new(|k, n| format!("api:\n  {k}: {n}\n")),
        ),
        (
            "/properties/stores/additionalProperties/properties",
            Box::new(|k, n| format!("stores:\n  s: {{url: \"redis://127.0.0.1:1\", {k}: {n}}}\n")),
        ),
        (
            "/properties/stores/additionalProperties/properties/breaker/properties",
            Box::new(|k, n| {
                format!("stores:\n  s: {{url: \"redis://127.0.0.1:1\", breaker: {{{k}: {n}}}}}\n")
            }),
        ),
        (
            "/$defs/default_limit/properties",
            Box::new(|k, n| {
                let kind = kind_for(k);
                let base = minimal_limit(&kind);
                // The field replaces the minimal limit's own value of it.
                let kind_field = format!("kind: {kind}");
                let field = format!("{k}: {n}");
                let fields: Vec<&str> = std::iter::once(kind_field.as_str())
                    .chain(
                        base.split(", ")
                            .filter(|f| !f.starts_with(&format!("{k}:"))),
                    )
                    .chain(std::iter::once(field.as_str()))
                    .collect();
                format!("defaults:\n  limits:\n    l: {{{}}}\n", fields.join(", "))
            }),
        ),
        (
            "/$defs/default_limit/properties/sketch/properties",
            // The other dimension at its least: the reader also bounds hashes × slots,
            // which the schema cannot state.
            Box::new(|k, n| {
                let other = if k == "slots" {
                    "hashes: 1"
                } else {
                    "slots: 16"
                };
                format!("defaults:\n  limits:\n    l: {{kind: inflight, max: 1, sketch: {{{other}, {k}: {n}}}}}\n")
            }),
        ),
    ];
    let path = Path::new("t.yaml");
    let mut checked = 0;
    for (pointer, wrap) in &places {
        let props = schema.pointer(pointer).unwrap().as_object().unwrap();
        for (key, prop) in props {
            if prop["type"] != "integer" {
                continue;
            }
            let mut cases = Vec::new();
            if let Some(lo) = prop["minimum"].as_u64() {
                cases.push((lo.to_string(), true));
                cases.push((format!("{}", i128::from(lo) - 1), false));
            }
            if let Some(hi) = prop["maximum"].as_u64() {
                cases.push((hi.to_string(), true));
                cases.push(((u128::from(hi) + 1).to_string(), false));
            }
            for (value, ok) in cases {
                let text = format!("{}{ORIGIN}", wrap(key, &value));
                let reader = reader_accepts(&text, path);
                let errors = schema_errors(&v, &text);
                assert_eq!(
                    reader.is_ok(),
                    ok,
                    "reader on {key}: {value}: {reader:?}\n{text}"
                );
                assert_eq!(
                    errors.is_empty(),
                    ok,
                    "schema on {key}: {value}: {errors:?}\n{text}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "only {checked} bounds checked");
}
