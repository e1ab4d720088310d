//! Suspicious but valid configs: accepted, with a located warning each.

use crate::config::parse_str;

macro_rules! base {
    () => {
        "origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n"
    };
}

/// Every warning for `text`, rendered; panics when the config is refused.
fn warnings(text: &str) -> Vec<String> {
    match parse_str(text, "w.yaml") {
        Ok(loaded) => loaded.warnings.iter().map(|d| d.to_string()).collect(),
        Err(e) => panic!("refused: {e}"),
    }
}

const CASES: &[(&str, &str, &[&str])] = &[
    (
        "override raises a rate max",
        concat!(
            base!(),
            "    limits:\n      l:\n        kind: rate\n        max: 100\n        per: 1s\n",
            "        overrides:\n          - match: {customer: big}\n            max: 600\n"
        ),
        &["w.yaml:12:18: origins.a.limits.l.overrides[0].max: warning: override max 600 is above the limit's max 100; it raises the limit for matching requests"],
    ),
    (
        "override raises an inflight max, lowering is fine",
        concat!(
            base!(),
            "    limits:\n      l:\n        kind: inflight\n        max: 10\n        overrides:\n",
            "          - {match: {customer: small}, max: 0}\n          - {match: {customer: big}, max: 11}\n"
        ),
        &[
            "w.yaml:11:43: origins.a.limits.l.overrides[1].max: warning: override max 11 is above the limit's max 10; it raises the limit for matching requests",
        ],
    ),
    (
        "bucket never fills within a day",
        concat!(
            base!(),
            "    limits:\n      l:\n        kind: token_bucket\n        capacity: 100000\n",
            "        refill: {amount: 1, every: 1s}\n"
        ),
        &["w.yaml:9:9: origins.a.limits.l.refill: warning: refilling 1 every 1s takes 1day 3h 46m 40s to fill capacity 100000; an emptied bucket will not recover within a day"],
    ),
    (
        "override bucket never fills, and raises capacity",
        concat!(
            base!(),
            "    limits:\n      l:\n        kind: token_bucket\n        capacity: 10\n",
            "        refill: {amount: 1, every: 1s}\n        overrides:\n",
            "          - match: {customer: big}\n            capacity: 200000\n"
        ),
        &[
            "w.yaml:11:13: origins.a.limits.l.overrides[0]: warning: refilling 1 every 1s takes 2days 7h 33m 20s to fill capacity 200000; an emptied bucket will not recover within a day",
            "w.yaml:12:23: origins.a.limits.l.overrides[0].capacity: warning: override capacity 200000 is above the limit's capacity 10; it raises the limit for matching requests",
        ],
    ),
    (
        "sni without tls",
        concat!(base!(), "    sni: a.test\n"),
        &["w.yaml:5:10: origins.a.sni: warning: `sni` has no effect without `tls: true`"],
    ),
    (
        "a default's warning is shown once for two origins",
        concat!(
            "defaults:\n  limits:\n    d:\n      kind: inflight\n      max: 1\n",
            "      overrides: [{match: {customer: x}, max: 2}]\n",
            base!(),
            "  b:\n    hosts: [b.test]\n    upstreams: [\"127.0.0.1:2\"]\n"
        ),
        &[
            "w.yaml:5:12: defaults.limits.d.max: warning: a sketch of 4 × 8192 with max 1 may wrongly reject up to 6.2% of new keys when 4096 requests are in flight (a key is rejected when each row's slot already holds 1 of other keys); raise `sketch.slots` to 16384 or more",
            "w.yaml:6:47: defaults.limits.d.overrides[0].max: warning: override max 2 is above the limit's max 1; it raises the limit for matching requests",
        ],
    ),
    (
        "a customer-keyed limit applies with the origin's name as the customer",
        concat!(
            base!(),
            "    limits:\n      per_customer: {kind: rate, key: [customer, path], max: 5, per: 1s}\n"
        ),
        &[],
    ),
    (
        "a customer header is enough",
        concat!(
            "server:\n  customer_header: x-customer-id\n",
            base!(),
            "    limits:\n      l: {kind: inflight, max: 5}\n"
        ),
        &[],
    ),
    (
        "a rate limit's sketch is ignored",
        concat!(
            base!(),
            "    limits:\n      l:\n        kind: rate\n        max: 100\n        per: 1m\n",
            "        sketch: {hashes: 4, slots: 8192}\n"
        ),
        &["w.yaml:10:9: origins.a.limits.l.sketch: warning: rate limits are exact per key; `sketch` is ignored, size the table with `max_keys`"],
    ),
    (
        "a default rate limit's sketch is warned once for two origins",
        concat!(
            "defaults:\n  limits:\n    d: {kind: rate, max: 1, per: 1s, sketch: {slots: 64}}\n",
            base!(),
            "  b:\n    hosts: [b.test]\n    upstreams: [\"127.0.0.1:2\"]\n"
        ),
        &["w.yaml:3:38: defaults.limits.d.sketch: warning: rate limits are exact per key; `sketch` is ignored, size the table with `max_keys`"],
    ),
    (
        "an inflight max of 1 saturates the default sketch",
        concat!(base!(), "    limits:\n      l: {kind: inflight, max: 1}\n"),
        &["w.yaml:6:32: origins.a.limits.l.max: warning: a sketch of 4 × 8192 with max 1 may wrongly reject up to 6.2% of new keys when 4096 requests are in flight (a key is rejected when each row's slot already holds 1 of other keys); raise `sketch.slots` to 16384 or more"],
    ),
    (
        "a connection cap of 1000 lets max 1 fit the default sketch",
        concat!(
            "server:\n  max_connections: 1000\n",
            base!(),
            "    limits:\n      l: {kind: inflight, max: 1}\n"
        ),
        &[],
    ),
    (
        "a connection cap of 20000 makes max 4 saturate the default sketch",
        concat!(
            "server:\n  max_connections: 20000\n",
            base!(),
            "    limits:\n      l: {kind: inflight, max: 4}\n"
        ),
        &["w.yaml:8:32: origins.a.limits.l.max: warning: a sketch of 4 × 8192 with max 4 may wrongly reject up to 13.9% of new keys when `server.max_connections` (20000) requests are in flight (a key is rejected when each row's slot already holds 4 of other keys); raise `sketch.slots` to 16384 or more"],
    ),
    (
        "a small sketch is warned at its slots",
        concat!(
            base!(),
            "    limits:\n      l:\n        kind: inflight\n        max: 10\n",
            "        sketch: {hashes: 2, slots: 1024}\n"
        ),
        &["w.yaml:9:36: origins.a.limits.l.sketch.slots: warning: a sketch of 2 × 1024 with max 10 may wrongly reject up to 16.0% of new keys when 4096 requests are in flight (a key is rejected when each row's slot already holds 10 of other keys); raise `sketch.slots` to 4096 or more"],
    ),
    (
        "an inflight max of 2 fits the default sketch",
        concat!(base!(), "    limits:\n      l: {kind: inflight, max: 2}\n"),
        &[],
    ),
    (
        "a concurrency max and a group max above global are lowered to it",
        concat!(
            base!(),
            "    limits:\n      l:\n        kind: concurrency\n        max: 50\n        global: 20\n",
            "        groups:\n          - {name: big, members: {customer: [a]}, max: 30}\n",
            "          - {name: small, members: {customer: [b]}, max: 20}\n",
            "        overrides:\n          - {match: {customer: c}, max: 40}\n",
            "          - {match: {customer: d}, max: 0}\n"
        ),
        &[
            "w.yaml:8:14: origins.a.limits.l.max: warning: max 50 is above global 20: lowered to 20, as all keys together hold at most 20 copies",
            "w.yaml:11:56: origins.a.limits.l.groups[0].max: warning: group `big` max 30 is above global 20: lowered to 20, as all keys together hold at most 20 copies",
            "w.yaml:14:41: origins.a.limits.l.overrides[0].max: warning: max 40 is above global 20: lowered to 20, as all keys together hold at most 20 copies",
        ],
    ),
    (
        "a concurrency resource's max above global is lowered to it",
        concat!(
            base!(),
            "resources:\n  r:\n    kind: concurrency\n    max: 9\n    global: 4\n",
            "    groups: [{name: g, members: {customer: [a]}, max: 5}]\n"
        ),
        &[
            "w.yaml:8:10: resources.r.max: warning: max 9 is above global 4: lowered to 4, as all keys together hold at most 4 copies",
            "w.yaml:10:55: resources.r.groups[0].max: warning: group `g` max 5 is above global 4: lowered to 4, as all keys together hold at most 4 copies",
        ],
    ),
    (
        "tiers: a zero active time is removed, a partial last window trimmed, a long window shortened silently",
        concat!(
            base!(),
            "    limits:\n      l:\n        kind: tiered\n        tiers:\n",
            "          - {limit: 5, window: 1m, active: 0s}\n",
            "          - {limit: 3, window: 1m, active: 150s}\n",
            "          - {limit: 2, window: 10m, active: 5m}\n"
        ),
        &[
            "w.yaml:9:11: origins.a.limits.l.tiers: warning: tier 1 has zero active time, so it could never be entered: removed",
            "w.yaml:9:11: origins.a.limits.l.tiers: warning: tier 2: active time 2m 30s is not a multiple of the window, trimmed to 2m (a partial last window would let a customer over the limit)",
        ],
    ),
    ("no warnings", base!(), &[]),
];

