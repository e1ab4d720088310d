//! The sliding log limiter: Grab's frequency caps, counted exactly against several
//! windows at once (3 a day *and* 10 a week).
//!
//! Each key has a log of the instants of its admitted events. A window `{max, per}` counts
//! the entries of the last `per`; a request of cost `c` at `now` is admitted only if every
//! window has room for it (`count + c ≤ max`), and is then recorded as `c` entries of the
//! same instant. A rejected request records nothing. A refund removes exactly the entries
//! its admission added. No estimate anywhere: the counts are those of the log.
//!
//! **Time in units.** An entry is a `u32` offset, in units of `u = 2^s` ns, from a per-key
//! base (a `u64` count of units). `u` is the smallest power of two with `longest_per / u ≤
//! 2³¹`, so the live entries and `now` always fit in 32 bits with room to spare: 1 ns for
//! windows up to 2.1 s (exact to the nanosecond), 32 ns for a minute, 2 µs for an hour,
//! 65.5 µs for a day, 0.52 ms for a week, 16.8 ms for 366 days (a relative error below
//! 10⁻⁹). An event at `t` is recorded as the *last* nanosecond of its unit,
//! `t' = ⌊t/u⌋·u + u − 1 ≥ t`, and counts in a window of length `per` while
//! `now < t' + per`: up to `u − 1` ns longer than exactly, never shorter. Counts are
//! therefore never below the exact ones, so the log never admits what exact counting would
//! reject (it errs on the strict side, by less than one unit), and `retry_after` is exact
//! for this rule: the same request is rejected one nanosecond before `now + retry_after`
//! and admitted at it. An entry whose instant is after `now` (a thread that read the clock
//! earlier but decides later) counts in every window, again the strict side. Such a late
//! decision is judged at its own `now` for the entries still in the log, but entries
//! already pruned by a later `now` stay gone: they had expired by the time it was decided.
//!
//! **Retry.** Entries are kept sorted by time, so in a window with `n` live entries of
//! which at most `max − c` may remain, the request fits once the `(n − max + c)`-th oldest
//! expires; the request fits everywhere at the latest of those instants over the windows.
//! A cost above some window's `max` never fits: its `retry_after` is that window's `per`,
//! a hint rather than a promise.
//!
//! **Table.** `sets = ⌈max_keys / 8⌉` sets of 8 slots, each set behind its own
//! `parking_lot::Mutex` (Lemire's multiply-high picks the set, as in the token bucket). A
//! slot is `(key, base, head, len)` (24 bytes; key 0 marks an empty slot, so a real key 0
//! is stored as 1) and owns a ring of `E` `u32` entries in one arena allocated, zeroed, at
//! construction, where `E` is the `max` of the longest window: entries older than that
//! window are pruned, and the longest window never holds more than its `max`. The arena is
//! one large zeroed allocation, so the OS maps its pages only when first written. A
//! decision locks one set, scans its 8 slots, prunes the expired head of the key's ring and
//! counts each window by binary search: no allocation, no other lock, no syscall. A key
//! whose log empties frees its slot.
//!
//! **Memory bound.** `25 + 4E` bytes per key of `max_keys` (the slot and its share of the
//! lock, plus the ring), whatever the keys do, plus under 200 + 32E bytes of rounding to
//! whole sets and a 256-byte header; see [`SlidingLog::memory_bytes`]. With
//! `[{max: 3, per: 1d}, {max: 10, per: 7d}]`, `E = 10`: 65 bytes per key, 65 MB for 1 M keys.
//!
//! **Eviction.** A new key takes an empty slot of its set, else a slot whose log is empty
//! by `now` (that equals absent: nothing is lost). Failing both, it evicts the log whose
//! forgetting would wrongly admit least ([`crate::limits::victim`]): the one furthest from
//! its cap (the room a new key has minus the room it has left), and of those the one whose
//! newest entry expires first. A key at its cap is thus never evicted while its set holds a
//! key further from a cap, so a flood of fresh keys (one entry each) cannot free a key
//! capped at 2 or more; the victim module's doc gives the flood that still can. The evicted
//! key forgets its log and fails open until it fills again. That is the price of bounded
//! memory, counted by [`SlidingLog::evictions`]; as in the token bucket, eviction starts
//! before `max_keys` keys hold entries (0.01% of them beyond their set at `max_keys / 4`,
//! 0.8% at half).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use crate::limits::clock::{Nanos, NANOS_PER_SEC};
use crate::limits::restore::Restored;
use crate::limits::table::{self, scan, Table, WAYS};
use crate::limits::verdict::{Grant, Verdict};
use crate::limits::victim;

