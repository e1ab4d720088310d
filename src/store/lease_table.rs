//! The slices one shared limit holds on this instance: a fixed table of hot keys'
//! [`Slice`]s, their renewals and give-backs, wired between the exact path of
//! `crate::store::shared` and the lease scripts of `crate::store::redis::lease`.
//!
//! **Admission.** [`LeaseTable::admit`] finds the key's slice (one set of [`WAYS`] entries,
//! atomics only: no lock, no allocation, no call) and admits from it. A key without a slice
//! feeds [`HotKeys`]; once it is hot it takes a free entry and its first slice is asked
//! for in the background, while the request that made it hot (and every request the slice
//! cannot pay) takes the exact path. Nobody waits on a lease call.
//!
//! **Holding kinds** (inflight, concurrency) lease blocks of slots:
//! [`LeaseTable::acquire`] takes slots of the key's block as an admission does, and
//! [`LeaseTable::release`] puts a released slot back into it (no call), giving a surplus
//! above twice the last block back at once; the sweep keeps an entry whose slots are in
//! use (their releases come back to it) and gives only its free slots back.
//!
//! **Renewal.** The admission that leaves a slice at its low-water mark (or finds it short)
//! holds the slice's renewal flag and spawns one take on the store's runtime, sized by
//! [`SliceSizer`] from the slice's own rate since the last take and the shared remainder
//! the store last reported. A take that grants 0 keeps the key quiet (no take) until the
//! bucket refills or the period ends; a failed one (store down) clears the flag.
//!
//! **Handing an entry over.** An entry changes key only while its renewal flag is held
//! (the idle sweep holds it; so does a grant landing), so a grant always lands in its
//! key's slice. An admission marks the entry busy and re-reads its key before taking from
//! the slice; the sweep marks the entry retiring and hands it over only if no admission
//! is busy on it (both in one total order), so an admission never spends another key's
//! quota. A bucket refund goes into the slice under the flag, for the same reason.
//!
//! **Give-backs.** The sweep ([`LeaseTable::sweep`], every `idle / 4` on the store's
//! runtime) gives back the slices unused for `idle`, frees their entries, and sets the
//! `tollgate_store_leased` gauge to what the table holds. Dropping the table (a reload
//! that rebuilt the limit, shutdown) gives back everything it holds, and a grant landing
//! after that goes straight back: the quota is counted once, in the store.
//!
//! **Memory.** [`ENTRIES`] entries of about 120 bytes and a [`HotKeys`] of
//! [`HOT_CELLS`] cells per leased limit, allocated once: about 38 KiB.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::Duration;

use prometheus::IntGauge;

use crate::limits::clock::{Clock, Nanos, NANOS_PER_SEC};
use crate::limits::lease::{Admit, HotKeys, LeaseParams, Slice, SliceSizer};
use crate::limits::table::{stored, WAYS};
use crate::metrics::LeaseCalls;
use crate::store::lease_close::Closing;
use crate::store::redis::LeaseGrant;
use crate::store::StoreError;

/// Slices one leased limit holds at most on this instance (keys hot at once).
pub const ENTRIES: usize = 256;

/// Cells of one leased limit's hot-key detector (a few times [`ENTRIES`]).
pub const HOT_CELLS: usize = 1024;

/// An entry's key while the sweep hands it over (no key is stored as it: [`slot_key`]).
const RETIRING: u64 = u64::MAX;

/// The key an entry stores for `key`: never 0 (free) nor [`RETIRING`].
fn slot_key(key: u64) -> u64 {
    stored(key).min(RETIRING - 1)
}

/// The shared remainder is not known yet.
const UNKNOWN: u64 = u64::MAX;

/// A lease-capable limit's store side: the take and give-back calls of its kind, sent to
/// its [`LeaseHost`]. A kind is a cheap handle (a store and a few `Arc`s): each call owns
/// a clone of it, so that its answer lands in the background.
pub(crate) trait LeaseKind: Clone + Send + Sync + 'static {
    /// Where the calls go.
    type Host: LeaseHost;

    /// The store the calls go to.
    fn host(&self) -> &Self::Host;

    /// Takes up to `want` units of the key's quota (one script call).
    fn take(
        self,
        key: u64,
        want: u64,
    ) -> impl Future<Output = Result<LeaseGrant, StoreError>> + Send + 'static;

    /// Gives `n` unspent units of `epoch` back to the key's quota (one script call).
    fn give_back(self, key: u64, n: u64, epoch: u64)
        -> impl Future<Output = bool> + Send + 'static;

    /// How long a key stays quiet after a take granted nothing: the time until the quota
    /// grows again (a bucket's refill interval; a rate's answer carries its period's end).
    fn quiet(&self) -> Nanos;
}

