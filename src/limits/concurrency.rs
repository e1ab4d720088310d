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

/// Copies held by one admitted request; dropping it gives them back exactly once.
pub struct ConcurrencyGuard {
    state: Arc<State>,
    key: u64,
    groups: u64,
    copies: u64,
    remaining: u64,
    tracked: bool,
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
        Ok(ConcurrencyGuard {
            state: Arc::clone(&self.state),
            key,
            groups: groups & self.state.valid,
            copies: grant.granted,
            remaining: grant.remaining,
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
    /// The key whose copies this guard holds.
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
    /// admission (the `remaining` of the RateLimit headers).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Whether the key's own count holds these copies (false: admitted untracked because
    /// its set was full; see the module doc).
    pub fn tracked(&self) -> bool {
        self.tracked
    }

    /// The admission as a [`Verdict`].
    pub fn verdict(&self) -> Verdict {
        Verdict::allow(self.remaining, 0)
    }
}

impl Drop for ConcurrencyGuard {
    fn drop(&mut self) {
        self.state
            .put_back(self.key, self.groups, self.copies, self.tracked);
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
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::sync::Barrier;

    /// Spreads small test keys over the sets, as real (hashed) keys are.
    fn spread(i: u64) -> u64 {
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    #[test]
    fn what_can_never_fit_is_never_retried() {
        let p = ConcurrencyParams {
            max: 4,
            global: Some(10),
            groups: vec![0, 2, 6],
        };
        let rej = |limit, wanted| Rejection {
            limit,
            in_use: 4,
            max: 4,
            wanted,
        };
        // A group of max 0 (bit 0) blocks whichever limit was full first.
        assert!(p.never_fits(0b001, 1));
        assert_eq!(p.refusal(&rej(Limit::Key, 1), 0b001).retry_after, NEVER);
        // Room some day: retry in a second.
        assert!(!p.never_fits(0b110, 2));
        assert_eq!(
            p.refusal(&rej(Limit::Key, 2), 0b110).retry_after,
            RETRY_AFTER
        );
        // MIN above the key's max, the global, or a group the key is in.
        assert!(p.never_fits(0, 5));
        assert!(p.never_fits(0b010, 3));
        assert!(!p.never_fits(0b100, 3));
        let global = ConcurrencyParams {
            max: 20,
            global: Some(10),
            groups: vec![],
        };
        assert!(global.never_fits(0, 11) && !global.never_fits(0, 10));
        assert_eq!(
            global.refusal(&rej(Limit::Global, 11), 0).retry_after,
            NEVER
        );
    }

    fn limiter(max: u64, global: Option<u64>, groups: &[u64]) -> ConcurrencyLimiter {
        let params = ConcurrencyParams {
            max,
            global,
            groups: groups.to_vec(),
        };
        ConcurrencyLimiter::new(params, 1_000).unwrap()
    }

    fn rejection(limit: Limit, in_use: u64, max: u64, wanted: u64) -> Rejection {
        reject(limit, in_use, max, wanted)
    }

    #[test]
    fn reserve_up_to_the_key_limit() {
        let l = limiter(5, None, &[]);
        assert_eq!(l.reserve(1, 0, 3, 3), Ok(3));
        assert_eq!(l.reserve(1, 0, 3, 3), Err(rejection(Limit::Key, 3, 5, 3)));
        // The largest n in [min, copies] that fits.
        assert_eq!(l.reserve(1, 0, 3, 1), Ok(2));
        assert_eq!(l.reserve(1, 0, 1, 1), Err(rejection(Limit::Key, 5, 5, 1)));
        assert_eq!(l.reserve(1, 0, 4, 0), Ok(0), "min 0 may grant nothing");
        assert_eq!(l.held(1), 5);
        assert_eq!(l.reserve(2, 0, 5, 5), Ok(5), "keys are independent");
        assert_eq!(l.in_use_global(), 10, "summed without a global limit");
        assert_eq!(l.len(), 2);
        // min above copies is lowered to copies.
        assert_eq!(l.reserve(3, 0, 2, 9), Ok(2));
        // A request bigger than max never fits.
        assert_eq!(l.reserve(4, 0, 6, 6), Err(rejection(Limit::Key, 0, 5, 6)));
        assert_eq!(l.len(), 3, "a rejected new key takes no slot");
    }

    #[test]
    fn reserve_up_to_the_global_limit() {
        let l = limiter(10, Some(12), &[]);
        assert_eq!(l.reserve(1, 0, 10, 10), Ok(10));
        assert_eq!(l.reserve(2, 0, 5, 1), Ok(2));
        assert_eq!(
            l.reserve(3, 0, 1, 1),
            Err(rejection(Limit::Global, 12, 12, 1))
        );
        assert_eq!((l.in_use_global(), l.held(2), l.held(3)), (12, 2, 0));
        l.release(1, 0, 4).unwrap();
        assert_eq!(l.reserve(3, 0, 9, 1), Ok(4));
        assert_eq!(l.in_use_global(), 12);
    }

    #[test]
    fn reserve_up_to_a_group_limit_and_group_bits_are_per_request() {
        let l = limiter(10, None, &[4, 100]);
        assert_eq!(l.reserve(1, 0b01, 3, 3), Ok(3));
        assert_eq!(l.reserve(2, 0b01, 3, 1), Ok(1));
        assert_eq!(
            l.reserve(3, 0b01, 1, 1),
            Err(rejection(Limit::Group(0), 4, 4, 1))
        );
        // The same key outside the group is not limited by it.
        assert_eq!(l.reserve(3, 0b10, 5, 5), Ok(5));
        assert_eq!((l.in_use(0), l.in_use(1), l.in_use(7)), (4, 5, 0));
        // Bits beyond the configured groups are ignored.
        assert_eq!(l.reserve(4, !0b11, 2, 2), Ok(2));
        assert_eq!((l.in_use(0), l.in_use(1)), (4, 5));
        l.release(4, !0b11, 2).unwrap();
        assert_eq!((l.in_use(0), l.in_use(1), l.held(4)), (4, 5, 0));
    }

    #[test]
    fn a_key_in_two_groups_takes_a_copy_from_each() {
        let l = limiter(10, Some(100), &[3, 5]);
        let both = 0b11;
        assert_eq!(l.reserve(1, both, 2, 2), Ok(2));
        assert_eq!((l.in_use(0), l.in_use(1), l.in_use_global()), (2, 2, 2));
        // Group 1 has 3 left, group 0 only 1: the smaller bulkhead decides.
        assert_eq!(l.reserve(2, both, 3, 1), Ok(1));
        assert_eq!(l.reserve(3, 0b10, 2, 2), Ok(2));
        assert_eq!((l.in_use(0), l.in_use(1), l.in_use_global()), (3, 5, 5));
        assert_eq!(
            l.reserve(5, both, 1, 1),
            Err(rejection(Limit::Group(0), 3, 3, 1))
        );
        l.release(1, both, 2).unwrap();
        assert_eq!((l.in_use(0), l.in_use(1), l.in_use_global()), (1, 3, 3));
        assert_eq!(l.reserve(3, 0b10, 2, 2), Ok(2));
        assert_eq!(
            l.reserve(5, both, 1, 1),
            Err(rejection(Limit::Group(1), 5, 5, 1))
        );
        assert_eq!((l.held(1), l.held(2), l.held(3), l.held(5)), (0, 1, 4, 0));
    }

    #[test]
    fn a_rejection_takes_nothing_anywhere() {
        let l = limiter(5, Some(10), &[3, 10]);
        let _a = l.acquire(1, 0b10, 4).unwrap();
        let _b = l.acquire(2, 0b01, 3).unwrap();
        let snapshot = |l: &ConcurrencyLimiter| {
            (
                l.held(1),
                l.held(3),
                l.in_use_global(),
                l.in_use(0),
                l.in_use(1),
                l.len(),
            )
        };
        let before = snapshot(&l);
        // Fits its key, the global count and group 1, not group 0 (full): nothing moves.
        assert_eq!(
            l.acquire(3, 0b11, 2).err(),
            Some(rejection(Limit::Group(0), 3, 3, 2))
        );
        // Fits groups, not its key.
        assert_eq!(
            l.acquire(1, 0b10, 2).err(),
            Some(rejection(Limit::Key, 4, 5, 2))
        );
        // Fits its key and group, not the global count.
        let _c = l.acquire(4, 0, 3).unwrap();
        assert_eq!(
            l.acquire(3, 0b10, 1).err(),
            Some(rejection(Limit::Global, 10, 10, 1))
        );
        assert_eq!(snapshot(&l).0, before.0);
        assert_eq!((l.held(3), l.in_use(0), l.in_use(1)), (0, 3, 4));
        assert_eq!(l.in_use_global(), 10);
        let v = l.acquire(3, 0, 1).err().unwrap().verdict();
        assert_eq!(v, Verdict::reject(0, 0, NANOS_PER_SEC));
    }

    #[test]
    fn release_restores_and_frees_the_slot() {
        let l = limiter(5, Some(20), &[8]);
        assert_eq!(l.reserve(1, 1, 5, 5), Ok(5));
        assert_eq!(l.release(1, 1, 2), Ok(()));
        assert_eq!((l.held(1), l.in_use(0), l.in_use_global()), (3, 3, 3));
        assert_eq!(l.reserve(1, 1, 2, 2), Ok(2));
        assert_eq!(l.release(1, 1, 5), Ok(()));
        assert_eq!((l.held(1), l.in_use(0), l.in_use_global()), (0, 0, 0));
        assert!(l.is_empty(), "a key holding nothing has no slot");
        assert_eq!(l.release(1, 1, 0), Ok(()), "releasing nothing is fine");
    }

    #[test]
    fn an_over_release_is_an_error_and_changes_nothing() {
        let l = limiter(10, Some(20), &[8, 8]);
        assert_eq!(l.reserve(1, 0b01, 3, 3), Ok(3));
        assert_eq!(l.reserve(2, 0b10, 2, 2), Ok(2));
        let snapshot = |l: &ConcurrencyLimiter| {
            (
                l.held(1),
                l.held(2),
                l.in_use_global(),
                l.in_use(0),
                l.in_use(1),
            )
        };
        let before = snapshot(&l);
        let over = |limit, held, released| OverRelease {
            limit,
            held,
            released,
        };
        assert_eq!(l.release(1, 0b01, 4), Err(over(Limit::Key, 3, 4)));
        assert_eq!(l.release(3, 0, 1), Err(over(Limit::Key, 0, 1)));
        // The key holds 3, but group 1 holds only 2 (the copies were not reserved in it):
        // global and group 0 were given back first, then rolled back.
        assert_eq!(l.release(1, 0b11, 3), Err(over(Limit::Group(1), 2, 3)));
        assert_eq!(snapshot(&l), before);
        assert_eq!(l.release(1, 0b01, 3), Ok(()));
        assert_eq!(snapshot(&l), (0, 2, 2, 0, 2));
    }

    #[test]
    fn a_guard_releases_exactly_once_even_after_its_limiter_is_gone() {
        let l = limiter(3, Some(3), &[3]);
        let g = l.acquire(7, 1, 2).unwrap();
        assert_eq!(
            (g.key(), g.copies(), g.groups(), g.tracked()),
            (7, 2, 1, true)
        );
        assert_eq!(g.remaining(), 1);
        assert_eq!(g.verdict(), Verdict::allow(1, 0));
        assert_eq!((l.held(7), l.in_use(0), l.in_use_global()), (2, 2, 2));
        assert_eq!(l.acquire(8, 1, 2).err().unwrap().limit, Limit::Global);
        drop(g);
        assert_eq!((l.held(7), l.in_use(0), l.in_use_global()), (0, 0, 0));
        assert!(l.is_empty());
        // Dropping a guard after the limiter (a config reload) still releases into its
        // own state, which lives as long as the guard.
        let g = l.acquire(7, 1, 3).unwrap();
        let state = Arc::clone(&l.state);
        drop(l);
        assert_eq!(state.global.0.load(Relaxed), 3);
        drop(g);
        assert_eq!(state.global.0.load(Relaxed), 0);
        assert_eq!(state.groups[0].0.load(Relaxed), 0);
        assert_eq!(Arc::strong_count(&state), 1);
        // Zero copies: admitted, nothing held.
        let l = limiter(0, None, &[]);
        let g = l.acquire(1, 0, 0).unwrap();
        assert_eq!((g.copies(), l.len()), (0, 0));
        assert_eq!(
            l.acquire(1, 0, 1).err(),
            Some(rejection(Limit::Key, 0, 0, 1))
        );
    }

    #[test]
    fn a_guard_and_a_hand_release_never_wrap_a_count() {
        let l = limiter(5, Some(5), &[5]);
        let g = l.acquire(1, 1, 2).unwrap();
        // The caller's error: releasing the guard's copies by hand.
        l.release(1, 1, 2).unwrap();
        drop(g);
        assert_eq!((l.held(1), l.in_use_global(), l.in_use(0)), (0, 0, 0));
        assert_eq!(l.reserve(1, 1, 5, 5), Ok(5));
    }

    #[test]
    fn too_many_groups_is_an_error() {
        let params = |n| ConcurrencyParams {
            max: 1,
            global: None,
            groups: vec![1; n],
        };
        assert_eq!(
            ConcurrencyLimiter::new(params(65), 10).err(),
            Some(ConcurrencyError::TooManyGroups(65))
        );
        let l = ConcurrencyLimiter::new(params(64), 10).unwrap();
        assert_eq!(l.state.valid, u64::MAX);
        assert_eq!(l.reserve(1, 1 << 63, 1, 1), Ok(1));
        assert_eq!(l.in_use(63), 1);
        let l = ConcurrencyLimiter::new(params(0), 10).unwrap();
        assert_eq!(l.state.valid, 0);
        let l = ConcurrencyLimiter::new(params(3), 10).unwrap();
        assert_eq!(l.state.valid, 0b111);
        assert_eq!(l.params().groups.len(), 3);
    }

    #[test]
    fn the_table_bound_admits_untracked_and_counts_it() {
        // max_keys 8: one set, shared by every key.
        let l = ConcurrencyLimiter::new(
            ConcurrencyParams {
                max: 2,
                global: Some(100),
                groups: vec![100],
            },
            8,
        )
        .unwrap();
        assert_eq!([size_of::<Set>(), size_of::<Counter>()], [136, 128]);
        assert_eq!(l.state.table.sets(), 1);
        let guards: Vec<_> = (1..=8).map(|k| l.acquire(k, 1, 1).unwrap()).collect();
        assert!(guards.iter().all(ConcurrencyGuard::tracked));
        // Key 9 finds its set full of holding keys: admitted untracked, counted.
        let g9 = l.acquire(9, 1, 2).unwrap();
        assert!(!g9.tracked());
        assert_eq!(
            (l.len(), l.untracked_total(), l.untracked_in_use()),
            (8, 1, 2)
        );
        assert_eq!((l.held(9), l.in_use_global(), l.in_use(0)), (0, 10, 10));
        // Its own max still bounds each request.
        assert_eq!(l.acquire(9, 1, 3).err().unwrap().limit, Limit::Key);
        // A reservation goes untracked too, and a release takes the shortfall from the
        // untracked count.
        assert_eq!(l.reserve(10, 0, 1, 1), Ok(1));
        assert_eq!((l.untracked_total(), l.untracked_in_use()), (2, 3));
        assert_eq!(
            l.release(10, 0, 4),
            Err(OverRelease {
                limit: Limit::Key,
                held: 0,
                released: 4
            })
        );
        l.release(10, 0, 1).unwrap();
        assert_eq!((l.untracked_in_use(), l.in_use_global()), (2, 10));
        drop(g9);
        assert_eq!(
            (l.untracked_in_use(), l.in_use_global(), l.in_use(0)),
            (0, 8, 8)
        );
        drop(guards);
        assert_eq!((l.len(), l.in_use_global(), l.in_use(0)), (0, 0, 0));
        // Freed slots are used again: tracked.
        assert!(l.acquire(9, 1, 1).unwrap().tracked());
        assert_eq!(l.untracked_total(), 2);
    }

    #[test]
    fn threads_hammering_return_every_count_to_zero() {
        const THREADS: usize = 8;
        let l = ConcurrencyLimiter::new(
            ConcurrencyParams {
                max: 3,
                global: Some(12),
                groups: vec![5, 7, 9],
            },
            64,
        )
        .unwrap();
        let barrier = Barrier::new(THREADS + 1);
        std::thread::scope(|s| {
            for t in 0..THREADS as u64 {
                let (l, barrier) = (&l, &barrier);
                s.spawn(move || {
                    let mut held = Vec::new();
                    let mut reserved = Vec::new();
                    for i in 0..3_000u64 {
                        let key = spread(i % 5 + t % 3);
                        let groups = (i ^ t) % 8;
                        if i % 3 == 0 {
                            if let Ok(n) = l.reserve(key, groups, 1 + i % 3, 1) {
                                reserved.push((key, groups, n));
                            }
                        } else if let Ok(g) = l.acquire(key, groups, 1 + i % 2) {
                            held.push(g);
                        }
                        // Every limit holds at every instant (no counter ever exceeds it).
                        assert!(l.in_use_global() <= 12);
                        assert!((0..3).all(|g| l.in_use(g) <= [5, 7, 9][g]));
                        if held.len() + reserved.len() > 2 {
                            held.clear();
                            for (key, groups, n) in reserved.drain(..) {
                                l.release(key, groups, n).unwrap();
                            }
                        }
                    }
                    barrier.wait();
                    // Hold something at the rendezvous, then give it all back.
                    drop(held);
                    for (key, groups, n) in reserved {
                        l.release(key, groups, n).unwrap();
                    }
                });
            }
            barrier.wait();
        });
        assert_eq!(l.in_use_global(), 0);
        assert_eq!((l.in_use(0), l.in_use(1), l.in_use(2)), (0, 0, 0));
        assert_eq!((l.len(), l.untracked_in_use()), (0, 0));
        assert!((0..10).all(|k| l.held(spread(k)) == 0));
    }

    #[test]
    fn threads_contending_for_one_key_never_overshoot() {
        let l = limiter(50, Some(1_000), &[1_000]);
        let admitted: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .filter_map(|_| l.reserve(9, 1, 1, 1).ok())
                            .sum::<u64>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        assert_eq!(admitted, 50);
        assert_eq!((l.held(9), l.in_use(0), l.in_use_global()), (50, 50, 50));
    }

    /// The semantics written literally: counts in maps, every limit checked before anything
    /// changes. The oracle of the proptest.
    #[derive(Debug, Default)]
    struct Model {
        held: HashMap<u64, u64>,
        global: u64,
        groups: [u64; 3],
    }

    const MAX: u64 = 4;
    const GLOBAL: u64 = 9;
    const GROUPS: [u64; 3] = [3, 5, 6];

    impl Model {
        /// Every limit that applies, in order (key, global, groups), as (limit, count, max).
        fn limits(&self, key: u64, groups: u64) -> Vec<(Limit, u64, u64)> {
            let held = self.held.get(&key).copied().unwrap_or(0);
            let mut all = vec![
                (Limit::Key, held, MAX),
                (Limit::Global, self.global, GLOBAL),
            ];
            for g in Bits(groups) {
                let i = usize::from(g);
                all.push((Limit::Group(g), self.groups[i], GROUPS[i]));
            }
            all
        }

        /// The room left everywhere, or the first limit without room for `min`.
        fn room(&self, key: u64, groups: u64, min: u64) -> Result<u64, Rejection> {
            let mut room = u64::MAX;
            for (limit, in_use, max) in self.limits(key, groups) {
                if max - in_use < min {
                    return Err(reject(limit, in_use, max, min));
                }
                room = room.min(max - in_use);
            }
            Ok(room)
        }

        fn reserve(&mut self, key: u64, groups: u64, copies: u64, min: u64) -> Option<u64> {
            let min = min.min(copies);
            let n = self.room(key, groups, min).ok()?.min(copies);
            *self.held.entry(key).or_default() += n;
            self.global += n;
            for g in Bits(groups) {
                self.groups[usize::from(g)] += n;
            }
            Some(n)
        }

        fn release(&mut self, key: u64, groups: u64, copies: u64) -> bool {
            let held = self.held.get(&key).copied().unwrap_or(0);
            if held < copies || Bits(groups).any(|g| self.groups[usize::from(g)] < copies) {
                return false;
            }
            *self.held.entry(key).or_default() -= copies;
            self.global -= copies;
            for g in Bits(groups) {
                self.groups[usize::from(g)] -= copies;
            }
            true
        }
    }

    proptest! {
        #[test]
        fn matches_the_model(
            steps in prop::collection::vec((0u64..4, 0u64..8, 0u64..6, 0u64..6, any::<bool>()), 1..150)
        ) {
            let l = ConcurrencyLimiter::new(
                ConcurrencyParams { max: MAX, global: Some(GLOBAL), groups: GROUPS.to_vec() },
                1 << 12,
            )
            .unwrap();
            let mut m = Model::default();
            for (key, groups, copies, min, release) in steps {
                if release {
                    let ok = m.release(key, groups, copies);
                    prop_assert_eq!(l.release(spread(key), groups, copies).is_ok(), ok);
                } else {
                    let got = l.reserve(spread(key), groups, copies, min);
                    if let Err(r) = got {
                        // The first limit without room, with its count.
                        prop_assert_eq!(Err(r), m.room(key, groups, min.min(copies)));
                    }
                    prop_assert_eq!(got.ok(), m.reserve(key, groups, copies, min));
                }
                prop_assert_eq!(l.in_use_global(), m.global);
                for g in 0..3 {
                    prop_assert_eq!(l.in_use(g), m.groups[g]);
                }
                for k in 0..4 {
                    prop_assert_eq!(l.held(spread(k)), m.held.get(&k).copied().unwrap_or(0));
                }
            }
        }
    }
}