/// The longest window spans at most this many units (see the module doc).
const SPAN: u64 = 1 << 31;

/// Units kept between a key's base and its oldest entry when the base is set, so that a
/// thread whose `now` is a little behind still records at its own instant.
const MARGIN: u64 = 1 << 29;

/// The longest window the configuration offers (366 days). Longer ones work too (the unit
/// grows with the window); this is the documented bound.
pub const MAX_PER: Nanos = 366 * 86_400 * NANOS_PER_SEC;

/// One window of a sliding log: at most `max` per sliding `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogWindow {
    /// Entries allowed in the window.
    pub max: u64,
    /// The window's length in nanoseconds (a `per` of 0 is raised to 1).
    pub per: Nanos,
}

/// Whether a request for `n` entries can never fit `windows`: a window's `max` is below
/// it (a `max: 0` block among them), so it never makes room, in process or in a store
/// (see [`Verdict::never_if`](crate::limits::verdict::Verdict::never_if)).
pub fn never_fits(windows: &[LogWindow], n: u64) -> bool {
    windows.iter().any(|w| n > w.max)
}

/// Parameters [`SlidingLog::new`] cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlidingLogError {
    /// A log limits nothing without a window.
    #[error("a sliding log needs at least one window")]
    NoWindows,
    /// The arena (`max_keys` × entries per key) cannot be allocated.
    #[error(
        "a sliding log of {entries} entries per key for {max_keys} keys does not fit in memory"
    )]
    TooLarge {
        /// Entries per key: the `max` of the longest window.
        entries: u64,
        /// The keys asked for.
        max_keys: usize,
    },
}

/// Exact sliding logs per key, checked against every window at once.
pub struct SlidingLog {
    /// The logs' heads, headed by the windows and the arena of their entries.
    table: Table<LogHead, Logs>,
}

/// What every decision reads besides the table: the windows and the entries' arena.
struct Logs {
    /// The windows, `per` at least 1, in the caller's order.
    windows: Box<[LogWindow]>,
    /// The longest `per`: entries older than that are pruned.
    longest: Nanos,
    /// The unit is `1 << shift` ns.
    shift: u32,
    /// Entries per key (`E`): the ring length of every slot.
    cap: u32,
    /// `E` entries per slot, slot `set · WAYS + way`; guarded by the slot's set lock
    /// (relaxed atomics only to write through a shared reference: plain moves on x86).
    entries: Box<[AtomicU32]>,
}

/// A key's log: `len` entries from `head` in its ring, offsets from `base` units (16
/// bytes; a slot with its key, 24).
#[derive(Debug, Clone, Copy, Default)]
struct LogHead {
    base: u64,
    head: u32,
    len: u32,
}

/// A way of the table: a key and its log's head.
type Slot = table::Slot<LogHead>;

/// One set: its lock and its slots, 200 bytes.
#[cfg(test)]
type Set = table::Set<LogHead>;

/// One slot and its ring, while its set is locked.
struct Log<'a> {
    slot: &'a mut Slot,
    ring: &'a [AtomicU32],
}

/// A decision before anything is recorded.
struct Judgement {
    allowed: bool,
    /// The smallest `max − count` over the windows, before this request.
    room: u64,
    retry_after: Nanos,
}

impl SlidingLog {
    /// Logs for `windows`, holding entries for at most `max_keys` keys (see the module doc
    /// for the memory this reserves and for eviction).
    ///
    /// A `per` of 0 is raised to 1 and a `max_keys` of 0 to 1 (one set of 8); a `max` of 0
    /// admits no cost above 0. No window, or an arena that cannot be allocated, is an
    /// error: the memory is reserved here, never on a decision.
    pub fn new(windows: &[LogWindow], max_keys: usize) -> Result<Self, SlidingLogError> {
        let windows: Box<[LogWindow]> = windows
            .iter()
            .map(|w| LogWindow {
                max: w.max,
                per: w.per.max(1),
            })
            .collect();
        let (entries, longest, shift) = geometry(&windows).ok_or(SlidingLogError::NoWindows)?;
        let too_large = SlidingLogError::TooLarge { entries, max_keys };
        let sets = Table::<LogHead>::sets_for(max_keys);
        let cap = u32::try_from(entries).map_err(|_| too_large.clone())?;
        let len = (sets.checked_mul(WAYS))
            .and_then(|slots| slots.checked_mul(cap as usize))
            .ok_or_else(|| too_large.clone())?;
        // One zeroed allocation: the OS maps its pages when first written.
        let entries =
            bytemuck::allocation::try_zeroed_slice_box::<AtomicU32>(len).map_err(|()| too_large)?;
        let logs = Logs {
            windows,
            longest,
            shift,
            cap,
            entries,
        };
        Ok(Self {
            table: Table::new(max_keys, logs),
        })
    }

