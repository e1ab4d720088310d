//! The lease table against a fake store (a quota in memory, background work run when the
//! test says) and an injected clock: hot detection, admission from slices, conservation of
//! quota, refunds, the idle give-back, drop and a store that is down.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::limits::clock::ManualClock;
use crate::metrics::Metrics;

type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A store holding `quota` units of one key's limit, its calls run by [`Fake::run`].
#[derive(Clone)]
struct Fake(Arc<State>);

struct State {
    quota: AtomicU64,
    up: AtomicBool,
    takes: AtomicU64,
    work: Mutex<Vec<Work>>,
    calls: LeaseCalls,
}

impl Fake {
    fn new(quota: u64) -> Self {
        let calls = Metrics::new().unwrap().store("fake").lease_calls;
        Fake(Arc::new(State {
            quota: AtomicU64::new(quota),
            up: AtomicBool::new(true),
            takes: AtomicU64::new(0),
            work: Mutex::new(Vec::new()),
            calls,
        }))
    }

    /// Runs the background work spawned so far (and what it spawns).
    fn run(&self) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        loop {
            let work: Vec<Work> = std::mem::take(&mut *self.0.work.lock().unwrap());
            if work.is_empty() {
                return;
            }
            for w in work {
                rt.block_on(w);
            }
        }
    }

    fn quota(&self) -> u64 {
        self.0.quota.load(Ordering::SeqCst)
    }
}

impl LeaseKind for Fake {
    type Host = State;

    fn host(&self) -> &State {
        &self.0
    }

    fn take(
        self,
        _key: u64,
        want: u64,
    ) -> impl Future<Output = Result<LeaseGrant, StoreError>> + Send + 'static {
        let s = self.0;
        async move {
            s.takes.fetch_add(1, Ordering::SeqCst);
            if !s.up.load(Ordering::SeqCst) {
                return Err(StoreError::Timeout);
            }
            let have = s.quota.load(Ordering::SeqCst);
            let granted = want.min(have);
            s.quota.fetch_sub(granted, Ordering::SeqCst);
            Ok(LeaseGrant {
                granted,
                remaining: have - granted,
                epoch: 0,
                valid_for: None,
            })
        }
    }

    fn give_back(
        self,
        _key: u64,
        n: u64,
        _epoch: u64,
    ) -> impl Future<Output = bool> + Send + 'static {
        let s = self.0;
        async move {
            s.quota.fetch_add(n, Ordering::SeqCst);
            true
        }
    }

    fn quiet(&self) -> Nanos {
        NANOS_PER_SEC
    }
}

impl LeaseHost for State {
    fn up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.work.lock().unwrap().push(Box::pin(work));
    }

    fn calls(&self) -> &LeaseCalls {
        &self.calls
    }
}

const MS: Nanos = 1_000_000;

fn table(fake: &Fake, limit: u64) -> (LeaseTable<Fake>, IntGauge, Arc<ManualClock>) {
    let gauge = IntGauge::new("leased", "test").unwrap();
    let clock = Arc::new(ManualClock::default());
    let ctx = LeaseCtx {
        params: LeaseParams {
            max_share: 100_000, // 10%
            ..LeaseParams::default()
        },
        gauge: gauge.clone(),
        clock: clock.clone(),
    };
    (LeaseTable::new(fake.clone(), ctx, limit, 1), gauge, clock)
}

/// Decides `key` every `step` from `from` for `n` decisions, running background work after
/// each: (admitted from slices, sent the exact way).
fn drive(
    t: &LeaseTable<Fake>,
    fake: &Fake,
    key: u64,
    from: Nanos,
    step: Nanos,
    n: u64,
) -> (u64, u64) {
    let (mut sliced, mut exact) = (0, 0);
    for i in 0..n {
        match t.admit(key, 1, from + i * step) {
            FromSlice::Admitted { .. } => sliced += 1,
            FromSlice::Exact => exact += 1,
        }
        fake.run();
    }
    (sliced, exact)
}

