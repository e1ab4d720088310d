//! The admin API (issue 14) through the real binary: its own listener, the bearer token on
//! every endpoint (the scheme in any case), `/config`, `/state` of every kind after
//! requests through the proxy (in process: the counts of held requests, back down after
//! their release, each window's count, the tier a burst entered with each tier's phase and
//! count; and in a real `redis-server` with each shared kind read by its read-only script:
//! the counts, every key unchanged after the read, 503 from a frozen Redis), `/top` after a
//! skewed load, the kill switch and its gauge, and malformed paths, queries, methods and
//! bodies.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::redis as harness;

use std::net::{SocketAddr, TcpStream};

use common::{client, eventually, Tollgate, Upstream, SERVER};
use harness::RedisServer;
use serde_json::Value;

const TOKEN: &str = "t0ps3cret";

/// A tollgate with the admin API on its own port, its token in a file beside the config.
struct Admin {
    t: Tollgate,
    admin: SocketAddr,
}

/// `limits` (indented for an origin's `limits:`) on origin `app` (host `app.test`), and
/// `extra` top-level sections.
async fn start(up: &Upstream, token: bool, limits: &str, extra: &str) -> Admin {
    // On 127.0.0.2: a port free there cannot be the proxy's or the metrics' (on 127.0.0.1),
    // which `free_port` may hand out again to a test running at the same time.
    let admin = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, format!("  {TOKEN}\n")).unwrap();
    let token_line = if token {
        format!("  admin_token_file: \"{}\"\n", token_file.display())
    } else {
        String::new()
    };
    let config = format!(
        "{SERVER}  admin: \"{admin}\"\n{token_line}  customer_header: x-customer\n  trusted_proxies: [\"127.0.0.1/32\"]\n{extra}origins:\n  app:\n    hosts: [app.test]\n    upstreams: [\"{}\"]\n    limits:\n{limits}",
        up.addr
    );
    let t = Tollgate::start(&config).await;
    // The token file must outlive the start only (it is read at load); keep the dir anyway.
    std::mem::forget(dir);
    eventually("the admin API answers", 250, || async {
        TcpStream::connect(admin).is_ok()
    })
    .await;
    // The proxy answers before the reloader watches the file: an edit made earlier is
    // missed.
    eventually("the reloader watches the config", 250, || async {
        t.log_text().contains("config reloader ready")
    })
    .await;
    Admin { t, admin }
}

impl Admin {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        client()
            .get(self.url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
    }

