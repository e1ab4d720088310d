//! The shared table for tiered limits (Charon's burst tiers): the paper's scenarios and
//! randomized rows against the in-process limiter and the Redis script, with time driven
//! by `at`, the global limit counted in Redis (a standalone store).
//!
//! Decisions must agree field by field (admitted, copies granted, current tier, which
//! limit decided, the first tier a grant reached, the room left). Times agree exactly
//! where the in-process limiter's time unit is 1 ns (windows up to 1.07 s) and within one
//! unit otherwise (it stores hits rounded up to its unit). Entries into each tier
//! (`tollgate_tier_entries_total`) agree too.

use super::*;
use tollgate::limits::tiered::{normalize, Tier, TieredDecision, TieredParams};
use tollgate::limits::TieredLimiter;
use tollgate::store::{EntryId, GlobalArg, StateKind, TieredGrant};

const MINUTE: Nanos = 60 * SEC;
const HOUR: Nanos = 60 * MINUTE;

fn tier(limit: u64, window: Nanos, active: Nanos, cooldown: Nanos) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable: false,
    }
}

fn skippable(t: Tier) -> Tier {
    Tier {
        skippable: true,
        ..t
    }
}

fn params(tiers: &[Tier], hard: Option<u64>, global: Option<u64>) -> TieredParams {
    let p = TieredParams {
        tiers: tiers.to_vec(),
        hard_limit: hard,
        global_limit: global,
    };
    normalize(&p).unwrap().params
}

/// One step: at `t`, a request of `[min, max]` copies for key `k`, or a refund of the
/// last admission (right after it, as the proxy's no-burn rule does).
#[derive(Debug, Clone, Copy)]
enum Step {
    Take {
        k: u64,
        t: Nanos,
        min: u64,
        max: u64,
    },
    Refund {
        t: Nanos,
    },
}

fn one(k: u64, t: Nanos) -> Step {
    Step::Take {
        k,
        t,
        min: 1,
        max: 1,
    }
}

fn many(k: u64, t: Nanos, min: u64, max: u64) -> Step {
    Step::Take { k, t, min, max }
}

fn repeat(n: usize, step: Step) -> Vec<Step> {
    vec![step; n]
}