#[test]
fn warnings_are_located() {
    for (name, text, expected) in CASES {
        assert_eq!(warnings(text), *expected, "{name}");
    }
}

#[test]
fn an_origin_raising_a_default_capacity_is_warned_at_its_own_line() {
    let text = concat!(
        "defaults:\n  limits:\n    d: {kind: token_bucket, capacity: 10, refill: {amount: 1, every: 1s}}\n",
        base!(),
        "    limits:\n      d: {capacity: 100000}\n"
    );
    assert_eq!(
        warnings(text),
        ["w.yaml:9:21: origins.a.limits.d.capacity: warning: refilling 1 every 1s takes 1day 3h 46m 40s to fill capacity 100000; an emptied bucket will not recover within a day"]
    );
}

#[test]
fn a_lowered_concurrency_max_is_what_the_limit_and_its_overrides_get() {
    use crate::config::model::LimitParams;
    let text = concat!(
        base!(),
        "    limits:\n      l:\n        kind: concurrency\n        max: 50\n        global: 20\n",
        "        groups:\n          - {name: big, members: {customer: [a]}, max: 30}\n",
        "          - {name: small, members: {customer: [b]}, max: 5}\n",
        "        overrides: [{match: {customer: c}, max: 40}]\n"
    );
    let loaded = parse_str(text, "w.yaml").unwrap();
    let limit = &loaded.config.origins[0].limits[0];
    let maxes = |p: &LimitParams| match p {
        LimitParams::Concurrency { max, groups, .. } => {
            (*max, groups.iter().map(|g| g.max).collect::<Vec<_>>())
        }
        other => panic!("not concurrency: {other:?}"),
    };
    assert_eq!(maxes(&limit.params), (20, vec![20, 5]));
    assert_eq!(maxes(&limit.overrides[0].params), (20, vec![20, 5]));
}

#[test]
fn warned_tiers_run_as_the_warnings_say() {
    use crate::config::model::LimitParams;
    let text = concat!(
        base!(),
        "    limits:\n      l:\n        kind: tiered\n        tiers:\n",
        "          - {limit: 5, window: 1m, active: 0s}\n",
        "          - {limit: 3, window: 1m, active: 150s}\n",
        "          - {limit: 2, window: 10m, active: 5m}\n"
    );
    let loaded = parse_str(text, "w.yaml").unwrap();
    let LimitParams::Tiered { tiered, .. } = &loaded.config.origins[0].limits[0].params else {
        panic!("not tiered");
    };
    let s = 1_000_000_000;
    let tiers: Vec<(u64, u64, u64)> = tiered
        .tiers
        .iter()
        .map(|t| (t.limit, t.window, t.active))
        .collect();
    // Tier 1 is gone; tier 2 runs two whole windows; tier 3's window is its active time.
    assert_eq!(tiers, [(3, 60 * s, 120 * s), (2, 300 * s, 300 * s)]);
}
