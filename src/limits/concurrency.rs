//! The concurrency limiter: Charon's copy-limited resources, counted exactly.
//!
//! A resource has copies. A request takes `copies` of them for a key (its *domain*) and
//! gives them back when it ends. Three kinds of limit apply, all exact, never a sketch
//! (limiting must not wrongly deny):
//!
//! - `max`: copies one key may hold at once (the domain limit);
//! - `global`: copies all keys together may hold (optional);
//! - groups (bulkheads): group `i` lets its members together hold `groups[i]` copies. Which
//!   groups a request belongs to is the caller's business (customer lists, segments): it
//!   passes them as a bitset, bit `i` for group `i`, so there are at most [`MAX_GROUPS`]
//!   (64). A key in several groups takes its copies from each of them.
//!
//! A request is admitted only if its copies fit every limit that applies (key, global,
//! each of its groups); otherwise it takes nothing. Two APIs share the state: the proxy's
//! [`ConcurrencyLimiter::acquire`], whose [`ConcurrencyGuard`] gives the copies back exactly
//! once when dropped, and the limiter API's [`reserve`](ConcurrencyLimiter::reserve) (the
//! largest grant in `[min, copies]` that fits) and [`release`](ConcurrencyLimiter::release)
//! (an over-release is an error and changes nothing).
//!
//! **Per-key counts.** `sets = ⌈max_keys / 8⌉` sets of 8 slots `(key, held)`, each set behind
//! its own `parking_lot::Mutex`, chosen by Lemire's multiply-high of the key hash, as in the
//! token bucket. A key holding nothing has no slot: its slot is freed when its count returns
//! to 0. 16 bytes a slot and 136 a set: 17 bytes per key of `max_keys`, all allocated by
//! [`ConcurrencyLimiter::new`], never grown (100 000 keys: 1.7 MB). A decision locks one
//! set: no allocation, no global lock, no syscall.
//!
//! **A full set.** A holding key can never be evicted: that would forget its copies. When
//! all 8 slots of a key's set hold copies, the request is admitted *untracked* (fail open,
//! as Charon does): the global and group counts still take its copies, exactly, but the
//! key's own `max` is only checked against this request, and its copies go to a shared
//! untracked count instead of the key's slot. Each such admission is counted
//! ([`ConcurrencyLimiter::untracked_total`]) and the untracked copies are a gauge
//! ([`ConcurrencyLimiter::untracked_in_use`]), so an operator sees it happen. A guard gives
//! untracked copies back to that count; [`ConcurrencyLimiter::release`] takes from the key's
//! slot first and the shortfall from the untracked count, so while copies are untracked an
//! over-release of a key can go unnoticed up to the untracked count (the global and group
//! checks still hold). A set overflows only when 9 holding keys share it: with `a` keys
//! holding at once, a set gets about Poisson(8a / max_keys) of them, and the share of
//! holding keys left untracked is 2.5e-7 at `a = max_keys / 10`, 1.5e-4 at `max_keys / 4`
//! and 0.8% at `max_keys / 2`. The proxy holds at most one key per open request, so a
//! `max_keys` of 10 × the connection cap makes untracked admissions practically never
//! happen (it cannot rule them out: 9 keys can always hash to one set).
//!
//! **Global and group counters** are atomics, one per cache-line pair, updated while the
//! key's set is locked (the key check is thus exact and a key rejection touches no
//! counter). Admission first reads every counter and shrinks the grant to what fits, so a
//! visibly full limit rejects without writing anything. It then takes the grant from each
//! counter in a fixed order (global, then groups by index) with a compare-and-swap that
//! only succeeds if the count stays within its max, so **no counter ever exceeds its max**,
//! even transiently. If a racing request took the last copies of a counter in between,
//! the counters already taken are given back and the grant is retried smaller (it strictly
//! shrinks, so this ends). During that give-back, copies that end up not granted are
//! briefly counted: a request racing exactly then can be rejected although, in a
//! one-at-a-time order, it would have fitted. That needs two requests contending for the
//! last copies of one limit within the same few nanoseconds; it is bounded by the number of
//! deciding threads and never admits too much. One lock for all counters would remove it
//! at the price of a global lock on every decision.
//!
//! Releases give back with a compare-and-swap that refuses to go below zero, after the
//! key check under the set lock; an over-release rolls back what it had already given. The
//! only way to reach that rollback is a caller releasing with groups other than it reserved
//! with; then a racing admission may take the briefly freed room and the rollback can leave
//! a counter above its max by at most those copies, until releases bring it down.
//!
//! **Retry-After.** A rejection frees when any holder ends, which may be at once: one
//! second ([`RETRY_AFTER`]) is the honest minimum, as for the inflight limiter.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::MutexGuard;