#[test]
fn a_cold_key_is_never_leased() {
    let fake = Fake::new(1_000_000);
    let (t, _, _) = table(&fake, 1_000_000);
    // 10 a second, below hot_above (20/s): every decision exact, no take.
    let (sliced, exact) = drive(&t, &fake, 42, 0, 100 * MS, 50);
    assert_eq!((sliced, exact), (0, 50));
    assert_eq!(fake.0.takes.load(Ordering::SeqCst), 0);
    assert_eq!(t.keys(), 0);
}

#[test]
fn a_hot_key_is_admitted_from_slices_and_quota_is_conserved() {
    let fake = Fake::new(1_000_000);
    let (t, gauge, clock) = table(&fake, 1_000_000);
    // 1000 a second for 5 s.
    let (sliced, exact) = drive(&t, &fake, 7, 0, MS, 5_000);
    assert!(exact < 50, "only until the first slice: {exact} exact");
    let takes = fake.0.takes.load(Ordering::SeqCst);
    // About one take per renew_every (100 ms): 10 a second, 0.01 per decision here.
    assert!(takes <= 60, "{takes} takes for {sliced} admissions");
    // Quota is conserved: what left the store is admitted or held.
    assert_eq!(1_000_000 - fake.quota(), sliced + t.held());
    // Idle for `idle`: the sweep gives it all back and frees the entry.
    clock.set(5 * NANOS_PER_SEC + 2 * NANOS_PER_SEC);
    let held = t.held();
    assert!(held > 0);
    assert_eq!(t.sweep(clock.now()), held);
    fake.run();
    assert_eq!(1_000_000 - fake.quota(), sliced);
    assert_eq!((t.held(), t.keys(), gauge.get()), (0, 0, 0));
}

#[test]
fn a_slice_never_admits_more_than_the_store_had() {
    let fake = Fake::new(300);
    let (t, _, _) = table(&fake, 1_000);
    let (sliced, _) = drive(&t, &fake, 9, 0, MS, 2_000);
    assert!(sliced <= 300, "{sliced}");
    assert!(sliced >= 250, "most of the quota is used: {sliced}");
    assert_eq!(300 - fake.quota(), sliced + t.held());
    // Empty: a take that grants nothing keeps the key quiet for a refill (1 s here).
    let takes = fake.0.takes.load(Ordering::SeqCst);
    drive(&t, &fake, 9, 2_000 * MS, MS, 500);
    assert!(fake.0.takes.load(Ordering::SeqCst) <= takes + 1);
}

#[test]
fn refunds_go_back_into_the_slice_and_the_gauge_follows() {
    let fake = Fake::new(10_000);
    let (t, gauge, clock) = table(&fake, 10_000);
    drive(&t, &fake, 3, 0, MS, 1_000);
    let held = t.held();
    assert!(t.refund(3, 2));
    assert_eq!(t.held(), held + 2);
    assert!(
        !t.refund(4, 2),
        "no slice for key 4: the caller refunds the store"
    );
    clock.set(NANOS_PER_SEC);
    assert_eq!(t.sweep(clock.now()), 0, "not idle yet");
    assert_eq!(gauge.get(), i64::try_from(held + 2).unwrap());
}

#[test]
fn dropping_the_table_gives_everything_back_once() {
    let fake = Fake::new(10_000);
    let (t, gauge, _) = table(&fake, 10_000);
    let (mut sliced, _) = drive(&t, &fake, 5, 0, MS, 1_000);
    // Admit until a renewal is on its way when the table goes.
    while fake.0.work.lock().unwrap().is_empty() {
        if matches!(t.admit(5, 1, 1_000 * MS), FromSlice::Admitted { .. }) {
            sliced += 1;
        }
    }
    drop(t);
    fake.run();
    assert_eq!(
        10_000 - fake.quota(),
        sliced,
        "held and in-flight quota back"
    );
    assert_eq!(gauge.get(), 0);
}