    /// Bytes [`SlidingLog::new`] allocates for `windows` and `max_keys`: the sets and the
    /// arena, not the 256-byte header. `None` without a window or past `usize`.
    ///
    /// For a config check to warn before a log is built; whatever the keys do, the
    /// limiter never allocates more.
    pub fn memory_bytes(windows: &[LogWindow], max_keys: usize) -> Option<usize> {
        let (entries, _, _) = geometry(windows)?;
        let slots = Table::<LogHead>::sets_for(max_keys).checked_mul(WAYS)?;
        let ring = usize::try_from(entries)
            .ok()?
            .checked_mul(size_of::<u32>())?;
        let per_slot = ring.checked_add(Table::<LogHead>::bytes_for(WAYS) / WAYS)?;
        slots.checked_mul(per_slot)
    }

    /// Decides a request of `cost` for `key` at `now`, and records it if admitted.
    ///
    /// `remaining` is the smallest room left over the windows, `reset_after` the time until
    /// the key's log is empty, and a rejection's `retry_after` the exact time until this
    /// request would fit every window (see the module doc). Pass the same `now` to
    /// [`refund`](Self::refund) to undo an admission.
    pub fn acquire(&self, key: u64, cost: u64, now: Nanos) -> Verdict {
        self.decide(key, cost, cost, now, true).verdict
    }

    /// Decides a request for between `min` and `want` entries (a `min` above `want` is
    /// lowered to `want`) for `key` at `now`: records the largest `n` in `[min, want]`
    /// that fits every window, `n = min(want, room)` with `room` the smallest
    /// `max − count` over the windows, or nothing if `min` does not fit. A rejection's
    /// `retry_after` is the exact time until `min` fits. `acquire_many(key, c, c, now)`
    /// decides exactly as `acquire(key, c, now)`.
    pub fn acquire_many(&self, key: u64, min: u64, want: u64, now: Nanos) -> Grant {
        self.decide(key, min.min(want), want, now, true)
    }

    /// What [`acquire`](Self::acquire) would answer, without recording anything.
    pub fn peek(&self, key: u64, cost: u64, now: Nanos) -> Verdict {
        self.decide(key, cost, cost, now, false).verdict
    }

    /// Removes the `cost` entries an admission at `at` recorded for `key` (a later limit
    /// rejected the request); returns how many were found.
    ///
    /// Entries of one unit are indistinguishable, so removing any `cost` of them restores
    /// exactly the log as if the admission had not happened. Fewer are found only if they
    /// have been pruned (expired), evicted or already refunded.
    pub fn refund(&self, key: u64, cost: u64, at: Nanos) -> u64 {
        let key = table::stored(key);
        let set = self.table.index(key);
        let mut slots = self.table.lock(set);
        let (hit, _) = scan(&slots, |s| s.key == key);
        let Some(slot) = slots.get_mut(hit) else {
            return 0;
        };
        let ring = self.ring(set, hit);
        let log = Log { slot, ring };
        let q = at >> self.logs().shift;
        // Recorded at the base if its unit was before it (see `push`).
        let Ok(off) = u32::try_from(q.saturating_sub(log.slot.value.base)) else {
            return 0;
        };
        let len = log.slot.value.len;
        let first = partition(len, |i| log.at(i) < off);
        let mut n = 0;
        while first + n < len && u64::from(n) < cost && log.at(first + n) == off {
            n += 1;
        }
        for i in first + n..len {
            log.put(i - n, log.at(i));
        }
        log.slot.value.len -= n;
        if log.slot.value.len == 0 {
            *log.slot = Slot::default();
        }
        u64::from(n)
    }