use crate::limits::clock::{Nanos, NANOS_PER_SEC};
use crate::limits::table::{self, scan, Table, Ways};
use crate::limits::verdict::{Verdict, NEVER};

/// Groups a limiter can have: the caller passes membership as one `u64` bitset.
pub const MAX_GROUPS: usize = 64;

/// `retry_after` of a concurrency rejection: copies free when any holder ends, so there is
/// no exact time to promise, and one second is the smallest honest `Retry-After`.
pub const RETRY_AFTER: Nanos = NANOS_PER_SEC;

/// Parameters of a concurrency limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConcurrencyParams {
    /// Copies one key (domain) may hold at once.
    pub max: u64,
    /// Copies all keys together may hold; `None` for no global limit.
    pub global: Option<u64>,
    /// Group `i`'s max: copies its members together may hold. At most [`MAX_GROUPS`].
    pub groups: Vec<u64>,
}

impl ConcurrencyParams {
    /// Whether a request in the groups of `groups` (a bitset, bit `i` for group `i`) can
    /// never be admitted: its key's `max`, the `global` or one of its groups' `max` is 0 (a
    /// block, e.g. a blacklist group). Such a rejection invites no retry, whichever limit
    /// was found full first (the global count, a probation group, the key's copies taken
    /// before a reload added it to the block).
    pub fn blocks(&self, groups: u64) -> bool {
        self.max == 0
            || self.global == Some(0)
            || self.groups.iter().enumerate().any(|(i, &max)| {
                max == 0
                    && 1u64
                        .checked_shl(i as u32)
                        .is_some_and(|bit| groups & bit != 0)
            })
    }

    /// Whether a request for at least `wanted` copies in `groups` can never be admitted:
    /// [`Self::blocks`], or `wanted` above its key's `max`, the `global`, or the `max` of
    /// one of its groups (a `MIN` larger than a limit). Its rejection invites no retry.
    pub fn never_fits(&self, groups: u64, wanted: u64) -> bool {
        let member = |i: usize| {
            1u64.checked_shl(i as u32)
                .is_some_and(|bit| groups & bit != 0)
        };
        self.blocks(groups)
            || wanted > self.max
            || self.global.is_some_and(|g| wanted > g)
            || self
                .groups
                .iter()
                .enumerate()
                .any(|(i, &max)| wanted > max && member(i))
    }

    /// A rejection of a request in `groups` as a [`Verdict`]: [`Rejection::verdict`],
    /// whose retry is [`NEVER`] when the request can never fit ([`Self::never_fits`]).
    pub fn refusal(&self, rejection: &Rejection, groups: u64) -> Verdict {
        let mut v = rejection.verdict();
        if self.never_fits(groups, rejection.wanted.max(1)) {
            v.retry_after = NEVER;
        }
        v
    }
}

/// Which limit a request hit or a release would break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The key's own (domain) limit.
    Key,
    /// The limit across all keys.
    Global,
    /// Group `i` (its index in [`ConcurrencyParams::groups`]).
    Group(u8),
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Key => f.write_str("key"),
            Limit::Global => f.write_str("global"),
            Limit::Group(i) => write!(f, "group {i}"),
        }
    }
}

