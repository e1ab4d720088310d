//! Charon's semantics through the limiter API, the same on both stores: every resource is
//! configured twice, in-process (`NAME`) and in a real `redis-server` (`NAME_s`), and
//! asked the same questions by redis-py (Debian's python3-redis, which scripts/deps.sh
//! installs), a client the project did not write.
//!
//! - A release the caller saw acknowledged is seen by its next reserve, one after the
//!   other and pipelined.
//! - A tiered reply carries the same fields on both stores (`tier`, `tier_limit`,
//!   `hard_limit`, `global_limit`, `decided_by`), and `limit` is the current tier's.
//! - A refused request changes nothing: a bulk request refused does not move the domain
//!   into higher tiers.
//! - A request that can never succeed is told `retry_after_ms: -1`; a grant cut by the
//!   hard limit says `decided_by: hard_limit`.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::redis as harness;

use std::net::TcpStream;
use std::process::Command;

use common::{eventually, free_port, Tollgate, Upstream, SERVER};
use harness::RedisServer;
use serde_json::{json, Value};

/// Tiers of 2 then 3 a minute, active 10 minutes; a hard limit of 3 a second.
const SEARCH: &str = "kind: tiered, hard_limit: 3, global_limit: 1000, tiers: [{ limit: 2, window: 1m, active: 10m, cooldown: 0s }, { limit: 3, window: 1m, active: 10m, cooldown: 0s }]";
/// The same tiers without a hard limit: 5 grants for a fresh domain.
const LADDER: &str = "kind: tiered, tiers: [{ limit: 2, window: 1m, active: 10m, cooldown: 0s }, { limit: 3, window: 1m, active: 10m, cooldown: 0s }]";
/// Three a day.
const CAPS: &str = "kind: sliding_log, windows: [{ max: 3, per: 1d }]";
/// One copy per domain, a blacklist group of max 0.
const SLOTS: &str = "kind: concurrency, max: 1, groups: [{ name: banned, members: { customer: [mallory] }, max: 0 }]";

/// A tollgate whose limiter API has every resource above twice: in-process and in the
/// store `shared` at `redis` (suffix `_s`).
struct Api {
    _t: Tollgate,
    _up: Upstream,
    port: u16,
}

async fn api(redis: &RedisServer) -> Api {
    let up = Upstream::start("127.0.0.1", "up").await;
    let port = free_port();
    let mut resources = String::from("resources:\n");
    for (name, spec) in [
        ("search", SEARCH),
        ("ladder", LADDER),
        ("caps", CAPS),
        ("slots", SLOTS),
    ] {
        resources.push_str(&format!("  {name}: {{ {spec} }}\n"));
        resources.push_str(&format!("  {name}_s: {{ {spec}, store: shared }}\n"));
    }
    let config = format!(
        "{SERVER}  limiter_api: \"127.0.0.1:{port}\"\nstores:\n  shared: {{ kind: redis, url: \"{}\", timeout: 1s, breaker: {{ failures: 1000, probe_every: 50ms }} }}\norigins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"{}\"]\n{resources}",
        redis.url(),
        up.addr
    );
    let t = Tollgate::start(&config).await;
    eventually("the limiter API answers", 250, || async {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    t.wait_metric("tollgate_store_up{store=\"shared\"}", 1.0)
        .await;
    Api {
        _t: t,
        _up: up,
        port,
    }
}

/// What every script starts with: a redis-py connection to the API (`r`) and `ch(...)`,
/// which runs a command and returns its reply as a dict (RESP2 field/value pairs).
const PRELUDE: &str = r#"
import json, sys
import redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]), decode_responses=True)
def fields(reply):
    return dict(zip(reply[::2], reply[1::2]))
def ch(*args):
    return fields(r.execute_command(*args))
"#;