/// What the lease calls of every kind in a store share: whether they are sent now, the
/// runtime their answers land on, and their counters (a `RedisStore` is one,
/// `crate::store::leased`).
pub(crate) trait LeaseHost: Send + Sync + 'static {
    /// Whether lease calls are sent now (the store is up).
    fn up(&self) -> bool;

    /// Runs `work` in the background, on the store's runtime.
    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static);

    /// `tollgate_store_lease_calls_total` of the store.
    fn calls(&self) -> &LeaseCalls;
}

/// What a limit's leases need besides its kind: its settings, the gauge of what it holds
/// (`tollgate_store_leased{store,origin,limit}`), and the clock of the idle sweep (the
/// proxy's clock: Unix nanoseconds, moving with the monotonic clock).
#[derive(Clone)]
pub struct LeaseCtx {
    /// `lease:` of the limit.
    pub params: LeaseParams,
    /// `tollgate_store_leased{store,origin,limit}`.
    pub gauge: IntGauge,
    /// The clock the sweep reads.
    pub clock: Arc<dyn Clock>,
}

/// The answer of [`LeaseTable::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FromSlice {
    /// Admitted from the key's slice with no call; `held` is what the slice holds after.
    Admitted {
        /// Units left in the slice.
        held: u64,
        /// The shared remainder the store last reported (0 if not known).
        remaining: u64,
    },
    /// No slice could pay: decide exactly.
    Exact,
}

struct Entry {
    key: AtomicU64,
    busy: AtomicU64,
    remaining: AtomicU64,
    /// The size of the last take: a holding kind keeps up to twice this free.
    block: AtomicU64,
    slice: Slice,
}

struct Inner<K: LeaseKind> {
    kind: K,
    params: LeaseParams,
    hot: HotKeys,
    sizer: SliceSizer,
    entries: Box<[Entry]>,
    closed: AtomicBool,
    gauge: IntGauge,
    reported: AtomicI64,
    clock: Arc<dyn Clock>,
}

/// The slices of one shared limit on this instance (module doc).
pub(crate) struct LeaseTable<K: LeaseKind> {
    inner: Arc<Inner<K>>,
}

impl<K: LeaseKind> LeaseTable<K> {
    /// The table of a limit of `kind` whose quota is `limit` (see `SliceSizer` for each
    /// kind's), shared by `instances` instances.
    pub(crate) fn new(kind: K, ctx: LeaseCtx, limit: u64, instances: u64) -> Self {
        let p = ctx.params;
        let inner = Arc::new(Inner {
            kind,
            params: p,
            hot: HotKeys::new(p.hot_above, HOT_CELLS),
            sizer: SliceSizer::new(&p, limit, instances),
            entries: (0..ENTRIES)
                .map(|_| Entry {
                    key: AtomicU64::new(0),
                    busy: AtomicU64::new(0),
                    remaining: AtomicU64::new(UNKNOWN),
                    block: AtomicU64::new(1),
                    slice: Slice::new(),
                })
                .collect(),
            closed: AtomicBool::new(false),
            gauge: ctx.gauge,
            reported: AtomicI64::new(0),
            clock: ctx.clock,
        });
        Self { inner }
    }

    /// [`LeaseTable::new`] with its idle sweep started: what a shared limit holds.
    pub(crate) fn started(kind: K, ctx: LeaseCtx, limit: u64, instances: u64) -> Self {
        let table = Self::new(kind, ctx, limit, instances);
        table.start_sweep();
        let weak: Weak<dyn Closing> = Arc::downgrade(&table.inner) as Weak<Inner<K>>;
        crate::store::lease_close::register(weak);
        table
    }