/// A request that did not fit: the first limit it hit (key, then global, then groups by
/// index), with that limit's count and max, so the caller can say which bulkhead was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{limit} concurrency limit: {in_use} of {max} copies in use, {wanted} more wanted")]
pub struct Rejection {
    /// The limit hit.
    pub limit: Limit,
    /// Copies it counted when the request was turned down.
    pub in_use: u64,
    /// Its max.
    pub max: u64,
    /// The least the request would have taken (`copies`, or `min` for a reservation).
    pub wanted: u64,
}

impl Rejection {
    /// The rejection as a [`Verdict`]: `remaining` is the limit's room, `retry_after` is
    /// [`RETRY_AFTER`].
    pub fn verdict(&self) -> Verdict {
        Verdict::reject(self.max.saturating_sub(self.in_use), 0, RETRY_AFTER)
    }
}

/// A release of more copies than are held: an error of the caller's bookkeeping, which
/// changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("over-release of the {limit} concurrency count: {held} held, {released} released")]
pub struct OverRelease {
    /// The count that would have gone below zero.
    pub limit: Limit,
    /// What it held (for [`Limit::Key`], the key's tracked copies).
    pub held: u64,
    /// What the release asked to give back.
    pub released: u64,
}

/// Bad parameters for [`ConcurrencyLimiter::new`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConcurrencyError {
    /// Group membership is a `u64` bitset.
    #[error("{0} concurrency groups; at most {MAX_GROUPS}")]
    TooManyGroups(usize),
}

/// Exact concurrency counts per key, globally and per group.
///
/// The state sits behind an `Arc` shared with every live guard, so a guard outlives a
/// config reload that replaces the limiter and gives its copies back to the counts it took
/// them from.
pub struct ConcurrencyLimiter {
    state: Arc<State>,
}

/// Copies held by one admitted request; dropping it gives them back exactly once. It
/// reads as what it holds ([`Copies`]).
pub struct ConcurrencyGuard {
    state: Arc<State>,
    held: Copies,
    tracked: bool,
}

/// What a concurrency guard holds, in process or in a store (`crate::store`'s guard reads
/// as one too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copies {
    pub(crate) key: u64,
    pub(crate) groups: u64,
    pub(crate) copies: u64,
    pub(crate) remaining: u64,
}

impl Copies {
    /// The key whose copies the guard holds.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The copies it holds.
    pub fn copies(&self) -> u64 {
        self.copies
    }

    /// The groups it took copies from (the configured bits of the mask acquired with).
    pub fn groups(&self) -> u64 {
        self.groups
    }

    /// The smallest room left across the limits it took copies from, right after the
    /// admission (the `remaining` of the RateLimit headers; 0 when a store's fallback
    /// admitted it).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }
}

impl std::ops::Deref for ConcurrencyGuard {
    type Target = Copies;

    fn deref(&self) -> &Copies {
        &self.held
    }
}

/// What a grant took, for a guard or a reservation.
struct Grant {
    granted: u64,
    remaining: u64,
    tracked: bool,
}

struct State {
    params: ConcurrencyParams,
    /// Bits of the configured groups; other bits of a caller's mask are ignored.
    valid: u64,
    /// The copies each key holds (a slot's value); a key holding nothing has no slot.
    table: Table<u64>,
    global: Counter,
    groups: Box<[Counter]>,
    /// Copies held untracked (their key's set was full of holding keys).
    untracked: Counter,
    /// Admissions made untracked, since construction.
    untracked_total: Counter,
}

/// One set: its lock and its slots, 136 bytes.
#[cfg(test)]
type Set = table::Set<u64>;

/// A key and the copies it holds, or an empty slot (key 0): 16 bytes.
type Slot = table::Slot<u64>;

/// A shared count on its own cache-line pair, so that cores updating different counters
/// do not false-share.
#[repr(align(128))]
#[derive(Default)]
struct Counter(AtomicU64);

/// The bits set in a mask, lowest first.
#[derive(Clone)]
struct Bits(u64);

impl Iterator for Bits {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        if self.0 == 0 {
            return None;
        }
        let bit = self.0.trailing_zeros() as u8;
        self.0 &= self.0 - 1;
        Some(bit)
    }
}

impl ConcurrencyLimiter {
    /// The most keys one table may hold, whatever it is handed (the config refuses more):
    /// the token bucket's bound.
    pub const MAX_KEYS: usize = table::MAX_KEYS;

