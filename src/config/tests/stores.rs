//! `store:` on every kind: each stateful kind may keep its state in a named Redis store,
//! and the name must be one of `stores:` (or `local`).

use crate::config::{parse_str, LimitParams};

fn with(limit: &str, stores: bool) -> String {
    let stores = if stores {
        "stores:\n  shared: { kind: redis, url: \"redis://127.0.0.1:1/0\" }\n"
    } else {
        ""
    };
    format!(
        "{stores}origins:\n  a:\n    hosts: [a.test]\n    upstreams: [\"127.0.0.1:1\"]\n    limits:\n      l:\n{limit}        store: shared\n"
    )
}

const KINDS: [&str; 6] = [
    "        kind: tiered\n        key: [customer]\n        global_limit: 10\n        tiers: [{ limit: 3, window: 1s, active: 1m, cooldown: 0s }]\n",
    "        kind: concurrency\n        key: [customer]\n        max: 2\n        global: 5\n        groups: [{ name: g, members: { customer: [a] }, max: 1 }]\n",
    "        kind: sliding_log\n        key: [customer]\n        windows: [{ max: 3, per: 1d }, { max: 10, per: 7d }]\n",
    "        kind: token_bucket\n        key: [customer]\n        capacity: 3\n        refill: { amount: 1, every: 1s }\n",
    "        kind: rate\n        key: [customer]\n        max: 3\n        per: 1s\n",
    "        kind: inflight\n        key: [customer]\n        max: 3\n",
];

#[test]
fn every_kind_may_name_a_shared_store() {
    for limit in KINDS {
        let parsed = parse_str(&with(limit, true), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let l = &parsed.config.origins[0].limits[0];
        assert_eq!(l.store.as_deref(), Some("shared"), "{limit}");
        if let LimitParams::Tiered { tiered, .. } = &l.params {
            assert_eq!(tiered.global_limit, Some(10));
        }
    }
}

#[test]
fn an_unknown_store_is_an_error_for_every_kind() {
    for limit in KINDS {
        let err = parse_str(&with(limit, false), "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("origins.a.limits.l.store: unknown store `shared`"),
            "{limit}: {err}"
        );
    }
}
