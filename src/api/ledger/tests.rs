//! Unit tests of `super`: the ledger's slots, releases and transfers.

use super::*;
use crate::limits::ConcurrencyParams;

/// A local concurrency state and its group names.
struct Pool {
    limiter: Arc<ConcurrencyLimiter>,
    names: Arc<[String]>,
}

impl Pool {
    fn counted(&self) -> Counted {
        Counted {
            counter: Counter::Local(Arc::clone(&self.limiter)),
            names: Arc::clone(&self.names),
        }
    }
}

fn limiter(max: u64, groups: Vec<u64>) -> Pool {
    let names: Vec<String> = (0..groups.len()).map(|i| format!("g{i}")).collect();
    Pool {
        limiter: Arc::new(
            ConcurrencyLimiter::new(
                ConcurrencyParams {
                    max,
                    global: Some(100),
                    groups,
                },
                64,
            )
            .unwrap(),
        ),
        names: names.into(),
    }
}

fn hold(
    budget: &Arc<ReservationBudget>,
    ledger: &Ledger,
    c: &Pool,
    gauge: &IntGauge,
    domain: &[u8],
    groups: u64,
    copies: u64,
) -> Reservation {
    let key = domain.len() as u64 * 7919;
    let taken = c.limiter.reserve(key, groups, copies, copies).unwrap();
    Reservation::new(
        NewReservation {
            resource: &Arc::from("uploads"),
            domain,
            groups,
            counted: Some(c.counted()),
            key,
            taken,
            forced: 0,
            gauge,
        },
        ledger.slot(budget).unwrap(),
    )
}

#[test]
fn a_ledger_releases_what_it_holds_once_and_refuses_more() {
    let budget = Arc::new(ReservationBudget::new(10));
    let gauge = IntGauge::new("g", "g").unwrap();
    let c = limiter(10, vec![5, 5]);
    let mut ledger = Ledger::default();
    let h = hold(&budget, &ledger, &c, &gauge, b"acme", 0b01, 3);
    ledger.add(h);
    let h = hold(&budget, &ledger, &c, &gauge, b"acme", 0b01, 2);
    ledger.add(h);
    assert_eq!(
        (ledger.len(), budget.used()),
        (1, 1),
        "merged into one entry"
    );
    assert_eq!((gauge.get(), c.limiter.in_use(0)), (5, 5));
    let g0: &[&[u8]] = &[b"g0"];
    let g1: &[&[u8]] = &[b"g1"];
    // More than held, or in groups it was not taken from: an error, nothing changes.
    assert_eq!(
        ledger.release(b"uploads", b"acme", 6, None),
        Err(LedgerError::OverRelease { held: 5, asked: 6 })
    );
    assert_eq!(
        ledger.release(b"uploads", b"acme", 1, Some(g1)),
        Err(LedgerError::OverRelease { held: 0, asked: 1 })
    );
    assert_eq!(
        ledger.release(b"uploads", b"other", 1, None).unwrap_err(),
        LedgerError::OverRelease { held: 0, asked: 1 }
    );
    assert_eq!((gauge.get(), c.limiter.in_use(0)), (5, 5));
    assert_eq!(ledger.release(b"uploads", b"acme", 2, Some(g0)), Ok(3));
    assert_eq!(
        (gauge.get(), c.limiter.in_use(0), c.limiter.in_use_global()),
        (3, 3, 3)
    );
    // The connection ends: the rest goes back, once.
    drop(ledger);
    assert_eq!(
        (gauge.get(), c.limiter.in_use(0), c.limiter.in_use_global()),
        (0, 0, 0)
    );
    assert_eq!(budget.used(), 0);
}

#[test]
fn copies_go_back_to_the_groups_and_state_they_were_taken_from() {
    let budget = Arc::new(ReservationBudget::new(10));
    let gauge = IntGauge::new("g", "g").unwrap();
    let (before, after) = (limiter(10, vec![5, 5]), limiter(10, vec![5, 5]));
    let mut ledger = Ledger::default();
    // Taken in group 0 of the old state; a reload moved the domain to group 1 of a
    // new state, where it takes more.
    let h = hold(&budget, &ledger, &before, &gauge, b"acme", 0b01, 2);
    ledger.add(h);
    let h = hold(&budget, &ledger, &after, &gauge, b"acme", 0b10, 1);
    ledger.add(h);
    assert_eq!(ledger.len(), 2);
    assert_eq!(ledger.holding(b"uploads", b"acme", None), 3);
    // Newest first: the new state's copy, then one of the old.
    assert_eq!(ledger.release(b"uploads", b"acme", 2, None), Ok(1));
    assert_eq!((after.limiter.in_use(1), before.limiter.in_use(0)), (0, 1));
    drop(ledger);
    assert_eq!(before.limiter.in_use(0), 0);
    assert_eq!(gauge.get(), 0);
}

