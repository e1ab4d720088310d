//! Copies held through the limiter API: each connection's [`Ledger`], and the table of
//! pending [`Transfers`].
//!
//! **Holds belong to the connection.** `CH.RESERVE` takes copies of a concurrency
//! resource for a domain and records them in the connection's ledger as a [`Reservation`] entry:
//! the resource, the domain, the groups the copies were taken from (a bitset of the
//! limiter that took them, with its group names) and the limiter's state itself. An entry
//! gives its copies back when it is dropped, exactly once, to the very state and groups it
//! took them from: a config reload that moves the domain to another group, or replaces
//! the state, changes nothing for copies already held. The ledger is dropped with the
//! connection however it ends (`QUIT`, EOF, reset, a vanished peer caught by TCP keepalive
//! or the idle timeout, shutdown), so every hold is released once per resource, domain and
//! groups.
//!
//! **Taken and forced copies.** An entry counts the copies its limiter holds (`taken`) and
//! those granted without taking anything (`forced`: the kill switch or shadow mode turned a
//! rejection into a grant, or the resource is unconfigured and `api.allow_unconfigured`
//! granted it). Both are the caller's to release; a release gives back forced copies first,
//! so the limiter keeps counting the copies that really are over its limit.
//!
//! **Release.** `CH.RELEASE` names the resource, the domain, a count and optionally the
//! groups (as `CH.RESERVE` replied them). It takes from this connection's matching entries,
//! newest first, and fails, changing nothing, if they hold fewer copies than asked: a
//! caller can never release what it does not hold, and so can never free another caller's
//! copies.
//!
//! **Transfers.** `CH.TRANSFER` moves held copies out of the ledger into [`Transfers`]
//! under a random 128-bit id; `CH.SEIZE id` moves them into the seizing connection's
//! ledger. A transfer not seized within its ttl is dropped, which releases its copies.
//!
//! **Bounds.** A connection has at most [`MAX_HOLDS_PER_CONNECTION`] entries, the process
//! at most [`MAX_HOLDS`] (ledgers and transfers together, a [`ReservationBudget`]), and at most
//! [`MAX_TRANSFERS`] pending transfers, each at most
//! [`MAX_TRANSFER_TTL`](super::bounds::MAX_TRANSFER_TTL) long.
//! `tollgate_api_holds{resource}` adds and subtracts as entries change, so it is exact.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::IntGauge;

use super::bounds::{MAX_HOLDS, MAX_HOLDS_PER_CONNECTION, MAX_TRANSFERS};
use crate::limits::ConcurrencyLimiter;
use crate::store::SharedConcurrencyGuard;

/// The process-wide count of hold entries, bounded by [`MAX_HOLDS`].
#[derive(Debug)]
pub struct ReservationBudget {
    used: AtomicUsize,
    max: usize,
}

impl ReservationBudget {
    /// A budget of `max` entries.
    pub fn new(max: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            max,
        }
    }

    /// Entries in use.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` entries, or none if that would pass the bound.
    fn take(self: &Arc<Self>, n: usize) -> Option<Slots> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.checked_add(n).filter(|&u| u <= self.max)?;
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(Slots {
                        budget: Arc::clone(self),
                        n,
                    })
                }
                Err(now) => used = now,
            }
        }
    }
}

impl Default for ReservationBudget {
    fn default() -> Self {
        Self::new(MAX_HOLDS)
    }
}

/// Entries taken from a [`ReservationBudget`], given back on drop.
#[derive(Debug)]
pub struct Slots {
    budget: Arc<ReservationBudget>,
    n: usize,
}

