//! Charon's operations through the real binary: `resources:` in the config, the `CH.*`
//! commands from real clients (the `redis` crate in RESP2 and RESP3, Debian's `redis-cli`),
//! holds that belong to connections, transfers, the kill switch, unconfigured resources,
//! reloads, and the metrics they leave.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{eventually, free_port, Tollgate, Upstream, SERVER};
use redis::Value;

/// A tollgate with the limiter API on, and its API port.
struct Api {
    t: Tollgate,
    port: u16,
    up: Upstream,
}

/// The config: the common server section with the API at `{api}`, `server_extra` (indented
/// server keys), one origin, and `tail` (top-level sections: api, resources, stores).
fn config(api: u16, up: &Upstream, server_extra: &str, tail: &str) -> String {
    format!(
        "{SERVER}  limiter_api: \"127.0.0.1:{api}\"\n{server_extra}origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"{}\"]\n{tail}",
        up.addr
    )
}

impl Api {
    async fn start(server_extra: &str, tail: &str) -> Api {
        let up = Upstream::start("127.0.0.1", "up").await;
        let port = free_port();
        let t = Tollgate::start(&config(port, &up, server_extra, tail)).await;
        eventually("the limiter API answers", 250, || async {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        Api { t, port, up }
    }

    /// Rewrites the config and waits until the reload is applied.
    async fn reload(&self, server_extra: &str, tail: &str) {
        let series = "tollgate_config_reloads_total{result=\"success\"}";
        let before = self.t.metric(series).await;
        self.t
            .write_config(&config(self.port, &self.up, server_extra, tail));
        self.t.signal(libc::SIGHUP);
        eventually("the reload is applied", 500, || async {
            self.t.metric(series).await > before
        })
        .await;
    }

    fn con(&self, resp3: bool) -> redis::Connection {
        let proto = if resp3 { "?protocol=resp3" } else { "" };
        redis::Client::open(format!("redis://127.0.0.1:{}/{proto}", self.port))
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(10))
            .unwrap()
    }

    async fn metric(&self, series: &str) -> f64 {
        self.t.metric(series).await
    }

    async fn holds(&self, resource: &str) -> f64 {
        self.metric(&format!("tollgate_api_holds{{resource=\"{resource}\"}}"))
            .await
    }

    async fn decisions(&self, resource: &str, kind: &str, decision: &str) -> f64 {
        self.metric(&format!(
            "tollgate_limit_decisions_total{{decision=\"{decision}\",kind=\"{kind}\",limit=\"{resource}\",origin=\"_api\"}}"
        ))
        .await
    }
}

/// Runs a command; its reply as a field map (a RESP3 map, or RESP2 field/value pairs).
fn ch(con: &mut redis::Connection, args: &[&str]) -> HashMap<String, Value> {
    let v: Value = redis::cmd(args[0]).arg(&args[1..]).query(con).unwrap();
    fields(v)
}

fn fields(v: Value) -> HashMap<String, Value> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Map(pairs) => pairs,
        Value::Array(items) => {
            assert!(items.len() % 2 == 0, "pairs: {items:?}");
            let mut it = items.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        other => panic!("a map reply, got {other:?}"),
    };
    pairs.into_iter().map(|(k, v)| (text(&k), v)).collect()
}

/// The error message of a command that must fail.
fn err(con: &mut redis::Connection, args: &[&str]) -> String {
    let r: redis::RedisResult<Value> = redis::cmd(args[0]).arg(&args[1..]).query(con);
    match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{args:?} should fail, replied {v:?}"),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        other => panic!("text, got {other:?}"),
    }
}

fn int(m: &HashMap<String, Value>, field: &str) -> i64 {
    match m.get(field) {
        Some(Value::Int(n)) => *n,
        other => panic!("{field}: an integer, got {other:?} in {m:?}"),
    }
}

fn list(m: &HashMap<String, Value>, field: &str) -> Vec<String> {
    match m.get(field) {
        Some(Value::Array(items)) => items.iter().map(text).collect(),
        Some(Value::Set(items)) => items.iter().map(text).collect(),
        other => panic!("{field}: a list, got {other:?} in {m:?}"),
    }
}