    /// Starts the idle sweep on the kind's runtime, every `idle / 4` (10 ms to 1 s); it
    /// ends with the table.
    fn start_sweep(&self) {
        let every = Duration::from_nanos(self.inner.params.idle / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let weak = Arc::downgrade(&self.inner);
        self.inner.kind.host().spawn(sweep_loop(weak, every));
    }

    /// Now, on the clock of the idle sweep (for callers that are not given a time).
    pub(crate) fn now(&self) -> Nanos {
        self.inner.clock.now()
    }

    /// The settings.
    pub(crate) fn params(&self) -> LeaseParams {
        self.inner.params
    }

    /// Admits `cost` for `key` at `now` from its slice, or says to decide exactly (module
    /// doc).
    pub(crate) fn admit(&self, key: u64, cost: u64, now: Nanos) -> FromSlice {
        self.offer(key, cost, now, false)
    }

    /// A holding kind's [`LeaseTable::admit`]: `slots` of the key's block, counted in use
    /// until [`LeaseTable::release`] puts them back.
    pub(crate) fn acquire(&self, key: u64, slots: u64, now: Nanos) -> FromSlice {
        self.offer(key, slots, now, true)
    }

    /// A holding kind's release of `slots` the store counts for this instance (taken from
    /// the block, `from_block`, or decided exactly): they go back into the key's block
    /// with no call, and a surplus above twice a block goes back to the store in the
    /// background (hysteresis). False when the key has no block to take them now (the
    /// caller releases to the store).
    pub(crate) fn release(&self, key: u64, slots: u64, from_block: bool, now: Nanos) -> bool {
        let inner = &self.inner;
        let key = slot_key(key);
        let Some(i) = inner.find(key) else {
            return false;
        };
        let e = &inner.entries[i];
        e.busy.fetch_add(1, Ordering::SeqCst);
        if e.key.load(Ordering::SeqCst) != key || inner.closed.load(Ordering::Acquire) {
            e.busy.fetch_sub(1, Ordering::Release);
            return false;
        }
        e.slice.put_back(slots, from_block, now);
        let surplus = e.slice.take_surplus(e.block.load(Ordering::Relaxed));
        e.busy.fetch_sub(1, Ordering::Release);
        if surplus > 0 {
            inner.give_back(key, surplus, 0);
        }
        true
    }

    /// [`LeaseTable::admit`] (`holding`: [`LeaseTable::acquire`]).
    fn offer(&self, key: u64, cost: u64, now: Nanos, holding: bool) -> FromSlice {
        let inner = &self.inner;
        let key = slot_key(key);
        if let Some(i) = inner.find(key) {
            let e = &inner.entries[i];
            // Busy while it admits: the sweep hands no busy entry over, and an entry
            // handed over since `find` is left alone (module doc).
            e.busy.fetch_add(1, Ordering::SeqCst);
            if e.key.load(Ordering::SeqCst) != key {
                e.busy.fetch_sub(1, Ordering::Release);
                return FromSlice::Exact;
            }
            let admitted = if holding {
                e.slice.acquire(cost, now)
            } else {
                e.slice.admit(cost, now)
            };
            e.busy.fetch_sub(1, Ordering::Release);
            match admitted {
                Admit::Admitted { renew } => {
                    if renew {
                        inner.renew(i, key, now);
                    }
                    let remaining = e.remaining.load(Ordering::Relaxed);
                    return FromSlice::Admitted {
                        held: e.slice.available(),
                        remaining: if remaining == UNKNOWN { 0 } else { remaining },
                    };
                }
                Admit::Short { renew } => {
                    if renew {
                        inner.renew(i, key, now);
                    }
                    return FromSlice::Exact;
                }
            }
        }
        if inner.hot.observe(key, now) && inner.kind.host().up() {
            if let Some(i) = inner.claim_entry(key) {
                let e = &inner.entries[i];
                if e.slice.claim() {
                    inner.renew(i, key, now);
                }
            }
        }
        FromSlice::Exact
    }

    /// Puts a refunded admission of `n` back into the key's slice; false when the key has
    /// no slice to take it now (the caller refunds the store).
    pub(crate) fn refund(&self, key: u64, n: u64) -> bool {
        let inner = &self.inner;
        let key = slot_key(key);
        let Some(i) = inner.find(key) else {
            return false;
        };
        let e = &inner.entries[i];
        if !e.slice.claim() {
            return false;
        }
        let kept = e.key.load(Ordering::Acquire) == key && !inner.closed.load(Ordering::Acquire);
        if kept {
            e.slice.refund(n);
        }
        e.slice.renew_failed();
        kept
    }

    /// One sweep at `now` (module doc): gives back idle slices, frees their entries, sets
    /// the gauge. Returns what was given back.
    #[cfg(test)]
    pub(crate) fn sweep(&self, now: Nanos) -> u64 {
        self.inner.sweep(now)
    }

    /// Quota the key's slice holds unspent (0 without a slice).
    pub(crate) fn available(&self, key: u64) -> u64 {
        let key = slot_key(key);
        self.inner
            .find(key)
            .map_or(0, |i| self.inner.entries[i].slice.available())
    }

    /// Quota held unspent in all slices.
    pub(crate) fn held(&self) -> u64 {
        self.inner.held()
    }

    /// Keys holding an entry.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.inner
            .entries
            .iter()
            .filter(|e| e.key.load(Ordering::Relaxed) != 0)
            .count()
    }
}