impl Slots {
    /// One of these slots, as its own value (`self` keeps the rest).
    fn one(&mut self) -> Slots {
        debug_assert!(self.n > 0);
        self.n = self.n.saturating_sub(1);
        Slots {
            budget: Arc::clone(&self.budget),
            n: 1,
        }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// Where a resource's copies are counted: the limiter state and its group names (bit `i`
/// of a mask is `names[i]`), or nothing for an unconfigured resource.
pub struct Counted {
    /// The state the copies were taken from.
    pub counter: Counter,
    /// Its groups' names, in bit order.
    pub names: Arc<[String]>,
}

/// The state a hold's taken copies go back to.
pub enum Counter {
    /// An in-process concurrency state: copies go back by key and groups.
    Local(Arc<ConcurrencyLimiter>),
    /// A concurrency limit kept in a shared store: the guard holding the copies across
    /// the fleet (under this instance's lease), which gives them back to the store.
    Shared(SharedConcurrencyGuard),
}

impl Counted {
    /// The same place for `n` copies split off a hold (see [`Reservation::split`]).
    fn split(&mut self, n: u64) -> Self {
        Self {
            counter: match &mut self.counter {
                Counter::Local(l) => Counter::Local(Arc::clone(l)),
                Counter::Shared(g) => Counter::Shared(g.split(n)),
            },
            names: Arc::clone(&self.names),
        }
    }
}

/// Copies of one resource held for one domain in one set of groups of one state.
pub struct Reservation {
    resource: Arc<str>,
    domain: Box<[u8]>,
    groups: u64,
    counted: Option<Counted>,
    key: u64,
    taken: u64,
    forced: u64,
    gauge: IntGauge,
    _slot: Slots,
}

/// What a new hold is made of (see [`Reservation`]).
pub struct NewReservation<'a> {
    /// The resource's name.
    pub resource: &'a Arc<str>,
    /// The domain.
    pub domain: &'a [u8],
    /// The groups the copies were taken from (bits of `counted`'s limiter).
    pub groups: u64,
    /// Where they are counted (`None`: an unconfigured resource).
    pub counted: Option<Counted>,
    /// The domain's key in the limiter.
    pub key: u64,
    /// Copies the limiter holds.
    pub taken: u64,
    /// Copies granted without taking (kill switch, shadow, unconfigured).
    pub forced: u64,
    /// `tollgate_api_holds{resource}`.
    pub gauge: &'a IntGauge,
}

impl Reservation {
    /// A hold of `new`'s copies in `slot` (its entry); the gauge counts them from now.
    pub fn new(new: NewReservation<'_>, slot: Slots) -> Self {
        let held = Self {
            resource: Arc::clone(new.resource),
            domain: new.domain.into(),
            groups: new.groups,
            counted: new.counted,
            key: new.key,
            taken: new.taken,
            forced: new.forced,
            gauge: new.gauge.clone(),
            _slot: slot,
        };
        held.gauge.add(gauge_count(held.copies()));
        held
    }

    /// The resource's name.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The domain.
    pub fn domain(&self) -> &[u8] {
        &self.domain
    }

    /// Copies held (taken and forced).
    pub fn copies(&self) -> u64 {
        self.taken.saturating_add(self.forced)
    }

    /// The names of the groups the copies were taken from.
    pub fn group_names(&self) -> Vec<&str> {
        let Some(c) = &self.counted else {
            return Vec::new();
        };
        c.names
            .iter()
            .enumerate()
            .filter(|(i, _)| self.groups >> i & 1 == 1)
            .map(|(_, n)| n.as_str())
            .collect()
    }

    /// Whether `other` counts in the same place: same resource, domain, groups and state.
    fn same_place(&self, other: &Reservation) -> bool {
        let same_state = match (&self.counted, &other.counted) {
            (Some(a), Some(b)) => match (&a.counter, &b.counter) {
                (Counter::Local(a), Counter::Local(b)) => Arc::ptr_eq(a, b),
                (Counter::Shared(a), Counter::Shared(b)) => a.same_place(b),
                (Counter::Local(_), Counter::Shared(_))
                | (Counter::Shared(_), Counter::Local(_)) => false,
            },
            (None, None) => true,
            (Some(_), None) | (None, Some(_)) => false,
        };
        same_state
            && self.groups == other.groups
            && self.resource == other.resource
            && self.domain == other.domain
    }

    /// Whether the entry is of `resource` and `domain`, in exactly the groups `groups`
    /// (when given; names in any order).
    fn matches(&self, resource: &[u8], domain: &[u8], groups: Option<&[&[u8]]>) -> bool {
        if self.resource.as_bytes() != resource || &*self.domain != domain {
            return false;
        }
        let Some(wanted) = groups else {
            return true;
        };
        let held = self.group_names();
        held.len() == wanted.len() && held.iter().all(|h| wanted.contains(&h.as_bytes()))
    }