    /// The bytes [`ConcurrencyLimiter::new`] allocates for `max_keys` (after the same
    /// clamping): whole sets of 8 slots.
    pub fn table_bytes(max_keys: usize) -> usize {
        Table::<u64>::bytes_for(max_keys.min(Self::MAX_KEYS))
    }

    /// A limiter with `params`, counting exactly for at most `max_keys` keys holding copies
    /// at once (see the module doc for the memory and for what happens beyond).
    ///
    /// A `max_keys` of 0 is raised to 1 (one set of 8). A `max` (or group max) of 0 admits
    /// nothing. More than [`MAX_GROUPS`] groups is an error.
    pub fn new(params: ConcurrencyParams, max_keys: usize) -> Result<Self, ConcurrencyError> {
        let n = params.groups.len();
        if n > MAX_GROUPS {
            return Err(ConcurrencyError::TooManyGroups(n));
        }
        Ok(Self {
            state: Arc::new(State {
                valid: u64::MAX
                    .checked_shr(MAX_GROUPS as u32 - n as u32)
                    .unwrap_or(0),
                table: Table::new(max_keys.min(Self::MAX_KEYS), ()),
                global: Counter::default(),
                groups: (0..n).map(|_| Counter::default()).collect(),
                untracked: Counter::default(),
                untracked_total: Counter::default(),
                params,
            }),
        })
    }

    /// Takes `copies` for `key` in `groups` (bit `i`: group `i`), or nothing.
    ///
    /// The guard gives them back when dropped, whatever ends the request. The rejection
    /// names the first limit that did not fit. `copies` of 0 always succeeds and holds
    /// nothing. Bits of `groups` beyond the configured groups are ignored.
    pub fn acquire(
        &self,
        key: u64,
        groups: u64,
        copies: u64,
    ) -> Result<ConcurrencyGuard, Rejection> {
        let grant = self.state.grant(key, groups, copies, copies)?;
        let held = Copies {
            key,
            groups: groups & self.state.valid,
            copies: grant.granted,
            remaining: grant.remaining,
        };
        Ok(ConcurrencyGuard {
            state: Arc::clone(&self.state),
            held,
            tracked: grant.tracked,
        })
    }

    /// Takes the largest `n` in `[min, copies]` that fits every limit, and returns `n`;
    /// takes nothing if even `min` does not fit.
    ///
    /// For the limiter API (Charon's RESERVE), whose caller gives the copies back with
    /// [`release`](Self::release). A `min` above `copies` is lowered to `copies`; with a
    /// `min` of 0 the grant may be 0.
    pub fn reserve(&self, key: u64, groups: u64, copies: u64, min: u64) -> Result<u64, Rejection> {
        Ok(self.state.grant(key, groups, copies, min)?.granted)
    }

    /// Gives back `copies` of `key` in `groups`, or, if that is more than the key, the
    /// global count or one of the groups holds, changes nothing and says which.
    ///
    /// Pass the groups the copies were reserved with. Copies a guard holds are counted
    /// with the key too: releasing them by hand is the caller's error, after which the
    /// guard's own release stops at zero instead of wrapping.
    pub fn release(&self, key: u64, groups: u64, copies: u64) -> Result<(), OverRelease> {
        self.state.release(key, groups, copies)
    }

    /// Copies `key` holds, tracked in its slot (untracked copies are not included).
    pub fn held(&self, key: u64) -> u64 {
        let s = &self.state;
        let key = table::stored(key);
        let slots = s.set(key);
        slots
            .iter()
            .find(|slot| slot.key == key)
            .map_or(0, |slot| slot.value)
    }

    /// Copies held across all keys, untracked ones included.
    ///
    /// With a `global` limit this is one atomic read. Without one the count is not kept on
    /// the decision path (that would cost every decision an update of one shared cache
    /// line), so this sums the table set by set: for metrics and tests, not the hot path.
    pub fn in_use_global(&self) -> u64 {
        let s = &self.state;
        if s.params.global.is_some() {
            return s.global.0.load(Relaxed);
        }
        let mut held = 0;
        s.table.each(|slot| held += slot.value);
        held + s.untracked.0.load(Relaxed)
    }

