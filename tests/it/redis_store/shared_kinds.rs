//! The shared sliding log, tiered and concurrency limiters around their scripts: the
//! fallback modes at this instance's share, faults within the budget, renewals repairing
//! Redis after it lost everything, and Redis Cluster (the key's and the variant's counters
//! in different slots).

use super::*;
use tollgate::limits::concurrency::Limit;
use tollgate::limits::sliding_log::LogWindow;
use tollgate::limits::tiered::{DecidedBy, Tier, TieredParams};
use tollgate::limits::{ConcurrencyParams, TieredLimiter};
use tollgate::store::{
    CounterKeys, LogTicket, SharedConcurrency, SharedSlidingLog, SharedTiered, StateKind,
};

fn caps() -> Vec<LogWindow> {
    vec![
        LogWindow { max: 3, per: DAY },
        LogWindow {
            max: 10,
            per: 7 * DAY,
        },
    ]
}

fn tiers(global: Option<u64>) -> TieredParams {
    let t = |limit, cooldown| Tier {
        limit,
        window: SEC,
        active: 10 * SEC,
        cooldown,
        skippable: false,
    };
    TieredParams {
        tiers: vec![t(6, 0), t(3, 10 * SEC)],
        hard_limit: None,
        global_limit: global,
    }
}

fn conc(max: u64, global: Option<u64>, groups: &[u64]) -> ConcurrencyParams {
    ConcurrencyParams {
        max,
        global,
        groups: groups.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallbacks_decide_at_this_instances_share() {
    let port = harness::free_port();
    let down = |fallback: Fallback| {
        let mut c = standalone(&format!("redis://127.0.0.1:{port}/0"));
        c.tuning.fallback = fallback;
        c.tuning.instances = 3;
        start(c).0
    };
    let store = down(Fallback::Local);
    // Sliding log: ⌈3 / 3⌉ a day here.
    let log = SharedSlidingLog::new(&store, names(&store, "log"), &caps(), 100, 64).unwrap();
    let d = log.acquire(1, 1, 0).await;
    assert_eq!((d.source, d.verdict.allowed), (Source::Fallback, true));
    assert!(matches!(d.ticket, LogTicket::Local(0)));
    assert!(!log.acquire(1, 1, SEC).await.verdict.allowed);
    // A fallback admission is refunded locally.
    log.refund(1, &d);
    assert!(log.acquire(1, 1, 2 * SEC).await.verdict.allowed);
    // A partial grant from the local share: [1, 5] grants 1.
    let d = log.acquire_at(2, 1, 5, 0, None).await;
    assert_eq!((d.verdict.allowed, d.granted), (true, 1));
    // Tiered: tiers of ⌈6 / 3⌉ and ⌈3 / 3⌉.
    let t = SharedTiered::new(&store, names(&store, "tiers"), &tiers(None), 100).unwrap();
    let got: Vec<(bool, usize)> = futures_join((0..4).map(|_| t.acquire(1, 0)))
        .await
        .into_iter()
        .map(|d| (d.decision.verdict.allowed, d.decision.tier))
        .collect();
    assert_eq!(got, [(true, 1), (true, 1), (true, 2), (false, 2)]);
    assert_eq!(
        (t.entries(1), t.entries(2)),
        (1, 1),
        "the fallback's entries"
    );
    // Concurrency: ⌈6 / 3⌉ per key, the group's ⌈4 / 3⌉.
    let c = SharedConcurrency::new(
        &store,
        names(&store, "conc"),
        conc(6, None, &[4]),
        &["g"],
        100,
    )
    .unwrap();
    let a = c.acquire(1, 0, 1).await;
    assert_eq!(a.source, Source::Fallback);
    let b = c.acquire(1, 0, 1).await.value.unwrap();
    let r = c.acquire(1, 0, 1).await.value.err().unwrap();
    assert_eq!((r.limit, r.max), (Limit::Key, 2));
    let g1 = c.acquire(2, 1, 1).await.value.unwrap();
    let g2 = c.acquire(2, 1, 1).await.value.unwrap();
    assert_eq!(
        c.acquire(3, 1, 1).await.value.err().unwrap().limit,
        Limit::Group(0)
    );
    assert_eq!((c.in_use_here(), c.group_in_use_here(0)), (4, 2));
    drop((a, b, g1, g2));
    assert_eq!((c.in_use_here(), c.group_in_use_here(0)), (0, 0));
    assert!(
        c.acquire(1, 1, 1).await.value.is_ok(),
        "given back to the fallback"
    );
    // Allow: everything passes; deny: nothing, retry after one probe interval.
    let store = down(Fallback::Allow);
    let log = SharedSlidingLog::new(&store, names(&store, "log"), &caps(), 100, 0).unwrap();
    let t = SharedTiered::new(&store, names(&store, "tiers"), &tiers(None), 100).unwrap();
    let c = SharedConcurrency::new(&store, names(&store, "conc"), conc(1, None, &[]), &[], 100)
        .unwrap();
    let mut guards = Vec::new();
    for _ in 0..5 {
        assert!(log.acquire(1, 1, 0).await.verdict.allowed);
        assert!(t.acquire(1, 0).await.decision.verdict.allowed);
        guards.push(c.acquire(1, 0, 1).await.value.unwrap());
    }
    let store = down(Fallback::Deny);
    let log = SharedSlidingLog::new(&store, names(&store, "log"), &caps(), 100, 0).unwrap();
    let t = SharedTiered::new(&store, names(&store, "tiers"), &tiers(None), 100).unwrap();
    let c = SharedConcurrency::new(&store, names(&store, "conc"), conc(1, None, &[]), &[], 100)
        .unwrap();
    assert_eq!(
        log.acquire(1, 1, 0).await.verdict,
        Verdict::reject(0, 0, 50 * MS)
    );
    assert_eq!(
        t.acquire(1, 0).await.decision.verdict,
        Verdict::reject(0, 0, 50 * MS)
    );
    assert!(c.acquire(1, 0, 1).await.value.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_each_decision_at_most_its_budget() {
    let mut redis = RedisServer::start();
    let (store, metrics) = start_up(fast(&redis.url())).await;
    let log = SharedSlidingLog::new(&store, names(&store, "log"), &caps(), 100, 0).unwrap();
    let t = SharedTiered::new(&store, names(&store, "tiers"), &tiers(Some(100)), 100).unwrap();
    let c = SharedConcurrency::new(
        &store,
        names(&store, "conc"),
        conc(5, Some(50), &[10]),
        &["g"],
        100,
    )
    .unwrap();
    redis.freeze();
    let mut guards = Vec::new();
    for key in 0..10 {
        let started = Instant::now();
        let d = log.acquire(key, 1, 0).await;
        assert!(d.verdict.allowed && d.source == Source::Fallback);
        let d = t.acquire(key, 0).await;
        assert!(d.decision.verdict.allowed && d.source == Source::Fallback);
        let o = c.acquire(key, 1, 1).await;
        assert_eq!(o.source, Source::Fallback);
        guards.push(o.value.unwrap());
        let took = started.elapsed();
        assert!(
            took < 3 * (store.config().tuning.timeout + SLACK),
            "three decisions took {took:?}"
        );
    }
    assert!(!store.is_up(), "the breaker opened");
    assert_eq!(metrics.fallback.get(), 30);
    // Dropping guards admitted by the fallback while Redis is frozen never waits.
    let started = Instant::now();
    drop(guards);
    assert!(started.elapsed() < Duration::from_millis(50));
    redis.thaw();
    assert!(store.wait_up(Duration::from_secs(3)).await);
    assert_eq!(log.acquire(99, 1, 0).await.source, Source::Store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_renewals_repair_redis_from_the_local_counts() {
    let mut redis = RedisServer::start();
    let mut config = standalone(&redis.url());
    config.tuning.lease = Duration::from_millis(600);
    let (store, _) = start_up(config).await;
    let n = names(&store, "conc");
    let c =
        SharedConcurrency::new(&store, n.clone(), conc(10, Some(20), &[5]), &["g"], 100).unwrap();
    let mut guards = Vec::new();
    for _ in 0..3 {
        guards.push(c.acquire(9, 1, 1).await.value.unwrap());
    }
    // Redis loses everything; the copies are still held here, and one more is admitted
    // by the fallback.
    redis.kill();
    let o = c.acquire(9, 1, 1).await;
    assert_eq!(o.source, Source::Fallback);
    guards.push(o.value.unwrap());
    redis.restart();
    assert!(store.wait_up(Duration::from_secs(3)).await);
    // Within a renewal interval (200 ms) Redis holds the local truth: 4 copies of the key,
    // of the global count and of the group's.
    let want = [
        (CounterKeys::of_key(&n, 9).counts, 4),
        (CounterKeys::global(&n).counts, 4),
        (CounterKeys::group(&n, "g").counts, 4),
    ];
    super::concurrency::agree_for(&redis, &want, "repaired", Duration::from_secs(2)).await;
    drop(guards);
    let zero = want.map(|(k, _)| (k, 0));
    super::concurrency::agree_for(&redis, &zero, "released", Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_loses_its_copies_after_one_lease() {
    let redis = RedisServer::start();
    let mut config = standalone(&redis.url());
    config.tuning.lease = Duration::from_millis(600);
    let (store, _) = start_up(config).await;
    let n = names(&store, "conc");
    let l = SharedConcurrency::new(&store, n.clone(), conc(3, Some(3), &[]), &[], 100).unwrap();
    // Another instance took 3 copies, then died: it never renews them (the binary-level
    // test kills a real process; here its last script is all there is of it).
    let (own, global) = (CounterKeys::of_key(&n, 1), CounterKeys::global(&n));
    let took = store
        .counters_acquire("dead#0", &[&own, &global], &[3, 3], 3, 3)
        .await
        .unwrap();
    assert_eq!(
        took,
        tollgate::store::CountersOutcome::Granted {
            granted: 3,
            remaining: 0
        }
    );
    let died = Instant::now();
    let r = l.acquire(2, 0, 1).await.value.err().unwrap();
    assert_eq!((r.limit, r.in_use), (Limit::Global, 3));
    // This limiter's own copies are renewed past several leases; the dead one's are gone
    // after one.
    let guard = loop {
        if let Ok(g) = l.acquire(2, 0, 1).await.value {
            break g;
        }
        assert!(
            died.elapsed() < Duration::from_secs(3),
            "the dead share stayed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        died.elapsed() >= Duration::from_millis(500),
        "gone before its lease"
    );
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(fleet_totals(&l).await, [1], "renewed, not expired");
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_runs_sliding_logs_tiers_and_concurrency() {
    let cluster = RedisCluster::start();
    let endpoint = Endpoint::Cluster(cluster.urls());
    let (a, _) = start_up(config(endpoint.clone())).await;
    let (b, _) = start_up(config(endpoint)).await;
    assert!(a.is_cluster());
    // Two proxies share one frequency cap exactly.
    let la = SharedSlidingLog::new(&a, names(&a, "caps"), &caps(), 100, 0).unwrap();
    let lb = SharedSlidingLog::new(&b, names(&b, "caps"), &caps(), 100, 0).unwrap();
    for key in 0..5u64 {
        let mut admitted = 0;
        for i in 0..8 {
            let l = if i % 2 == 0 { &la } else { &lb };
            let d = l.acquire(key, 1, 0).await;
            assert_eq!(d.source, Source::Store);
            admitted += u64::from(d.verdict.allowed);
        }
        assert_eq!(admitted, 3, "key {key}");
    }
    // Tiered keys of one limit key share a slot; the global limit is each instance's
    // share (instances: 1 here, so all of it), with the in-process semantics.
    let p = TieredParams {
        tiers: vec![
            Tier {
                limit: 1,
                window: 60 * SEC,
                active: 3_600 * SEC,
                cooldown: 0,
                skippable: false,
            },
            Tier {
                limit: 10,
                window: 60 * SEC,
                active: 3_600 * SEC,
                cooldown: 0,
                skippable: false,
            },
        ],
        hard_limit: Some(50),
        global_limit: Some(3),
    };
    let st = SharedTiered::new(&a, names(&a, "tiers"), &p, 100).unwrap();
    let local = TieredLimiter::new(&p, 100).unwrap();
    let mut by = Vec::new();
    for (k, t) in [(1, 100), (1, 100), (2, 200), (2, 300), (1, 300), (3, 1_100)] {
        let got = st.acquire(k, t * MS).await;
        let want = local.acquire(k, t * MS);
        by.push(want.decided_by);
        assert_eq!(got.source, Source::Store);
        let g = got.decision;
        assert_eq!(
            (g.verdict.allowed, g.tier, g.decided_by),
            (want.verdict.allowed, want.tier, want.decided_by),
            "key {k} at {t} ms"
        );
    }
    assert_eq!(by[3], DecidedBy::GlobalLimit, "{by:?}");
    let n = names(&a, "tiers");
    let slots: std::collections::HashSet<i64> = [
        StateKind::TieredState,
        StateKind::TierLog(1),
        StateKind::TierLog(2),
        StateKind::TieredHard,
    ]
    .into_iter()
    .map(|k| cluster.keyslot(&n.key(1, k)))
    .collect();
    assert_eq!(slots.len(), 1);
    // Concurrency: the key's counter and the variant's (global, groups) live in different
    // slots and are decided by two scripts in one round trip; exact across two proxies.
    let params = conc(100, Some(12), &[5, 100]);
    let ca = Arc::new(
        SharedConcurrency::new(&a, names(&a, "conc"), params.clone(), &["big", "all"], 100)
            .unwrap(),
    );
    let cb = Arc::new(
        SharedConcurrency::new(&b, names(&b, "conc"), params, &["big", "all"], 100).unwrap(),
    );
    let n = names(&a, "conc");
    let (key_slot, global_slot, group_slot) = (
        cluster.keyslot(&CounterKeys::of_key(&n, 7).counts),
        cluster.keyslot(&CounterKeys::global(&n).counts),
        cluster.keyslot(&CounterKeys::group(&n, "big").leases),
    );
    assert_eq!(
        global_slot, group_slot,
        "the variant's counters share a slot"
    );
    assert_ne!(key_slot, global_slot);
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let l = Arc::clone(if i % 2 == 0 { &ca } else { &cb });
        tasks.push(tokio::spawn(async move {
            let groups = if i % 3 == 0 { 0b11 } else { 0b10 };
            (groups, l.acquire(i % 7, groups, 1).await)
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        let (groups, o) = t.await.unwrap();
        assert_eq!(o.source, Source::Store);
        if let Ok(g) = o.value {
            held.push((groups, g));
        }
    }
    let big = held.iter().filter(|(g, _)| g & 1 == 1).count();
    assert_eq!(held.len(), 12, "the global limit");
    assert!(big <= 5, "the bulkhead: {big}");
    // What one side took beyond a grant was given back: the counters settle at the truth.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let totals = fleet_totals(&ca).await;
        if totals == [12, big as u64, 12] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fleet totals {totals:?}, big {big}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while fleet_totals(&ca).await != [0, 0, 0] {
        assert!(Instant::now() < deadline, "copies not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_moves_a_customer_releases_to_the_group_it_took_from() {
    let redis = RedisServer::start();
    let (store, _) = start_up(standalone(&redis.url())).await;
    let n = names(&store, "moves");
    let params = conc(10, None, &[2, 2]);
    // Before the reload: groups [a, b]; the customer is in `a` (bit 0).
    let before =
        SharedConcurrency::new(&store, n.clone(), params.clone(), &["a", "b"], 100).unwrap();
    let old = before.acquire(1, 0b01, 1).await.value.unwrap();
    // The reload lists the groups as [b, a] and moves the customer to `b` (now bit 0): a
    // new limiter, while the old guard still holds its copy.
    let after = SharedConcurrency::new(&store, n.clone(), params, &["b", "a"], 100).unwrap();
    drop(before);
    let new = after.acquire(1, 0b01, 1).await.value.unwrap();
    let (a, b) = (CounterKeys::group(&n, "a"), CounterKeys::group(&n, "b"));
    let key = CounterKeys::of_key(&n, 1);
    super::concurrency::agree_for(
        &redis,
        &[
            (a.counts.clone(), 1),
            (b.counts.clone(), 1),
            (key.counts.clone(), 2),
        ],
        "both held",
        Duration::from_secs(2),
    )
    .await;
    // The old copy goes back to `a`, the group it was taken from.
    drop(old);
    super::concurrency::agree_for(
        &redis,
        &[
            (a.counts.clone(), 0),
            (b.counts.clone(), 1),
            (key.counts.clone(), 1),
        ],
        "old released",
        Duration::from_secs(2),
    )
    .await;
    drop(new);
    super::concurrency::agree_for(
        &redis,
        &[(b.counts, 0), (key.counts, 0)],
        "new released",
        Duration::from_secs(2),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_repairs_only_what_redis_may_have_wrong() {
    // A clean count in Redis may include an acquire or release still on its way back to
    // the holder: a renewal must not overwrite it. A dirty one is overwritten; a lost one
    // is restored.
    let redis = RedisServer::start();
    let (store, _) = start_up(standalone(&redis.url())).await;
    let n = names(&store, "renew");
    let own = CounterKeys::of_key(&n, 1);
    let field = |redis: &RedisServer| match redis.cmd(&["HGET", &own.counts, "h#0"]) {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap().parse::<u64>().unwrap(),
        redis::Value::Nil => 0,
        other => panic!("{other:?}"),
    };
    store
        .counters_acquire("h#0", &[&own], &[10], 2, 2)
        .await
        .unwrap();
    // The holder has heard of one of the two (the second acquire is still on its way).
    assert_eq!(
        store
            .counters_renew("h#0", &[&own], &[(1, false)])
            .await
            .unwrap(),
        [2]
    );
    assert_eq!(field(&redis), 2, "clean: Redis's count stays");
    assert_eq!(
        store
            .counters_renew("h#0", &[&own], &[(1, true)])
            .await
            .unwrap(),
        [1]
    );
    assert_eq!(field(&redis), 1, "dirty: the holder's count is written");
    redis.cmd(&["FLUSHALL"]);
    assert_eq!(
        store
            .counters_renew("h#0", &[&own], &[(3, false)])
            .await
            .unwrap(),
        [3]
    );
    assert_eq!(field(&redis), 3, "lost: restored");
    assert_eq!(
        store
            .counters_renew("h#0", &[&own], &[(0, true)])
            .await
            .unwrap(),
        [0]
    );
    assert_eq!(redis.cmd(&["EXISTS", &own.counts]), redis::Value::Int(0));
    // Inflight renewals follow the same rule.
    let counts = n.key(2, StateKind::InflightCounts);
    store.inflight_acquire(&n, 2, 10).await.unwrap().unwrap();
    store.inflight_acquire(&n, 2, 10).await.unwrap().unwrap();
    assert_eq!(store.inflight_renew(&n, 2, 1, false).await.unwrap(), 2);
    assert_eq!(store.inflight_renew(&n, 2, 1, true).await.unwrap(), 1);
    redis.cmd(&["DEL", &counts]);
    assert_eq!(store.inflight_renew(&n, 2, 4, false).await.unwrap(), 4);
}