    /// Gives back `n` of the copies (forced ones first), to the state they were taken
    /// from.
    fn release(&mut self, n: u64) {
        let n = n.min(self.copies());
        let forced = n.min(self.forced);
        let taken = n - forced;
        self.forced -= forced;
        self.taken -= taken;
        if taken > 0 {
            match self.counted.as_mut().map(|c| &mut c.counter) {
                Some(Counter::Local(l)) => {
                    if let Err(e) = l.release(self.key, self.groups, taken) {
                        // The ledger only releases what this entry took, so this is a
                        // count already lowered by hand (an untracked admission's
                        // shortfall).
                        log::warn!(
                            "limiter API: releasing {taken} copies of `{}`: {e}",
                            self.resource
                        );
                    }
                }
                Some(Counter::Shared(g)) => {
                    g.release(taken);
                }
                None => {}
            }
        }
        self.gauge.sub(gauge_count(n));
    }

    /// Moves `n` of the copies (forced ones first) into a new entry in `slot`, which
    /// then owns them (the gauge's total does not change).
    fn split(&mut self, n: u64, slot: Slots) -> Reservation {
        let n = n.min(self.copies());
        let forced = n.min(self.forced);
        let taken = n - forced;
        self.forced -= forced;
        self.taken -= taken;
        Reservation {
            resource: Arc::clone(&self.resource),
            domain: self.domain.clone(),
            groups: self.groups,
            counted: self.counted.as_mut().map(|c| c.split(taken)),
            key: self.key,
            taken,
            forced,
            gauge: self.gauge.clone(),
            _slot: slot,
        }
    }

    /// Adds `other`'s copies (counted in the same place) to this entry.
    fn absorb(&mut self, mut other: Reservation) {
        self.taken = self.taken.saturating_add(other.taken);
        self.forced = self.forced.saturating_add(other.forced);
        if let (Some(mine), Some(theirs)) = (&mut self.counted, &mut other.counted) {
            if let (Counter::Shared(mine), Counter::Shared(theirs)) =
                (&mut mine.counter, &mut theirs.counter)
            {
                mine.absorb(theirs);
            }
        }
        // Emptied, `other` releases nothing when dropped.
        other.taken = 0;
        other.forced = 0;
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("resource", &self.resource)
            .field("domain", &String::from_utf8_lossy(&self.domain))
            .field("groups", &self.group_names())
            .field("taken", &self.taken)
            .field("forced", &self.forced)
            .finish()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release(self.copies());
    }
}

fn gauge_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Why a release or transfer changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The matching entries hold fewer copies than asked.
    #[error("this connection holds {held} of them, {asked} asked")]
    OverRelease {
        /// Copies held in the matching entries.
        held: u64,
        /// Copies asked.
        asked: u64,
    },
    /// The connection or the process has no room for another entry.
    #[error("too many holds: {0}")]
    Full(&'static str),
}

/// One connection's holds (module doc).
#[derive(Default)]
pub struct Ledger {
    entries: Vec<Reservation>,
}

impl Ledger {
    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Copies held over every entry.
    pub fn copies(&self) -> u64 {
        self.entries.iter().map(Reservation::copies).sum()
    }

    /// A slot for one more entry, or why there is none.
    pub fn slot(&self, budget: &Arc<ReservationBudget>) -> Result<Slots, LedgerError> {
        if self.entries.len() >= MAX_HOLDS_PER_CONNECTION {
            return Err(LedgerError::Full("this connection's maximum"));
        }
        budget
            .take(1)
            .ok_or(LedgerError::Full("the process's maximum"))
    }

    /// Records `held`, merged into an entry counting in the same place if there is one
    /// (its slot is then given back).
    pub fn add(&mut self, held: Reservation) {
        if held.copies() == 0 {
            return;
        }
        match self.entries.iter_mut().find(|e| e.same_place(&held)) {
            Some(entry) => entry.absorb(held),
            None => self.entries.push(held),
        }
    }