/// The paper's scenarios (the in-process limiter's tests), as steps.
fn scenarios() -> Vec<(&'static str, TieredParams, Vec<Step>)> {
    let mut out = Vec::new();
    // A first request bursts from tier 0 into tier 1; the active period ends.
    out.push((
        "tier zero to one",
        params(&[tier(3, SEC, 10 * SEC, 0)], None, None),
        vec![
            one(7, 0),
            one(7, 400 * MS),
            one(7, 500 * MS),
            one(7, 600 * MS),
            one(7, SEC),
            one(7, 10 * SEC - MS),
            one(7, 10 * SEC),
        ],
    ));
    // Penalty pattern: stacked tiers with proportional cooldowns.
    let penalty = params(
        &[
            tier(10, MINUTE, HOUR, 0),
            tier(5, MINUTE, 10 * MINUTE, 10 * MINUTE),
            tier(1, MINUTE, 20 * MINUTE, 20 * MINUTE),
        ],
        None,
        None,
    );
    let mut steps = repeat(16, one(42, 0));
    steps.push(one(42, 2 * SEC));
    steps.push(one(42, 5 * MINUTE));
    steps.push(one(42, 5 * MINUTE));
    steps.extend(repeat(16, one(42, 20 * MINUTE)));
    steps.extend(repeat(11, one(42, 30 * MINUTE)));
    steps.push(one(42, 30 * MINUTE + 30 * SEC));
    out.push(("penalty", penalty, steps));
    // Prison: limit 1, a day long: once entered, nothing passes until it ends.
    let mut steps = repeat(6, one(9, 0));
    steps.extend([one(9, 2 * MINUTE), one(9, DAY - SEC), one(9, DAY)]);
    out.push((
        "prison",
        params(
            &[tier(5, MINUTE, HOUR, 0), tier(1, DAY, DAY, 0)],
            None,
            None,
        ),
        steps,
    ));
    // Batch: 5000 per 5 minutes, then nothing for a day (in batches of 100 copies).
    let mut steps: Vec<Step> = (0..50).map(|i| many(3, i * 5 * SEC, 100, 100)).collect();
    steps.extend([
        one(3, 5 * MINUTE - SEC),
        one(3, 5 * MINUTE),
        one(3, 5 * MINUTE + DAY - SEC),
        one(3, 5 * MINUTE + DAY),
    ]);
    out.push((
        "batch",
        params(&[tier(5000, 5 * MINUTE, 5 * MINUTE, DAY)], None, None),
        steps,
    ));
    // A cooling tier blocks the burst unless it is skippable.
    for skip in [false, true] {
        let t2 = tier(2, SEC, 2 * SEC, 5 * SEC);
        let t2 = if skip { skippable(t2) } else { t2 };
        out.push((
            "cooling",
            params(
                &[tier(2, SEC, 20 * SEC, 0), t2, tier(2, SEC, 10 * SEC, 0)],
                None,
                None,
            ),
            vec![
                many(1, 0, 2, 2),
                one(1, 0),
                many(1, 3 * SEC, 2, 2),
                one(1, 3 * SEC),
                one(1, 4 * SEC),
                one(1, 7 * SEC),
            ],
        ));
    }
    // Fallback several levels down at once.
    out.push((
        "fallback",
        params(
            &[
                tier(1, SEC, 100 * SEC, 0),
                tier(1, SEC, 10 * SEC, 0),
                tier(1, SEC, 20 * SEC, 0),
            ],
            None,
            None,
        ),
        vec![
            one(8, 0),
            one(8, 0),
            one(8, 0),
            one(8, 15 * SEC),
            one(8, 20 * SEC),
            one(8, 20 * SEC),
            one(8, 30 * SEC),
            one(8, 100 * SEC),
        ],
    ));
    // The hard limit rejects whatever the tier and never bursts.
    out.push((
        "hard",
        params(
            &[tier(2, MINUTE, HOUR, 0), tier(100, MINUTE, HOUR, 0)],
            Some(3),
            None,
        ),
        vec![
            one(1, 0),
            one(1, 0),
            one(1, 0),
            one(1, 500 * MS),
            one(1, SEC),
            many(1, SEC + MS, 2, 5),
            one(1, 2 * SEC),
        ],
    ));
    // The global limit across keys, per aligned second, counted in Redis.
    out.push((
        "global",
        params(
            &[tier(1, MINUTE, HOUR, 0), tier(10, MINUTE, HOUR, 0)],
            None,
            Some(3),
        ),
        vec![
            one(1, 100 * MS),
            one(1, 100 * MS),
            one(2, 200 * MS),
            one(2, 300 * MS),
            one(1, 300 * MS),
            one(1, SEC),
            Step::Refund { t: SEC + 1_000 },
            one(3, SEC + 2_000),
            one(4, SEC + 3_000),
            one(5, SEC + 4_000),
            one(6, SEC + 5_000),
            many(7, 2 * SEC, 1, 5),
            one(8, 2 * SEC),
        ],
    ));
    // Refunds take back hits, not tier entries.
    out.push((
        "refund",
        params(
            &[
                tier(2, MINUTE, 10 * MINUTE, 0),
                tier(5, MINUTE, 10 * MINUTE, HOUR),
            ],
            Some(4),
            None,
        ),
        vec![
            one(1, 0),
            one(1, 0),
            Step::Refund { t: 10 * MS },
            one(1, 20 * MS),
            one(1, 30 * MS),
            Step::Refund { t: 40 * MS },
            one(1, 40 * MS),
            one(1, 50 * MS),
            one(1, 60 * MS),
            many(2, 0, 1, 4),
            many(2, 0, 1, 4),
            Step::Refund { t: 0 },
            one(2, 0),
            one(2, 10 * MINUTE),
        ],
    ));
    // Copies fill the current tier, then burst; a batch's Retry-After.
    let copies = params(
        &[tier(5, SEC, 10 * SEC, 0), tier(3, SEC, 10 * SEC, 10 * SEC)],
        Some(20),
        None,
    );
    out.push((
        "copies",
        copies.clone(),
        vec![
            many(1, 0, 1, 4),
            many(1, 0, 3, 10),
            one(1, 0),
            many(2, 0, 5, 5),
            many(3, 0, 9, 9),
            many(4, 0, 2, 2),
            many(4, 100 * MS, 2, 2),
            many(4, 200 * MS, 1, 1),
            many(4, 300 * MS, 2, 2),
            many(4, 400 * MS, 3, 3),
            many(4, 1_300 * MS, 3, 3),
        ],
    ));
    // Day-long windows: coarse in-process units.
    out.push((
        "coarse",
        params(
            &[tier(2, DAY, 2 * DAY, 0), tier(1, HOUR, HOUR, DAY)],
            Some(3),
            None,
        ),
        vec![
            one(6, 12_345_000),
            one(6, HOUR + 999_999_000),
            one(6, 2 * HOUR + 1_000_001_000),
            one(6, 3 * HOUR),
            one(6, DAY + 3 * HOUR),
        ],
    ));
    out
}

