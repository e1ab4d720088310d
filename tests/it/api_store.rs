//! The limiter API on a Redis store, through real binaries and a real `redis-server`:
//! `RL.*` buckets in Redis when `api.store` names a store (shared by instances, their
//! parameters in their key names, `AT` replays exact, fail-open by the store's fallback),
//! `CH.REQUEST` on resources kept in a store (one script call with a `MIN`), and
//! `CH.RESERVE` holding copies of a concurrency resource across instances.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::redis as harness;
use crate::common::smyte;

use std::net::TcpStream;
use std::time::Duration;

use common::{eventually, free_port, Tollgate, Upstream, SERVER};
use harness::RedisServer;
use redis::Value;

/// A tollgate whose API and resources use the Redis store `shared` at `url`.
struct Instance {
    t: Tollgate,
    port: u16,
}

async fn instance(up: &Upstream, url: &str, tail: &str) -> Instance {
    let port = free_port();
    let config = format!(
        "{SERVER}  limiter_api: \"127.0.0.1:{port}\"\nstores:\n  shared: {{ kind: redis, url: \"{url}\", timeout: 250ms, breaker: {{ failures: 1, probe_every: 50ms }} }}\napi:\n  store: shared\norigins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"{}\"]\n{tail}",
        up.addr
    );
    let t = Tollgate::start(&config).await;
    eventually("the limiter API answers", 250, || async {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    t.wait_metric("tollgate_store_up{store=\"shared\"}", 1.0)
        .await;
    Instance { t, port }
}

impl Instance {
    fn con(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(10))
            .unwrap()
    }
}

fn reduce(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<i64> {
    redis::cmd("RL.REDUCE").arg(args).query(con)
}

fn keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    match redis.cmd(&["KEYS", pattern]) {
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("a key, got {other:?}"),
            })
            .collect(),
        other => panic!("KEYS replies an array, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rl_buckets_live_in_redis_shared_by_instances() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let (a, b) = (
        instance(&up, &redis.url(), "").await,
        instance(&up, &redis.url(), "").await,
    );
    let (mut ca, mut cb) = (a.con(), b.con());
    let two = ["TwoPerMin", "2", "60"];
    let replies = [
        reduce(&mut ca, &two).unwrap(),
        reduce(&mut cb, &two).unwrap(),
        reduce(&mut ca, &two).unwrap(),
    ];
    assert_eq!(replies, [2, 1, 0], "one bucket for both instances");
    let got: i64 = redis::cmd("RL.GET").arg(&two).query(&mut cb).unwrap();
    assert_eq!(got, 0);
    // Its parameters are in its name: another max is another bucket.
    assert_eq!(reduce(&mut cb, &["TwoPerMin", "3", "60"]).unwrap(), 3);
    let names = keys(&redis, "tollgate:_rl:*");
    assert!(
        names
            .iter()
            .any(|k| k.starts_with("tollgate:_rl:2:2:60:{") && k.ends_with("}:tb")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|k| k.starts_with("tollgate:_rl:3:3:60:{")),
        "{names:?}"
    );
    // STRICT, REFILL, TAKE > 1 and a clock sometimes behind: a recorded history replayed
    // with AT on Redis replies exactly what the contract's model does.
    let history = smyte::History::recorded(300);
    let got: Vec<i64> = history.pipeline("replay").query(&mut ca).unwrap();
    assert_eq!(got, history.want);
    // What the scripts cannot compute exactly is refused, not rounded.
    let e = reduce(&mut ca, &["x", "2", "1125899907"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("invalid 'refill_seconds': at most 1125899906 with api.store on Redis"),
        "{e}"
    );
    let e = reduce(&mut ca, &["x", "1125899906842625", "60"]).unwrap_err();
    assert!(e.to_string().contains("invalid 'max'"), "{e}");
    let ok =
        a.t.metric("tollgate_store_requests_total{result=\"ok\",store=\"shared\"}")
            .await;
    assert!(ok >= 302.0, "every call went to Redis: {ok}");
    assert_eq!(
        a.t.metric("tollgate_store_fallback_decisions_total{store=\"shared\"}")
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rl_falls_back_while_redis_is_gone_and_comes_back_by_itself() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let a = instance(&up, &redis.url(), "").await;
    let mut con = a.con();
    assert_eq!(reduce(&mut con, &["fb", "2", "60"]).unwrap(), 2);
    redis.kill();
    // The local fallback (one instance: the whole bucket) answers, in-process.
    let replies: Vec<i64> = (0..3)
        .map(|_| reduce(&mut con, &["fb", "2", "60"]).unwrap())
        .collect();
    assert_eq!(replies, [2, 1, 0], "a fresh local bucket");
    assert!(
        a.t.metric("tollgate_store_fallback_decisions_total{store=\"shared\"}")
            .await
            >= 3.0
    );
    redis.restart();
    a.t.wait_metric("tollgate_store_up{store=\"shared\"}", 1.0)
        .await;
    // Redis restarted empty: the bucket starts full there.
    assert_eq!(reduce(&mut con, &["fb", "2", "60"]).unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ch_request_on_resources_in_a_store_grants_in_one_call() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let tail = "resources:\n  logins: { kind: token_bucket, capacity: 10, refill: { amount: 1, every: 1h }, store: shared }\n  sends: { kind: rate, max: 5, per: 1h, store: shared }\n";
    let (a, b) = (
        instance(&up, &redis.url(), tail).await,
        instance(&up, &redis.url(), tail).await,
    );
    let (mut ca, mut cb) = (a.con(), b.con());
    let ask = |con: &mut redis::Connection, args: &[&str]| -> (i64, String) {
        let v: Vec<Value> = redis::cmd("CH.REQUEST").arg(args).query(con).unwrap();
        let field = |name: &str| {
            let i = v
                .iter()
                .position(|f| *f == Value::BulkString(name.as_bytes().to_vec()))
                .unwrap_or_else(|| panic!("{name} in {v:?}"));
            v[i + 1].clone()
        };
        let Value::Int(granted) = field("granted") else {
            panic!("{v:?}");
        };
        let Value::BulkString(source) = field("source") else {
            panic!("{v:?}");
        };
        (granted, String::from_utf8(source).unwrap())
    };
    assert_eq!(ask(&mut ca, &["logins", "alice", "6"]), (6, "store".into()));
    assert_eq!(
        ask(&mut cb, &["logins", "alice", "6", "MIN", "3"]),
        (4, "store".into())
    );
    assert_eq!(ask(&mut ca, &["logins", "alice", "1"]).0, 0);
    assert_eq!(
        ask(&mut cb, &["logins", "bob", "10"]).0,
        10,
        "one bucket per domain"
    );
    assert_eq!(ask(&mut ca, &["sends", "alice", "3"]).0, 3);
    assert_eq!(ask(&mut cb, &["sends", "alice", "3", "MIN", "1"]).0, 2);
    let names = keys(&redis, "tollgate:_api:*");
    assert!(
        names
            .iter()
            .any(|k| k.starts_with("tollgate:_api:logins:b:{") && k.ends_with("}:tb")),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .any(|k| k.starts_with("tollgate:_api:sends:b:{")),
        "{names:?}"
    );
    let allowed = "tollgate_limit_decisions_total{decision=\"allowed\",kind=\"token_bucket\",limit=\"logins\",origin=\"_api\"}";
    assert_eq!(a.t.metric(allowed).await + b.t.metric(allowed).await, 3.0);
}

/// The fields of a `CH.*` reply (RESP2 field/value pairs), by name.
fn fields(v: &[Value]) -> std::collections::HashMap<String, Value> {
    v.chunks(2)
        .map(|p| match p {
            [Value::BulkString(k), v] => (String::from_utf8_lossy(k).into_owned(), v.clone()),
            other => panic!("a field and its value, got {other:?}"),
        })
        .collect()
}

fn ch(con: &mut redis::Connection, args: &[&str]) -> std::collections::HashMap<String, Value> {
    let v: Vec<Value> = redis::cmd(args[0]).arg(&args[1..]).query(con).unwrap();
    fields(&v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ch_reserve_on_a_concurrency_resource_in_a_store_holds_across_instances() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let tail = "resources:\n  uploads: { kind: concurrency, max: 5, groups: [{ name: partners, members: { customer: [bigco] }, max: 8 }], store: shared }\n";
    let (a, b) = (
        instance(&up, &redis.url(), tail).await,
        instance(&up, &redis.url(), tail).await,
    );
    let (mut ca, mut cb) = (a.con(), b.con());
    let granted = |f: &std::collections::HashMap<String, Value>| match f.get("granted") {
        Some(Value::Int(n)) => *n,
        other => panic!("granted: {other:?} in {f:?}"),
    };
    let r = ch(&mut ca, &["CH.RESERVE", "uploads", "bigco", "3"]);
    assert_eq!(granted(&r), 3, "{r:?}");
    assert_eq!(r["source"], Value::BulkString(b"store".to_vec()));
    assert_eq!(
        r["groups"],
        Value::Array(vec![Value::BulkString(b"partners".to_vec())])
    );
    assert_eq!(r["held"], Value::Int(3));
    // The other instance sees the fleet's count: 2 of 5 left.
    let r = ch(
        &mut cb,
        &["CH.RESERVE", "uploads", "bigco", "3", "MIN", "1"],
    );
    assert_eq!(granted(&r), 2, "{r:?}");
    let r = ch(&mut cb, &["CH.RESERVE", "uploads", "bigco", "1"]);
    assert_eq!(granted(&r), 0, "{r:?}");
    assert_eq!(r["limited_by"], Value::BulkString(b"domain".to_vec()));
    // Another domain has its own count.
    assert_eq!(
        granted(&ch(&mut cb, &["CH.RESERVE", "uploads", "acme", "5"])),
        5
    );
    // A release reaches the store: the other instance may take the copies.
    let r = ch(&mut ca, &["CH.RELEASE", "uploads", "bigco", "2"]);
    assert_eq!(r["held"], Value::Int(1), "{r:?}");
    let mut tries = 0;
    loop {
        let r = ch(&mut cb, &["CH.RESERVE", "uploads", "bigco", "2"]);
        if granted(&r) == 2 {
            break;
        }
        tries += 1;
        assert!(tries < 1_500, "released copies never became free: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A transfer moves store-held copies between connections of one instance; the
    // seizer's release frees them.
    let id: String = redis::cmd("CH.TRANSFER")
        .arg(&["uploads", "bigco", "1", "30"])
        .query(&mut cb)
        .unwrap();
    let mut seizer = b.con();
    let _: Value = redis::cmd("CH.SEIZE").arg(&id).query(&mut seizer).unwrap();
    let holds = "tollgate_api_holds{resource=\"uploads\"}";
    assert_eq!(a.t.metric(holds).await, 1.0);
    assert_eq!(b.t.metric(holds).await, 9.0);
    // A connection that ends gives its copies back, once, to the store.
    drop(ca);
    a.t.wait_metric(holds, 0.0).await;
    drop(seizer);
    b.t.wait_metric(holds, 8.0).await;
    eventually("copies of ended connections are free again", 250, || {
        let mut con = b.con();
        async move {
            let f = ch(&mut con, &["CH.RESERVE", "uploads", "bigco", "2"]);
            granted(&f) == 2
        }
    })
    .await;
}
