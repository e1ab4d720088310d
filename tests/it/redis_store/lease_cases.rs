//! The shared case table of the leased kinds: the same workload against each kind's
//! in-process limiter, its Redis store deciding exactly (`lease: off`) and its Redis store
//! leasing (hot from the first decision, slices of a quarter of the limit), one instance.
//!
//! Every place admits exactly the limit and never one more: a token bucket that does not
//! refill within the test, a rate of one period a day, and the holding kinds (inflight,
//! concurrency) taking slots, releasing some and taking them again. The exact places
//! refuse nothing before the limit; a leased place may refuse while a slice is on its way
//! (its quota is then neither in Redis nor in the slice), so it is asked again, bounded.
//! Once the holding kinds have released everything, Redis counts for this instance
//! exactly the free slots its blocks hold (the leased gauge), and nothing deciding
//! exactly.

use super::*;
use tollgate::limits::lease::{LeaseParams, PPM};
use tollgate::limits::{ConcurrencyLimiter, ConcurrencyParams};
use tollgate::store::{LeaseCtx, SharedConcurrency};

/// The limit of every case.
const LIMIT: u64 = 8;

/// Where a case's state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Local,
    Exact,
    Leased,
}

const PLACES: [Place; 3] = [Place::Local, Place::Exact, Place::Leased];

/// Leases hot from the first decision, slices of up to a quarter of the limit.
fn lease(place: Place, store: &RedisStore, limit: &str) -> Option<LeaseCtx> {
    let params = LeaseParams {
        hot_above: 1,
        max_share: PPM / 4,
        ..LeaseParams::default()
    };
    (place == Place::Leased).then(|| LeaseCtx::new(params, store, "shop", limit))
}