fn field_text(m: &HashMap<String, Value>, field: &str) -> String {
    text(m.get(field).unwrap_or_else(|| panic!("{field} in {m:?}")))
}

const UPLOADS: &str = "resources:\n  uploads:\n    kind: concurrency\n    max: 3\n    global: 6\n    groups:\n      - { name: big, members: { customer: [bigco, hugeco] }, max: 4 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_up_to_the_domain_group_and_global_limits() {
    let api = Api::start("", UPLOADS).await;
    let (mut a, mut b) = (api.con(true), api.con(false));
    let r = ch(&mut a, &["CH.RESERVE", "uploads", "alice", "3"]);
    assert_eq!(int(&r, "granted"), 3);
    assert_eq!(list(&r, "groups"), Vec::<String>::new());
    assert_eq!(
        (int(&r, "held"), int(&r, "in_use"), int(&r, "limit")),
        (3, 3, 3)
    );
    assert_eq!(int(&r, "global"), 6);
    // The domain's limit.
    let r = ch(&mut a, &["CH.RESERVE", "uploads", "alice", "1"]);
    assert_eq!(int(&r, "granted"), 0);
    assert_eq!(field_text(&r, "limited_by"), "domain");
    assert_eq!(int(&r, "retry_after_ms"), 1000);
    // A member of `big` takes from the group too.
    let r = ch(&mut a, &["CH.RESERVE", "uploads", "bigco", "3"]);
    assert_eq!(
        (int(&r, "granted"), list(&r, "groups")),
        (3, vec!["big".to_string()])
    );
    // The global limit: 6 of 6 held, from another connection too.
    let r = ch(&mut b, &["CH.RESERVE", "uploads", "hugeco", "1"]);
    assert_eq!(
        (int(&r, "granted"), field_text(&r, "limited_by")),
        (0, "global".into())
    );
    // Room again globally; the group has 1 of 4 left, so MIN 1 gets 1 of the 3 asked.
    let r = ch(&mut a, &["CH.RELEASE", "uploads", "alice", "3"]);
    assert_eq!((int(&r, "released"), int(&r, "held")), (3, 0));
    let r = ch(
        &mut b,
        &["CH.RESERVE", "uploads", "hugeco", "3", "MIN", "1"],
    );
    assert_eq!(
        (int(&r, "granted"), list(&r, "groups")),
        (1, vec!["big".to_string()])
    );
    let r = ch(&mut b, &["CH.RESERVE", "uploads", "hugeco", "1"]);
    assert_eq!(field_text(&r, "limited_by"), "group:big");
    // 4 of 6 held globally: 2 fit, a MIN that does not fit takes nothing.
    let r = ch(&mut b, &["CH.RESERVE", "uploads", "carol", "2", "MIN", "2"]);
    assert_eq!(int(&r, "granted"), 2);
    let r = ch(&mut b, &["CH.RESERVE", "uploads", "dave", "2", "MIN", "1"]);
    assert_eq!(
        (int(&r, "granted"), field_text(&r, "limited_by")),
        (0, "global".into())
    );
    // Exact gauges and counts: bigco 3, hugeco 1, carol 2.
    assert_eq!(api.holds("uploads").await, 6.0);
    assert_eq!(
        api.decisions("uploads", "concurrency", "allowed").await,
        4.0
    );
    assert_eq!(
        api.decisions("uploads", "concurrency", "rejected").await,
        4.0
    );
    // Both connections end: every hold goes back.
    drop((a, b));
    eventually("holds are released when connections end", 250, || async {
        api.holds("uploads").await == 0.0
    })
    .await;
    let mut c = api.con(true);
    let r = ch(&mut c, &["CH.RESERVE", "uploads", "bigco", "3"]);
    assert_eq!(
        int(&r, "granted"),
        3,
        "bigco's and the group's copies are back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_grants_the_largest_count_that_fits_with_its_context() {
    let tail = "resources:\n  logins: { kind: token_bucket, capacity: 10, refill: { amount: 1, every: 1h } }\n  sends: { kind: rate, max: 5, per: 1h }\n  caps: { kind: sliding_log, windows: [{ max: 3, per: 1d }, { max: 4, per: 7d }] }\n  search:\n    kind: tiered\n    hard_limit: 4\n    tiers:\n      - { limit: 2, window: 1m, active: 10m, cooldown: 0s }\n      - { limit: 5, window: 1m, active: 10m, cooldown: 0s }\n";
    let api = Api::start("", tail).await;
    for resp3 in [false, true] {
        let domain = if resp3 { "alice3" } else { "alice2" };
        let mut con = api.con(resp3);
        let r = ch(&mut con, &["CH.REQUEST", "logins", domain, "6"]);
        assert_eq!(
            (int(&r, "granted"), int(&r, "remaining"), int(&r, "limit")),
            (6, 4, 10)
        );
        assert_eq!(
            (field_text(&r, "kind"), field_text(&r, "source")),
            ("token_bucket".into(), "local".into())
        );
        let r = ch(&mut con, &["CH.REQUEST", "logins", domain, "6", "MIN", "3"]);
        assert_eq!((int(&r, "granted"), int(&r, "remaining")), (4, 0));
        let r = ch(&mut con, &["CH.REQUEST", "logins", domain, "2", "MIN", "1"]);
        assert_eq!(int(&r, "granted"), 0);
        let retry = int(&r, "retry_after_ms");
        assert!(
            (3_599_000..=3_600_000).contains(&retry),
            "one refill: {retry}"
        );
        assert_eq!(int(&r, "shadow_rejected"), 0);
        // A rate and a sliding log: the same rule, their own limits.
        let r = ch(&mut con, &["CH.REQUEST", "sends", domain, "7", "MIN", "2"]);
        assert_eq!((int(&r, "granted"), int(&r, "limit")), (5, 5));
        let r = ch(&mut con, &["CH.REQUEST", "caps", domain, "5", "MIN", "1"]);
        assert_eq!(
            (int(&r, "granted"), int(&r, "limit"), int(&r, "remaining")),
            (3, 3, 0)
        );
        let r = ch(&mut con, &["CH.REQUEST", "caps", domain, "1"]);
        assert_eq!(int(&r, "granted"), 0);
        // Tiered: 2 in tier 1, the burst into tier 2 stops at the hard limit of 4/s.
        let r = ch(&mut con, &["CH.REQUEST", "search", domain, "5", "MIN", "1"]);
        assert_eq!(
            (int(&r, "granted"), int(&r, "tier"), int(&r, "tier_limit")),
            (4, 2, 5)
        );
        assert_eq!(int(&r, "hard_limit"), 4);
        assert_eq!(r.get("global_limit"), Some(&Value::Nil));
        let r = ch(&mut con, &["CH.REQUEST", "search", domain, "1"]);
        assert_eq!(int(&r, "granted"), 0);
        assert_eq!(field_text(&r, "decided_by"), "hard_limit");
    }
    assert_eq!(
        api.decisions("logins", "token_bucket", "allowed").await,
        4.0
    );
    assert_eq!(
        api.decisions("logins", "token_bucket", "rejected").await,
        2.0
    );
    assert_eq!(api.decisions("search", "tiered", "rejected").await, 2.0);
    // The kinds answer their own command only.
    let mut con = api.con(false);
    let e = err(&mut con, &["CH.RESERVE", "logins", "x", "1"]);
    assert!(
        e.contains("is a `token_bucket` resource: use CH.REQUEST"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_on_a_tiered_resource_is_decided_by_its_global_limit() {
    // Per key the tier has room for 100; over every key the resource admits 3 a second.
    let tail = "resources:\n  search:\n    kind: tiered\n    global_limit: 3\n    tiers:\n      - { limit: 100, window: 1m, active: 10m, cooldown: 0s }\n";
    let api = Api::start("", tail).await;
    let mut con = api.con(true);
    // The global count is per clock second: should the second turn between the two
    // requests, the second one finds room again, and the pair is retried on new domains.
    let mut refused = None;
    for attempt in 0..5 {
        let (a, b) = (format!("a{attempt}"), format!("b{attempt}"));
        let r = ch(&mut con, &["CH.REQUEST", "search", &a, "3"]);
        assert_eq!(int(&r, "granted"), 3, "{r:?}");
        let r = ch(&mut con, &["CH.REQUEST", "search", &b, "2", "MIN", "1"]);
        if int(&r, "granted") == 0 {
            refused = Some(r);
            break;
        }
    }
    let r = refused.expect("another domain's request was refused within the second");
    assert_eq!(field_text(&r, "decided_by"), "global_limit", "{r:?}");
    assert_eq!(int(&r, "global_limit"), 3);
    assert_eq!(r.get("hard_limit"), Some(&Value::Nil));
    // b's own tier is untouched: it was the global limit, not a tier, that refused it.
    assert_eq!((int(&r, "tier"), int(&r, "shadow_rejected")), (0, 0));
    let retry = int(&r, "retry_after_ms");
    assert!((1..=1000).contains(&retry), "the next second: {retry}");
    assert!(api.decisions("search", "tiered", "rejected").await >= 1.0);
}

/// `redis-cli` in an interactive session whose process is killed mid-way: its
/// connection's holds are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_client_and_a_reset_socket_release_their_holds() {
    let api = Api::start("", UPLOADS).await;
    let mut cli = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &api.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-cli (scripts/deps.sh installs redis-tools)");
    // Its stdin stays open: it waits for more, with its connection open.
    let mut stdin = cli.stdin.take().unwrap();
    writeln!(stdin, "CH.RESERVE uploads bigco 3").unwrap();
    stdin.flush().unwrap();
    api.t
        .wait_metric("tollgate_api_holds{resource=\"uploads\"}", 3.0)
        .await;
    cli.kill().unwrap();
    cli.wait().unwrap();
    eventually("a killed client's holds are released", 250, || async {
        api.holds("uploads").await == 0.0
    })
    .await;
    // A raw socket closed with a reset (SO_LINGER 0): the same.
    let mut raw = TcpStream::connect(("127.0.0.1", api.port)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(b"*4\r\n$10\r\nCH.RESERVE\r\n$7\r\nuploads\r\n$5\r\nbigco\r\n$1\r\n2\r\n")
        .unwrap();
    let mut reply = [0u8; 64];
    let n = std::io::Read::read(&mut raw, &mut reply).unwrap();
    assert!(reply[..n].starts_with(b"*"), "{:?}", &reply[..n]);
    assert_eq!(api.holds("uploads").await, 2.0);
    socket2::SockRef::from(&raw)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(raw);
    eventually("a reset socket's holds are released", 250, || async {
        api.holds("uploads").await == 0.0
    })
    .await;
    let mut con = api.con(true);
    assert_eq!(
        int(
            &ch(&mut con, &["CH.RESERVE", "uploads", "bigco", "3"]),
            "granted"
        ),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_move_holds_and_expire_unseized() {
    let api = Api::start("", UPLOADS).await;
    let (mut a, mut b) = (api.con(true), api.con(false));
    assert_eq!(
        int(
            &ch(&mut a, &["CH.RESERVE", "uploads", "bigco", "3"]),
            "granted"
        ),
        3
    );
    let id: String = redis::cmd("CH.TRANSFER")
        .arg(&["uploads", "bigco", "2", "60", "GROUPS", "big"])
        .query(&mut a)
        .unwrap();
    assert_eq!(id.len(), 32);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    let s = ch(&mut b, &["CH.SEIZE", &id]);
    assert_eq!(
        (field_text(&s, "resource"), field_text(&s, "domain")),
        ("uploads".into(), "bigco".into())
    );
    assert_eq!(
        (int(&s, "copies"), list(&s, "groups")),
        (2, vec!["big".to_string()])
    );
    let e = err(&mut a, &["CH.SEIZE", &id]);
    assert!(e.contains("unknown transfer"), "seized once: {e}");
    let e = err(&mut a, &["CH.SEIZE", "0123456789abcdef0123456789abcdef"]);
    assert!(e.contains("unknown transfer"), "{e}");
    // A's connection holds 1, B's 2: each is released with its own connection.
    let e = err(&mut a, &["CH.RELEASE", "uploads", "bigco", "2"]);
    assert!(
        e.contains("over-release: this connection holds 1 copies"),
        "{e}"
    );
    drop(a);
    eventually("A's copy is released", 250, || async {
        api.holds("uploads").await == 2.0
    })
    .await;
    let r = ch(&mut b, &["CH.RESERVE", "uploads", "bigco", "1"]);
    assert_eq!(
        (int(&r, "granted"), int(&r, "held"), int(&r, "in_use")),
        (1, 3, 3)
    );
    // A transfer nobody seizes is released after its ttl.
    let id: String = redis::cmd("CH.TRANSFER")
        .arg(&["uploads", "bigco", "3", "0.2"])
        .query(&mut b)
        .unwrap();
    assert_eq!(
        api.holds("uploads").await,
        3.0,
        "held by the transfer meanwhile"
    );
    eventually("an unseized transfer is released", 250, || async {
        api.holds("uploads").await == 0.0
    })
    .await;
    let e = err(&mut b, &["CH.SEIZE", &id]);
    assert!(e.contains("unknown transfer"), "{e}");
    assert_eq!(
        int(
            &ch(&mut b, &["CH.RESERVE", "uploads", "bigco", "3"]),
            "granted"
        ),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_release_is_an_error_that_changes_nothing() {
    let api = Api::start("", UPLOADS).await;
    let mut a = api.con(true);
    ch(&mut a, &["CH.RESERVE", "uploads", "bigco", "2"]);
    for (args, want) in [
        (vec!["CH.RELEASE", "uploads", "bigco", "3"], "over-release: this connection holds 2 copies of 'uploads' for domain 'bigco', 3 asked; nothing changed"),
        (vec!["CH.RELEASE", "uploads", "bigco", "1", "GROUPS"], "holds 0 copies of 'uploads' for domain 'bigco' in groups [], 1 asked"),
        (vec!["CH.RELEASE", "uploads", "bigco", "1", "GROUPS", "small"], "holds 0 copies of 'uploads' for domain 'bigco' in groups [small], 1 asked"),
        (vec!["CH.RELEASE", "uploads", "alice", "1"], "holds 0 copies of 'uploads' for domain 'alice'"),
        (vec!["CH.RELEASE", "logins", "bigco", "1"], "holds 0 copies of 'logins'"),
        (vec!["CH.TRANSFER", "uploads", "bigco", "3", "10"], "holds 2 copies"),
    ] {
        let e = err(&mut a, &args);
        assert!(e.contains(want), "{args:?}: {e}");
    }
    assert_eq!(api.holds("uploads").await, 2.0, "nothing changed");
    // Another connection cannot release what this one holds.
    let mut b = api.con(false);
    let e = err(&mut b, &["CH.RELEASE", "uploads", "bigco", "1"]);
    assert!(e.contains("holds 0 copies"), "{e}");
    let r = ch(
        &mut a,
        &["CH.RELEASE", "uploads", "bigco", "2", "GROUPS", "big"],
    );
    assert_eq!((int(&r, "released"), int(&r, "held")), (2, 0));
    assert_eq!(api.holds("uploads").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfigured_resources_follow_allow_unconfigured_live() {
    let api = Api::start("", "api:\n  allow_unconfigured: false\n").await;
    let mut con = api.con(true);
    let e = err(&mut con, &["CH.REQUEST", "mailer", "alice", "3"]);
    assert!(e.contains("unknown resource 'mailer'"), "{e}");
    let e = err(&mut con, &["CH.RESERVE", "mailer", "alice", "3"]);
    assert!(e.contains("unknown resource 'mailer'"), "{e}");
    api.reload("", "api:\n  allow_unconfigured: true\n").await;
    let r = ch(
        &mut con,
        &["CH.REQUEST", "mailer", "alice", "3", "MIN", "1"],
    );
    assert_eq!(
        (int(&r, "granted"), field_text(&r, "kind")),
        (3, "_unconfigured".into())
    );
    let r = ch(&mut con, &["CH.RESERVE", "workers", "alice", "4"]);
    assert_eq!((int(&r, "granted"), int(&r, "held")), (4, 4));
    assert_eq!(api.holds("_unconfigured").await, 4.0);
    assert_eq!(
        api.decisions("_unconfigured", "unconfigured", "allowed")
            .await,
        2.0
    );
    let r = ch(&mut con, &["CH.RELEASE", "workers", "alice", "4"]);
    assert_eq!(int(&r, "held"), 0);
    assert_eq!(api.holds("_unconfigured").await, 0.0);
    // Turned off again: refused again, on the same connection.
    api.reload("", "api:\n  allow_unconfigured: false\n").await;
    let e = err(&mut con, &["CH.REQUEST", "mailer", "alice", "1"]);
    assert!(e.contains("unknown resource"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_turns_rejections_into_counted_grants() {
    let tail = "resources:\n  logins: { kind: token_bucket, capacity: 2, refill: { amount: 1, every: 1h } }\n  uploads: { kind: concurrency, max: 1 }\n";
    let api = Api::start("  kill_switch: true\n", tail).await;
    let mut con = api.con(true);
    assert_eq!(
        int(
            &ch(&mut con, &["CH.REQUEST", "logins", "a", "2"]),
            "granted"
        ),
        2
    );
    let r = ch(&mut con, &["CH.REQUEST", "logins", "a", "2"]);
    assert_eq!((int(&r, "granted"), int(&r, "shadow_rejected")), (2, 1));
    assert_eq!(
        int(
            &ch(&mut con, &["CH.RESERVE", "uploads", "a", "1"]),
            "granted"
        ),
        1
    );
    let r = ch(&mut con, &["CH.RESERVE", "uploads", "a", "2"]);
    assert_eq!((int(&r, "granted"), int(&r, "shadow_rejected")), (2, 1));
    assert_eq!(int(&r, "held"), 3);
    assert_eq!(
        api.decisions("logins", "token_bucket", "shadow_rejected")
            .await,
        1.0
    );
    assert_eq!(
        api.decisions("uploads", "concurrency", "shadow_rejected")
            .await,
        1.0
    );
    // Switched off by a reload: rejections are enforced again.
    api.reload("", tail).await;
    let r = ch(&mut con, &["CH.REQUEST", "logins", "a", "1"]);
    assert_eq!((int(&r, "granted"), int(&r, "shadow_rejected")), (0, 0));
    // The forced copies are released first: the limiter still counts its 1.
    let r = ch(&mut con, &["CH.RELEASE", "uploads", "a", "2"]);
    assert_eq!(int(&r, "held"), 1);
    let mut other = api.con(false);
    let r = ch(&mut other, &["CH.RESERVE", "uploads", "a", "1"]);
    assert_eq!(int(&r, "granted"), 0, "the one taken copy is still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_resources_and_held_copies_go_back_where_they_were_taken() {
    let groups = |big: &str, small: &str| {
        format!("resources:\n  logins: {{ kind: token_bucket, capacity: CAP, refill: {{ amount: 1, every: 1h }} }}\n  uploads:\n    kind: concurrency\n    max: 4\n    groups:\n      - {{ name: big, members: {{ customer: [{big}] }}, max: 4 }}\n      - {{ name: small, members: {{ customer: [{small}] }}, max: 4 }}\n")
    };
    let api = Api::start("", &groups("bigco, hugeco", "tiny").replace("CAP", "2")).await;
    let (mut a, mut b) = (api.con(true), api.con(true));
    assert_eq!(
        int(&ch(&mut a, &["CH.REQUEST", "logins", "x", "2"]), "granted"),
        2
    );
    let r = ch(&mut a, &["CH.RESERVE", "uploads", "bigco", "3"]);
    assert_eq!(list(&r, "groups"), ["big"]);
    // bigco moves to `small`; `logins` keeps its state (same shape) until its capacity
    // changes.
    api.reload("", &groups("hugeco", "bigco, tiny").replace("CAP", "2"))
        .await;
    assert_eq!(
        int(&ch(&mut a, &["CH.REQUEST", "logins", "x", "1"]), "granted"),
        0
    );
    let r = ch(&mut b, &["CH.RESERVE", "uploads", "bigco", "1"]);
    assert_eq!(
        list(&r, "groups"),
        ["small"],
        "new copies come from the new group"
    );
    let r = ch(
        &mut b,
        &["CH.RESERVE", "uploads", "hugeco", "2", "MIN", "1"],
    );
    assert_eq!(int(&r, "granted"), 1, "big still counts bigco's 3 copies");
    // Releasing bigco's 3 copies gives them back to `big`, where they were taken.
    let r = ch(
        &mut a,
        &["CH.RELEASE", "uploads", "bigco", "3", "GROUPS", "big"],
    );
    assert_eq!(int(&r, "held"), 0);
    let r = ch(&mut b, &["CH.RESERVE", "uploads", "hugeco", "3"]);
    assert_eq!(int(&r, "granted"), 3, "big has its 3 copies back");
    api.reload("", &groups("hugeco", "bigco, tiny").replace("CAP", "5"))
        .await;
    assert_eq!(
        int(&ch(&mut a, &["CH.REQUEST", "logins", "x", "5"]), "granted"),
        5,
        "a new capacity is a new bucket"
    );
    // A resource removed by a reload is unknown; held copies of it can still be
    // released (they go back to the state they came from).
    api.reload("", "resources:\n  logins: { kind: token_bucket, capacity: 5, refill: { amount: 1, every: 1h } }\n")
        .await;
    let e = err(&mut b, &["CH.RESERVE", "uploads", "hugeco", "1"]);
    assert!(e.contains("unknown resource 'uploads'"), "{e}");
    let r = ch(&mut b, &["CH.RELEASE", "uploads", "hugeco", "4"]);
    assert_eq!(int(&r, "held"), 0);
    assert_eq!(api.holds("uploads").await, 1.0, "bigco's copy");
    drop(b);
    eventually("released", 250, || async {
        api.holds("uploads").await == 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_ch_arguments_get_errors_and_the_connection_goes_on() {
    let api = Api::start("", UPLOADS).await;
    let mut con = api.con(false);
    let long = "d".repeat(257);
    let many: Vec<String> = (0..65).map(|i| format!("g{i}")).collect();
    let mut too_many_groups = vec!["CH.RELEASE", "uploads", "bigco", "1", "GROUPS"];
    too_many_groups.extend(many.iter().map(String::as_str));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["CH.REQUEST", "uploads", "x"], "wrong number of arguments for 'ch.request'"),
        (vec!["CH.SEIZE"], "wrong number of arguments for 'ch.seize'"),
        (vec!["CH.SEIZE", "a", "b"], "wrong number of arguments for 'ch.seize'"),
        (vec!["CH.TRANSFER", "uploads", "x", "1"], "wrong number of arguments for 'ch.transfer'"),
        (vec!["CH.RESERVE", "uploads", "x", "-1"], "invalid 'copies'"),
        (vec!["CH.RESERVE", "uploads", "x", "1180591620717411303424"], "invalid 'copies': expected an integer from 1 to 9223372036854775807, got '1180591620717411303424'"),
        (vec!["CH.RESERVE", "uploads", "x", "3", "MIN", "-1"], "invalid 'MIN'"),
        (vec!["CH.RESERVE", "uploads", "x", "3", "MIN", "4"], "invalid 'MIN': 4 is above copies 3"),
        (vec!["CH.RESERVE", "uploads", &long, "1"], "invalid 'domain': expected 1 to 256 bytes, got 257"),
        (vec!["CH.RESERVE", "uploads", "", "1"], "invalid 'domain'"),
        (vec!["CH.RESERVE", "nope", "x", "1"], "unknown resource 'nope'"),
        (vec!["CH.REQUEST", "uploads", "x", "1"], "is a `concurrency` resource: use CH.RESERVE"),
        (vec!["CH.TRANSFER", "uploads", "x", "1", "-5"], "invalid 'ttl_seconds'"),
        (vec!["CH.TRANSFER", "uploads", "x", "1", "86401"], "invalid 'ttl_seconds'"),
        (vec!["CH.TRANSFER", "uploads", "x", "1", "1", "WITH"], "unknown option 'WITH'"),
        (too_many_groups, "65 group names; at most 64"),
        (vec!["CH.SEIZE", "../../etc/passwd"], "unknown transfer"),
    ];
    for (args, want) in &cases {
        let e = err(&mut con, args);
        assert!(e.contains(want), "{args:?}: {e}");
    }
    assert_eq!(
        redis::cmd("PING").query::<String>(&mut con).unwrap(),
        "PONG"
    );
    let errors = api
        .metric("tollgate_api_commands_total{command=\"ch.reserve\",result=\"error\"}")
        .await;
    assert_eq!(errors, 7.0);
}

/// The limiter API guide's session, through `redis-cli`: what an operator types and reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cli_session() {
    let tail = "resources:\n  logins: { kind: token_bucket, capacity: 10, refill: { amount: 1, every: 1h } }\n  uploads: { kind: concurrency, max: 5, global: 100 }\n";
    let api = Api::start("", tail).await;
    let input = "CH.REQUEST logins alice 3\nCH.RESERVE uploads acme 4\nCH.RELEASE uploads acme 2\nCH.RELEASE uploads acme 5\n";
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &api.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(input.as_bytes())?;
            c.wait_with_output()
        })
        .expect("redis-cli");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    // Field, value, field, value...: redis-cli without a tty prints one item a line.
    assert_eq!(&lines[..4], ["granted", "3", "remaining", "7"], "{text}");
    assert!(text.contains("released\n2\nheld\n2\n"), "{text}");
    assert!(
        text.contains("ERR over-release: this connection holds 2 copies of 'uploads' for domain 'acme', 5 asked; nothing changed"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_metrics_pass_promtool() {
    let api = Api::start("", &format!("api:\n  allow_unconfigured: true\n{UPLOADS}")).await;
    let mut con = api.con(true);
    ch(&mut con, &["CH.RESERVE", "uploads", "bigco", "2"]);
    ch(
        &mut con,
        &["CH.RESERVE", "uploads", "alice", "4", "MIN", "4"],
    );
    ch(&mut con, &["CH.RESERVE", "mailer", "alice", "1"]);
    let text = api.t.metrics_text().await;
    for needle in [
        "tollgate_api_holds{resource=\"uploads\"} 2",
        "tollgate_api_holds{resource=\"_unconfigured\"} 1",
        "tollgate_limit_decisions_total{decision=\"allowed\",kind=\"concurrency\",limit=\"uploads\",origin=\"_api\"} 1",
        "tollgate_limit_decisions_total{decision=\"rejected\",kind=\"concurrency\",limit=\"uploads\",origin=\"_api\"} 1",
        "tollgate_limit_decisions_total{decision=\"allowed\",kind=\"unconfigured\",limit=\"_unconfigured\",origin=\"_api\"} 1",
        "tollgate_api_commands_total{command=\"ch.reserve\",result=\"rejected\"} 1",
        "tollgate_api_connections 1",
        "tollgate_concurrency_in_use{group=\"big\",limit=\"uploads\",origin=\"_api\"} 2",
        "tollgate_concurrency_max{group=\"_all\",limit=\"uploads\",origin=\"_api\"} 6",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/deps.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "promtool: {out:?}");
}

/// The limiter API guide's Python client (examples/limiter_api.py, redis-py from Debian's
/// python3-redis, which scripts/deps.sh installs) against the binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_runs_against_the_binary() {
    let tail = "resources:\n  sends: { kind: rate, max: 5, per: 1h }\n  uploads: { kind: concurrency, max: 3 }\n";
    let api = Api::start("", tail).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/limiter_api.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(api.port.to_string())
        .output()
        .expect("/usr/bin/python3 with redis-py (scripts/deps.sh installs python3-redis)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        &lines[..4],
        [
            "login allowed 2",
            "login allowed 1",
            "login refused 0",
            "sends granted 4 remaining 1"
        ],
        "{text}"
    );
    assert!(
        lines[4].starts_with("sends granted 0 retry after ms "),
        "{text}"
    );
    assert_eq!(
        lines[5..7],
        [
            "uploads held 2 groups []",
            "uploads released 2 still held 0"
        ],
        "{text}"
    );
    assert!(
        lines[7].starts_with("over-release refused: over-release: this connection holds 0 copies"),
        "{text}"
    );
    assert_eq!(api.holds("uploads").await, 0.0);
}