/// Randomized rows with windows up to a second (1 ns in-process units: exact).
fn random_rows() -> Vec<(&'static str, TieredParams, Vec<Step>)> {
    let mut rng = Rng(0x7133_7e2e_d000_0001);
    let mut out = Vec::new();
    for _ in 0..30 {
        let n = 1 + rng.below(3);
        let tiers: Vec<Tier> = (0..n)
            .map(|_| {
                let window = [200 * MS, 500 * MS, SEC][rng.below(3) as usize];
                let t = tier(
                    rng.below(4),
                    window,
                    window * (1 + rng.below(4)),
                    window * rng.below(3),
                );
                if rng.below(3) == 0 {
                    skippable(t)
                } else {
                    t
                }
            })
            .collect();
        let hard = (rng.below(2) == 0).then(|| 1 + rng.below(5));
        let global = (rng.below(3) == 0).then(|| 1 + rng.below(6));
        let p = params(&tiers, hard, global);
        let mut t = 0;
        let steps = (0..1 + rng.below(40))
            .map(|_| {
                t += rng.below(300) * MS + rng.below(2) * 1_000;
                if rng.below(6) == 0 {
                    return Step::Refund { t };
                }
                let k = rng.below(2);
                let min = 1 + rng.below(2);
                many(k, t, min, min + rng.below(3))
            })
            .collect();
        out.push(("random", p, steps));
    }
    out
}

