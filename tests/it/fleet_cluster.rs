//! Shared limits on a local three-node Redis Cluster through the real binary: two
//! instances share one bucket exactly, and a key whose slot migrates to another node
//! (`CLUSTER SETSLOT` IMPORTING/MIGRATING, `MIGRATE`, `SETSLOT NODE`) while traffic runs
//! keeps working: no 5xx, failing open at worst, and its state moves with it. And a
//! primary frozen under traffic, replaced by its replica (`CLUSTER FAILOVER TAKEOVER`):
//! no 5xx, fail open meanwhile, and Redis decides again from the replicated state.

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::fleet;
use crate::common::redis as harness;

use std::time::Duration;

use common::{eventually, Tollgate, Upstream};
use fleet::{
    assert_no_5xx_within, bucket, burst, config_at, fleet, no_fallback, status, Traffic, EXACT,
    ROOMY, SHARED,
};
use harness::{RedisCluster, RedisServer};

fn target(cluster: &RedisCluster) -> String {
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    format!("urls: [{}]\n    cluster: true", urls.join(", "))
}

fn text(v: redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
        redis::Value::SimpleString(s) => s,
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("not text: {other:?}"),
    }
}

/// The names of the keys on `node` that match `pattern`.
fn keys(node: &RedisServer, pattern: &str) -> Vec<String> {
    match node.cmd(&["KEYS", pattern]) {
        redis::Value::Array(keys) => keys.into_iter().map(text).collect(),
        other => panic!("KEYS: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_one_bucket_on_a_cluster_exactly() {
    const C: usize = 20;
    let cluster = RedisCluster::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let all = fleet(
        2,
        &config_at(up.addr, &target(&cluster), ROOMY, &bucket(C as u64, EXACT)),
    )
    .await;
    // Several customers, so that their keys land on different nodes.
    for who in ["acme", "globex", "initech", "umbrella", "hooli"] {
        let statuses = burst(&all, who, C).await;
        let ok = statuses.iter().filter(|s| **s == 200).count();
        assert_eq!(ok, C, "{who}: admitted {ok} of {C}");
        assert!(statuses.iter().all(|s| *s == 200 || *s == 429));
    }
    no_fallback(&all).await;
    let per_node: Vec<usize> = cluster
        .nodes
        .iter()
        .map(|n| keys(n, "tollgate:app:tokens:*").len())
        .collect();
    assert_eq!(per_node.iter().sum::<usize>(), 5, "{per_node:?}");
    assert!(
        per_node.iter().filter(|n| **n > 0).count() >= 2,
        "all keys on one node: {per_node:?}"
    );
}

/// A roomy shared bucket for the traffic, where customer `drained` has 2 tokens (one an
/// hour).
fn roomy_but_drained() -> String {
    format!(
        "{}        overrides:\n          - match: {{ customer: drained }}\n            capacity: 2\n",
        bucket(1_000_000, SHARED)
    )
}

/// Takes `drained`'s two tokens; the third request is refused (by Redis).
async fn drain(t: &Tollgate) {
    assert_eq!(status(t, "drained").await, 200);
    assert_eq!(status(t, "drained").await, 200);
    assert_eq!(status(t, "drained").await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_whose_slot_migrates_keeps_working_and_keeps_its_state() {
    let cluster = RedisCluster::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = roomy_but_drained();
    let store =
        "timeout: 500ms\n    breaker: { failures: 3, probe_every: 50ms }\n    fallback: allow";
    let all = fleet(1, &config_at(up.addr, &target(&cluster), store, &limits)).await;
    let t = &all[0];
    drain(t).await;
    // Where the drained key lives.
    let (src, key) = cluster
        .nodes
        .iter()
        .enumerate()
        .find_map(|(i, n)| {
            keys(n, "tollgate:app:tokens:o0:*")
                .into_iter()
                .next()
                .map(|k| (i, k))
        })
        .expect("the drained key in some node");
    let dst = (src + 1) % 3;
    let slot = cluster.keyslot(&key).to_string();
    let id = |i: usize| text(cluster.nodes[i].cmd(&["CLUSTER", "MYID"]));
    let (src_id, dst_id) = (id(src), id(dst));
    let (s, d) = (&cluster.nodes[src], &cluster.nodes[dst]);

    // Traffic on the drained key itself while its slot moves.
    let load = Traffic::start(&[t.url("/")], "drained", 2, Duration::from_secs(30));
    load.more(20).await;
    d.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]);
    s.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]);
    load.more(20).await;
    let port = d.port().to_string();
    s.cmd(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", &key]);
    // Between MIGRATE and SETSLOT NODE the source answers ASK.
    load.more(20).await;
    for n in &cluster.nodes {
        n.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
    }
    load.more(20).await;
    // The key moved with its state: still drained, decided by Redis on the new node.
    assert_eq!(keys(d, &key), vec![key.clone()]);
    assert!(keys(s, &key).is_empty());
    eventually("decisions back on Redis after the move", 200, || async {
        t.metric(fleet::UP).await == 1.0
    })
    .await;
    let before = t.metric(fleet::FALLBACK).await;
    assert_eq!(status(t, "drained").await, 429);
    assert_eq!(t.metric(fleet::FALLBACK).await, before);
    let seen = load.stop().await;
    assert_no_5xx_within(
        &seen,
        Duration::from_millis(500),
        Duration::from_millis(500),
        "slot migration",
    );
    // Fail open at worst: some answers may be 200 by the fallback, the rest are 429.
    assert!(seen.iter().all(|s| s.status == 200 || s.status == 429));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_frozen_under_traffic_fails_over_to_its_replica() {
    const BUDGET: Duration = Duration::from_millis(100);
    let mut cluster = RedisCluster::start_replicated();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = roomy_but_drained();
    let store =
        "timeout: 100ms\n    breaker: { failures: 3, probe_every: 50ms }\n    fallback: allow\n    deny_cache: 0";
    let all = fleet(1, &config_at(up.addr, &target(&cluster), store, &limits)).await;
    let t = &all[0];
    drain(t).await;
    // The primary that holds the drained key, and its replica, once the key reached it.
    let (primary, key) = (0..cluster.nodes.len())
        .filter(|&i| cluster.is_primary(i))
        .find_map(|i| {
            keys(&cluster.nodes[i], "tollgate:app:tokens:o0:*")
                .into_iter()
                .next()
                .map(|k| (i, k))
        })
        .expect("the drained key on some primary");
    let replica = cluster.replica_of(primary).expect("a replica");
    eventually("the key replicated", 200, || async {
        keys(&cluster.nodes[replica], &key) == vec![key.clone()]
    })
    .await;

    // Traffic on the drained key itself and on a roomy one; then the primary freezes.
    let load = Traffic::start(&[t.url("/")], "drained", 2, Duration::from_secs(60));
    let roomy = Traffic::start(&[t.url("/")], "roomy", 1, Duration::from_secs(60));
    load.more(20).await;
    let fallback_before = t.metric(fleet::FALLBACK).await;
    cluster.nodes[primary].freeze();
    // Fail open: each decision on the frozen node misses its budget and the fallback
    // (`allow`) admits the drained key. (The breaker need not open: the roomy key's node
    // answers, so failures are not consecutive.)
    load.more(20).await;
    assert!(t.metric(fleet::FALLBACK).await > fallback_before);
    assert_eq!(status(t, "drained").await, 200, "fail open while frozen");
    // The replica takes over without the frozen primary's agreement.
    cluster.nodes[replica].cmd(&["CLUSTER", "FAILOVER", "TAKEOVER"]);
    eventually("the replica is a primary", 200, || async {
        cluster.is_primary(replica)
    })
    .await;
    // Redis decides again, from the replicated state: still drained.
    eventually("Redis decides the drained key again", 500, || async {
        t.metric(fleet::UP).await == 1.0 && status(t, "drained").await == 429
    })
    .await;
    // (The fallback, `allow`, never rejects, and there is no deny cache: a 429 is Redis's.
    // A decision a loaded machine makes after its budget falls back, so it is asked again.)
    load.more(20).await;
    let mut tries = 0;
    while status(t, "drained").await != 429 {
        tries += 1;
        assert!(tries < 50, "Redis stopped deciding:\n{}", t.log_text());
    }
    let mut seen = load.stop().await;
    seen.extend(roomy.stop().await);
    // The deadline is generous: a request may wait out the budget once per call the
    // breaker needs to open, on a debug build on a busy machine (as in fleet_faults: it
    // catches a hang).
    assert_no_5xx_within(&seen, BUDGET, Duration::from_secs(3), "failover");
    assert!(seen.iter().all(|s| s.status == 200 || s.status == 429));
    cluster.nodes[primary].thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_logs_tiers_and_concurrency_on_a_cluster() {
    let cluster = RedisCluster::start();
    let up = Upstream::start("127.0.0.1", "up").await;
    let limits = format!(
        "      caps:
        kind: sliding_log
        key: [customer]
        windows: [{{ max: 4, per: 1d }}]
{SHARED}      tiers:
        kind: tiered
        key: [customer]
        global_limit: 1000
        tiers:
          - {{ limit: 1000, window: 1m, active: 1h, cooldown: 0s }}
{SHARED}      slots:
        kind: concurrency
        key: [header:x-slot]
        max: 10
        global: 3
        groups:
          - {{ name: big, members: {{ customer: [bigco] }}, max: 1 }}
{SHARED}"
    );
    let all = fleet(2, &config_at(up.addr, &target(&cluster), ROOMY, &limits)).await;
    // The cap is shared exactly, for keys on every node.
    for who in ["acme", "globex", "initech", "umbrella"] {
        let statuses = burst(&all, who, 4).await;
        let ok = statuses.iter().filter(|s| **s == 200).count();
        assert_eq!(ok, 4, "{who}: {statuses:?}");
    }
    // Concurrency (keyed by `x-slot`, so the burst above skipped it): the key's counter
    // and the limit's (global, group) are in different slots, decided in one round trip;
    // the group and the global limit hold fleet-wide.
    let send = |i: usize, path: &str, who: &str| {
        let (url, who) = (all[i].url(path), who.to_string());
        async move {
            common::client()
                .get(url)
                .header("host", "app.test")
                .header("x-customer-id", &who)
                .header("x-slot", &who)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .ok()
        }
    };
    let hold = |i: usize, who: &str| tokio::spawn(send(i, "/hold", who));
    let status = |i: usize, who: &str| {
        let f = send(i, "/", who);
        async move { f.await.unwrap_or(0) }
    };
    let holds = vec![hold(0, "bigco"), hold(1, "hooli")];
    eventually("2 held", 500, || async { up.held() == 2 }).await;
    assert_eq!(status(1, "bigco").await, 503, "the group, fleet-wide");
    let third = hold(1, "pied");
    eventually("3 held", 500, || async { up.held() == 3 }).await;
    assert_eq!(status(0, "other").await, 503, "the global limit");
    up.release();
    for h in holds.into_iter().chain([third]) {
        assert_eq!(h.await.unwrap(), Some(200));
    }
    eventually("copies given back", 200, || async {
        status(0, "other").await == 200
    })
    .await;
    no_fallback(&all).await;
}
