//! The shared table for concurrency (Charon's copy-limited resources): every case runs
//! through the shared limiter on a standalone Redis and through the in-process limiter,
//! decision by decision, and after every step the counts in Redis (the key's, the global
//! one, each group's) must equal the in-process limiter's.
//!
//! Releases go to Redis in the background (a guard's drop never waits), so after a
//! release the table polls Redis, bounded, until it agrees.

use super::*;
use tollgate::limits::concurrency::{ConcurrencyGuard, Limit, Rejection};
use tollgate::limits::{ConcurrencyLimiter, ConcurrencyParams};
use tollgate::store::{CounterKeys, SharedConcurrency, SharedConcurrencyGuard};

/// One step: take `[min, copies]` for key `k` in `groups`, or release the `n`-th holding.
#[derive(Debug, Clone, Copy)]
enum Step {
    Take {
        k: u64,
        groups: u64,
        min: u64,
        copies: u64,
    },
    Release {
        n: usize,
    },
}

fn take(k: u64, groups: u64) -> Step {
    Step::Take {
        k,
        groups,
        min: 1,
        copies: 1,
    }
}

fn range(k: u64, groups: u64, min: u64, copies: u64) -> Step {
    Step::Take {
        k,
        groups,
        min,
        copies,
    }
}

fn rel(n: usize) -> Step {
    Step::Release { n }
}

struct Case {
    name: &'static str,
    params: ConcurrencyParams,
    groups: Vec<&'static str>,
    steps: Vec<Step>,
}

fn p(max: u64, global: Option<u64>, groups: &[u64]) -> ConcurrencyParams {
    ConcurrencyParams {
        max,
        global,
        groups: groups.to_vec(),
    }
}

fn cases() -> Vec<Case> {
    let mut cases = vec![
        Case {
            name: "domain",
            params: p(2, None, &[]),
            groups: vec![],
            steps: vec![
                take(1, 0),
                take(1, 0),
                take(1, 0),
                take(2, 0),
                rel(0),
                take(1, 0),
                rel(1),
                rel(2),
                take(1, 0),
            ],
        },
        Case {
            name: "global",
            params: p(5, Some(3), &[]),
            groups: vec![],
            steps: vec![
                take(1, 0),
                take(2, 0),
                take(3, 0),
                take(4, 0),
                rel(1),
                take(4, 0),
                range(5, 0, 1, 4),
            ],
        },
        // The probation group (max 1), a blacklist (max 0), and a big customer exhausting
        // its bulkhead while small customers still get through.
        Case {
            name: "bulkheads",
            params: p(10, Some(20), &[3, 1, 0]),
            groups: vec!["big", "probation", "blacklist"],
            steps: vec![
                take(1, 0b001),
                take(1, 0b001),
                take(1, 0b001),
                take(1, 0b001),
                take(2, 0),
                take(3, 0),
                take(4, 0b010),
                take(5, 0b010),
                take(6, 0b100),
                take(7, 0b011),
                rel(0),
                take(7, 0b011),
                rel(3),
                take(6, 0b101),
                take(2, 0),
            ],
        },
        // Partial grants (the limiter API's MIN).
        Case {
            name: "partial",
            params: p(6, Some(8), &[5]),
            groups: vec!["g"],
            steps: vec![
                range(1, 0b1, 2, 4),
                range(1, 0b1, 1, 4),
                range(1, 0b1, 1, 4),
                range(2, 0, 3, 3),
                range(2, 0, 1, 3),
                rel(1),
                range(3, 0b1, 1, 9),
                range(3, 0, 0, 2),
            ],
        },
    ];
    let mut rng = Rng(0xc0c0_7e57_0000_0001);
    for _ in 0..15 {
        let groups = rng.below(3) as usize;
        let maxes: Vec<u64> = (0..groups).map(|_| rng.below(5)).collect();
        let global = (rng.below(2) == 0).then(|| 1 + rng.below(6));
        let mut held = 0usize;
        let steps = (0..1 + rng.below(40))
            .map(|_| {
                if held > 0 && rng.below(3) == 0 {
                    return rel(rng.below(held as u64) as usize);
                }
                held += 1;
                let copies = 1 + rng.below(3);
                let mask = rng.below(1 << groups);
                range(rng.below(3), mask, 1 + rng.below(copies), copies)
            })
            .collect();
        cases.push(Case {
            name: "random",
            params: p(1 + rng.below(4), global, &maxes),
            groups: ["a", "b"][..groups].to_vec(),
            steps,
        });
    }
    cases
}