    /// Entries of `key` counting in window `window` (an index into the windows given to
    /// [`SlidingLog::new`]) at `now`: for the admin state endpoint and tests.
    pub fn count(&self, key: u64, window: usize, now: Nanos) -> u64 {
        let Some(w) = self.logs().windows.get(window) else {
            return 0;
        };
        let key = table::stored(key);
        let set = self.table.index(key);
        let mut slots = self.table.lock(set);
        let (hit, _) = scan(&slots, |s| s.key == key);
        let Some(slot) = slots.get_mut(hit) else {
            return 0;
        };
        let log = Log {
            slot,
            ring: self.ring(set, hit),
        };
        u64::from(log.slot.value.len - self.first_live(&log, w.per, now))
    }

    /// The windows (`per` at least 1).
    pub fn windows(&self) -> &[LogWindow] {
        &self.logs().windows
    }

    /// The unit of time entries are recorded in, in ns: an entry counts up to this much
    /// minus 1 ns longer than exactly (see the module doc).
    pub fn resolution(&self) -> Nanos {
        1 << self.logs().shift
    }

    /// Entries a key's ring holds: the `max` of the longest window.
    pub fn entries_per_key(&self) -> u32 {
        self.logs().cap
    }

    /// Keys holding entries (a log empty by now still counts until touched).
    ///
    /// Locks each set in turn, so it is for metrics and tests, not the hot path.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key holds entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Logs evicted before they were empty, since construction.
    ///
    /// Each is a key that forgets its log and fails open until it fills again: a rising
    /// count means `max_keys` is too small for the keys holding entries. Reusing the slot
    /// of a log that is empty by now loses nothing and is not counted.
    pub fn evictions(&self) -> u64 {
        self.table.evictions()
    }

    /// Judges `min` (at most `want`) for `key` at `now`; when it fits, grants
    /// `n = min(want, room)` (which fits too: `room` is the smallest room over the
    /// windows) and records it if `record`.
    fn decide(&self, key: u64, min: u64, want: u64, now: Nanos, record: bool) -> Grant {
        let key = table::stored(key);
        let set = self.table.index(key);
        let q = now >> self.logs().shift;
        let mut slots = self.table.lock(set);
        let (hit, empty) = scan(&slots, |s| s.key == key);
        if let Some(slot) = slots.get_mut(hit) {
            let mut log = Log {
                slot,
                ring: self.ring(set, hit),
            };
            self.prune(&mut log, now);
            let j = self.judge(Some(&log), min, now);
            let n = granted(&j, min, want);
            let v = self.verdict(&j, n, log.newest(), q, now);
            if record && j.allowed && n > 0 {
                // Admitted: len + n ≤ cap ≤ u32::MAX.
                self.push(&mut log, q, n as u32);
            }
            if log.slot.value.len == 0 {
                *log.slot = Slot::default();
            }
            return grant(v, j.allowed, n);
        }
        let j = self.judge(None, min, now);
        let n = granted(&j, min, want);
        let v = self.verdict(&j, n, None, q, now);
        if record && j.allowed && n > 0 {
            let way = self.victim(&slots, set, empty, now);
            slots[way] = Slot {
                key,
                value: LogHead::default(),
            };
            let mut log = Log {
                slot: &mut slots[way],
                ring: self.ring(set, way),
            };
            self.push(&mut log, q, n as u32);
        }
        grant(v, j.allowed, n)
    }

    /// Whether `cost` fits every window of `log` (pruned at `now`; `None`: empty), and
    /// when it will if not.
    fn judge(&self, log: Option<&Log<'_>>, cost: u64, now: Nanos) -> Judgement {
        let mut room = u64::MAX;
        let mut allowed = true;
        let (mut ready, mut never) = (now, 0);
        for w in self.logs().windows.iter() {
            let (first, count) = log.map_or((0, 0), |log| {
                let first = self.first_live(log, w.per, now);
                (first, u64::from(log.slot.value.len - first))
            });
            room = room.min(w.max.saturating_sub(count));
            if count.saturating_add(cost) <= w.max {
                continue;
            }
            allowed = false;
            match log {
                Some(log) if cost <= w.max => {
                    // The window fits once its (count + cost - max)-th oldest live entry
                    // expires: 1 ≤ that ≤ count, as cost ≤ max < count + cost.
                    let i = first + (count + cost - w.max - 1) as u32;
                    ready = ready.max(self.expire(log.quantum(i), w.per));
                }
                _ => never = never.max(w.per),
            }
        }
        Judgement {
            allowed,
            room,
            retry_after: if never > 0 { never } else { ready - now },
        }
    }