    /// Copies of `resource` this connection holds for `domain` (in `groups`, if given).
    pub fn holding(&self, resource: &[u8], domain: &[u8], groups: Option<&[&[u8]]>) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.matches(resource, domain, groups))
            .map(Reservation::copies)
            .sum()
    }

    /// Gives back `copies` of `resource` held for `domain` (in exactly `groups`, if given),
    /// newest entries first; returns the copies still held there. Holding fewer is an
    /// error that changes nothing.
    pub fn release(
        &mut self,
        resource: &[u8],
        domain: &[u8],
        copies: u64,
        groups: Option<&[&[u8]]>,
    ) -> Result<u64, LedgerError> {
        let held = self.holding(resource, domain, groups);
        if copies > held {
            return Err(LedgerError::OverRelease {
                held,
                asked: copies,
            });
        }
        let mut left = copies;
        for entry in self.entries.iter_mut().rev() {
            if left == 0 {
                break;
            }
            if entry.matches(resource, domain, groups) {
                let n = left.min(entry.copies());
                entry.release(n);
                left -= n;
            }
        }
        self.entries.retain(|e| e.copies() > 0);
        Ok(held - copies)
    }

    /// Moves `copies` of `resource` held for `domain` (in exactly `groups`, if given) out
    /// of the ledger, newest entries first, as the entries of a transfer. Holding fewer,
    /// or no room for the entries a partial move needs, is an error that changes nothing.
    pub fn take_out(
        &mut self,
        resource: &[u8],
        domain: &[u8],
        copies: u64,
        groups: Option<&[&[u8]]>,
        budget: &Arc<ReservationBudget>,
    ) -> Result<Vec<Reservation>, LedgerError> {
        let held = self.holding(resource, domain, groups);
        if copies > held || copies == 0 {
            return Err(LedgerError::OverRelease {
                held,
                asked: copies,
            });
        }
        // The plan, newest first: whole entries move as they are; at most one is split,
        // and needs a slot of its own.
        let mut plan = Vec::new();
        let mut left = copies;
        for (i, entry) in self.entries.iter().enumerate().rev() {
            if left == 0 {
                break;
            }
            if entry.matches(resource, domain, groups) {
                let n = left.min(entry.copies());
                plan.push((i, n));
                left -= n;
            }
        }
        let (whole, parts): (Vec<_>, Vec<_>) = plan
            .into_iter()
            .partition(|&(i, n)| n == self.entries[i].copies());
        let mut slots = budget
            .take(parts.len())
            .ok_or(LedgerError::Full("the process's maximum"))?;
        let mut out = Vec::with_capacity(whole.len() + parts.len());
        for (i, n) in parts {
            out.push(self.entries[i].split(n, slots.one()));
        }
        // Whole entries, highest index first (the plan's order) so that each removal
        // keeps the places of those still to remove.
        for (i, _) in whole {
            out.push(self.entries.remove(i));
        }
        Ok(out)
    }

    /// Releases everything, newest first: the connection is ending.
    pub fn release_all(&mut self) {
        while let Some(entry) = self.entries.pop() {
            drop(entry);
        }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// A transfer waiting to be seized.
struct Transfer {
    holds: Vec<Reservation>,
    deadline: Instant,
}

/// Pending transfers by id (module doc). One lock for the table: `CH.TRANSFER` and
/// `CH.SEIZE` are rare next to decisions, and a lookup is one hash.
pub struct Transfers {
    table: Mutex<HashMap<[u8; 16], Transfer>>,
    max: usize,
}

/// A transfer's id as clients see it: 32 lower-case hex digits.
pub type TransferId = String;

/// Why a transfer could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// [`MAX_TRANSFERS`] are pending.
    #[error("{0} transfers are pending, the maximum; seize or let some expire")]
    Full(usize),
    /// The OS gave no random bytes for an id.
    #[error("no random bytes for a transfer id: {0}")]
    Random(String),
}