/// What the in-process limiter holds for one admission.
enum LocalHold {
    Guard(ConcurrencyGuard),
    Reserved { key: u64, groups: u64, copies: u64 },
    Released,
}

/// A counter's total in Redis (every holder's copies).
fn total(redis: &RedisServer, counts: &str) -> u64 {
    match redis.cmd(&["HVALS", counts]) {
        redis::Value::Array(v) => v
            .iter()
            .map(|x| match x {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).parse::<u64>().unwrap(),
                other => panic!("{other:?}"),
            })
            .sum(),
        other => panic!("HVALS: {other:?}"),
    }
}

/// Polls (bounded) until every counter in Redis equals the in-process limiter's count.
async fn agree(redis: &RedisServer, checks: &[(String, u64)], what: &str) {
    agree_for(redis, checks, what, Duration::from_secs(5)).await
}

/// [`agree`] within `within`.
pub(crate) async fn agree_for(
    redis: &RedisServer,
    checks: &[(String, u64)],
    what: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let seen: Vec<u64> = checks.iter().map(|(k, _)| total(redis, k)).collect();
        let want: Vec<u64> = checks.iter().map(|(_, v)| *v).collect();
        if seen == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: redis {seen:?}, local {want:?} ({checks:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_table_matches_the_local_limiter() {
    let redis = RedisServer::start();
    let (store, _) = start_up(standalone(&redis.url())).await;
    for (case, c) in cases().into_iter().enumerate() {
        let n = store.names("shop", &format!("conc{case}"), Variant::Base);
        let shared =
            SharedConcurrency::new(&store, n.clone(), c.params.clone(), &c.groups, 64).unwrap();
        let local = ConcurrencyLimiter::new(c.params.clone(), 64).unwrap();
        let key = |k: u64| 20_000 + k;
        let mut holds: Vec<(SharedConcurrencyGuard, LocalHold)> = Vec::new();
        for (i, step) in c.steps.iter().enumerate() {
            let what = format!("{} (case {case}) step {i} {step:?}", c.name);
            match *step {
                Step::Take {
                    k,
                    groups,
                    min,
                    copies,
                } => {
                    let got = shared.acquire_range(key(k), groups, min, copies).await;
                    assert_eq!(got.source, Source::Store, "{what}");
                    let want: Result<(u64, Option<u64>, LocalHold), Rejection> = if min == copies {
                        local
                            .acquire(key(k), groups, copies)
                            .map(|g| (g.copies(), Some(g.remaining()), LocalHold::Guard(g)))
                    } else {
                        local.reserve(key(k), groups, copies, min).map(|n| {
                            let hold = LocalHold::Reserved {
                                key: key(k),
                                groups,
                                copies: n,
                            };
                            (n, None, hold)
                        })
                    };
                    match (got.value, want) {
                        (Ok(g), Ok((n, remaining, hold))) => {
                            assert_eq!(g.copies(), n, "{what}");
                            if let Some(r) = remaining {
                                assert_eq!(g.remaining(), r, "{what}: remaining");
                            }
                            holds.push((g, hold));
                        }
                        (Err(g), Err(l)) => assert_eq!(g, l, "{what}"),
                        (g, l) => panic!(
                            "{what}: redis {:?}, local {:?}",
                            g.map(|g| g.copies()),
                            l.map(|l| l.0)
                        ),
                    }
                }
                Step::Release { n } => {
                    if let Some((g, hold)) = holds.get_mut(n) {
                        match std::mem::replace(hold, LocalHold::Released) {
                            LocalHold::Guard(lg) => drop(lg),
                            LocalHold::Reserved {
                                key,
                                groups,
                                copies,
                            } => local.release(key, groups, copies).unwrap(),
                            LocalHold::Released => continue,
                        }
                        g.release(u64::MAX);
                    }
                }
            }
            // Redis holds exactly what the in-process limiter holds.
            let mut checks: Vec<(String, u64)> = (0..8)
                .map(|k| (CounterKeys::of_key(&n, key(k)).counts, local.held(key(k))))
                .collect();
            if c.params.global.is_some() {
                checks.push((CounterKeys::global(&n).counts, local.in_use_global()));
            }
            for (gi, name) in c.groups.iter().enumerate() {
                checks.push((CounterKeys::group(&n, name).counts, local.in_use(gi)));
            }
            agree(&redis, &checks, &what).await;
            // The local gauges (this instance's copies) agree too.
            let held: u64 = (0..8).map(|k| local.held(key(k))).sum();
            assert_eq!(shared.in_use_here(), held, "{what}: in_use_here");
            for gi in 0..c.groups.len() {
                assert_eq!(shared.group_in_use_here(gi), local.in_use(gi), "{what}");
            }
        }
        drop(holds);
    }
    // Every copy went back exactly once: nothing but the probe key is left.
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis.cmd(&["DBSIZE"]) != redis::Value::Int(1) {
        assert!(
            Instant::now() < deadline,
            "leftover keys: {:?}",
            sliding_log::redis_keys(&redis, "*")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blacklist_group_of_max_0_names_its_group_and_never_invites_a_retry() {
    let redis = RedisServer::start();
    let (store, _) = start_up(standalone(&redis.url())).await;
    let n = names(&store, "blacklist");
    let shared =
        SharedConcurrency::new(&store, n, p(5, None, &[2, 0]), &["ok", "blacklist"], 64).unwrap();
    let r = shared.acquire(1, 0b10, 1).await.value.err().unwrap();
    assert_eq!(
        r,
        Rejection {
            limit: Limit::Group(1),
            in_use: 0,
            max: 0,
            wanted: 1
        }
    );
    assert!(shared.acquire(1, 0b01, 1).await.value.is_ok());
    // Copies of 0 hold nothing and always pass.
    let g = shared.acquire(1, 0b10, 0).await.value.unwrap();
    assert_eq!(g.copies(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_share_groups_and_a_global_limit_exactly() {
    let redis = RedisServer::start();
    let (a, _) = start_up(standalone(&redis.url())).await;
    let (b, _) = start_up(standalone(&redis.url())).await;
    let params = p(100, Some(30), &[10]);
    let la = Arc::new(
        SharedConcurrency::new(&a, names(&a, "fleet"), params.clone(), &["big"], 1_000).unwrap(),
    );
    let lb =
        Arc::new(SharedConcurrency::new(&b, names(&b, "fleet"), params, &["big"], 1_000).unwrap());
    // 64 concurrent requests over both, half of them in group `big`: exactly 10 big ones
    // and 30 in all are admitted.
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let l = Arc::clone(if i % 2 == 0 { &la } else { &lb });
        tasks.push(tokio::spawn(async move {
            let group = u64::from(i % 4 < 2);
            let o = l.acquire(i, group, 1).await;
            assert_eq!(o.source, Source::Store);
            (group, o.value.ok())
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        held.push(t.await.unwrap());
    }
    let big = held.iter().filter(|(g, h)| *g == 1 && h.is_some()).count();
    let all = held.iter().filter(|(_, h)| h.is_some()).count();
    assert_eq!(big, 10, "the bulkhead");
    assert_eq!(all, 30, "the global limit");
    assert_eq!(fleet_totals(&la).await, [30, 10]);
    // Gauges per instance sum to the fleet's.
    assert_eq!(la.in_use_here() + lb.in_use_here(), 30);
    assert_eq!(la.group_in_use_here(0) + lb.group_in_use_here(0), 10);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while fleet_totals(&la).await != [0, 0] {
        assert!(Instant::now() < deadline, "copies not given back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