/// Runs `code` (after [`PRELUDE`]) with `/usr/bin/python3` against the API; returns the
/// JSON it printed last.
fn python(port: u16, code: &str) -> Value {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(format!("{PRELUDE}\n{code}"))
        .arg(port.to_string())
        .output()
        .expect("/usr/bin/python3 with redis-py (scripts/deps.sh installs python3-redis)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("JSON from python ({e}): {text}"))
}

/// Reserves and releases one copy, `n` times one after the other and `n` times pipelined
/// (a batch of reserve, release, reserve, release...), on one connection; returns the
/// refused reserves of each way, with a refusal's reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_caller_saw_is_seen_by_its_next_reserve() {
    let redis = RedisServer::start();
    let a = api(&redis).await;
    for resource in ["slots", "slots_s"] {
        let out = python(
            a.port,
            &format!(
                r#"
n = 1000
refused, first = 0, None
for i in range(n):
    got = ch("CH.RESERVE", "{resource}", "acme", 1)
    if got["granted"] != 1:
        refused += 1
        first = first or got
        continue
    ch("CH.RELEASE", "{resource}", "acme", 1)
piped = 0
for batch in range(n // 100):
    p = r.pipeline(transaction=False)
    for i in range(100):
        p.execute_command("CH.RESERVE", "{resource}", "acme", 1)
        p.execute_command("CH.RELEASE", "{resource}", "acme", 1)
    for reply in p.execute(raise_on_error=False):
        if isinstance(reply, list) and "granted" in reply and fields(reply)["granted"] != 1:
            piped += 1
            first = first or fields(reply)
print(json.dumps({{"refused": refused, "piped": piped, "first": first}}))
"#
            ),
        );
        assert_eq!(
            out,
            json!({"refused": 0, "piped": 0, "first": null}),
            "{resource}"
        );
    }
}

/// The replies of `code`'s requests on `name` and `name_s`, as two JSON values.
fn both(port: u16, name: &str, code: &str) -> (Value, Value) {
    let run = |resource: String| python(port, &format!("RES = {resource:?}\n{code}"));
    (run(name.to_string()), run(format!("{name}_s")))
}

/// The fields that must agree between the two stores (`source` says which store it was;
/// `reset_after_ms` depends on when each ran).
fn comparable(mut v: Value) -> Value {
    for reply in v.as_array_mut().into_iter().flatten() {
        if let Some(map) = reply.as_object_mut() {
            map.remove("source");
            map.remove("reset_after_ms");
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_replies_carry_the_same_fields_on_both_stores() {
    let redis = RedisServer::start();
    let a = api(&redis).await;
    // Two in tier 1, then a burst into tier 2 (3 a minute); the hard limit (3 a second)
    // is not reached.
    let code = r#"print(json.dumps([ch("CH.REQUEST", RES, "dom", 1) for _ in range(3)]))"#;
    let (local, store) = both(a.port, "search", code);
    for replies in [&local, &store] {
        let last = &replies[2];
        assert_eq!(last["tier"], 2, "{replies}");
        assert_eq!(last["limit"], 3, "tier 2's limit: {replies}");
        assert_eq!(last["tier_limit"], 3, "{replies}");
        assert_eq!(last["hard_limit"], 3, "{replies}");
        assert_eq!(last["global_limit"], 1000, "{replies}");
        assert_eq!(last["decided_by"], "tier", "{replies}");
    }
    assert_eq!(store[0]["source"], "store");
    assert_eq!(comparable(local), comparable(store));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bulk_request_moves_no_domain_into_higher_tiers() {
    let redis = RedisServer::start();
    let a = api(&redis).await;
    let code = r#"
bulk = ch("CH.REQUEST", RES, "bulky", 9, "MIN", 9)
after = sum(ch("CH.REQUEST", RES, "bulky", 1)["granted"] for _ in range(8))
fresh = sum(ch("CH.REQUEST", RES, "fresh", 1)["granted"] for _ in range(8))
print(json.dumps({"bulk": bulk["granted"], "tier": bulk.get("tier"), "after": after, "fresh": fresh}))
"#;
    let (local, store) = both(a.port, "ladder", code);
    for out in [local, store] {
        assert_eq!(
            out,
            json!({"bulk": 0, "tier": 0, "after": 5, "fresh": 5}),
            "a refusal changes nothing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_can_never_succeed_is_never_retried_and_the_hard_limit_says_so() {
    let redis = RedisServer::start();
    let a = api(&redis).await;
    let code = r#"
never = ch("CH.REQUEST", RES, "never", 4, "MIN", 4)
cut = ch("CH.REQUEST", RES, "cut", 9, "MIN", 1)
print(json.dumps({
    "never": [never["granted"], never["retry_after_ms"], never.get("decided_by")],
    "cut": [cut["granted"], cut.get("decided_by")],
}))
"#;
    let (local, store) = both(a.port, "search", code);
    for out in [local, store] {
        assert_eq!(
            out,
            json!({"never": [0, -1, "hard_limit"], "cut": [3, "hard_limit"]}),
            "MIN 4 above the hard limit of 3 can never pass; 9 cut to 3 by it"
        );
    }
    let code = r#"
capped = ch("CH.REQUEST", RES, "big", 4, "MIN", 4)
print(json.dumps([capped["granted"], capped["retry_after_ms"]]))
"#;
    let (local, store) = both(a.port, "caps", code);
    for out in [local, store] {
        assert_eq!(out, json!([0, -1]), "4 never fit in a window of 3");
    }
    let code = r#"
banned = ch("CH.RESERVE", RES, "mallory", 1)
print(json.dumps([banned["granted"], banned["retry_after_ms"], banned["limited_by"]]))
"#;
    let (local, store) = both(a.port, "slots", code);
    for out in [local, store] {
        assert_eq!(
            out,
            json!([0, -1, "group:banned"]),
            "a group of max 0 blocks"
        );
    }
}
