//! One key's held slice: admission from quota already taken from the store, with atomics
//! only (no allocation, no lock, no syscall), so a hot key's decision costs what a local
//! one does.
//!
//! **Accounting.** `avail` is the quota held and not yet spent. An admission of cost `c`
//! compare-and-swaps `avail → avail - c` and only succeeds if `avail ≥ c`; a grant from
//! the store adds to it; an idle give-back, a period change or a lapse takes all of it out
//! (by swap). For holding kinds (slots of a concurrency or inflight max) a released slot
//! comes back into `avail`, and a surplus above twice a block goes back to the store
//! (hysteresis: a request's release costs no call). Hence, at every instant,
//!
//! ```text
//!     admitted + avail + given_back + voided = granted + released
//! ```
//!
//! and since `avail ≥ 0`, `admitted ≤ granted + released`: a slice never admits more than
//! was leased to it (overshoot 0); for holding kinds the slots in use never exceed the
//! slots held. The tests check the identity after every step of random interleavings and
//! under concurrent admissions.
//!
//! **Renewal.** After an admission leaves at most the low-water mark (a quarter of the
//! slice, [`SliceSizer::low_water`](crate::limits::lease::SliceSizer::low_water)), or when
//! a request finds the slice short, the one caller that flips `renewing` is told to renew
//! (in the background); the others are not, until the renewal's answer
//! ([`Slice::grant`]) or failure ([`Slice::renew_failed`]) clears it.
//!
//! **Validity.** A slice's quota may be spent until `until` only: the end of the rate
//! period it was counted in, or the lapse of the store's lease on slots. The caller passes
//! an `until` computed from the store's reply as its own send time plus the time the store
//! said was left, which is never later than the store's own instant. A grant for another
//! `epoch` (the next rate period) replaces what is left instead of adding to it: counts of
//! an ended period are void.
//!
//! **Idle.** A slice not used for `idle` is emptied and its quota given back
//! ([`Slice::take_idle`]), so an instance that stopped seeing a key holds none of it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::limits::clock::Nanos;

/// What [`Slice::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Admitted from the slice, with no call. `renew`: this caller must ask for the next
    /// slice (in the background; nobody waits for it).
    Admitted {
        /// Ask the store for the next slice.
        renew: bool,
    },
    /// The slice cannot pay this cost (empty, short or lapsed): the caller decides
    /// exactly, as with leases off. `renew` as above.
    Short {
        /// Ask the store for the next slice.
        renew: bool,
    },
}

/// One key's slice of a shared limit's quota on this instance.
#[derive(Debug, Default)]
pub struct Slice {
    avail: AtomicU64,
    low_water: AtomicU64,
    epoch: AtomicU64,
    until: AtomicU64,
    last_use: AtomicU64,
    in_use: AtomicU64,
    used: AtomicU64,
    since: AtomicU64,
    voided: AtomicU64,
    quiet_until: AtomicU64,
    renewing: AtomicBool,
}