    /// The verdict of `j` for a log whose newest entry is `newest` (in units).
    fn verdict(
        &self,
        j: &Judgement,
        cost: u64,
        newest: Option<u64>,
        q: u64,
        now: Nanos,
    ) -> Verdict {
        let reset = |newest: Option<u64>| {
            newest.map_or(0, |n| {
                self.expire(n, self.logs().longest).saturating_sub(now)
            })
        };
        if !j.allowed {
            return Verdict::reject(j.room, reset(newest), j.retry_after.max(1));
        }
        // Recorded at `q`, or at the base if `q` is before it, which is before `newest`.
        let newest = if cost > 0 {
            Some(newest.map_or(q, |n| n.max(q)))
        } else {
            newest
        };
        Verdict::allow(j.room - cost, reset(newest))
    }

    /// The first instant at which an entry of unit `q` no longer counts in a window of
    /// `per`: `t' + per` with `t'` the last nanosecond of the unit.
    fn expire(&self, q: u64, per: Nanos) -> Nanos {
        q.saturating_add(1)
            .saturating_mul(1 << self.logs().shift)
            .saturating_sub(1)
            .saturating_add(per)
    }

    /// The index of the first entry of `log` still counting in a window of `per` at `now`
    /// (entries are sorted, so the ones before it are exactly those that expired).
    fn first_live(&self, log: &Log<'_>, per: Nanos, now: Nanos) -> u32 {
        partition(log.slot.value.len, |i| {
            self.expire(log.quantum(i), per) <= now
        })
    }

    /// Drops the entries expired in every window, i.e. in the longest.
    fn prune(&self, log: &mut Log<'_>, now: Nanos) {
        while log.slot.value.len > 0 && self.expire(log.quantum(0), self.logs().longest) <= now {
            log.slot.value.head = log.wrap(log.slot.value.head as usize + 1);
            log.slot.value.len -= 1;
        }
    }

    /// Records `cost` entries at unit `q`, keeping the ring sorted (`len + cost ≤ cap`).
    fn push(&self, log: &mut Log<'_>, q: u64, cost: u32) {
        if log.slot.value.len == 0 {
            log.slot.value.base = q.saturating_sub(MARGIN);
            log.slot.value.head = 0;
        }
        // A `now` before the base moves the base down; only a skew of about the longest
        // window, which would not fit 32 bits, is recorded at the base (later than it
        // happened: the strict side).
        let q = if q < log.slot.value.base && !log.lower_base(q) {
            log.slot.value.base
        } else {
            q
        };
        if q - log.slot.value.base > u64::from(u32::MAX) {
            log.rebase(q);
        }
        // Pruned at `now`, the live entries span at most SPAN + 1 units: this fits.
        let off = u32::try_from(q - log.slot.value.base).unwrap_or(u32::MAX);
        let len = log.slot.value.len;
        // Entries almost always arrive in order: this stops at once.
        let mut at = len;
        while at > 0 && log.at(at - 1) > off {
            at -= 1;
        }
        for i in (at..len).rev() {
            log.put(i + cost, log.at(i));
        }
        for i in at..at + cost {
            log.put(i, off);
        }
        log.slot.value.len = len + cost;
    }

    /// The way a new key takes: `empty` if it is a way, else the log of least
    /// [`Score`](victim::Score) (see [`SlidingLog::score`]); taking a live one is counted.
    fn victim(&self, slots: &[Slot; WAYS], set: usize, empty: usize, now: Nanos) -> usize {
        self.table.victim(slots, empty, 0, |way, head| {
            let mut slot = Slot {
                key: 0,
                value: *head,
            };
            let log = Log {
                slot: &mut slot,
                ring: self.ring(set, way),
            };
            self.score(&log, now)
        })
    }