/// The last admission of a case: local decision, Redis grant, id, and the global mode.
type Admission = (u64, TieredDecision, TieredGrant, EntryId);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_table_matches_the_local_limiter() {
    let redis = RedisServer::start();
    let (store, _) = start_up(standalone(&redis.url())).await;
    let mut cases = scenarios();
    cases.extend(random_rows());
    let mut checked_retries = 0;
    for (case, (name, p, steps)) in cases.into_iter().enumerate() {
        let local = TieredLimiter::new(&p, 64).unwrap();
        let n = store.names("shop", &format!("tiered{case}"), Variant::Base);
        let global = match p.global_limit {
            Some(limit) => GlobalArg::InStore { limit },
            None => GlobalArg::None,
        };
        // The in-process unit: 1 ns up to 1.07 s windows (the hard limit's is 1 s).
        let longest = p
            .tiers
            .iter()
            .map(|t| t.window)
            .chain(p.hard_limit.map(|_| SEC))
            .max()
            .unwrap();
        let unit: Nanos = 1 << (64 - (longest - 1).leading_zeros()).saturating_sub(30);
        let mut entered = vec![0u64; p.tiers.len()];
        let mut last: Option<Admission> = None;
        let key = |k: u64| 10_000 * (case as u64 + 1) + k;
        for (i, step) in steps.iter().enumerate() {
            let what = format!("{name} (case {case}) step {i} {step:?}");
            match *step {
                Step::Take { k, t, min, max } => {
                    let want = local.acquire_many(key(k), min, max, t);
                    let id = store.entry_id();
                    let got = store
                        .tiered(&n, key(k), &p, &id, (min, max), global, t, at(t))
                        .await
                        .unwrap();
                    let d = got.decision;
                    assert_eq!(
                        (
                            d.verdict.allowed,
                            d.granted,
                            d.tier,
                            d.decided_by,
                            d.first_tier,
                            d.verdict.remaining
                        ),
                        (
                            want.verdict.allowed,
                            want.granted,
                            want.tier,
                            want.decided_by,
                            want.first_tier,
                            want.verdict.remaining
                        ),
                        "{what}: redis {d:?}, local {want:?}"
                    );
                    let close = |g: Nanos, l: Nanos| g <= l && l - g < unit;
                    assert!(
                        close(d.verdict.reset_after, want.verdict.reset_after),
                        "{what}: reset {d:?} vs {want:?}"
                    );
                    if want.verdict.allowed {
                        assert_eq!(d.verdict.retry_after, 0);
                    } else {
                        // Exact up to the unit; and on the strict side, unless the answer
                        // is the "never" hint (the state's end, at least a second).
                        let (g, l) = (d.verdict.retry_after, want.verdict.retry_after);
                        assert!(
                            close(g, l) || (l >= SEC && g.abs_diff(l) < unit),
                            "{what}: retry {d:?} vs {want:?}"
                        );
                        checked_retries += 1;
                    }
                    for (e, tier) in entered.iter_mut().zip(0..) {
                        *e += u64::from(got.entered >> tier & 1);
                    }
                    last = want.verdict.allowed.then(|| (key(k), want, got, id));
                }
                Step::Refund { t } => {
                    if let Some((k, want, got, id)) = last.take() {
                        local.refund(k, &want, t);
                        store
                            .tiered_refund(&n, k, &p, &id, &got, global, at(t))
                            .await
                            .unwrap();
                    }
                }
            }
        }
        for (tier, e) in entered.iter().enumerate() {
            assert_eq!(
                *e,
                local.entries(tier + 1),
                "{name} (case {case}): entries of tier {}",
                tier + 1
            );
        }
    }
    assert!(
        checked_retries > 60,
        "only {checked_retries} rejections compared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_retry_after_is_a_promise_on_redis() {
    // A rejection's Retry-After, replayed on fresh keys: 1 µs early is rejected, on time
    // is admitted (the in-process limiter's own promise, to its nanosecond).
    let redis = RedisServer::start();
    let (store, _) = start_up(standalone(&redis.url())).await;
    // (params, a script of (t, copies) ending with a rejection, the copies to retry)
    type Case = (TieredParams, Vec<(Nanos, u64)>, u64);
    let cases: Vec<Case> = vec![
        (
            params(
                &[tier(5, MINUTE, HOUR, 0), tier(1, DAY, DAY, 0)],
                None,
                None,
            ),
            [(0, 1); 6].into_iter().chain([(2 * MINUTE, 1)]).collect(),
            1,
        ),
        (
            params(
                &[tier(2, MINUTE, HOUR, 0), tier(100, MINUTE, HOUR, 0)],
                Some(3),
                None,
            ),
            vec![(0, 1), (0, 1), (0, 1), (500 * MS, 1)],
            1,
        ),
        (
            params(
                &[tier(5, SEC, 10 * SEC, 0), tier(3, SEC, 10 * SEC, 10 * SEC)],
                Some(20),
                None,
            ),
            vec![
                (0, 2),
                (100 * MS, 2),
                (200 * MS, 1),
                (300 * MS, 2),
                (400 * MS, 3),
            ],
            3,
        ),
        (
            params(&[tier(5000, 5 * MINUTE, 5 * MINUTE, DAY)], None, None),
            (0..50)
                .map(|i| (i * 5 * SEC, 100))
                .chain([(MINUTE * 4, 1)])
                .collect(),
            1,
        ),
    ];
    let mut probe = 0u64;
    for (case, (p, script, min)) in cases.into_iter().enumerate() {
        let n = store.names("shop", &format!("promise{case}"), Variant::Base);
        let run = |key: u64, until: usize| {
            let (store, n, p, script) = (store.clone(), n.clone(), p.clone(), script.clone());
            async move {
                let mut last = None;
                for &(t, c) in &script[..until] {
                    let id = store.entry_id();
                    let g = store
                        .tiered(&n, key, &p, &id, (c, c), GlobalArg::None, t, at(t))
                        .await
                        .unwrap();
                    last = Some(g.decision);
                }
                last
            }
        };
        probe += 3;
        let d = run(probe, script.len()).await.unwrap();
        assert!(
            !d.verdict.allowed,
            "case {case}: the script ends with a rejection"
        );
        let t = script.last().unwrap().0;
        let due = t + d.verdict.retry_after;
        for (key, t_probe, allowed) in [(probe + 1, due - 1_000, false), (probe + 2, due, true)] {
            run(key, script.len() - 1).await;
            let id = store.entry_id();
            let g = store
                .tiered(
                    &n,
                    key,
                    &p,
                    &id,
                    (min, min),
                    GlobalArg::None,
                    t_probe,
                    at(t_probe),
                )
                .await
                .unwrap();
            assert_eq!(
                g.decision.verdict.allowed, allowed,
                "case {case} at {t_probe}: {g:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_state_is_bounded_and_expires_with_the_key() {
    let redis = RedisServer::start();
    let (store, _) = start_up(standalone(&redis.url())).await;
    let p = params(
        &[tier(3, SEC, 2 * SEC, 0), tier(2, SEC, 2 * SEC, SEC)],
        Some(10),
        None,
    );
    let n = names(&store, "bounded");
    // Real time (no `at`): the keys must expire by Redis's clock.
    for _ in 0..20 {
        let id = store.entry_id();
        store
            .tiered(&n, 1, &p, &id, (1, 1), GlobalArg::None, 0, None)
            .await
            .unwrap();
    }
    // At most L hits per tier log, at most H in the hard log.
    let card = |kind| match redis.cmd(&["ZCARD", &n.key(1, kind)]) {
        redis::Value::Int(c) => c,
        other => panic!("{other:?}"),
    };
    assert_eq!(card(StateKind::TierLog(1)), 3);
    assert_eq!(card(StateKind::TierLog(2)), 2);
    assert_eq!(card(StateKind::TieredHard), 5);
    // Every key of the limit key shares one slot, and expires by the state's end (tier 2
    // entered now: active 2 s, cooling 1 s: at most 3 s).
    let keys = sliding_log::redis_keys(&redis, "tollgate:shop:bounded:*");
    assert_eq!(keys.len(), 4, "{keys:?}");
    let slots: std::collections::HashSet<u16> = keys
        .iter()
        .map(|k| tollgate::store::key::cluster_slot(k.as_bytes()))
        .collect();
    assert_eq!(slots.len(), 1, "{keys:?}");
    for k in &keys {
        match redis.cmd(&["PTTL", k]) {
            redis::Value::Int(ms) => assert!((1..=3_000).contains(&ms), "{k}: {ms}"),
            other => panic!("{other:?}"),
        }
    }
    // And they are gone once it has passed (polled, bounded).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sliding_log::redis_keys(&redis, "tollgate:shop:bounded:*").is_empty() {
        assert!(Instant::now() < deadline, "tiered keys never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