/// Asks `attempt` until `want` more are admitted (at most 2 000 times; refusals are waited
/// out 1 ms each), then `2 × LIMIT` more times, all refused. A leased place may refuse
/// before the limit while a slice is on its way, and a store place after releases (they
/// land in the background): `settled` says none were just released. Returns the refusals
/// before the limit.
async fn admit_to_the_limit<F, Fut>(place: Place, want: u64, settled: bool, mut attempt: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (mut admitted, mut refused) = (0, 0);
    while admitted < want {
        if attempt().await {
            admitted += 1;
        } else {
            refused += 1;
            assert!(refused < 2_000, "{place:?}: {admitted} of {want} admitted");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    for _ in 0..2 * LIMIT {
        assert!(!attempt().await, "{place:?}: one more than the limit");
    }
    if place == Place::Local || place == Place::Exact && settled {
        assert_eq!(refused, 0, "{place:?} refused before the limit");
    }
    refused
}

/// A guard of any kind, held until dropped.
type Guard = Box<dyn Send>;

fn boxed(g: impl Send + 'static) -> Guard {
    Box::new(g)
}

/// The holding kinds' waves through `acquire` (a guard, or `None` when refused): the
/// limit taken, 3 released, 3 taken again, then everything released.
async fn holding_waves<F, Fut>(place: Place, mut acquire: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<Guard>>,
{
    let held = std::sync::Mutex::new(Vec::new());
    for wave in [LIMIT, 3] {
        let held = &held;
        admit_to_the_limit(place, wave, wave == LIMIT, || {
            let got = acquire();
            async move { got.await.map(|g| held.lock().unwrap().push(g)).is_some() }
        })
        .await;
        let mut h = held.lock().unwrap();
        let keep = h.len().saturating_sub(3);
        h.truncate(keep);
    }
}

/// Once the releases have landed (in the background), Redis counts for this instance only
/// the free slots of its blocks (`blocks`), none deciding exactly: waited for, 30 s at
/// most.
async fn only_blocks_counted<P, Fut>(place: Place, peek: P, blocks: impl Fn() -> u64)
where
    P: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<u64, StoreError>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let total = peek().await.unwrap_or(u64::MAX);
        if total == blocks() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{place:?}: Redis counts {total}, blocks hold {}",
            blocks()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if place == Place::Exact {
        assert_eq!(blocks(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_leased_kind_admits_exactly_its_limit_local_exact_and_leased() {
    let redis = RedisServer::start();
    let (store, metrics) = start_up(semantics(&redis.url())).await;
    let now = || SEC;
    for place in PLACES {
        // A token bucket of LIMIT that refills once a day.
        let p = bucket(LIMIT, 1, DAY, false);
        let local = TokenBucket::new(p, 64);
        let n = names(&store, &format!("bucket_{place:?}"));
        let shared =
            SharedTokenBucket::new(&store, n, p, 64, 0).with_lease(lease(place, &store, "b"));
        let (local, shared) = (&local, &shared);
        admit_to_the_limit(place, LIMIT, true, move || async move {
            match place {
                Place::Local => local.acquire(1, 1, now()).allowed,
                Place::Exact | Place::Leased => shared.acquire(1, 1, now()).await.allowed,
            }
        })
        .await;

        // A rate of LIMIT a day.
        let r = RateParams {
            max: LIMIT,
            per: DAY,
            strict: false,
            window: Default::default(),
        };
        let local = RateLimiter::with_window(r.per, r.window, 64);
        let n = names(&store, &format!("rate_{place:?}"));
        let shared = SharedRate::new(&store, n, r, 64, 0).with_lease(lease(place, &store, "r"));
        let (local, shared) = (&local, &shared);
        admit_to_the_limit(place, LIMIT, true, move || async move {
            match place {
                Place::Local => local.acquire(1, LIMIT, 1, false, now()).allowed,
                Place::Exact | Place::Leased => shared.acquire(1, 1, now()).await.allowed,
            }
        })
        .await;
    }
    assert_eq!(metrics.fallback.get(), 0, "every decision was the store's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_holding_kind_admits_exactly_its_max_local_exact_and_leased() {
    let redis = RedisServer::start();
    let (store, metrics) = start_up(semantics(&redis.url())).await;
    let sketch = SketchSize {
        hashes: 4,
        slots: 1024,
    };
    for place in PLACES {
        // Inflight: LIMIT taken, 3 released, 3 taken again, all released.
        let local = InflightLimiter::new(sketch);
        let n = names(&store, &format!("inflight_{place:?}"));
        let shared =
            SharedInflight::new_leased(&store, n, LIMIT, sketch, lease(place, &store, "i"));
        let (local, sh) = (&local, &shared);
        holding_waves(place, move || async move {
            match place {
                Place::Local => local.acquire(1, LIMIT).ok().map(|(g, _)| boxed(g)),
                Place::Exact | Place::Leased => {
                    let got = sh.acquire(1).await;
                    assert_eq!(got.source, Source::Store, "{place:?}");
                    got.value.ok().map(boxed)
                }
            }
        })
        .await;
        if place != Place::Local {
            only_blocks_counted(place, || sh.peek(1), || sh.holdings().leased()).await;
        }

        // Concurrency (no global, no groups): the same waves.
        let params = ConcurrencyParams {
            max: LIMIT,
            global: None,
            groups: Vec::new(),
        };
        let local = ConcurrencyLimiter::new(params.clone(), 64).unwrap();
        let n = names(&store, &format!("conc_{place:?}"));
        let shared =
            SharedConcurrency::new_leased(&store, n, params, &[], 64, lease(place, &store, "c"))
                .unwrap();
        let (local, sh) = (&local, &shared);
        holding_waves(place, move || async move {
            match place {
                Place::Local => local.acquire(1, 0, 1).ok().map(boxed),
                Place::Exact | Place::Leased => {
                    let got = sh.acquire(1, 0, 1).await;
                    assert_eq!(got.source, Source::Store, "{place:?}");
                    got.value.ok().map(boxed)
                }
            }
        })
        .await;
        if place != Place::Local {
            only_blocks_counted(place, || sh.peek(1), || sh.holdings().leased()).await;
        }
    }
    assert_eq!(metrics.fallback.get(), 0, "every decision was the store's");
}