    /// What forgetting `log` would wrongly admit at `now`: its loss is the room a new key
    /// has (the smallest window `max`) minus the room it has left (the smallest `max −
    /// count` over the windows), so a capped key loses its whole cap and a key with one
    /// entry loses 1; it empties when its newest entry leaves the longest window.
    fn score(&self, log: &Log<'_>, now: Nanos) -> victim::Score {
        let Some(newest) = log.newest() else {
            return victim::Score::FREE;
        };
        let (mut fresh, mut room) = (u64::MAX, u64::MAX);
        for w in self.logs().windows.iter() {
            let count = u64::from(log.slot.value.len - self.first_live(log, w.per, now));
            fresh = fresh.min(w.max);
            room = room.min(w.max.saturating_sub(count));
        }
        victim::Score::new(
            fresh.saturating_sub(room),
            self.expire(newest, self.logs().longest),
            now,
        )
    }

    /// The windows and the arena.
    #[inline(always)]
    fn logs(&self) -> &Logs {
        self.table.head()
    }

    /// The ring of slot `way` of set `set`.
    fn ring(&self, set: usize, way: usize) -> &[AtomicU32] {
        let cap = self.logs().cap as usize;
        let start = (set * WAYS + way) * cap;
        &self.logs().entries[start..start + cap]
    }
}

/// The count granted when `j` judged `min`: `min(want, room)` if it fits (`room ≥ min`
/// then), else `min` (what the rejection's verdict describes).
fn granted(j: &Judgement, min: u64, want: u64) -> u64 {
    if j.allowed {
        want.min(j.room).max(min)
    } else {
        min
    }
}

fn grant(verdict: Verdict, allowed: bool, n: u64) -> Grant {
    Grant {
        verdict,
        granted: if allowed { n } else { 0 },
    }
}

impl Log<'_> {
    /// A ring position from a position that may be up to twice the ring's length.
    fn wrap(&self, j: usize) -> u32 {
        let cap = self.ring.len();
        (if j >= cap { j - cap } else { j }) as u32
    }

    fn index(&self, i: u32) -> usize {
        self.wrap(self.slot.value.head as usize + i as usize) as usize
    }

    /// The offset of entry `i` (0: the oldest).
    fn at(&self, i: u32) -> u32 {
        self.ring[self.index(i)].load(Relaxed)
    }

    fn put(&self, i: u32, off: u32) {
        self.ring[self.index(i)].store(off, Relaxed);
    }

    /// The unit of entry `i`.
    fn quantum(&self, i: u32) -> u64 {
        self.slot.value.base + u64::from(self.at(i))
    }

    /// The unit of the newest entry.
    fn newest(&self) -> Option<u64> {
        self.slot.value.len.checked_sub(1).map(|i| self.quantum(i))
    }

    /// Moves the base down to MARGIN units below `q` (before the base), if the newest
    /// entry's offset still fits; returns whether it did.
    fn lower_base(&mut self, q: u64) -> bool {
        let new_base = q.saturating_sub(MARGIN);
        let delta = self.slot.value.base - new_base;
        let newest = self.slot.value.len.checked_sub(1).map_or(0, |i| self.at(i));
        let Ok(delta) = u32::try_from(delta) else {
            return false;
        };
        if newest.checked_add(delta).is_none() {
            return false;
        }
        for i in 0..self.slot.value.len {
            self.put(i, self.at(i) + delta);
        }
        self.slot.value.base = new_base;
        true
    }

    /// Moves the base up to MARGIN units below the oldest entry (or below `q`), so that
    /// `q` gets an offset that fits.
    fn rebase(&mut self, q: u64) {
        let oldest = self.quantum(0);
        let base = self.slot.value.base;
        let new_base = oldest.min(q).saturating_sub(MARGIN).max(base);
        // new_base ≤ oldest: every offset stays ≥ 0, and delta ≤ the oldest offset.
        let delta = (new_base - base) as u32;
        for i in 0..self.slot.value.len {
            self.put(i, self.at(i) - delta);
        }
        self.slot.value.base = new_base;
    }
}

/// The (entries per key, longest per, unit shift) of `windows` (`per` already ≥ 1);
/// `None` without a window.
fn geometry(windows: &[LogWindow]) -> Option<(u64, Nanos, u32)> {
    let longest = windows.iter().map(|w| w.per.max(1)).max()?;
    // Every window of the longest `per` bounds the log; the smallest of their maxes wins.
    let entries = windows
        .iter()
        .filter(|w| w.per.max(1) == longest)
        .map(|w| w.max)
        .min()?;
    let mut shift = 0;
    while longest >> shift > SPAN {
        shift += 1;
    }
    Some((entries, longest, shift))
}