impl<K: LeaseKind> Drop for LeaseTable<K> {
    /// Gives back everything held; a grant landing later goes straight back. No request
    /// admits any more (the limiter is gone); only background work may still run, and
    /// each unit is drained (a swap) by exactly one of it and this.
    fn drop(&mut self) {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::Release);
        for e in inner.entries.iter() {
            let key = e.key.load(Ordering::Acquire);
            let n = e.slice.drain();
            if key != 0 && n > 0 {
                inner.give_back(key, n, e.slice.epoch());
            }
        }
        inner.report(0);
    }
}

impl<K: LeaseKind> Inner<K> {
    /// The set of `key` (stored), by multiply-high.
    fn set(&self, key: u64) -> usize {
        let sets = self.entries.len() / WAYS;
        ((u128::from(key) * sets as u128) >> 64) as usize * WAYS
    }

    /// The entry holding `key`.
    fn find(&self, key: u64) -> Option<usize> {
        let first = self.set(key);
        (first..first + WAYS).find(|&i| self.entries[i].key.load(Ordering::Acquire) == key)
    }

    /// A free entry of `key`'s set, taken for it (or the one it already has).
    fn claim_entry(&self, key: u64) -> Option<usize> {
        let first = self.set(key);
        for i in first..first + WAYS {
            let e = &self.entries[i];
            match e
                .key
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    e.remaining.store(UNKNOWN, Ordering::Relaxed);
                    return Some(i);
                }
                Err(k) if k == key => return Some(i),
                Err(_) => {}
            }
        }
        None
    }

    /// Asks for the next slice of entry `i` (its renewal flag held by the caller), sized
    /// from its rate since the last take; the answer lands in the background.
    fn renew(self: &Arc<Self>, i: usize, key: u64, now: Nanos) {
        let e = &self.entries[i];
        if !self.kind.host().up() || self.closed.load(Ordering::Acquire) {
            e.slice.renew_failed();
            return;
        }
        let (used, over) = e.slice.rate(now);
        // A first slice (nothing measured yet): the key is above hot_above.
        let (count, over) = if used == 0 {
            (self.params.hot_above, NANOS_PER_SEC)
        } else {
            (used, over)
        };
        let remaining = e.remaining.load(Ordering::Relaxed);
        let want = self
            .sizer
            .size(count, over, (remaining != UNKNOWN).then_some(remaining));
        e.block.store(want.max(1), Ordering::Relaxed);
        let take = self.kind.clone().take(key, want);
        let me = Arc::clone(self);
        self.kind.host().spawn(async move {
            let reply = take.await;
            me.landed(i, key, want, now, reply);
        });
    }

    /// A take's answer for entry `i`, asked at `sent` for `want`.
    fn landed(
        &self,
        i: usize,
        key: u64,
        want: u64,
        sent: Nanos,
        reply: Result<LeaseGrant, StoreError>,
    ) {
        let e = &self.entries[i];
        let calls = self.kind.host().calls();
        let g = match reply {
            Ok(g) => g,
            Err(_) => {
                calls.failed.inc();
                e.slice.renew_failed();
                return;
            }
        };
        match g.granted {
            0 => calls.empty.inc(),
            n if n < want => calls.partial.inc(),
            _ => calls.granted.inc(),
        }
        if self.closed.load(Ordering::Acquire) || e.key.load(Ordering::Acquire) != key {
            if g.granted > 0 {
                self.give_back(key, g.granted, g.epoch);
            }
            e.slice.renew_failed();
            return;
        }
        e.remaining.store(g.remaining, Ordering::Relaxed);
        if g.granted == 0 {
            let quiet = g.valid_for.unwrap_or_else(|| self.kind.quiet());
            e.slice.quiet_until(sent.saturating_add(quiet));
            e.slice.renew_failed();
            return;
        }
        // Measured from before the call: never later than the store's own end.
        let until = g.valid_for.map_or(u64::MAX, |v| sent.saturating_add(v));
        e.slice
            .grant(g.granted, g.epoch, until, SliceSizer::low_water(want), sent);
    }

    /// Gives `n` units of `key` back in the background.
    fn give_back(&self, key: u64, n: u64, epoch: u64) {
        self.give_back_then(key, n, epoch, None);
    }

    /// [`Inner::give_back`], sending `()` on `done` once the call has ended.
    fn give_back_then(&self, key: u64, n: u64, epoch: u64, done: Option<mpsc::Sender<()>>) {
        let call = self.kind.clone().give_back(key, n, epoch);
        let host = self.kind.host();
        let (returned, failed) = (host.calls().returned.clone(), host.calls().failed.clone());
        host.spawn(async move {
            if call.await {
                returned.inc();
            } else {
                failed.inc();
            }
            if let Some(done) = done {
                let _ = done.send(());
            }
        });
    }

    fn sweep(&self, now: Nanos) -> u64 {
        let mut given = 0;
        for e in self.entries.iter() {
            let key = e.key.load(Ordering::Acquire);
            if key == 0
                || key == RETIRING
                || e.slice.idle_for(now) < self.params.idle
                || !e.slice.claim()
            {
                continue;
            }
            // A holding kind's entry with slots in use stays (their releases come back
            // to it); only its free slots go back.
            if e.slice.in_use() > 0 {
                let n = e.slice.drain();
                e.slice.renew_failed();
                if n > 0 {
                    given += n;
                    self.give_back(key, n, 0);
                }
                continue;
            }
            // Hand over only an entry no admission is using.
            if e.key
                .compare_exchange(key, RETIRING, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                e.slice.renew_failed();
                continue;
            }
            if e.busy.load(Ordering::SeqCst) != 0 {
                e.key.store(key, Ordering::SeqCst);
                e.slice.renew_failed();
                continue;
            }
            let n = e.slice.drain();
            let epoch = e.slice.epoch();
            e.slice.reset();
            e.key.store(0, Ordering::Release);
            e.slice.renew_failed();
            if n > 0 {
                given += n;
                self.give_back(key, n, epoch);
            }
        }
        self.report(self.held());
        given
    }

    fn held(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.key.load(Ordering::Relaxed) != 0)
            .map(|e| e.slice.available())
            .sum()
    }

    /// Moves the gauge by what this table holds now less what it last reported (several
    /// tables, a limit's overrides, share one gauge).
    fn report(&self, held: u64) {
        let held = i64::try_from(held).unwrap_or(i64::MAX);
        let before = self.reported.swap(held, Ordering::AcqRel);
        self.gauge.add(held - before);
    }
}

impl<K: LeaseKind> Closing for Inner<K> {
    /// What dropping the table does (its `Drop`), with each give-back reporting its end:
    /// the process is exiting while the table lives on in the config.
    fn close(&self, done: &mpsc::Sender<()>) -> usize {
        self.closed.store(true, Ordering::Release);
        let mut sent = 0;
        for e in self.entries.iter() {
            let key = e.key.load(Ordering::Acquire);
            let n = e.slice.drain();
            if key != 0 && n > 0 {
                self.give_back_then(key, n, e.slice.epoch(), Some(done.clone()));
                sent += 1;
            }
        }
        self.report(0);
        sent
    }
}

/// The sweep of `table` every `every`, while it lives.
async fn sweep_loop<K: LeaseKind>(table: Weak<Inner<K>>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(t) = table.upgrade() else {
            return;
        };
        if t.closed.load(Ordering::Acquire) {
            return;
        }
        t.sweep(t.clock.now());
    }
}

#[cfg(test)]
#[path = "lease_table_tests.rs"]
mod tests;
