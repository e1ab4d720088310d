//! The shared table for sliding logs: every case against the in-process log and the Redis
//! script, with time driven by `at`.
//!
//! The in-process log counts an entry up to one unit of its time resolution longer than
//! exactly (the strict side), Redis to its microsecond: for windows up to 2 s the unit is
//! 1 ns and, at whole microseconds, every field agrees exactly; for day and week windows
//! admissions and counts agree (the cases keep clear of expiry instants) and the times
//! (`reset_after`, `retry_after`) agree within one unit.

use super::*;
use tollgate::limits::sliding_log::LogWindow;
use tollgate::limits::SlidingLog;
use tollgate::store::{EntryId, LogGrant, StateKind};

const HOUR: Nanos = 3_600 * SEC;
const WEEK: Nanos = 7 * DAY;

fn w(max: u64, per: Nanos) -> LogWindow {
    LogWindow { max, per }
}

/// One step: at `t`, ask for `[min, cost]` entries, or refund the `n`-th admission of the
/// case so far.
#[derive(Debug, Clone, Copy)]
enum Step {
    Take { t: Nanos, min: u64, cost: u64 },
    Refund { n: usize },
}

fn take(t: Nanos, cost: u64) -> Step {
    Step::Take { t, min: cost, cost }
}

fn range(t: Nanos, min: u64, cost: u64) -> Step {
    Step::Take { t, min, cost }
}

fn cases() -> Vec<(Vec<LogWindow>, Vec<Step>)> {
    let caps = vec![w(3, DAY), w(10, WEEK)];
    let mut cases = vec![
        // Grab's caps, 3 a day and 10 a week, one at a time across day and week
        // boundaries: day 0 takes 3, the 4th waits for the first to be a day old.
        (
            caps.clone(),
            vec![
                take(9 * HOUR, 1),
                take(10 * HOUR, 1),
                take(11 * HOUR, 1),
                take(12 * HOUR, 1),
                take(DAY + 8 * HOUR, 1),
                take(DAY + 9 * HOUR + SEC, 1),
                take(DAY + 10 * HOUR + SEC, 1),
                take(DAY + 11 * HOUR + SEC, 1),
                take(DAY + 12 * HOUR + SEC, 1),
                take(2 * DAY + 12 * HOUR + 2 * SEC, 3),
                take(3 * DAY + 13 * HOUR, 2),
                // 9 this week: one more fits, then the week is full until day 7.
                take(3 * DAY + 14 * HOUR, 1),
                take(4 * DAY + 15 * HOUR, 1),
                take(6 * DAY + 23 * HOUR, 1),
                take(WEEK + 9 * HOUR + SEC, 1),
                take(WEEK + 10 * HOUR + 2 * SEC, 1),
                take(WEEK + 11 * HOUR + 2 * SEC, 2),
            ],
        ),
        // Cost > 1, refunds restoring exactly the entries taken, and a refund's room.
        (
            caps.clone(),
            vec![
                take(HOUR, 2),
                take(2 * HOUR, 2),
                Step::Refund { n: 1 },
                take(2 * HOUR + SEC, 1),
                take(3 * HOUR, 1),
                Step::Refund { n: 0 },
                take(3 * HOUR + SEC, 2),
                take(DAY + HOUR + SEC, 3),
                take(2 * DAY, 3),
                take(3 * DAY + HOUR, 4),
            ],
        ),
        // Partial grants (the limiter API's MIN): the largest count that fits.
        (
            caps,
            vec![
                range(HOUR, 1, 2),
                range(2 * HOUR, 1, 5),
                range(3 * HOUR, 1, 1),
                range(DAY + 2 * HOUR + SEC, 2, 3),
                Step::Refund { n: 1 },
                range(DAY + 3 * HOUR + SEC, 2, 3),
                range(DAY + 4 * HOUR + SEC, 0, 2),
            ],
        ),
        // Short windows, exact to the microsecond.
        (
            vec![w(2, SEC), w(5, 2 * SEC)],
            vec![
                take(0, 2),
                take(SEC - 1_000, 1),
                take(SEC, 2),
                take(SEC + 1_000, 1),
                take(2 * SEC, 1),
                take(2 * SEC + 500 * MS, 2),
                Step::Refund { n: 3 },
                take(2 * SEC + 500 * MS, 2),
                take(3 * SEC, 3),
            ],
        ),
        // A block (max 0) and a cost above a window's max: never.
        (
            vec![w(0, SEC)],
            vec![take(0, 1), take(SEC, 1), range(SEC, 0, 1)],
        ),
        (
            vec![w(2, SEC), w(100, DAY)],
            vec![take(0, 3), take(0, 2), take(10 * MS, 1)],
        ),
    ];
    // Randomized rows with windows of 1 to 2 s: every field exact.
    let mut rng = Rng(0x51d1_e10c_0000_0001);
    for _ in 0..40 {
        let windows: Vec<LogWindow> = (0..1 + rng.below(3))
            .map(|_| {
                w(
                    rng.below(6),
                    [SEC, 1_500 * MS, 2 * SEC][rng.below(3) as usize],
                )
            })
            .collect();
        let mut t = 0;
        let mut admitted = 0usize;
        let steps = (0..1 + rng.below(40))
            .map(|_| {
                t += rng.below(600) * MS + rng.below(3) * 1_000;
                if admitted > 0 && rng.below(5) == 0 {
                    return Step::Refund {
                        n: rng.below(admitted as u64) as usize,
                    };
                }
                admitted += 1;
                let cost = rng.below(4);
                if rng.below(4) == 0 {
                    range(t, rng.below(cost + 1), cost)
                } else {
                    take(t, cost)
                }
            })
            .collect();
        cases.push((windows, steps));
    }
    cases
}