/// The first `i` in `0..len` for which `before(i)` is false, `before` being true on a
/// prefix: a binary search.
fn partition(len: u32, before: impl Fn(u32) -> bool) -> u32 {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

impl SlidingLog {
    /// Calls `f` for every key holding entries, with its entries' instants, oldest first
    /// (a log empty by now is included until touched; [`SlidingLog::import`] drops it).
    /// Each instant is the last nanosecond of the entry's unit, the instant the log itself
    /// counts it from, so an import never counts an entry shorter than this log would.
    /// One way at a time is copied under its set's lock (at most `E` entries), and `f`
    /// runs with no lock held; `buf` is reused between keys.
    pub fn export(&self, buf: &mut Vec<Nanos>, mut f: impl FnMut(u64, &[Nanos])) {
        for set in 0..self.table.sets() {
            for way in 0..WAYS {
                let key = {
                    let mut slots = self.table.lock(set);
                    let slot = &mut slots[way];
                    if slot.key == 0 {
                        continue;
                    }
                    let log = Log {
                        slot,
                        ring: self.ring(set, way),
                    };
                    buf.clear();
                    buf.extend((0..log.slot.value.len).map(|i| self.last_ns(log.quantum(i))));
                    log.slot.key
                };
                f(key, buf);
            }
        }
    }

    /// Puts a saved log back at `now`: `entries` (instants in any order; sorted here, and
    /// one after `now` is taken as `now`) lose those expired in every window by `now` and
    /// keep at most the newest `E`. The log is stored unless nothing is left. It replaces
    /// the key's log if it has one, else takes an empty slot or one whose log is empty by
    /// now; it never evicts (see [`crate::limits::restore`]).
    ///
    /// An entry at instant `t` is recorded in the unit holding `t`, whose last nanosecond
    /// is at or after `t`: it counts at least as long as the saved one did (the strict side,
    /// as every entry of the log).
    pub fn import(&self, key: u64, entries: &mut [Nanos], now: Nanos) -> Restored {
        for t in entries.iter_mut() {
            *t = (*t).min(now) >> self.logs().shift;
        }
        entries.sort_unstable();
        let live_from = entries.partition_point(|&q| self.expire(q, self.logs().longest) <= now);
        let live = &entries[live_from..];
        let live = &live[live.len().saturating_sub(self.logs().cap as usize)..];
        let key = table::stored(key);
        let set = self.table.index(key);
        let mut slots = self.table.lock(set);
        let (hit, _) = scan(&slots, |s| s.key == key);
        let Some(&oldest) = live.first() else {
            if let Some(slot) = slots.get_mut(hit) {
                *slot = Slot::default();
            }
            return Restored::Empty;
        };
        let free = || {
            (0..WAYS).find(|&way| {
                let mut slot = slots[way];
                let log = Log {
                    slot: &mut slot,
                    ring: self.ring(set, way),
                };
                slot_free(
                    log.newest().map(|n| self.expire(n, self.logs().longest)),
                    now,
                )
            })
        };
        let Some(way) = (hit < WAYS).then_some(hit).or_else(free) else {
            return Restored::NoRoom;
        };
        let base = oldest.saturating_sub(MARGIN);
        slots[way] = Slot {
            key,
            value: LogHead {
                base,
                head: 0,
                // At most `cap` entries: fits u32.
                len: live.len() as u32,
            },
        };
        let log = Log {
            slot: &mut slots[way],
            ring: self.ring(set, way),
        };
        for (i, &q) in live.iter().enumerate() {
            // Live entries span at most the longest window (2^31 units) plus the margin.
            log.put(i as u32, u32::try_from(q - base).unwrap_or(u32::MAX));
        }
        Restored::Stored
    }

    /// The last nanosecond of unit `q`: the instant an entry of that unit counts from.
    fn last_ns(&self, q: u64) -> Nanos {
        q.saturating_add(1)
            .saturating_mul(1 << self.logs().shift)
            .saturating_sub(1)
    }
}

/// Whether a way whose newest entry leaves the log at `expires` (`None`: empty) is free at
/// `now`.
fn slot_free(expires: Option<Nanos>, now: Nanos) -> bool {
    expires.is_none_or(|e| e <= now)
}

#[cfg(test)]
mod tests;
