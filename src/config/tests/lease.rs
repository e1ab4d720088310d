//! `lease:` on limits: `auto` by default on a Redis store for the kinds that lease, `off`,
//! or its settings; refused, with file:line:column, on a local limit and on the kinds that
//! stay exact; shown by `check --print-effective`, which parses back to the same model.

use crate::config::effective::printed_back;
use crate::config::parse_str;
use crate::limits::lease::{LeaseParams, PPM};

const MS: u64 = 1_000_000;

fn config(limit: &str, store: bool) -> String {
    let store_line = if store { "        store: shared\n" } else { "" };
    format!(
        "stores:\n  shared: {{ kind: redis, url: \"redis://127.0.0.1:1/0\" }}\norigins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n    limits:\n      l:\n{limit}{store_line}"
    )
}

const BUCKET: &str =
    "        kind: token_bucket\n        capacity: 3\n        refill: { amount: 1, every: 1s }\n";
const RATE: &str = "        kind: rate\n        max: 3\n        per: 1s\n";
const INFLIGHT: &str = "        kind: inflight\n        max: 3\n";
const CONCURRENCY: &str = "        kind: concurrency\n        key: [customer]\n        max: 3\n";
const LOG: &str =
    "        kind: sliding_log\n        key: [customer]\n        windows: [{ max: 3, per: 1d }]\n";
const TIERED: &str = "        kind: tiered\n        key: [customer]\n        tiers: [{ limit: 3, window: 1s, active: 1m, cooldown: 0s }]\n";