#[test]
fn forced_copies_are_released_first_and_never_reach_the_limiter() {
    let budget = Arc::new(ReservationBudget::new(10));
    let gauge = IntGauge::new("g", "g").unwrap();
    let c = limiter(2, vec![]);
    let mut ledger = Ledger::default();
    let h = hold(&budget, &ledger, &c, &gauge, b"acme", 0, 2);
    ledger.add(h);
    let forced = Reservation::new(
        NewReservation {
            resource: &Arc::from("uploads"),
            domain: b"acme",
            groups: 0,
            counted: Some(c.counted()),
            key: 4 * 7919,
            taken: 0,
            forced: 3,
            gauge: &gauge,
        },
        ledger.slot(&budget).unwrap(),
    );
    ledger.add(forced);
    assert_eq!((gauge.get(), c.limiter.held(4 * 7919)), (5, 2));
    assert_eq!(ledger.release(b"uploads", b"acme", 3, None), Ok(2));
    assert_eq!(c.limiter.held(4 * 7919), 2, "the forced copies went first");
    assert_eq!(ledger.release(b"uploads", b"acme", 2, None), Ok(0));
    assert_eq!((gauge.get(), c.limiter.held(4 * 7919)), (0, 0));
}

#[test]
fn transfers_move_holds_and_release_them_when_they_expire() {
    let budget = Arc::new(ReservationBudget::new(10));
    let gauge = IntGauge::new("g", "g").unwrap();
    let c = limiter(10, vec![]);
    let transfers = Arc::new(Transfers::new(2));
    let (mut a, mut b) = (Ledger::default(), Ledger::default());
    let h = hold(&budget, &a, &c, &gauge, b"acme", 0, 5);
    a.add(h);
    // Part of an entry: it is split, the rest stays.
    let out = a.take_out(b"uploads", b"acme", 3, None, &budget).unwrap();
    assert_eq!(
        (a.holding(b"uploads", b"acme", None), budget.used()),
        (2, 2)
    );
    let id = transfers.park(out, Duration::from_secs(60)).ok().unwrap();
    assert_eq!(id.len(), 32);
    let unknown = Err(SeizeError::Unknown);
    assert_eq!(
        transfers
            .seize(b"00000000000000000000000000000000", 9)
            .map(|_| ()),
        unknown
    );
    assert_eq!(transfers.seize(b"not an id", 9).map(|_| ()), unknown);
    assert_eq!(
        transfers.seize(id.as_bytes(), 0).map(|_| ()),
        Err(SeizeError::NoRoom(1)),
        "no room: it stays pending"
    );
    for h in transfers.seize(id.as_bytes(), 9).unwrap() {
        b.add(h);
    }
    assert_eq!(
        transfers.seize(id.as_bytes(), 9).map(|_| ()),
        unknown,
        "seized once"
    );
    assert_eq!(b.holding(b"uploads", b"acme", None), 3);
    assert_eq!((gauge.get(), c.limiter.held(4 * 7919)), (5, 5));
    // A whole entry moves as it is; unseized past its ttl, it is released.
    let out = b.take_out(b"uploads", b"acme", 3, None, &budget).unwrap();
    assert!(b.is_empty());
    transfers.park(out, Duration::from_millis(1)).ok().unwrap();
    transfers.sweep(Instant::now() + Duration::from_millis(2));
    assert!(transfers.is_empty());
    assert_eq!((gauge.get(), c.limiter.held(4 * 7919)), (2, 2));
    // More than held: an error, nothing moves.
    assert_eq!(
        a.take_out(b"uploads", b"acme", 3, None, &budget)
            .unwrap_err(),
        LedgerError::OverRelease { held: 2, asked: 3 }
    );
    drop(a);
    assert_eq!((gauge.get(), budget.used()), (0, 0));
}

#[test]
fn the_budgets_bound_entries_and_transfers() {
    let budget = Arc::new(ReservationBudget::new(1));
    let ledger = Ledger::default();
    let slot = ledger.slot(&budget).unwrap();
    assert!(ledger.slot(&budget).is_err());
    drop(slot);
    assert!(ledger.slot(&budget).is_ok());
    let transfers = Arc::new(Transfers::new(1));
    transfers
        .park(Vec::new(), Duration::from_secs(60))
        .ok()
        .unwrap();
    let (e, _) = transfers
        .park(Vec::new(), Duration::from_secs(60))
        .unwrap_err();
    assert_eq!(e, TransferError::Full(1));
}