    /// Copies group `group` holds: an exact gauge (0 for a group that does not exist).
    pub fn in_use(&self, group: usize) -> u64 {
        self.state
            .groups
            .get(group)
            .map_or(0, |c| c.0.load(Relaxed))
    }

    /// The parameters.
    pub fn params(&self) -> &ConcurrencyParams {
        &self.state.params
    }

    /// Keys holding copies in the table. Locks each set in turn: metrics and tests only.
    pub fn len(&self) -> usize {
        self.state.table.len()
    }

    /// Whether no key holds copies in the table.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Admissions made untracked because the key's set was full of holding keys, since
    /// construction: a rising count means `max_keys` is too small for the keys holding
    /// copies at once.
    pub fn untracked_total(&self) -> u64 {
        self.state.untracked_total.0.load(Relaxed)
    }

    /// Copies currently held untracked.
    pub fn untracked_in_use(&self) -> u64 {
        self.state.untracked.0.load(Relaxed)
    }
}

impl ConcurrencyGuard {
    /// Whether the key's own count holds these copies (false: admitted untracked because
    /// its set was full; see the module doc).
    pub fn tracked(&self) -> bool {
        self.tracked
    }

    /// The admission as a [`Verdict`].
    pub fn verdict(&self) -> Verdict {
        Verdict::allow(self.held.remaining, 0)
    }
}

impl Drop for ConcurrencyGuard {
    fn drop(&mut self) {
        let h = self.held;
        self.state.put_back(h.key, h.groups, h.copies, self.tracked);
    }
}

