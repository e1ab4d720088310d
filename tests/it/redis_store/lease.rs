//! Lease calls against a real `redis-server`: slices of a hot key's quota taken by several
//! concurrent takers never add up to more than the limit (token bucket: capacity + refill ×
//! elapsed; rate: max per period; slots: max at every instant), unspent quota given back
//! is taken again, a rate lease belongs to its period, and a holder that stops renewing
//! loses its slots after one lease.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};
use tollgate::store::{CounterKeys, LeaseGrant};

fn rate(max: u64, per: Nanos) -> RateParams {
    RateParams {
        max,
        per,
        strict: false,
        window: Default::default(),
    }
}

/// Three stores on one Redis: three instances of a fleet.
async fn fleet(redis: &RedisServer, lease: Duration) -> Vec<RedisStore> {
    let mut stores = Vec::new();
    for name in ["a", "b", "c"] {
        let mut c = standalone(&redis.url());
        c.instance = name.to_string();
        c.tuning.lease = lease;
        // Returns are background calls, whose budget is the probe's: a second, so that
        // a loaded machine does not time them out.
        c.tuning.probe_every = Duration::from_secs(1);
        stores.push(start_up(c).await.0);
    }
    stores
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_bucket_takers_never_take_more_than_capacity_plus_refills() {
    let redis = RedisServer::start();
    let stores = fleet(&redis, Duration::from_secs(10)).await;
    let p = bucket(500, 50, 100 * MS, false);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        for j in 0..3u64 {
            let store = store.clone();
            let n = names(&store, "hot");
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(0x9e37_79b9 + 7 * i as u64 + j);
                let mut taken = 0;
                for _ in 0..100 {
                    let want = 1 + rng.below(40);
                    let g = store.lease_take(&n, 1, &p, want, None).await.unwrap();
                    assert!(g.granted <= want && g.valid_for.is_none() && g.epoch == 0);
                    taken += g.granted;
                }
                taken
            }));
        }
    }
    let mut taken = 0;
    for t in tasks {
        taken += t.await.unwrap();
    }
    // Redis's elapsed time between the first take and the last is within this one (1 ms
    // of slack for the wall clock Redis reads against the monotonic one).
    let elapsed = started.elapsed() + Duration::from_millis(1);
    let refills = elapsed.as_nanos() as u64 / (100 * MS);
    let bound = 500 + 50 * refills;
    assert!(taken <= bound, "took {taken} > {bound} in {elapsed:?}");
    assert!(
        taken >= 500,
        "a demand of ~18 000 drains the bucket: {taken}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rate_takers_never_count_more_than_max_in_a_period() {
    let redis = RedisServer::start();
    let stores = fleet(&redis, Duration::from_secs(10)).await;
    let r = rate(300, SEC);
    let first = BASE_US / 1_000_000;
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        for j in 0..3u64 {
            let store = store.clone();
            let n = names(&store, "hot");
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(0x51ed_2701 + 11 * i as u64 + j);
                let mut grants: Vec<LeaseGrant> = Vec::new();
                for k in 0..150u64 {
                    // The first half in period `first` (at 100 ms), the rest in the next
                    // one (at 1.5 s, half of the previous period still weighing).
                    let t = if k < 75 { 100 * MS } else { 1_500 * MS } + k * 1_000;
                    let want = 1 + rng.below(20);
                    let g = store.lease_take(&n, 1, &r, want, at(t)).await.unwrap();
                    assert!(g.granted <= want);
                    grants.push(g);
                }
                grants
            }));
        }
    }
    let mut per_epoch = std::collections::BTreeMap::<u64, u64>::new();
    for t in tasks {
        for g in t.await.unwrap() {
            *per_epoch.entry(g.epoch).or_default() += g.granted;
            // Valid until its period ends (from a clock behind the stored period, the
            // stored one's end).
            assert!(g.valid_for.unwrap() <= 2 * SEC);
        }
    }
    for (epoch, counted) in &per_epoch {
        assert!(*counted <= 300, "period {epoch}: {counted} > 300");
    }
    assert_eq!(per_epoch.get(&first), Some(&300), "{per_epoch:?}");
    // The next period's room was what the previous one's weight left: at most 150 at
    // half of it.
    assert!(
        per_epoch.get(&(first + 1)).copied().unwrap_or(0) <= 150,
        "{per_epoch:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_slot_takers_never_hold_more_than_max() {
    let redis = RedisServer::start();
    let stores = fleet(&redis, Duration::from_secs(10)).await;
    let held = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        for j in 0..3u64 {
            let store = store.clone();
            let (held, peak) = (held.clone(), peak.clone());
            let counter = RedisStore::inflight_counter(&names(&store, "slots"), 1);
            let holder = format!("{}:lease:{j}", store.config().instance);
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(0x2545_f491 + 13 * i as u64 + j);
                let mut got = 0;
                for _ in 0..100 {
                    let want = 1 + rng.below(6);
                    let g = store
                        .lease_slots_take(&holder, &[&counter], &[20], want)
                        .await
                        .unwrap();
                    if g.granted == 0 {
                        continue;
                    }
                    got += g.granted;
                    // Counted after Redis granted and uncounted before it gets them back:
                    // never below what Redis holds for this fleet.
                    let now = held.fetch_add(g.granted, Ordering::SeqCst) + g.granted;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    held.fetch_sub(g.granted, Ordering::SeqCst);
                    // A holder holds one block at a time: a return asked again after a
                    // timeout cannot take more than its own block (never below zero).
                    let deadline = Instant::now() + Duration::from_secs(30);
                    loop {
                        match store
                            .counters_release(&holder, &[&counter], g.granted)
                            .await
                        {
                            Ok(_) => break,
                            Err(StoreError::Timeout) if Instant::now() < deadline => {}
                            Err(e) => panic!("return: {e:?}"),
                        }
                    }
                }
                got
            }));
        }
    }
    let mut got = 0;
    for t in tasks {
        got += t.await.unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 20, "the fleet held {peak} > 20");
    assert!(got > 20, "slots were reused after their return: {got}");
    let counter = RedisStore::inflight_counter(&names(&stores[0], "slots"), 1);
    let totals = stores[0].counters_total(&[&counter]).await.unwrap();
    assert_eq!(totals, vec![0], "every block was given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_quota_is_taken_again() {
    let redis = RedisServer::start();
    let (s, _) = start_up(standalone(&redis.url())).await;
    let n = names(&s, "ret");
    // Token bucket: tokens back to the bucket.
    let b = bucket(10, 1, SEC, false);
    let take = |want| s.lease_take(&n, 1, &b, want, at(0));
    assert_eq!(
        (
            take(6).await.unwrap().granted,
            take(6).await.unwrap().granted
        ),
        (6, 4)
    );
    assert_eq!(take(1).await.unwrap().remaining, 0);
    assert_eq!(s.token_bucket_refund(&n, 1, &b, 3, at(0)).await.unwrap(), 3);
    let g = take(5).await.unwrap();
    assert_eq!((g.granted, g.remaining), (3, 0));
    // Rate: counts back to their period.
    let r = rate(10, SEC);
    let epoch = BASE_US / 1_000_000;
    let g = s.lease_take(&n, 1, &r, 7, at(100 * MS)).await.unwrap();
    assert_eq!(
        g,
        LeaseGrant {
            granted: 7,
            remaining: 3,
            epoch,
            valid_for: Some(900 * MS)
        }
    );
    assert_eq!(
        s.lease_take(&n, 1, &r, 7, at(100 * MS))
            .await
            .unwrap()
            .granted,
        3
    );
    let curr = s
        .lease_rate_return(&n, 1, &r, 4, epoch, at(200 * MS))
        .await
        .unwrap();
    assert_eq!(curr, 6);
    assert_eq!(
        s.lease_take(&n, 1, &r, 10, at(200 * MS))
            .await
            .unwrap()
            .granted,
        4
    );
    // Slots: a block back to the counters; the smaller room of two counters decides.
    let key = CounterKeys::of_key(&n, 1);
    let global = CounterKeys::global(&n);
    let g = s
        .lease_slots_take("a:lease", &[&key, &global], &[10, 4], 6)
        .await
        .unwrap();
    assert_eq!((g.granted, g.remaining, g.epoch), (4, 0, 0));
    assert_eq!(g.valid_for, Some(10 * SEC), "the store's lease");
    let none = s
        .lease_slots_take("b:lease", &[&key, &global], &[10, 4], 1)
        .await
        .unwrap();
    assert_eq!(none.granted, 0);
    assert_eq!(
        s.counters_release("a:lease", &[&key, &global], 3)
            .await
            .unwrap(),
        1
    );
    let g = s
        .lease_slots_take("b:lease", &[&key, &global], &[10, 4], 6)
        .await
        .unwrap();
    assert_eq!((g.granted, g.remaining), (3, 0));
    assert_eq!(
        s.counters_total(&[&key, &global]).await.unwrap(),
        vec![4, 4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_period_change_resets_the_rate_lease() {
    let redis = RedisServer::start();
    let (s, _) = start_up(standalone(&redis.url())).await;
    let n = names(&s, "period");
    let r = rate(10, SEC);
    let p = BASE_US / 1_000_000;
    let g = s.lease_take(&n, 1, &r, 10, at(100 * MS)).await.unwrap();
    assert_eq!((g.granted, g.epoch), (10, p));
    assert_eq!(
        s.lease_take(&n, 1, &r, 1, at(900 * MS))
            .await
            .unwrap()
            .granted,
        0
    );
    // Half into the next period: a new epoch, valid until its end, and room for what the
    // previous period's weight leaves (10 - 10 · 0.5).
    let g = s.lease_take(&n, 1, &r, 10, at(1_500 * MS)).await.unwrap();
    assert_eq!(
        g,
        LeaseGrant {
            granted: 5,
            remaining: 0,
            epoch: p + 1,
            valid_for: Some(500 * MS)
        }
    );
    // Counts of the old period given back come off its weight (6 left: 5 + 3 = 8 used).
    let curr = s
        .lease_rate_return(&n, 1, &r, 4, p, at(1_500 * MS))
        .await
        .unwrap();
    assert_eq!(curr, 5, "the new period's count is untouched");
    assert_eq!(
        s.lease_take(&n, 1, &r, 10, at(1_500 * MS))
            .await
            .unwrap()
            .granted,
        2
    );
    // Counts of a period two back are gone already: nothing changes.
    let curr = s
        .lease_rate_return(&n, 1, &r, 5, p, at(2_100 * MS))
        .await
        .unwrap();
    assert_eq!(curr, 0, "a third period starts empty");
    let g = s.lease_take(&n, 1, &r, 10, at(2_100 * MS)).await.unwrap();
    // prev = 7 (5 + 2) at e = 0.1: room = ⌊10 - 7 · 0.9⌋ = 3.
    assert_eq!((g.granted, g.epoch), (3, p + 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_holders_slots_come_back() {
    let redis = RedisServer::start();
    let stores = fleet(&redis, Duration::from_millis(1_500)).await;
    let (a, b) = (&stores[0], &stores[1]);
    let counter = RedisStore::inflight_counter(&names(a, "lapse"), 1);
    let g = a
        .lease_slots_take("a:lease", &[&counter], &[5], 5)
        .await
        .unwrap();
    assert_eq!(g.granted, 5);
    let taken = Instant::now();
    let none = b
        .lease_slots_take("b:lease", &[&counter], &[5], 5)
        .await
        .unwrap();
    assert_eq!(none.granted, 0, "a holds all 5");
    // a never renews: its lease lapses, and b's next take finds the slots free.
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        let g = b
            .lease_slots_take("b:lease", &[&counter], &[5], 5)
            .await
            .unwrap();
        if g.granted > 0 {
            break g.granted;
        }
        assert!(Instant::now() < deadline, "a's slots never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(got, 5);
    assert!(
        taken.elapsed() >= Duration::from_millis(1_000),
        "not before a's lease lapsed"
    );
}

/// The pure parts and the scripts together, as the runtime will use them (a preview of
/// the wiring, on a simulated clock passed to Redis as `at`): three instances offer one hot
/// key three times a token bucket's rate for 5 s, each admitting from its slice, renewing
/// it at the low-water mark and deciding exactly when the slice is short. The fleet admits
/// at most capacity + refill × elapsed, and at least 97% of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_admit_from_slices_within_the_bucket() {
    use tollgate::limits::lease::{Admit, HotKeys, LeaseParams, Slice, SliceSizer};
    let redis = RedisServer::start();
    let stores = fleet(&redis, Duration::from_secs(10)).await;
    // 1 000 tokens, 100 every 100 ms: 1 000 a second; the limit L = 1 000, so a slice is
    // at most 10 (1%).
    let p = bucket(1_000, 100, 100 * MS, false);
    let params = LeaseParams::default();
    let sizer = SliceSizer::new(&params, 1_000, 3);
    let hot: Vec<HotKeys> = (0..3).map(|_| HotKeys::new(params.hot_above, 64)).collect();
    let slices: Vec<Slice> = (0..3).map(|_| Slice::new()).collect();
    let mut remaining: Vec<Option<u64>> = vec![None; 3];
    // The deny cache: a rejection is remembered until its retry_after.
    let mut denied_until = [0u64; 3];
    let (mut admitted, mut requests, mut calls) = (0u64, 0u64, 0u64);
    let end = 5 * SEC;
    let mut t = 0;
    while t < end {
        // Each instance is offered one request a millisecond: 3 000 a second in all.
        for i in 0..3 {
            let (store, slice) = (&stores[i], &slices[i]);
            let n = names(store, "hot");
            requests += 1;
            let is_hot = hot[i].observe(1, t);
            let mut renew = false;
            let mut ok = false;
            if is_hot {
                match slice.admit(1, t) {
                    Admit::Admitted { renew: r } => (ok, renew) = (true, r),
                    Admit::Short { renew: r } => renew = r,
                }
            }
            if !ok && t >= denied_until[i] {
                // The exact path: one call.
                calls += 1;
                let v = store
                    .token_bucket_many(&n, 1, &p, 1, 1, at(t))
                    .await
                    .unwrap()
                    .verdict;
                ok = v.allowed;
                if !ok {
                    denied_until[i] = t + v.retry_after;
                }
            }
            admitted += u64::from(ok);
            if renew {
                calls += 1;
                let (count, over) = slice.rate(t);
                let want = sizer.size(count, over, remaining[i]);
                let g = store.lease_take(&n, 1, &p, want, at(t)).await.unwrap();
                remaining[i] = Some(g.remaining);
                slice.grant(g.granted, g.epoch, u64::MAX, SliceSizer::low_water(want), t);
                if g.granted == 0 {
                    // Nothing until the next refill.
                    slice.quiet_until(t + 100 * MS - t % (100 * MS));
                }
            }
        }
        t += MS;
    }
    // Whatever is still held goes back: it was never admitted.
    let held: u64 = slices.iter().map(Slice::available).sum();
    let bound = 1_000 + 100 * (end / (100 * MS));
    assert!(admitted <= bound, "admitted {admitted} > {bound}");
    assert!(
        admitted * 100 >= bound * 97,
        "admitted {admitted} of {bound}, {held} held"
    );
    assert!(held <= 3 * sizer.cap(), "held {held}");
    println!("admitted {admitted} of {bound}; {calls} calls for {requests} requests");
    // At the limit most requests are refused by the deny cache, and a slice of at most
    // 10 tokens (1% of the limit) costs a take per 10 admissions or so.
    assert!(
        calls * 4 < requests,
        "{calls} calls for {requests} requests"
    );
}