impl Slice {
    /// An empty slice (nothing held, nothing admitted).
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits an event of cost `cost` at `now` from the slice if it holds `cost` and has
    /// not lapsed. No allocation, no lock, no syscall: a few atomic operations.
    pub fn admit(&self, cost: u64, now: Nanos) -> Admit {
        if now >= self.until.load(Ordering::Acquire) {
            let void = self.avail.swap(0, Ordering::AcqRel);
            if void > 0 {
                if now < self.until.load(Ordering::Acquire) {
                    // A grant landed meanwhile ([`Slice::grant`] moves `until` before it
                    // adds): what was taken is its own and valid, so it goes back.
                    self.avail.fetch_add(void, Ordering::AcqRel);
                } else {
                    self.voided.fetch_add(void, Ordering::Relaxed);
                }
            }
            return Admit::Short {
                renew: self.claim_renewal(),
            };
        }
        let mut current = self.avail.load(Ordering::Acquire);
        loop {
            if current < cost {
                let quiet = now < self.quiet_until.load(Ordering::Relaxed);
                return Admit::Short {
                    renew: !quiet && self.claim_renewal(),
                };
            }
            match self.avail.compare_exchange_weak(
                current,
                current - cost,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        self.used.fetch_add(cost, Ordering::Relaxed);
        self.last_use.fetch_max(now, Ordering::Relaxed);
        let left = current - cost;
        Admit::Admitted {
            renew: left <= self.low_water.load(Ordering::Relaxed) && self.claim_renewal(),
        }
    }

    /// A holding kind's acquisition: [`Slice::admit`], and the slot is counted in use
    /// until [`Slice::release`].
    pub fn acquire(&self, cost: u64, now: Nanos) -> Admit {
        let a = self.admit(cost, now);
        if matches!(a, Admit::Admitted { .. }) {
            self.in_use.fetch_add(cost, Ordering::Relaxed);
        }
        a
    }

    /// A holding kind's release of `n` slots acquired from this slice: they come back
    /// into the slice (no call). Never more than are in use.
    pub fn release(&self, n: u64, now: Nanos) {
        let mut current = self.in_use.load(Ordering::Acquire);
        let n = loop {
            let n = n.min(current);
            match self.in_use.compare_exchange_weak(
                current,
                current - n,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break n,
                Err(actual) => current = actual,
            }
        };
        self.avail.fetch_add(n, Ordering::AcqRel);
        self.last_use.fetch_max(now, Ordering::Relaxed);
    }

    /// A holding kind's release of `n` slots the store counts for this holder: slots this
    /// slice admitted (`from_slice`) come off the in-use count; slots the exact path
    /// decided join the slice as a grant would (the identity of the module doc holds with
    /// them counted in `granted`). Either way all `n` come back into the slice (no call),
    /// valid with no end: slots live as long as their holder's lease in the store, which
    /// outlives the slice, so a slice that was never granted must not void them.
    pub fn put_back(&self, n: u64, from_slice: bool, now: Nanos) {
        self.until.store(u64::MAX, Ordering::Release);
        if from_slice {
            self.release(n, now);
        } else {
            self.avail.fetch_add(n, Ordering::AcqRel);
            self.last_use.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// The renewal's answer: `granted` more units for `epoch` (a rate period; 0 for the
    /// kinds without one), spendable until `until`, with the next low-water mark. A new
    /// epoch voids what is left of the old one. Clears the renewal flag.
    pub fn grant(&self, granted: u64, epoch: u64, until: Nanos, low_water: u64, now: Nanos) {
        // Old epoch's units out, then the new end, then the grant: an admission that
        // read the old (lapsed) end never voids the new units (see `admit`).
        if self.epoch.swap(epoch, Ordering::AcqRel) != epoch {
            let void = self.avail.swap(0, Ordering::AcqRel);
            self.voided.fetch_add(void, Ordering::Relaxed);
        }
        self.low_water.store(low_water, Ordering::Relaxed);
        self.until.store(until, Ordering::Release);
        self.avail.fetch_add(granted, Ordering::AcqRel);
        self.last_use.fetch_max(now, Ordering::Relaxed);
        self.renewing.store(false, Ordering::Release);
    }

    /// The store had nothing to lease (a take granted 0): a short slice asks for no
    /// renewal before `until` (the next refill, the period's end), so a key at its limit
    /// costs the exact path's calls only, which the deny cache absorbs, not a take each.
    pub fn quiet_until(&self, until: Nanos) {
        self.quiet_until.store(until, Ordering::Relaxed);
    }

    /// The renewal failed (store down, budget spent): another may be asked for.
    pub fn renew_failed(&self) {
        self.renewing.store(false, Ordering::Release);
    }

    /// If the slice has not been used for `idle` by `now` and no renewal is on its way,
    /// empties it and returns what it held, to give back to the store; else 0.
    pub fn take_idle(&self, now: Nanos, idle: Nanos) -> u64 {
        if now.saturating_sub(self.last_use.load(Ordering::Relaxed)) < idle || !self.claim_renewal()
        {
            return 0;
        }
        let n = self.avail.swap(0, Ordering::AcqRel);
        self.renewing.store(false, Ordering::Release);
        n
    }

    /// A holding kind's surplus: when more than `2 × block` slots are free, all but
    /// `block` of them are taken out, to give back to the store; else 0. The gap between
    /// the two marks is the hysteresis that keeps a key whose in-use count wobbles from
    /// calling at each release.
    pub fn take_surplus(&self, block: u64) -> u64 {
        let block = block.max(1);
        let mut current = self.avail.load(Ordering::Acquire);
        loop {
            if current <= block.saturating_mul(2) {
                return 0;
            }
            match self.avail.compare_exchange_weak(
                current,
                block,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return current - block,
                Err(actual) => current = actual,
            }
        }
    }

    /// The units admitted since the last reading and the time they took (for the next
    /// slice's size), starting a new reading at `now`.
    pub fn rate(&self, now: Nanos) -> (u64, Nanos) {
        let used = self.used.swap(0, Ordering::Relaxed);
        let since = self.since.swap(now, Ordering::Relaxed);
        (used, now.saturating_sub(since))
    }

    /// The quota held and not spent: this key's part of the under-admission bound
    /// (`tollgate_store_leased`).
    pub fn available(&self) -> u64 {
        self.avail.load(Ordering::Acquire)
    }

    /// A holding kind's slots in use (acquired from the slice, not released).
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// A holding kind's slots held from the store: in use plus free.
    pub fn held(&self) -> u64 {
        self.in_use().saturating_add(self.available())
    }

    /// Quota voided so far: left when a period ended or a lease lapsed.
    pub fn voided(&self) -> u64 {
        self.voided.load(Ordering::Relaxed)
    }

    /// Whether a renewal is on its way.
    pub fn renewing(&self) -> bool {
        self.renewing.load(Ordering::Acquire)
    }

    /// Puts back `n` units an admission from this slice took (a later limit rejected the
    /// request: the no-burn rule): they are held again, to be spent or given back. The
    /// identity of the module doc holds with `admitted` lowered by `n`.
    pub fn refund(&self, n: u64) {
        self.avail.fetch_add(n, Ordering::AcqRel);
    }

    /// Takes the renewal flag if it is clear (true for the one caller that did): while it
    /// is held no grant lands, so the holder may empty and hand the slice over; it clears
    /// it with [`Slice::renew_failed`].
    pub fn claim(&self) -> bool {
        self.claim_renewal()
    }

    /// Empties the slice, returning what it held (to give back to the store).
    pub fn drain(&self) -> u64 {
        self.avail.swap(0, Ordering::AcqRel)
    }

    /// Forgets the previous holder's validity, epoch, quiet time and low-water mark, so the
    /// slice starts over for another key (called with the renewal flag held, after
    /// [`Slice::drain`]).
    pub fn reset(&self) {
        self.until.store(0, Ordering::Release);
        self.epoch.store(0, Ordering::Release);
        self.quiet_until.store(0, Ordering::Relaxed);
        self.low_water.store(0, Ordering::Relaxed);
        self.used.store(0, Ordering::Relaxed);
    }

    /// The epoch (rate period) of the quota held.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// How long the slice has gone unused at `now`.
    pub fn idle_for(&self, now: Nanos) -> Nanos {
        now.saturating_sub(self.last_use.load(Ordering::Relaxed))
    }

    /// Sets the renewal flag if it was clear: true for the one caller that did.
    fn claim_renewal(&self) -> bool {
        !self.renewing.load(Ordering::Relaxed)
            && self
                .renewing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    const FOREVER: Nanos = u64::MAX;

    #[test]
    fn admits_what_was_granted_and_not_one_more() {
        let s = Slice::new();
        assert_eq!(s.admit(1, 0), Admit::Short { renew: true }, "empty: renew");
        s.grant(10, 0, FOREVER, 2, 0);
        for _ in 0..10 {
            assert!(matches!(s.admit(1, 1), Admit::Admitted { .. }));
        }
        assert!(matches!(s.admit(1, 1), Admit::Short { .. }));
        assert_eq!(s.available(), 0);
        // A cost larger than what is left takes nothing.
        s.grant(3, 0, FOREVER, 0, 2);
        assert!(matches!(s.admit(4, 2), Admit::Short { .. }));
        assert_eq!(s.available(), 3);
        assert!(matches!(s.admit(3, 2), Admit::Admitted { .. }));
    }

    #[test]
    fn the_low_water_mark_asks_one_caller_to_renew() {
        let s = Slice::new();
        s.grant(100, 0, FOREVER, 25, 0);
        for i in 0..74 {
            assert_eq!(s.admit(1, 1), Admit::Admitted { renew: false }, "{i}");
        }
        assert_eq!(s.admit(1, 1), Admit::Admitted { renew: true }, "25 left");
        assert!(s.renewing());
        assert_eq!(
            s.admit(1, 1),
            Admit::Admitted { renew: false },
            "already asked"
        );
        s.grant(100, 0, FOREVER, 25, 1);
        assert!(!s.renewing());
        assert_eq!(s.available(), 124);
        // A failed renewal lets the next caller below the mark ask again.
        for _ in 0..99 {
            s.admit(1, 2);
        }
        assert!(s.renewing());
        s.renew_failed();
        assert_eq!(s.admit(1, 2), Admit::Admitted { renew: true });
    }

    #[test]
    fn an_idle_slice_goes_back_and_a_used_one_does_not() {
        let idle = 2_000;
        let s = Slice::new();
        s.grant(50, 0, FOREVER, 0, 1_000);
        assert_eq!(s.take_idle(2_999, idle), 0, "granted at 1000");
        s.admit(5, 2_500);
        assert_eq!(s.take_idle(4_499, idle), 0, "used at 2500");
        assert_eq!(s.take_idle(4_500, idle), 45, "idle for 2000");
        assert_eq!(s.available(), 0);
        assert_eq!(s.take_idle(9_000, idle), 0, "nothing left");
        // Not while a renewal is on its way (its grant would land in an emptied slice).
        s.grant(7, 0, FOREVER, 0, 9_000);
        assert!(matches!(s.admit(7, 9_000), Admit::Admitted { renew: true }));
        assert_eq!(s.take_idle(20_000, idle), 0);
    }

    #[test]
    fn a_new_period_voids_the_old_counts_and_a_lapsed_slice_admits_nothing() {
        let s = Slice::new();
        s.grant(10, 7, 1_000, 0, 0);
        s.admit(4, 10);
        // Renewed in the next period: the 6 left of period 7 are void.
        s.grant(5, 8, 2_000, 0, 1_000);
        assert_eq!((s.available(), s.voided()), (5, 6));
        // Past its end nothing is admitted and what is left is void.
        assert!(matches!(s.admit(1, 2_000), Admit::Short { renew: true }));
        assert_eq!((s.available(), s.voided()), (0, 11));
    }

    #[test]
    fn slots_put_back_into_a_slice_never_granted_stay_valid() {
        // Released slots decided exactly join a slice no take has granted yet (its end
        // still 0): they are admitted, never voided.
        let s = Slice::new();
        s.put_back(2, false, 5);
        assert!(matches!(s.acquire(1, 6), Admit::Admitted { .. }));
        assert_eq!((s.available(), s.voided(), s.in_use()), (1, 0, 1));
        s.put_back(1, true, 7);
        assert_eq!((s.available(), s.in_use()), (2, 0));
    }

    #[test]
    fn holding_kinds_reuse_released_slots_and_give_surplus_back_with_hysteresis() {
        let s = Slice::new();
        s.grant(8, 0, FOREVER, 0, 0);
        for _ in 0..8 {
            assert!(matches!(s.acquire(1, 1), Admit::Admitted { .. }));
        }
        assert!(matches!(s.acquire(1, 1), Admit::Short { .. }));
        assert_eq!((s.in_use(), s.held()), (8, 8));
        s.release(3, 2);
        assert_eq!((s.in_use(), s.available(), s.held()), (5, 3, 8));
        assert!(
            matches!(s.acquire(1, 3), Admit::Admitted { .. }),
            "a released slot"
        );
        // Releasing more than in use is bounded.
        s.release(100, 4);
        assert_eq!((s.in_use(), s.available()), (0, 8));
        // block 4: 8 free is not above 2 × 4, no call.
        assert_eq!(s.take_surplus(4), 0);
        s.grant(1, 0, FOREVER, 0, 5);
        assert_eq!(s.take_surplus(4), 5, "9 free: keep 4");
        assert_eq!((s.available(), s.held()), (4, 4));
    }

    #[test]
    fn an_empty_grant_quiets_renewals_until_told() {
        let s = Slice::new();
        s.grant(1, 0, FOREVER, 0, 0);
        assert_eq!(s.admit(1, 1), Admit::Admitted { renew: true });
        s.grant(0, 0, FOREVER, 0, 2);
        s.quiet_until(100);
        assert_eq!(s.admit(1, 50), Admit::Short { renew: false });
        assert_eq!(s.admit(1, 99), Admit::Short { renew: false });
        assert_eq!(s.admit(1, 100), Admit::Short { renew: true });
    }

    #[test]
    fn rate_readings_count_admissions_between_them() {
        let s = Slice::new();
        s.grant(100, 0, FOREVER, 0, 0);
        let _ = s.rate(1_000);
        for _ in 0..30 {
            s.admit(1, 1_500);
        }
        assert_eq!(s.rate(3_000), (30, 2_000));
        assert_eq!(s.rate(3_500), (0, 500));
    }

    #[test]
    fn concurrent_admissions_never_exceed_the_grant() {
        let s = Arc::new(Slice::new());
        s.grant(10_000, 0, FOREVER, 2_500, 0);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let (mut admitted, mut renewals) = (0u64, 0u64);
                    for i in 0..5_000u64 {
                        let cost = 1 + (i + t) % 3;
                        match s.admit(cost, i) {
                            Admit::Admitted { renew } => {
                                admitted += cost;
                                renewals += u64::from(renew);
                            }
                            Admit::Short { renew } => renewals += u64::from(renew),
                        }
                    }
                    (admitted, renewals)
                })
            })
            .collect();
        let (admitted, renewals) = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert!(admitted <= 10_000, "overshoot: {admitted}");
        assert_eq!(admitted + s.available(), 10_000, "nothing lost either");
        assert!(
            admitted >= 10_000 - 2,
            "demand of 40 000 spends all but a cost"
        );
        assert_eq!(renewals, 1, "one renewal asked for while it is on its way");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit(u64),
        Acquire(u64),
        Release(u64),
        Grant { n: u64, epoch: u64, life: Nanos },
        Idle,
        Surplus(u64),
        Fail,
        Advance(Nanos),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..5).prop_map(Op::Admit),
            2 => (1u64..5).prop_map(Op::Acquire),
            2 => (1u64..5).prop_map(Op::Release),
            2 => (0u64..20, 0u64..3, 1u64..5_000).prop_map(|(n, epoch, life)| Op::Grant { n, epoch, life }),
            1 => Just(Op::Idle),
            1 => (1u64..6).prop_map(Op::Surplus),
            1 => Just(Op::Fail),
            2 => (0u64..2_000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// `admitted + avail + given_back + voided = granted + released` after every step,
        /// so a slice never admits more than it was leased plus what was released to it.
        #[test]
        fn never_admits_beyond_what_was_leased(ops in proptest::collection::vec(op(), 1..200)) {
            let s = Slice::new();
            let (mut now, mut admitted, mut granted, mut released, mut back) = (0u64, 0u64, 0u64, 0u64, 0u64);
            let mut in_use = 0u64;
            for op in ops {
                match op {
                    Op::Admit(c) => if let Admit::Admitted { .. } = s.admit(c, now) { admitted += c },
                    Op::Acquire(c) => if let Admit::Admitted { .. } = s.acquire(c, now) {
                        admitted += c;
                        in_use += c;
                    },
                    Op::Release(n) => {
                        let n = n.min(in_use);
                        in_use -= n;
                        released += n;
                        s.release(n, now);
                    }
                    Op::Grant { n, epoch, life } => {
                        granted += n;
                        s.grant(n, epoch, now + life, n / 4, now);
                    }
                    Op::Idle => back += s.take_idle(now, 1_000),
                    Op::Surplus(b) => back += s.take_surplus(b),
                    Op::Fail => s.renew_failed(),
                    Op::Advance(d) => now += d,
                }
                prop_assert_eq!(admitted + s.available() + back + s.voided(), granted + released);
                prop_assert!(admitted <= granted + released);
                prop_assert_eq!(s.in_use(), in_use);
            }
        }
    }
}