    async fn json(&self, path: &str) -> (u16, Value) {
        let r = self.get(path).await;
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    async fn put_kill(&self, body: &str) -> (u16, Value) {
        let r = client()
            .put(self.url("/kill-switch"))
            .bearer_auth(TOKEN)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    async fn send(&self, customer: &str) -> u16 {
        client()
            .get(self.t.url("/"))
            .header("host", "app.test")
            .header("x-customer", customer)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }
}

const BUCKET: &str = "      tokens:\n        kind: token_bucket\n        key: [customer, host]\n        capacity: 10\n        refill: { amount: 1, every: 1h }\n        top_keys: 5\n      plain:\n        kind: rate\n        key: [customer]\n        max: 1000\n        per: 1h\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_asks_for_the_token() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let a = start(&up, true, BUCKET, "").await;
    let paths = [
        ("GET", "/config"),
        ("GET", "/kill-switch"),
        ("PUT", "/kill-switch"),
        ("GET", "/limits/app/tokens/state?customer=a&host=app.test"),
        ("GET", "/limits/app/tokens/top"),
        ("GET", "/nowhere"),
    ];
    for (method, path) in paths {
        let method: reqwest::Method = method.parse().unwrap();
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("t0ps3cret"),
            Some("Bearer t0ps3cre"),
        ] {
            let mut req = client().request(method.clone(), a.url(path)).body("on");
            if let Some(auth) = auth {
                req = req.header("authorization", auth);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status().as_u16(), 401, "{method} {path} with {auth:?}");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
            assert!(r.headers().contains_key("www-authenticate"));
        }
        let r = client()
            .request(method.clone(), a.url(path))
            .bearer_auth(TOKEN)
            .body("off")
            .send()
            .await
            .unwrap();
        assert_ne!(r.status().as_u16(), 401, "{method} {path} with the token");
        // The scheme is case-insensitive.
        let r = client()
            .request(method.clone(), a.url(path))
            .header("authorization", format!("bEARER {TOKEN}"))
            .body("off")
            .send()
            .await
            .unwrap();
        assert_ne!(r.status().as_u16(), 401, "{method} {path} with `bEARER`");
    }
    // Nothing was switched by the refused PUTs.
    let (_, k) = a.json("/kill-switch").await;
    assert_eq!(k["kill_switch"], false);
    // The token never reaches the log, nor /config.
    let config = a.get("/config").await.text().await.unwrap();
    assert!(!config.contains(TOKEN));
    assert!(config.contains("admin_token_file"));
    assert!(!a.t.log_text().contains(TOKEN));
    // The proxy port does not serve the admin API.
    let r = client()
        .get(a.t.url("/config"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_ne!(
        r.headers().get("content-type").map(|v| v.to_str().unwrap()),
        Some("application/yaml; charset=utf-8")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_is_the_effective_config_and_follows_a_reload() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let a = start(&up, false, BUCKET, "").await;
    let r = a.get("/config").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "application/yaml; charset=utf-8"
    );
    let text = r.text().await.unwrap();
    // The same text as `tollgate check --print-effective` of the file.
    let out = std::process::Command::new(common::binary())
        .args(["check", "--print-effective", "--config"])
        .arg(&a.t.config_path)
        .output()
        .unwrap();
    assert_eq!(text, String::from_utf8(out.stdout).unwrap());
    assert!(text.contains("top_keys: 5"), "{text}");
    assert!(text.contains(&format!("admin: {}", a.admin)), "{text}");

    let before = std::fs::read_to_string(&a.t.config_path).unwrap();
    std::fs::write(&a.t.config_path, before.replace("max: 1000", "max: 777")).unwrap();
    eventually("/config shows the reloaded config", 500, || async {
        a.get("/config")
            .await
            .text()
            .await
            .unwrap()
            .contains("max: 777")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_token_bucket_counts_the_requests_through_the_proxy() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let a = start(&up, true, BUCKET, "").await;
    let path = "/limits/app/tokens/state?customer=acme&host=app.test";
    let (status, s) = a.json(path).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["state"]["tokens"], 10);
    assert_eq!(s["state"]["last_refill_ms_ago"], Value::Null);
    for _ in 0..4 {
        assert_eq!(a.send("acme").await, 200);
    }
    assert_eq!(a.send("other").await, 200);
    let (status, s) = a.json(path).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "token_bucket");
    assert_eq!(s["variant"], "base");
    assert_eq!(s["key"], "customer=acme&host=app.test");
    assert_eq!(s["state"]["tokens"], 6, "{s}");
    assert_eq!(s["state"]["capacity"], 10);
    assert!(s["state"]["last_refill_ms_ago"].as_f64().unwrap() >= 0.0);
    // Reading changes nothing.
    let (_, again) = a.json(path).await;
    assert_eq!(again["state"]["tokens"], 6);
    // The rate limit's window.
    let (status, s) = a.json("/limits/app/plain/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["state"]["max"], 1000);
    // 4, or a hair less if the hour turned between the requests and the read.
    let estimate = s["state"]["estimate"].as_f64().unwrap();
    assert!((3.99..=4.0).contains(&estimate), "{s}");
}

/// `/state` reads a `path` part in the normal form the proxy keys on: `//` and `/./` name
/// the key of `/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_path_key_reads_the_path_as_the_proxy_does() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      per_path: { kind: rate, key: [path], max: 10, per: 1h }\n";
    let a = start(&up, true, limits, "").await;
    for _ in 0..3 {
        assert_eq!(a.send("acme").await, 200);
    }
    for given in ["/", "//", "/./", "/a/.."] {
        let (status, s) = a
            .json(&format!("/limits/app/per_path/state?path={given}"))
            .await;
        assert_eq!(status, 200, "{s}");
        let estimate = s["state"]["estimate"].as_f64().unwrap();
        assert!((2.99..=3.0).contains(&estimate), "{given}: {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_problems() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let a = start(&up, false, BUCKET, "").await;
    let cases = [
        ("/limits/app/tokens/state?customer=acme", 400, "`host`"),
        ("/limits/app/tokens/state", 400, "missing key parts"),
        (
            "/limits/app/tokens/state?customer=a&host=b&bogus=1",
            400,
            "unknown key part",
        ),
        (
            "/limits/app/tokens/state?customer=a&customer=b&host=c",
            400,
            "twice",
        ),
        (
            "/limits/app/tokens/state?customer=%zz&host=c",
            400,
            "percent",
        ),
        (
            "/limits/app/tokens/state?client_ip=nope&customer=a&host=b",
            400,
            "IP address",
        ),
        ("/limits/%zz/tokens/state?customer=a&host=b", 400, "percent"),
        ("/limits/app/%2/top", 400, "percent"),
        ("/limits/app/%FF/state?customer=a", 400, "not UTF-8"),
        ("/limits/app/tokens/top?n=0", 400, "from 1 to 5"),
        ("/limits/app/tokens/top?n=6", 400, "from 1 to 5"),
        ("/limits/app/tokens/top?n=x", 400, "from 1 to 5"),
        ("/limits/app/tokens/top?m=1", 400, "only `n`"),
        ("/limits/app/plain/top", 404, "top_keys: 20"),
        (
            "/limits/nope/tokens/state?customer=a&host=b",
            404,
            "no origin `nope`",
        ),
        ("/limits/app/nope/state?customer=a", 404, "no limit `nope`"),
        ("/limits/app/tokens/other", 404, "no admin resource"),
        ("/limits/app/tokens", 404, "no admin resource"),
        ("/", 404, "no admin resource"),
        ("/config/extra", 404, "no admin resource"),
    ];
    for (path, status, detail) in cases {
        let r = a.get(path).await;
        assert_eq!(r.status().as_u16(), status, "{path}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{path}"
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["status"], status, "{path}");
        let text = body["detail"].as_str().unwrap();
        assert!(text.contains(detail), "{path}: {text}");
    }
    // Wrong methods: 405 with Allow.
    for (method, path, allow) in [
        ("POST", "/config", "GET"),
        ("DELETE", "/kill-switch", "GET, PUT"),
        ("PUT", "/limits/app/tokens/top", "GET"),
    ] {
        let r = client()
            .request(method.parse().unwrap(), a.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 405, "{method} {path}");
        assert_eq!(r.headers()["allow"], allow);
    }
    // Too many header fields.
    let mut req = client().get(a.url("/config"));
    for i in 0..70 {
        req = req.header(format!("x-h{i}"), "1");
    }
    assert_eq!(req.send().await.unwrap().status().as_u16(), 431);
    // Bad and oversized kill-switch bodies.
    let (status, body) = a.put_kill("maybe").await;
    assert_eq!((status, body["status"].as_u64()), (400, Some(400)));
    let (status, _) = a.put_kill(&"o".repeat(4096)).await;
    assert_eq!(status, 413);
    let (_, k) = a.json("/kill-switch").await;
    assert_eq!(k["kill_switch"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_names_the_heaviest_key_first() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let a = start(&up, false, BUCKET, "").await;
    // Skewed: "heavy" 14 times (10 admitted, 4 rejected), "mid" 3, five others once each.
    for _ in 0..14 {
        a.send("heavy").await;
    }
    for _ in 0..3 {
        assert_eq!(a.send("mid").await, 200);
    }
    for i in 0..5 {
        assert_eq!(a.send(&format!("light{i}")).await, 200);
    }
    let (status, top) = a.json("/limits/app/tokens/top?n=3").await;
    assert_eq!(status, 200, "{top}");
    assert_eq!(top["top_keys"], 5);
    let admitted = top["by_admitted"].as_array().unwrap();
    assert_eq!(admitted.len(), 3, "{top}");
    assert_eq!(admitted[0]["key"], "customer=heavy&host=app.test", "{top}");
    assert_eq!(admitted[0]["admitted"], 10);
    assert_eq!(admitted[1]["key"], "customer=mid&host=app.test", "{top}");
    let rejected = top["by_rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 1, "{top}");
    assert_eq!(rejected[0]["key"], "customer=heavy&host=app.test");
    assert_eq!(rejected[0]["rejected"], 4);
    // The key text can be pasted into /state.
    let key = admitted[0]["key"].as_str().unwrap();
    let (status, s) = a.json(&format!("/limits/app/tokens/state?{key}")).await;
    assert_eq!((status, &s["state"]["tokens"]), (200, &Value::from(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_lets_over_limit_requests_through_and_shows_on_the_gauge() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      tight:\n        kind: token_bucket\n        key: [customer]\n        capacity: 1\n        refill: { amount: 1, every: 1h }\n";
    let a = start(&up, true, limits, "").await;
    assert_eq!(a.send("c").await, 200);
    assert_eq!(a.send("c").await, 429);
    assert_eq!(a.t.metric("tollgate_kill_switch").await, 0.0);
    let (status, k) = a.put_kill("on\n").await;
    assert_eq!(status, 200, "{k}");
    assert_eq!(
        (k["kill_switch"].clone(), k["admin"].clone()),
        (Value::from(true), Value::from(true))
    );
    assert_eq!(a.send("c").await, 200);
    assert_eq!(a.send("c").await, 200);
    assert_eq!(a.t.metric("tollgate_kill_switch").await, 1.0);
    // A reload keeps the admin's setting.
    let before = std::fs::read_to_string(&a.t.config_path).unwrap();
    std::fs::write(&a.t.config_path, format!("{before}\n# touched\n")).unwrap();
    a.t.wait_metric("tollgate_config_reloads_total{result=\"success\"}", 1.0)
        .await;
    assert_eq!(a.send("c").await, 200);
    let (status, k) = a.put_kill("off").await;
    assert_eq!(
        (status, k["kill_switch"].clone()),
        (200, Value::from(false))
    );
    assert_eq!(a.send("c").await, 429);
    assert_eq!(a.t.metric("tollgate_kill_switch").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_token_bucket_and_a_rate_in_redis() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let stores = format!(
        "stores:\n  shared: {{ kind: redis, url: \"{}\", timeout: 250ms }}\n",
        redis.url()
    );
    let limits = "      tokens:\n        kind: token_bucket\n        store: shared\n        key: [customer]\n        capacity: 10\n        refill: { amount: 1, every: 1h }\n      window:\n        kind: rate\n        store: shared\n        key: [customer]\n        max: 100\n        per: 1m\n";
    let a = start(&up, false, limits, &stores).await;
    a.t.wait_metric("tollgate_store_up{store=\"shared\"}", 1.0)
        .await;
    for _ in 0..3 {
        assert_eq!(a.send("acme").await, 200);
    }
    let keys_before = redis.cmd(&["DBSIZE"]);
    let snapshot = redis_snapshot(&redis);
    let (status, s) = a.json("/limits/app/tokens/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["store"], "shared");
    assert_eq!(s["state"]["tokens"], 7, "{s}");
    assert_eq!(s["state"]["store"], "shared");
    let (_, s) = a.json("/limits/app/tokens/state?customer=nobody").await;
    assert_eq!(s["state"]["tokens"], 10, "{s}");
    // Read-only: no key was created by the reads.
    assert_eq!(redis.cmd(&["DBSIZE"]), keys_before);
    // The shared rate counted the same 3 requests in its current window (a minute).
    let (status, s) = a.json("/limits/app/window/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "rate");
    assert_eq!(s["state"]["store"], "shared");
    let (prev, curr) = (&s["state"]["previous"], &s["state"]["current"]);
    // The minute may turn between the requests and the read: 3 in all, either side.
    assert_eq!(prev.as_u64().unwrap() + curr.as_u64().unwrap(), 3, "{s}");
    let estimate = s["state"]["estimate"].as_f64().unwrap();
    assert!(estimate > 0.0 && estimate <= 3.0, "{s}");
    if prev == 0 {
        assert_eq!(estimate, 3.0, "{s}");
    }
    assert_eq!(s["state"]["max"], 100);
    assert_eq!(s["state"]["per_ms"], 60_000.0);
    let (_, s) = a.json("/limits/app/window/state?customer=nobody").await;
    assert_eq!(s["state"]["estimate"], 0.0, "{s}");
    assert_eq!(s["state"]["current"], 0, "{s}");
    assert_eq!(redis.cmd(&["DBSIZE"]), keys_before);
    assert_eq!(redis_snapshot(&redis), snapshot);
    state_is_503_when_redis_is_frozen(&a, &mut redis, "window").await;
}

/// Every key in `redis` with its `DUMP` (type, value and members), in key order: a read
/// that created, changed or deleted any key changes this.
fn redis_snapshot(redis: &RedisServer) -> Vec<(Vec<u8>, redis::Value)> {
    let redis::Value::Array(keys) = redis.cmd(&["KEYS", "*"]) else {
        panic!("KEYS *");
    };
    let mut out: Vec<(Vec<u8>, redis::Value)> = keys
        .into_iter()
        .map(|k| {
            let redis::Value::BulkString(k) = k else {
                panic!("a key: {k:?}");
            };
            let name = String::from_utf8(k.clone()).unwrap();
            (k, redis.cmd(&["DUMP", &name]))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A tollgate with `limits` in a Redis store named `shared` (a 250 ms budget, `options`
/// more of the store's settings).
async fn start_shared(redis: &RedisServer, up: &Upstream, limits: &str, options: &str) -> Admin {
    let stores = format!(
        "stores:\n  shared: {{ kind: redis, url: \"{}\", timeout: 250ms{options} }}\n",
        redis.url()
    );
    let a = start(up, false, limits, &stores).await;
    a.t.wait_metric("tollgate_store_up{store=\"shared\"}", 1.0)
        .await;
    a
}

/// A frozen Redis (SIGSTOP) makes `/state` of `limit` a 503 problem within the store's
/// budget, not a hang (the client gives up after its own timeout, far longer).
async fn state_is_503_when_redis_is_frozen(a: &Admin, redis: &mut RedisServer, limit: &str) {
    redis.freeze();
    let r = a
        .get(&format!("/limits/app/{limit}/state?customer=acme"))
        .await;
    redis.thaw();
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    let body: Value = r.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains("Redis store"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_sliding_log_in_redis_counts_each_window() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      caps:\n        kind: sliding_log\n        store: shared\n        key: [customer]\n        windows: [{ max: 4, per: 1h }, { max: 100, per: 1d }]\n";
    let a = start_shared(&redis, &up, limits, "").await;
    // 4 admitted, 2 rejected (a rejection records nothing).
    let statuses: Vec<u16> = sends(&a, "acme", 6).await;
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
    let before = redis_snapshot(&redis);
    assert!(!before.is_empty(), "the log is in Redis");
    let (status, s) = a.json("/limits/app/caps/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "sliding_log");
    assert_eq!(s["store"], "shared");
    assert_eq!(s["state"]["store"], "shared");
    let w = &s["state"]["windows"];
    assert_eq!(w[0]["count"], 4, "{s}");
    assert_eq!(w[0]["max"], 4, "{s}");
    assert_eq!(w[0]["per_ms"], 3_600_000.0, "{s}");
    assert_eq!(w[1]["count"], 4, "{s}");
    assert_eq!(w[1]["max"], 100, "{s}");
    let (_, s) = a.json("/limits/app/caps/state?customer=nobody").await;
    assert_eq!(s["state"]["windows"][0]["count"], 0, "{s}");
    assert_eq!(s["state"]["windows"][1]["count"], 0, "{s}");
    // Read-only: every key and its content are as before the reads.
    assert_eq!(redis_snapshot(&redis), before);
    state_is_503_when_redis_is_frozen(&a, &mut redis, "caps").await;
}

/// `n` requests for `customer` through the proxy, one after another; their statuses.
async fn sends(a: &Admin, customer: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(a.send(customer).await);
    }
    out
}

/// The one key of `redis` whose name ends with `suffix`.
fn redis_key_ending(redis: &RedisServer, suffix: &str) -> String {
    let redis::Value::Array(keys) = redis.cmd(&["KEYS", &format!("*{suffix}")]) else {
        panic!("KEYS");
    };
    assert_eq!(keys.len(), 1, "{keys:?}");
    let redis::Value::BulkString(k) = &keys[0] else {
        panic!("a key: {keys:?}");
    };
    String::from_utf8(k.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_concurrency_in_redis_counts_live_holders_only() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      seats:\n        kind: concurrency\n        store: shared\n        key: [customer]\n        max: 10\n";
    // A lease of an hour: no renewal rewrites the leases between the snapshots.
    let a = start_shared(&redis, &up, limits, ", lease: 1h").await;
    // Three requests held open by the upstream hold three copies.
    let holds = hold(&a, &up, "acme", 3).await;
    // Another holder of the fleet: one live copy, and five of a holder whose lease ended
    // (dead: the acquire script would drop them, so the read must not count them).
    let counts = redis_key_ending(&redis, ":cc");
    let leases = redis_key_ending(&redis, ":cl");
    redis.cmd(&["HSET", &counts, "other#1", "1", "dead#1", "5"]);
    redis.cmd(&[
        "ZADD",
        &leases,
        "99999999999999999",
        "other#1",
        "1",
        "dead#1",
    ]);
    let before = redis_snapshot(&redis);
    let (status, s) = a.json("/limits/app/seats/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "concurrency");
    assert_eq!(s["state"]["store"], "shared");
    assert_eq!(s["state"]["held"], 4, "3 here and 1 live elsewhere: {s}");
    assert_eq!(s["state"]["held_here"], 3, "{s}");
    assert_eq!(s["state"]["max"], 10);
    let (_, s) = a.json("/limits/app/seats/state?customer=nobody").await;
    assert_eq!(s["state"]["held"], 0, "{s}");
    assert_eq!(s["state"]["held_here"], 0, "{s}");
    // Read-only: the dead holder is still there, every key as it was.
    assert_eq!(redis_snapshot(&redis), before);
    state_is_503_when_redis_is_frozen(&a, &mut redis, "seats").await;
    release(&up, holds).await;
}

/// Limit `search` (for an origin's `limits:`): tiers of 2 and 3 an hour, a hard limit of 100
/// and a global one of 1000; `store` is an indented `store:` line, or empty.
fn tiered(store: &str) -> String {
    format!(
        "      search:\n        kind: tiered\n{store}        key: [customer]\n        hard_limit: 100\n        global_limit: 1000\n        tiers:\n          - {{ limit: 2, window: 1h, active: 1h, cooldown: 0s }}\n          - {{ limit: 3, window: 1h, active: 1h, cooldown: 0s }}\n"
    )
}

/// A new key of [`tiered`] is at tier 0 with both tiers' room; then four requests: two fill
/// tier 1, the third bursts into tier 2, the fourth stays there.
async fn burst_into_tier_2(a: &Admin) {
    let (status, s) = a.json("/limits/app/search/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["state"]["current_tier"], 0, "a new key: {s}");
    assert_eq!(s["state"]["available"], 5, "both tiers reachable: {s}");
    assert_eq!(sends(a, "acme", 4).await, [200, 200, 200, 200]);
}

/// The `/state` answer `s` after [`burst_into_tier_2`], and another key still at tier 0.
async fn assert_tier_2_after_the_burst(a: &Admin, s: &Value) {
    let st = &s["state"];
    assert_eq!(st["current_tier"], 2, "{s}");
    assert_eq!(st["available"], 1, "tier 2 holds 2 of 3: {s}");
    assert_eq!(st["tiers"][0]["count"], 2, "{s}");
    assert_eq!(st["tiers"][0]["phase"], "active", "{s}");
    assert_eq!(st["tiers"][0]["limit"], 2, "{s}");
    assert_eq!(st["tiers"][0]["window_ms"], 3_600_000.0, "{s}");
    assert_eq!(st["tiers"][1]["count"], 2, "{s}");
    assert_eq!(st["tiers"][1]["phase"], "active", "{s}");
    assert_eq!(st["tiers"][1]["limit"], 3, "{s}");
    assert_eq!(st["hard"]["count"], 4, "{s}");
    assert_eq!(st["hard"]["limit"], 100, "{s}");
    // The global second may have turned since: at most the 4 admissions are counted.
    let room = st["global_room"].as_u64().unwrap();
    assert!((996..=1000).contains(&room), "{s}");
    let (_, s) = a.json("/limits/app/search/state?customer=nobody").await;
    assert_eq!(s["state"]["current_tier"], 0, "{s}");
    assert_eq!(s["state"]["tiers"][0]["count"], 0, "{s}");
    assert_eq!(s["state"]["tiers"][0]["phase"], "inactive", "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_tiered_limit_in_redis_shows_the_tiers_a_burst_entered() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let a = start_shared(&redis, &up, &tiered("        store: shared\n"), "").await;
    burst_into_tier_2(&a).await;
    // The global count's key lives 2 s: left out, lest it expire between the snapshots
    // on a slow machine.
    let lasting = |redis: &RedisServer| {
        let mut keys = redis_snapshot(redis);
        keys.retain(|(k, _)| !k.ends_with(b":tg"));
        keys
    };
    let before = lasting(&redis);
    assert!(
        before.len() >= 4,
        "state, 2 tier logs, hard log: {before:?}"
    );
    let (status, s) = a.json("/limits/app/search/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "tiered");
    let st = &s["state"];
    assert_eq!(st["store"], "shared");
    assert_tier_2_after_the_burst(&a, &s).await;
    // Read-only: no tier entered, no hit logged, every key as it was.
    assert_eq!(lasting(&redis), before);
    state_is_503_when_redis_is_frozen(&a, &mut redis, "search").await;
}

/// `n` requests for `customer` held open by the upstream (`/hold`), returned once it holds
/// them all; each task ends with the request's status (0 if it failed).
async fn hold(
    a: &Admin,
    up: &Upstream,
    customer: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<u16>> {
    let before = up.held();
    let url = a.t.url("/hold");
    let holds = (0..n)
        .map(|_| {
            let (url, customer) = (url.clone(), customer.to_string());
            tokio::spawn(async move {
                client()
                    .get(url)
                    .header("host", "app.test")
                    .header("x-customer", customer)
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16())
            })
        })
        .collect();
    eventually("the upstream holds the requests", 250, || async {
        up.held() == before + n
    })
    .await;
    holds
}

/// Lets the upstream answer the held requests; each is admitted.
async fn release(up: &Upstream, holds: Vec<tokio::task::JoinHandle<u16>>) {
    up.release();
    for h in holds {
        assert_eq!(h.await.unwrap(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_local_inflight_and_concurrency_counts_held_requests() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      conc:\n        kind: inflight\n        key: [customer]\n        max: 10\n      seats:\n        kind: concurrency\n        key: [customer]\n        max: 10\n";
    let a = start(&up, false, limits, "").await;
    let (status, s) = a.json("/limits/app/conc/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "inflight");
    assert_eq!(s["store"], "local");
    assert_eq!(s["state"]["estimate"], 0, "{s}");
    let holds = hold(&a, &up, "acme", 3).await;
    let (status, s) = a.json("/limits/app/conc/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    // A count-min estimate is never below the true count; with one key in the sketch it
    // is exact.
    assert_eq!(s["state"]["estimate"], 3, "{s}");
    assert_eq!(s["state"]["max"], 10);
    let (status, s) = a.json("/limits/app/seats/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "concurrency");
    assert_eq!(s["store"], "local");
    assert_eq!(s["state"]["held"], 3, "{s}");
    assert_eq!(s["state"]["max"], 10);
    let (_, s) = a.json("/limits/app/seats/state?customer=nobody").await;
    assert_eq!(s["state"]["held"], 0, "{s}");
    // Reading released nothing.
    let (_, s) = a.json("/limits/app/seats/state?customer=acme").await;
    assert_eq!(s["state"]["held"], 3, "{s}");
    release(&up, holds).await;
    eventually("both counts back at 0", 250, || async {
        let (_, c) = a.json("/limits/app/conc/state?customer=acme").await;
        let (_, s) = a.json("/limits/app/seats/state?customer=acme").await;
        c["state"]["estimate"] == 0 && s["state"]["held"] == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_local_sliding_log_counts_each_window() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      caps:\n        kind: sliding_log\n        key: [customer]\n        windows: [{ max: 4, per: 1h }, { max: 100, per: 1d }]\n";
    let a = start(&up, false, limits, "").await;
    // 4 admitted, 2 rejected (a rejection records nothing).
    assert_eq!(sends(&a, "acme", 6).await, [200, 200, 200, 200, 429, 429]);
    assert_eq!(sends(&a, "other", 1).await, [200]);
    let (status, s) = a.json("/limits/app/caps/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "sliding_log");
    assert_eq!(s["store"], "local");
    let w = &s["state"]["windows"];
    assert_eq!(w.as_array().unwrap().len(), 2, "{s}");
    assert_eq!(w[0]["count"], 4, "{s}");
    assert_eq!(w[0]["max"], 4, "{s}");
    assert_eq!(w[0]["per_ms"], 3_600_000.0, "{s}");
    assert_eq!(w[1]["count"], 4, "{s}");
    assert_eq!(w[1]["max"], 100, "{s}");
    assert_eq!(w[1]["per_ms"], 86_400_000.0, "{s}");
    let (_, s) = a.json("/limits/app/caps/state?customer=other").await;
    assert_eq!(s["state"]["windows"][0]["count"], 1, "{s}");
    assert_eq!(s["state"]["windows"][1]["count"], 1, "{s}");
    let (_, s) = a.json("/limits/app/caps/state?customer=nobody").await;
    assert_eq!(s["state"]["windows"][0]["count"], 0, "{s}");
    // Reading logged nothing.
    let (_, s) = a.json("/limits/app/caps/state?customer=acme").await;
    assert_eq!(s["state"]["windows"][1]["count"], 4, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_local_tiered_limit_shows_the_tier_a_burst_entered() {
    let up = Upstream::start("127.0.0.1", "up").await;
    let a = start(&up, false, &tiered(""), "").await;
    burst_into_tier_2(&a).await;
    let (status, s) = a.json("/limits/app/search/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "tiered");
    assert_eq!(s["store"], "local");
    let st = &s["state"];
    // The same fields as a tiered limit in Redis shows.
    assert_eq!(st["tiers"].as_array().unwrap().len(), 2, "{s}");
    assert_eq!(st["tiers"][0]["tier"], 1, "{s}");
    assert_eq!(st["tiers"][1]["tier"], 2, "{s}");
    assert_tier_2_after_the_burst(&a, &s).await;
    // Reading entered no tier and logged nothing.
    let (_, again) = a.json("/limits/app/search/state?customer=acme").await;
    assert_eq!(again["state"]["tiers"], st["tiers"], "{again}");
    assert_eq!(again["state"]["available"], 1, "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_an_inflight_in_redis_counts_live_holders_only() {
    let mut redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = "      conc:\n        kind: inflight\n        store: shared\n        key: [customer]\n        max: 10\n";
    // A lease of an hour: no renewal rewrites the leases between the snapshots.
    let a = start_shared(&redis, &up, limits, ", lease: 1h").await;
    let (status, s) = a.json("/limits/app/conc/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["state"]["in_flight"], 0, "{s}");
    let holds = hold(&a, &up, "acme", 3).await;
    // Another instance of the fleet: two live units, and four of an instance whose lease
    // ended (dead: the read must not count them).
    let counts = redis_key_ending(&redis, ":ic");
    let leases = redis_key_ending(&redis, ":il");
    redis.cmd(&["HSET", &counts, "other", "2", "dead", "4"]);
    redis.cmd(&["ZADD", &leases, "99999999999999999", "other", "1", "dead"]);
    let before = redis_snapshot(&redis);
    let (status, s) = a.json("/limits/app/conc/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["kind"], "inflight");
    assert_eq!(s["store"], "shared");
    assert_eq!(s["state"]["store"], "shared");
    assert_eq!(
        s["state"]["in_flight"], 5,
        "3 here and 2 live elsewhere: {s}"
    );
    assert_eq!(s["state"]["max"], 10);
    let (_, s) = a.json("/limits/app/conc/state?customer=nobody").await;
    assert_eq!(s["state"]["in_flight"], 0, "{s}");
    // Read-only: the dead instance is still there, every key as it was.
    assert_eq!(redis_snapshot(&redis), before);
    state_is_503_when_redis_is_frozen(&a, &mut redis, "conc").await;
    release(&up, holds).await;
    eventually("this instance's units given back", 250, || async {
        let (_, s) = a.json("/limits/app/conc/state?customer=acme").await;
        s["state"]["in_flight"] == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_a_leased_inflight_key_leaves_out_its_free_block_slots() {
    let redis = RedisServer::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    // Hot from 5 acquisitions a second; a block of up to half the limit; never idle.
    let limits = "      conc:\n        kind: inflight\n        store: shared\n        key: [customer]\n        max: 20\n        lease: { hot_above: 5/s, max_share: 50%, idle: 1h }\n";
    let a = start_shared(&redis, &up, limits, ", lease: 1h").await;
    let leased = "tollgate_store_leased{limit=\"conc\",origin=\"app\",store=\"shared\"}";
    let mut sent = 0;
    while a.t.metric(leased).await == 0.0 {
        assert_eq!(a.send("acme").await, 200);
        sent += 1;
        assert!(sent < 2_000, "no block after {sent} requests");
    }
    // No request in flight: Redis counts the block's free slots, /state does not.
    let (status, s) = a.json("/limits/app/conc/state?customer=acme").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["state"]["in_flight"], 0, "{s}");
    let free = s["state"]["leased_here"].as_u64().unwrap();
    assert!(free > 0, "{s}");
}