fn lease_of(text: &str) -> Option<LeaseParams> {
    let parsed = parse_str(text, "t.yaml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    parsed.config.origins[0].limits[0].lease
}

fn error_of(text: &str) -> String {
    parse_str(text, "t.yaml").unwrap_err().to_string()
}

#[test]
fn auto_is_the_default_on_a_redis_store_for_the_kinds_that_lease() {
    for kind in [BUCKET, RATE, INFLIGHT, CONCURRENCY] {
        assert_eq!(
            lease_of(&config(kind, true)),
            Some(LeaseParams::default()),
            "{kind}"
        );
        assert_eq!(lease_of(&config(kind, false)), None, "local: {kind}");
        let auto = format!("{kind}        lease: auto\n");
        assert_eq!(lease_of(&config(&auto, true)), Some(LeaseParams::default()));
        let off = format!("{kind}        lease: off\n");
        assert_eq!(lease_of(&config(&off, true)), None, "off: {kind}");
    }
    for kind in [LOG, TIERED] {
        assert_eq!(lease_of(&config(kind, true)), None, "stays exact: {kind}");
    }
    assert_eq!(
        LeaseParams::default(),
        LeaseParams {
            hot_above: 20,
            max_share: PPM / 100,
            renew_every: 100 * MS,
            idle: 2_000 * MS
        }
    );
}

#[test]
fn settings_are_read_and_the_others_keep_their_defaults() {
    let limit = format!(
        "{BUCKET}        lease: {{ hot_above: 50/s, max_share: 2.5%, renew_every: 250ms, idle: 5s }}\n"
    );
    assert_eq!(
        lease_of(&config(&limit, true)),
        Some(LeaseParams {
            hot_above: 50,
            max_share: 25_000,
            renew_every: 250 * MS,
            idle: 5_000 * MS
        })
    );
    let limit = format!("{RATE}        lease: {{ hot_above: 7 }}\n");
    assert_eq!(
        lease_of(&config(&limit, true)),
        Some(LeaseParams {
            hot_above: 7,
            ..LeaseParams::default()
        })
    );
}

#[test]
fn a_lease_on_a_local_limit_or_an_exact_kind_is_refused_where_it_is_written() {
    let text = config(&format!("{BUCKET}        lease: auto\n"), false);
    assert_eq!(
        error_of(&text),
        "t.yaml:12:16: origins.a.limits.l.lease: `lease` needs a Redis store (`store: NAME`): a local limit decides in process, with no call to save"
    );
    let text = config(&format!("{LOG}        lease: off\n"), true);
    assert!(
        error_of(&text).starts_with(
            "t.yaml:12:9: origins.a.limits.l.lease: `lease` is not a field of kind `sliding_log`: sliding logs and tiers stay exact"
        ),
        "{}",
        error_of(&text)
    );
    let text = config(&format!("{TIERED}        lease: auto\n"), true);
    assert!(
        error_of(&text).contains("`lease` is not a field of kind `tiered`"),
        "{}",
        error_of(&text)
    );
    // Not in an override either: one lease per limit.
    let text = config(
        &format!("{RATE}        overrides:\n          - match: {{customer: a}}\n            lease: off\n"),
        true,
    );
    assert!(
        error_of(&text).contains("overrides[0].lease"),
        "{}",
        error_of(&text)
    );
}

#[test]
fn bad_settings_name_their_field() {
    for (setting, column, message) in [
        ("lease: sometimes", 16, "unknown `lease` value `sometimes`"),
        (
            "lease: { hot_above: fast }",
            29,
            "`fast` is not a rate; write decisions per second, e.g. `20/s`",
        ),
        (
            "lease: { hot_above: 0/s }",
            29,
            "must be between 1/s and 4294967296/s, found `0/s`",
        ),
        (
            "lease: { max_share: 1 }",
            29,
            "`1` is not a share; write a percentage, e.g. `1%`",
        ),
        (
            "lease: { max_share: 150% }",
            29,
            "must be a percentage above 0% and at most 100%, found `150%`",
        ),
        (
            "lease: { max_share: 0% }",
            29,
            "must be a percentage above 0% and at most 100%",
        ),
        (
            "lease: { renew_every: 0s }",
            31,
            "duration `0s` is out of range: must be between 1ms and 1m",
        ),
        ("lease: { idle: 2 }", 24, "durations need a unit"),
        ("lease: { idl: 2s }", 18, "unknown key `idl`"),
    ] {
        let text = config(&format!("{BUCKET}        {setting}\n"), true);
        let err = error_of(&text);
        let field = if setting.contains("idl:") {
            "lease.idl"
        } else if setting.contains('{') {
            &format!("lease.{}", setting.split(['{', ':']).nth(2).unwrap().trim())
        } else {
            "lease"
        };
        assert!(
            err.starts_with(&format!("t.yaml:12:{column}: origins.a.limits.l.{field}: "))
                && err.contains(message),
            "{setting}: {err}"
        );
    }
}

#[test]
fn print_effective_shows_the_lease_and_parses_back() {
    let text = format!(
        "stores:\n  shared: {{ kind: redis, url: \"redis://127.0.0.1:1/0\" }}\norigins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n    limits:\n      auto:\n{BUCKET}        store: shared\n      off:\n{RATE}        store: shared\n        lease: off\n      set:\n{INFLIGHT}        store: shared\n        lease: {{ hot_above: 50/s, max_share: 0.5%, renew_every: 250ms, idle: 5s }}\n      local:\n{RATE}      exact:\n{LOG}        store: shared\n"
    );
    let config = parse_str(&text, "t.yaml").unwrap().config;
    let yaml = printed_back(&config);
    assert!(
        yaml.contains("lease:\n          hot_above: 20/s\n          max_share: 1%\n          renew_every: 100ms\n          idle: 2s\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("lease: 'off'") || yaml.contains("lease: off"),
        "{yaml}"
    );
    assert!(yaml.contains("max_share: 0.5%"), "{yaml}");
    assert_eq!(
        yaml.matches("\n        lease:").count(),
        3,
        "not on the local or exact limits: {yaml}"
    );
}

#[test]
fn a_lease_on_a_concurrency_limit_with_global_or_groups_is_refused_and_auto_skips_it() {
    let error =
        "origins.a.limits.l.lease: `lease` needs a concurrency limit without `global` or `groups`";
    let global = format!("{CONCURRENCY}        global: 10\n");
    let groups = format!(
        "{CONCURRENCY}        groups: [{{ name: g, members: {{ customer: [x] }}, max: 2 }}]\n"
    );
    for base in [&global, &groups] {
        let text = config(&format!("{base}        lease: auto\n"), true);
        assert!(error_of(&text).contains(error), "{}", error_of(&text));
        // Off is what such a limit does anyway, and what it defaults to.
        let text = config(&format!("{base}        lease: off\n"), true);
        assert_eq!(lease_of(&text), None);
        let text = config(base, true);
        assert_eq!(lease_of(&text), None);
    }
    // Without them it leases.
    let text = config(&format!("{CONCURRENCY}        lease: auto\n"), true);
    assert_eq!(lease_of(&text), Some(LeaseParams::default()));
}