/// Why a transfer could not be seized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SeizeError {
    /// No pending transfer has this id: never made, already seized, or expired.
    #[error("unknown transfer")]
    Unknown,
    /// The transfer has this many entries, more than the seizing connection has room for.
    #[error("no room for {0} entries")]
    NoRoom(usize),
}

impl Default for Transfers {
    fn default() -> Self {
        Self::new(MAX_TRANSFERS)
    }
}

impl Transfers {
    /// A table of at most `max` pending transfers.
    pub fn new(max: usize) -> Self {
        Self {
            table: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// Transfers pending (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.table.lock().len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parks `holds` under a new random id until seized or `ttl` passes; the copies are
    /// then released by a timer on the current tokio runtime (or by the next
    /// [`sweep`](Self::sweep) without one). On error the holds are handed back.
    pub fn park(
        self: &Arc<Self>,
        holds: Vec<Reservation>,
        ttl: Duration,
    ) -> Result<TransferId, (TransferError, Vec<Reservation>)> {
        let now = Instant::now();
        let handle = tokio::runtime::Handle::try_current().ok();
        if handle.is_none() {
            // No timer can release what expires: sweep as transfers are made.
            self.sweep(now);
        }
        let mut raw = [0u8; 16];
        if let Err(e) = getrandom::fill(&mut raw) {
            return Err((TransferError::Random(e.to_string()), holds));
        }
        {
            let mut table = self.table.lock();
            if table.len() >= self.max {
                return Err((TransferError::Full(self.max), holds));
            }
            let deadline = now + ttl;
            table.insert(raw, Transfer { holds, deadline });
        }
        if let Some(handle) = handle {
            let weak: Weak<Self> = Arc::downgrade(self);
            handle.spawn(async move {
                tokio::time::sleep(ttl).await;
                if let Some(table) = weak.upgrade() {
                    table.expire(&raw);
                }
            });
        }
        let mut id = String::with_capacity(32);
        for b in raw {
            let _ = write!(id, "{b:02x}");
        }
        Ok(id)
    }

    /// Takes the holds of transfer `id` (as [`park`](Self::park) replied it), if it is
    /// pending, not expired, and has at most `room` entries (else it stays pending).
    pub fn seize(&self, id: &[u8], room: usize) -> Result<Vec<Reservation>, SeizeError> {
        let raw = parse_id(id).ok_or(SeizeError::Unknown)?;
        let now = Instant::now();
        let mut table = self.table.lock();
        let transfer = table.get(&raw).ok_or(SeizeError::Unknown)?;
        if transfer.deadline > now && transfer.holds.len() > room {
            return Err(SeizeError::NoRoom(transfer.holds.len()));
        }
        let transfer = table.remove(&raw).ok_or(SeizeError::Unknown)?;
        drop(table);
        if transfer.deadline <= now {
            // Expired while its timer was pending: released (by the drop), not seized.
            return Err(SeizeError::Unknown);
        }
        Ok(transfer.holds)
    }

    /// Releases transfer `raw` if it is still pending.
    fn expire(&self, raw: &[u8; 16]) {
        let gone = self.table.lock().remove(raw);
        if let Some(t) = gone {
            let copies: u64 = t.holds.iter().map(Reservation::copies).sum();
            log::debug!("limiter API: a transfer of {copies} copies expired unseized; released");
        }
    }

    /// Releases every transfer whose ttl has passed by `now`.
    pub fn sweep(&self, now: Instant) {
        let expired: Vec<Transfer> = {
            let mut table = self.table.lock();
            let ids: Vec<[u8; 16]> = table
                .iter()
                .filter(|(_, t)| t.deadline <= now)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| table.remove(id)).collect()
        };
        // Released here, outside the lock.
        drop(expired);
    }
}

/// A transfer id's 16 bytes from its 32 hex digits.
fn parse_id(text: &[u8]) -> Option<[u8; 16]> {
    if text.len() != 32 {
        return None;
    }
    let mut raw = [0u8; 16];
    for (i, pair) in text.chunks(2).enumerate() {
        let hex = |b: u8| (b as char).to_digit(16);
        raw[i] = (hex(pair[0])? * 16 + hex(pair[1])?) as u8;
    }
    Some(raw)
}

#[cfg(test)]
mod tests;