/// The in-process decision with the limiter API's `[min, cost]`: the largest count its
/// room allows (the in-process log has no partial grant of its own).
fn local_take(log: &SlidingLog, key: u64, min: u64, cost: u64, now: Nanos) -> LogGrant {
    let room = log.peek(key, 0, now).remaining;
    let n = cost.min(room).max(min.min(cost));
    let verdict = log.acquire(key, n, now);
    LogGrant {
        verdict,
        granted: if verdict.allowed { n } else { 0 },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_table_matches_the_local_limiter() {
    let redis = RedisServer::start();
    let (store, _) = start_up(standalone(&redis.url())).await;
    let n = names(&store, "caps");
    for (case, (windows, steps)) in cases().into_iter().enumerate() {
        let local = SlidingLog::new(&windows, 64).unwrap();
        let unit = local.resolution();
        let key = 4_000 + case as u64;
        // Admissions so far: (time, granted, the Redis entry id).
        let mut admitted: Vec<(Nanos, u64, EntryId)> = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let what = format!("case {case} step {i} {step:?} {windows:?}");
            match *step {
                Step::Take { t, min, cost } => {
                    let want = local_take(&local, key, min, cost, t);
                    let id = store.entry_id();
                    let got = store
                        .sliding_log(&n, key, &windows, &id, (min, cost), at(t))
                        .await
                        .unwrap();
                    assert_eq!(
                        (got.verdict.allowed, got.granted, got.verdict.remaining),
                        (want.verdict.allowed, want.granted, want.verdict.remaining),
                        "{what}: redis {got:?}, local {want:?}"
                    );
                    // Redis counts exactly, the local log up to one unit longer.
                    let close = |g: Nanos, l: Nanos| g <= l && l - g < unit.max(1_000);
                    assert!(
                        close(got.verdict.reset_after, want.verdict.reset_after),
                        "{what}: reset {got:?} vs {want:?}"
                    );
                    if got.verdict.allowed {
                        admitted.push((t, got.granted, id));
                        continue;
                    }
                    let fits = windows.iter().all(|x| min.min(cost) <= x.max);
                    if fits {
                        assert!(
                            close(got.verdict.retry_after, want.verdict.retry_after),
                            "{what}: retry {got:?} vs {want:?}"
                        );
                        // The promise, on Redis: one µs early is rejected, on time fits.
                        let due = t + got.verdict.retry_after;
                        let probe = 70_000 + 2 * (case * 100 + i) as u64;
                        let m = min.min(cost);
                        let replay = |key: u64, t_probe: Nanos| {
                            let (store, n, windows) = (store.clone(), n.clone(), windows.clone());
                            let admitted = admitted.clone();
                            async move {
                                for (t, g, _) in &admitted {
                                    let id = store.entry_id();
                                    store
                                        .sliding_log(&n, key, &windows, &id, (*g, *g), at(*t))
                                        .await
                                        .unwrap();
                                }
                                let id = store.entry_id();
                                store
                                    .sliding_log(&n, key, &windows, &id, (m, m), at(t_probe))
                                    .await
                                    .unwrap()
                                    .verdict
                                    .allowed
                            }
                        };
                        assert!(!replay(probe, due - 1_000).await, "{what}: admitted early");
                        assert!(replay(probe + 1, due).await, "{what}: rejected on time");
                    } else {
                        // Never: the longest window short of the cost is the hint, in both.
                        assert_eq!(got.verdict.retry_after, want.verdict.retry_after, "{what}");
                    }
                }
                Step::Refund { n: which } => {
                    let Some((t, granted, id)) = admitted.get(which).cloned() else {
                        continue;
                    };
                    let now = steps_now(&steps, i);
                    let want = local.refund(key, granted, t);
                    let got = store
                        .sliding_log_refund(&n, key, &windows, &id, granted, at(now))
                        .await
                        .unwrap();
                    // The in-process log removes entries of that instant; Redis exactly the
                    // admission's: the same count, as long as nothing else shares its
                    // instant (the cases' admissions never do).
                    assert_eq!(got, want, "{what}");
                    admitted[which].1 = 0;
                }
            }
            // Every window counts the same entries in both.
            let now = steps_now(&steps, i);
            let log = n.key(key, StateKind::SlidingLog);
            for (k, x) in windows.iter().enumerate() {
                let from = format!("({}", at(now).unwrap() as i64 - (x.per / 1_000) as i64);
                let counted = match redis.cmd(&["ZCOUNT", &log, &from, "+inf"]) {
                    redis::Value::Int(c) => c as u64,
                    other => panic!("ZCOUNT: {other:?}"),
                };
                assert_eq!(counted, local.count(key, k, now), "{what}: window {k}");
            }
        }
    }
    // Every log has an expiry (its newest entry's, plus a replay's minute of slack).
    let logs = redis_keys(&redis, "tollgate:shop:caps:*");
    assert!(logs.len() > 10, "{logs:?}");
    for key in logs {
        match redis.cmd(&["PTTL", &key]) {
            redis::Value::Int(ms) => assert!(ms > 0, "{key}: PTTL {ms}"),
            other => panic!("PTTL: {other:?}"),
        }
    }
}

/// The `t` of step `i` (or of the last take before it).
fn steps_now(steps: &[Step], i: usize) -> Nanos {
    steps[..=i]
        .iter()
        .rev()
        .find_map(|s| match s {
            Step::Take { t, .. } => Some(*t),
            Step::Refund { .. } => None,
        })
        .unwrap_or(0)
}

pub(crate) fn redis_keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    match redis.cmd(&["KEYS", pattern]) {
        redis::Value::Array(keys) => keys
            .into_iter()
            .map(|k| match k {
                redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("KEYS: {other:?}"),
    }
}