#[test]
fn with_the_store_down_held_slices_still_admit_then_the_exact_path_decides() {
    let fake = Fake::new(100_000);
    let (t, _, _) = table(&fake, 100_000);
    drive(&t, &fake, 11, 0, MS, 1_000);
    fake.0.up.store(false, Ordering::SeqCst);
    let held = t.held();
    let (sliced, exact) = drive(&t, &fake, 11, 1_000 * MS, MS, held + 100);
    assert_eq!(sliced, held, "the slice is spent");
    assert_eq!(exact, 100, "then the exact path (and its fallback)");
}

#[test]
fn concurrent_admissions_refunds_sweeps_and_hand_overs_conserve_quota() {
    let fake = Fake::new(1_000_000);
    let clock = Arc::new(ManualClock::default());
    let ctx = LeaseCtx {
        params: LeaseParams {
            hot_above: 1,
            max_share: 100_000,
            idle: 5 * MS,
            ..LeaseParams::default()
        },
        gauge: IntGauge::new("leased", "test").unwrap(),
        clock: clock.clone(),
    };
    let t = Arc::new(LeaseTable::new(fake.clone(), ctx, 1_000_000, 1));
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3u64)
        .map(|w| {
            let (t, clock, admitted) = (t.clone(), clock.clone(), admitted.clone());
            std::thread::spawn(move || {
                // Until 20 000 are admitted from slices, however slowly the runner lands
                // the grants on a loaded machine (bounded: 60 s).
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                for i in 0u64.. {
                    if admitted.load(Ordering::Relaxed) >= 20_000
                        || std::time::Instant::now() > deadline
                    {
                        break;
                    }
                    if i % 1_000 == 0 {
                        // Let the runner in: the grants are what the workers wait for.
                        std::thread::yield_now();
                    }
                    // Keys come and go, so idle entries are handed over to others.
                    let key = 1 + (i / 2_000 + w) % 5;
                    clock.advance(std::time::Duration::from_micros(10));
                    if let FromSlice::Admitted { .. } = t.admit(key, 1, clock.now()) {
                        if i % 7 != 0 || !t.refund(key, 1) {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();
    let runner = {
        let (t, fake, clock, stop) = (t.clone(), fake.clone(), clock.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                fake.run();
                t.sweep(clock.now());
            }
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    runner.join().unwrap();
    fake.run();
    let admitted = admitted.load(Ordering::SeqCst);
    assert!(admitted >= 20_000, "admitted from slices: {admitted}");
    assert_eq!(1_000_000 - fake.quota(), admitted + t.held());
    // Every slice given back: nothing left out of the store but what was admitted.
    clock.advance(std::time::Duration::from_secs(1));
    t.sweep(clock.now());
    fake.run();
    assert_eq!(1_000_000 - fake.quota(), admitted);
}

/// A holding kind's fleet of one: `max` slots in the fake store; requests acquire a slot
/// (from the block, or exactly from the store) and release it (into the block, or
/// exactly), with the slots in use, free in the block and free in the store conserved.
struct Holding {
    fake: Fake,
    t: LeaseTable<Fake>,
    clock: Arc<ManualClock>,
    max: u64,
    in_use: u64,
    /// Whether each slot in use came from the block, oldest first.
    from_block: std::collections::VecDeque<bool>,
    exact_calls: u64,
}

impl Holding {
    fn new(max: u64) -> Self {
        let fake = Fake::new(max);
        let (t, _, clock) = table(&fake, max);
        Self {
            fake,
            t,
            clock,
            max,
            in_use: 0,
            from_block: std::collections::VecDeque::new(),
            exact_calls: 0,
        }
    }

    /// One acquisition at the clock's time: whether it got a slot.
    fn acquire(&mut self) -> bool {
        let (got, block) = match self.t.acquire(1, 1, self.clock.now()) {
            FromSlice::Admitted { .. } => (true, true),
            FromSlice::Exact => {
                self.exact_calls += 1;
                let q = &self.fake.0.quota;
                let taken =
                    q.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| q.checked_sub(1));
                (taken.is_ok(), false)
            }
        };
        if got {
            self.in_use += 1;
            self.from_block.push_back(block);
        }
        self.fake.run();
        self.check();
        got
    }

    fn release(&mut self) {
        assert!(self.in_use > 0);
        self.in_use -= 1;
        let block = self.from_block.pop_front().unwrap_or(false);
        if !self.t.release(1, 1, block, self.clock.now()) {
            self.exact_calls += 1;
            self.fake.0.quota.fetch_add(1, Ordering::SeqCst);
        }
        self.fake.run();
        self.check();
    }

    /// In use + free in blocks + free in the store = max: never more in use than max.
    fn check(&self) {
        assert_eq!(self.in_use + self.t.held() + self.fake.quota(), self.max);
    }
}

#[test]
fn a_hot_holding_key_reuses_its_block_with_no_call_and_never_exceeds_max() {
    let mut h = Holding::new(100);
    // A steady key: 8 in use, one request a millisecond.
    for i in 0..2_000u64 {
        h.clock.set(i * MS);
        if h.in_use >= 8 {
            h.release();
        }
        h.acquire();
    }
    assert_eq!(h.in_use, 8);
    // Once its block is taken, the key costs no call: releases go back into the block
    // and acquisitions take from it.
    let (calls, takes) = (h.exact_calls, h.fake.0.takes.load(Ordering::SeqCst));
    for i in 2_000..3_000u64 {
        h.clock.set(i * MS);
        h.release();
        assert!(h.acquire());
    }
    assert_eq!(h.exact_calls, calls, "no exact call in steady state");
    assert_eq!(h.fake.0.takes.load(Ordering::SeqCst), takes, "no take");
    // Everything released: a surplus above twice a block (10% of 100 = 10) goes back.
    while h.in_use > 0 {
        h.release();
    }
    assert!(h.t.held() <= 20, "held {}", h.t.held());
    // Idle: all of it goes back.
    h.clock.set(3_000 * MS + 2 * NANOS_PER_SEC);
    h.t.sweep(h.clock.now());
    h.fake.run();
    assert_eq!((h.t.held(), h.fake.quota()), (0, 100));
}

#[test]
fn a_full_holding_limit_is_decided_exactly_and_blocks_never_hold_more_than_max() {
    let mut h = Holding::new(12);
    // Offered far more than 12 at once: at most 12 are ever in use, and all 12 are.
    let mut got = 0;
    for i in 0..200u64 {
        h.clock.set(i * MS);
        got += u64::from(h.acquire());
    }
    assert_eq!((got, h.in_use), (12, 12));
    // Half released, then offered again: the block (or the store) gives them out again.
    for _ in 0..6 {
        h.release();
    }
    let mut again = 0;
    for i in 200..300u64 {
        h.clock.set(i * MS);
        again += u64::from(h.acquire());
    }
    assert_eq!((again, h.in_use), (6, 12));
}

#[test]
fn the_idle_sweep_keeps_a_holding_key_with_slots_in_use_and_gives_its_free_slots_back() {
    let mut h = Holding::new(1_000);
    for i in 0..500u64 {
        h.clock.set(i * MS);
        h.acquire();
        if h.in_use > 4 {
            h.release();
        }
    }
    let held = h.t.held();
    assert!(held > 0, "a block is held");
    // Idle with 4 slots in use (long requests): the free slots go back, the entry stays.
    h.clock.set(500 * MS + 2 * NANOS_PER_SEC);
    assert_eq!(h.t.sweep(h.clock.now()), held);
    h.fake.run();
    assert_eq!((h.t.held(), h.t.keys()), (0, 1));
    // Their releases still come back to the block, no call.
    let calls = h.exact_calls;
    while h.in_use > 0 {
        h.release();
    }
    assert_eq!(h.exact_calls, calls);
    assert_eq!(h.in_use + h.t.held() + h.fake.quota(), 1_000);
}