impl State {
    /// The locked set of `key` (already [`table::stored`]).
    fn set(&self, key: u64) -> MutexGuard<'_, Ways<u64>> {
        self.table.lock(self.table.index(key))
    }

    /// The shared counters a request in `groups` (already masked) touches, with their
    /// limit and max, in the one order every thread takes them: global, then groups.
    fn shared(&self, groups: u64) -> impl Iterator<Item = (Limit, &AtomicU64, u64)> + '_ {
        let global = self
            .params
            .global
            .map(|max| (Limit::Global, &self.global.0, max));
        global.into_iter().chain(Bits(groups).map(move |i| {
            let i_ = usize::from(i);
            (Limit::Group(i), &self.groups[i_].0, self.params.groups[i_])
        }))
    }

    /// The largest `n` in `[min, copies]` that fits, taken; or nothing and the first limit
    /// that did not fit.
    fn grant(&self, key: u64, groups: u64, copies: u64, min: u64) -> Result<Grant, Rejection> {
        let groups = groups & self.valid;
        let min = min.min(copies);
        let key = table::stored(key);
        let max = self.params.max;
        let mut slots = self.set(key);
        let (hit, empty) = scan(&slots, |s| s.key == key);
        let held = slots.get(hit).map_or(0, |slot| slot.value);
        let key_room = max.saturating_sub(held);
        if key_room < min {
            return Err(reject(Limit::Key, held, max, min));
        }
        let mut want = copies.min(key_room);
        let room = loop {
            // Read first: a visibly full limit rejects without writing anything.
            for (limit, count, max) in self.shared(groups) {
                let in_use = count.load(Relaxed);
                let room = max.saturating_sub(in_use);
                if room < min {
                    return Err(reject(limit, in_use, max, min));
                }
                want = want.min(room);
            }
            if want == 0 {
                break 0;
            }
            match self.take_all(groups, want) {
                Ok(room) => break room,
                Err((limit, in_use, max)) => {
                    // A racer took the room we read: retry with strictly fewer copies.
                    let room = max.saturating_sub(in_use);
                    if room < min {
                        return Err(reject(limit, in_use, max, min));
                    }
                    want = want.min(room);
                }
            }
        };
        let remaining = room.min(key_room - want);
        let tracked = if want == 0 {
            true
        } else if let Some(slot) = slots.get_mut(hit) {
            // held + want ≤ max: no overflow.
            slot.value += want;
            true
        } else if let Some(slot) = slots.get_mut(empty) {
            *slot = Slot { key, value: want };
            true
        } else {
            self.untracked.0.fetch_add(want, Relaxed);
            self.untracked_total.0.fetch_add(1, Relaxed);
            false
        };
        Ok(Grant {
            granted: want,
            remaining,
            tracked,
        })
    }

    /// Takes `n` from every shared counter of `groups`, each only if it stays within its
    /// max; returns the smallest room left. On the first that does not fit, gives back the
    /// ones taken and returns that counter's limit, count and max.
    fn take_all(&self, groups: u64, n: u64) -> Result<u64, (Limit, u64, u64)> {
        let mut room = u64::MAX;
        for (done, (limit, count, max)) in self.shared(groups).enumerate() {
            let fits = |c: u64| c.checked_add(n).filter(|&after| after <= max);
            match count.fetch_update(Relaxed, Relaxed, fits) {
                Ok(before) => room = room.min(max - before - n),
                Err(in_use) => {
                    for (_, count, _) in self.shared(groups).take(done) {
                        give_saturating(count, n);
                    }
                    return Err((limit, in_use, max));
                }
            }
        }
        Ok(room)
    }

    fn release(&self, key: u64, groups: u64, copies: u64) -> Result<(), OverRelease> {
        let groups = groups & self.valid;
        if copies == 0 {
            return Ok(());
        }
        let key = table::stored(key);
        let mut slots = self.set(key);
        let (hit, _) = scan(&slots, |s| s.key == key);
        let held = slots.get(hit).map_or(0, |slot| slot.value);
        let from_key = held.min(copies);
        let from_pool = copies - from_key;
        let over = |limit, held| OverRelease {
            limit,
            held,
            released: copies,
        };
        if from_pool > 0 && give(&self.untracked.0, from_pool).is_err() {
            return Err(over(Limit::Key, held));
        }
        for (done, (limit, count, _)) in self.shared(groups).enumerate() {
            if let Err(in_use) = give(count, copies) {
                for (_, count, _) in self.shared(groups).take(done) {
                    count.fetch_add(copies, Relaxed);
                }
                if from_pool > 0 {
                    self.untracked.0.fetch_add(from_pool, Relaxed);
                }
                return Err(over(limit, in_use));
            }
        }
        if let Some(slot) = slots.get_mut(hit) {
            slot.value -= from_key;
            if slot.value == 0 {
                slot.key = 0;
            }
        }
        Ok(())
    }

    /// A guard's release: exactly what it took, from where it took it. Saturates at zero
    /// (only reachable if the caller also released these copies by hand).
    fn put_back(&self, key: u64, groups: u64, copies: u64, tracked: bool) {
        if copies == 0 {
            return;
        }
        if tracked {
            let key = table::stored(key);
            let mut slots = self.set(key);
            if let Some(slot) = slots.iter_mut().find(|slot| slot.key == key) {
                slot.value = slot.value.saturating_sub(copies);
                if slot.value == 0 {
                    slot.key = 0;
                }
            }
        } else {
            give_saturating(&self.untracked.0, copies);
        }
        // After the key: the shared counts never fall below what the keys hold.
        for (_, count, _) in self.shared(groups) {
            give_saturating(count, copies);
        }
    }
}

fn reject(limit: Limit, in_use: u64, max: u64, wanted: u64) -> Rejection {
    Rejection {
        limit,
        in_use,
        max,
        wanted,
    }
}

/// Subtracts `n` if the count holds at least `n`; otherwise changes nothing and returns
/// the count.
fn give(count: &AtomicU64, n: u64) -> Result<u64, u64> {
    count.fetch_update(Relaxed, Relaxed, |c| c.checked_sub(n))
}

/// Subtracts `n`, stopping at zero.
fn give_saturating(count: &AtomicU64, n: u64) {
    // Never fails: the closure always returns Some.
    let _ = count.fetch_update(Relaxed, Relaxed, |c| Some(c.saturating_sub(n)));
}

#[cfg(test)]
mod tests;
