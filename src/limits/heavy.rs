//! The heavy hitters of one limit: which keys it admits and rejects most *right now*, for
//! the admin API's `/top`, at a bounded memory and a small, allocation-free cost per
//! decision.
//!
//! **Structure.** A count-min sketch of `d` = [`DEPTH`] rows × `w` columns counts every
//! decision; each cell packs two counters in one `AtomicU64` (admissions in the low 32
//! bits, rejections in the high 32), so one `fetch_add` per row records a decision of either
//! kind. Beside it, two small candidate lists (one ranked by admissions, one by
//! rejections) of at most `k` = `top_keys` keys each hold the only copies of key *text*:
//! a key's readable form is built when it enters a list, never otherwise.
//!
//! **Count-min odds.** A key's estimate is the minimum of its `d` cells. It never
//! undercounts; with `N` decisions counted, each cell of a row holds on average `N / w` of
//! other keys' counts, so by Markov's inequality one row overcounts by more than `εN`
//! (ε = e / w) with probability at most 1/e, and all `d` rows do (the estimate is off by
//! more than `εN`) with probability at most `e^-d`. With `d` = 4 and `w` ≥ 1024: the
//! estimate is within 0.27 % of the window's decisions with probability ≥ 98 %.
//!
//! **Top-k admission.** After counting, a key whose estimate is above the list's threshold
//! (the smallest member estimate, as last computed) and that is not a member yet takes the
//! list's lock and replaces the member with the smallest estimate if it beats it; members
//! are found without the lock, in an open-addressed table of their hashes. This is
//! count-min plus a heap (Cormode and Muthukrishnan), not Space-Saving: Space-Saving
//! replaces its minimum on *every* miss, which would build a key's text for every request
//! of the long tail. The guarantee is of the same kind: **every key outside a list has a
//! true count no larger than the estimate of every member** (when a key was turned away
//! or evicted, every member's estimate was at least its count, and estimates only grow
//! within a window; the proptest checks it against an exact counter). With the count-min
//! bound, the list therefore holds, with probability ≥ 1 − e^-d per member, every key
//! whose true count exceeds the k-th largest true count plus εN: the error Space-Saving
//! would give with `1/ε` counters.
//!
//! **Windowed.** Counts live in two epochs of [`HeavyHitters::epoch`] each (30 s by
//! default): the current and the previous one. An estimate adds both, so it covers the
//! last one to two epochs: "right now", not since start. The first decision of a new epoch
//! clears the older epoch's cells (`w × d` stores, once per epoch) and resets the
//! thresholds, so keys that were heavy a minute ago give way to today's as their counts
//! drop out. A decision racing with the clear may lose its count (it is an estimate
//! either way); no count is ever attributed to the wrong key.
//!
//! **Cost.** Per decision: one division (the epoch), `d` `fetch_add`s and `d` loads, one
//! comparison; a member probes a small table of its list (a few loads). No allocation, no
//! lock, except when a key enters a list (the lock, the scan of `k` members, the text).
//! Counts per cell and epoch saturate nothing: 2³² decisions of one column in one epoch
//! (143 million a second at 30 s) would carry admissions into rejections.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::limits::Nanos;

/// Rows of the count-min sketch: the estimate is off by more than εN with probability at
/// most e^-4 ≈ 1.8 %.
pub const DEPTH: usize = 4;

/// The default epoch: estimates cover the last 30 to 60 seconds.
pub const DEFAULT_EPOCH: Nanos = 30_000_000_000;

/// The fewest columns per row: ε = e / 1024 ≈ 0.27 % of the window's decisions.
const MIN_WIDTH: usize = 1024;

/// Multipliers of the rows' multiply-shift hashes (odd, from the fractional parts of
/// square roots of primes, like SHA-2's constants): the key arrives already well mixed
/// (an ahash or a portable 64-bit hash), so one multiply-shift per row spreads it.
const ROW_MIX: [u64; DEPTH] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0xd6e8_feb8_6659_fd93,
];

/// The low half of a cell: admissions.
const ADMIT: u64 = 1;
/// The high half of a cell: rejections.
const REJECT: u64 = 1 << 32;

/// Which decisions a list ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    /// Admissions (the low half of a cell).
    Admitted = 0,
    /// Rejections (the high half).
    Rejected = 1,
}

impl Ranking {
    fn of(cell: u64, ranking: Ranking) -> u64 {
        match ranking {
            Ranking::Admitted => cell & 0xffff_ffff,
            Ranking::Rejected => cell >> 32,
        }
    }
}

/// One key of a `/top` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopKey {
    /// The key's readable text, as [`crate::limits::KeySpec::text`] wrote it.
    pub key: String,
    /// Its estimated admissions in the window.
    pub admitted: u64,
    /// Its estimated rejections in the window.
    pub rejected: u64,
}

/// A key of a candidate list.
struct Member {
    key: u64,
    text: Box<str>,
}

/// One ranked candidate list: the members (under the lock) and the lock-free filter of
/// their hashes that lets a member skip the lock.
struct List {
    members: Mutex<Vec<Member>>,
    /// Open addressing, linear probing; [`EMPTY`] ends a probe, [`GONE`] does not.
    slots: Box<[AtomicU64]>,
    /// Smallest member estimate, as last computed: keys at or below it cannot enter.
    threshold: AtomicU64,
    /// Removed slots since the table was last rebuilt.
    gone: AtomicU64,
}

const EMPTY: u64 = 0;
const GONE: u64 = 1;

/// A key as stored in the filter: never [`EMPTY`] or [`GONE`].
fn tag(key: u64) -> u64 {
    key.max(2)
}

impl List {
    fn new(k: usize) -> Self {
        let slots = (4 * k).next_power_of_two().max(8);
        Self {
            members: Mutex::new(Vec::with_capacity(k)),
            slots: (0..slots).map(|_| AtomicU64::new(EMPTY)).collect(),
            threshold: AtomicU64::new(0),
            gone: AtomicU64::new(0),
        }
    }

    fn home(&self, key: u64) -> usize {
        let shift = 64 - self.slots.len().trailing_zeros();
        (tag(key).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> shift) as usize
    }

    /// Whether `key` is a member (lock-free; may miss a member while the table is
    /// rebuilt, which only sends it to the locked path).
    fn contains(&self, key: u64) -> bool {
        let t = tag(key);
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        for _ in 0..self.slots.len() {
            match self.slots[i].load(Ordering::Acquire) {
                EMPTY => return false,
                s if s == t => return true,
                _ => i = (i + 1) & mask,
            }
        }
        false
    }

    /// Adds `key` to the filter (under the members' lock).
    fn insert(&self, key: u64) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        for _ in 0..self.slots.len() {
            let s = self.slots[i].load(Ordering::Relaxed);
            if s == EMPTY || s == GONE {
                self.slots[i].store(tag(key), Ordering::Release);
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes `key` from the filter (under the members' lock), rebuilding the table once
    /// removed slots could make probes long.
    fn remove(&self, key: u64, members: &[Member]) {
        let t = tag(key);
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        for _ in 0..self.slots.len() {
            match self.slots[i].load(Ordering::Relaxed) {
                EMPTY => break,
                s if s == t => {
                    self.slots[i].store(GONE, Ordering::Release);
                    break;
                }
                _ => i = (i + 1) & mask,
            }
        }
        if self.gone.fetch_add(1, Ordering::Relaxed) + 1 >= (self.slots.len() / 4) as u64 {
            self.gone.store(0, Ordering::Relaxed);
            for s in self.slots.iter() {
                s.store(EMPTY, Ordering::Release);
            }
            for m in members {
                self.insert(m.key);
            }
        }
    }
}

/// The heavy hitters of one limit: a windowed count-min sketch of its decisions and two
/// top-k lists (by admissions, by rejections). See the module documentation.
pub struct HeavyHitters {
    k: usize,
    /// `log2(w)`.
    width_bits: u32,
    /// `[epoch parity][row][column]`, flattened.
    cells: Box<[AtomicU64]>,
    /// The current epoch's number (`now / epoch`).
    current: AtomicU64,
    epoch: Nanos,
    lists: [List; 2],
}

impl HeavyHitters {
    /// Lists of `k` keys (at least 1) over epochs of `epoch` nanoseconds (at least 1 ms).
    /// The sketch has `max(1024, 8k)` columns, rounded up to a power of two.
    pub fn new(k: usize, epoch: Nanos) -> Self {
        let k = k.max(1);
        let width = (8 * k).max(MIN_WIDTH).next_power_of_two();
        Self {
            k,
            width_bits: width.trailing_zeros(),
            cells: (0..2 * DEPTH * width).map(|_| AtomicU64::new(0)).collect(),
            current: AtomicU64::new(0),
            epoch: epoch.max(1_000_000),
            lists: [List::new(k), List::new(k)],
        }
    }

    /// The list size `k`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The epoch length: estimates cover the last one to two epochs.
    pub fn epoch(&self) -> Nanos {
        self.epoch
    }

    /// Bytes this structure holds, key texts aside.
    pub fn bytes(&self) -> usize {
        self.cells.len() * 8 + self.lists.iter().map(|l| l.slots.len() * 8).sum::<usize>()
    }

    /// Bytes [`HeavyHitters::new`] allocates for lists of `k` keys, key texts aside (at most
    /// `2k` texts of a few hundred bytes each come on top).
    pub fn bytes_for(k: usize) -> usize {
        let k = k.max(1);
        let width = (8 * k).max(MIN_WIDTH).next_power_of_two();
        2 * DEPTH * width * 8 + 2 * (4 * k).next_power_of_two().max(8) * 8
    }

    fn width(&self) -> usize {
        1 << self.width_bits
    }

    fn column(&self, row: usize, key: u64) -> usize {
        let x = (key ^ (key >> 29)).wrapping_mul(ROW_MIX[row]);
        (x >> (64 - self.width_bits)) as usize
    }

    fn cell(&self, parity: u64, row: usize, column: usize) -> &AtomicU64 {
        &self.cells[(parity as usize * DEPTH + row) * self.width() + column]
    }

    /// Moves to the epoch of `now` if it is a later one: clears the cells of the epoch
    /// that drops out (both when more than one epoch passed) and resets the thresholds.
    fn advance(&self, now: Nanos) -> u64 {
        let epoch = now / self.epoch;
        let seen = self.current.load(Ordering::Acquire);
        if epoch <= seen {
            return seen;
        }
        if self
            .current
            .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let stale: &[u64] = if epoch == seen + 1 {
                &[epoch % 2]
            } else {
                &[0, 1]
            };
            for parity in stale {
                let start = *parity as usize * DEPTH * self.width();
                for c in &self.cells[start..start + DEPTH * self.width()] {
                    c.store(0, Ordering::Relaxed);
                }
            }
            for list in &self.lists {
                list.threshold.store(0, Ordering::Relaxed);
            }
        }
        epoch
    }

    /// Counts one decision on `key` at `now` (`rejected` or admitted). `text` builds the
    /// key's readable form; it is called only when the key enters a list.
    pub fn record(&self, key: u64, rejected: bool, now: Nanos, text: impl FnOnce() -> String) {
        let epoch = self.advance(now);
        let (add, ranking) = if rejected {
            (REJECT, Ranking::Rejected)
        } else {
            (ADMIT, Ranking::Admitted)
        };
        let mut estimate = u64::MAX;
        for row in 0..DEPTH {
            let col = self.column(row, key);
            let cur = self
                .cell(epoch % 2, row, col)
                .fetch_add(add, Ordering::Relaxed)
                + add;
            let prev = self.cell((epoch + 1) % 2, row, col).load(Ordering::Relaxed);
            estimate = estimate.min(Ranking::of(cur, ranking) + Ranking::of(prev, ranking));
        }
        let list = &self.lists[ranking as usize];
        if estimate <= list.threshold.load(Ordering::Relaxed) || list.contains(key) {
            return;
        }
        self.enter(list, ranking, key, estimate, epoch, text);
    }

    /// The locked path: `key` (estimate `estimate`) is above the threshold and was not
    /// seen as a member.
    fn enter(
        &self,
        list: &List,
        ranking: Ranking,
        key: u64,
        estimate: u64,
        epoch: u64,
        text: impl FnOnce() -> String,
    ) {
        let mut members = list.members.lock();
        if members.iter().any(|m| m.key == key) {
            return;
        }
        if members.len() < self.k {
            members.push(Member {
                key,
                text: text().into_boxed_str(),
            });
            list.insert(key);
            if members.len() == self.k {
                let min = self.min_member(&members, ranking, epoch);
                list.threshold
                    .store(min.map_or(0, |m| m.1), Ordering::Relaxed);
            }
            return;
        }
        let Some((at, min)) = self.min_member(&members, ranking, epoch) else {
            return;
        };
        if estimate <= min {
            list.threshold.store(min, Ordering::Relaxed);
            return;
        }
        let old = std::mem::replace(
            &mut members[at],
            Member {
                key,
                text: text().into_boxed_str(),
            },
        );
        list.remove(old.key, &members);
        // A rebuild of the filter inside `remove` already added the new member.
        if !list.contains(key) {
            list.insert(key);
        }
        let min = self.min_member(&members, ranking, epoch);
        list.threshold
            .store(min.map_or(0, |m| m.1), Ordering::Relaxed);
    }

    /// The member with the smallest estimate, and the estimate.
    fn min_member(&self, members: &[Member], ranking: Ranking, epoch: u64) -> Option<(usize, u64)> {
        members
            .iter()
            .enumerate()
            .map(|(i, m)| (i, self.estimate_in(m.key, epoch, ranking)))
            .min_by_key(|&(_, e)| e)
    }

    /// The estimate of `key` for `ranking` with the current epoch `epoch`.
    fn estimate_in(&self, key: u64, epoch: u64, ranking: Ranking) -> u64 {
        (0..DEPTH)
            .map(|row| {
                let col = self.column(row, key);
                let cur = self.cell(epoch % 2, row, col).load(Ordering::Relaxed);
                let prev = self.cell((epoch + 1) % 2, row, col).load(Ordering::Relaxed);
                Ranking::of(cur, ranking) + Ranking::of(prev, ranking)
            })
            .min()
            .unwrap_or(0)
    }

    /// `key`'s estimated (admissions, rejections) in the window ending at `now`. Changes
    /// nothing: epochs that ended before the window are read as empty.
    pub fn estimate(&self, key: u64, now: Nanos) -> (u64, u64) {
        let epoch = now / self.epoch;
        let current = self.current.load(Ordering::Acquire);
        // Which parities still belong to the window [epoch - 1, epoch].
        let live = |parity: u64| {
            let e = if current % 2 == parity {
                Some(current)
            } else {
                current.checked_sub(1)
            };
            e.is_some_and(|e| e.saturating_add(1) >= epoch && e <= epoch)
        };
        let mut out = (u64::MAX, u64::MAX);
        for row in 0..DEPTH {
            let col = self.column(row, key);
            let (mut a, mut r) = (0, 0);
            for parity in 0..2 {
                if live(parity) {
                    let c = self.cell(parity, row, col).load(Ordering::Relaxed);
                    a += Ranking::of(c, Ranking::Admitted);
                    r += Ranking::of(c, Ranking::Rejected);
                }
            }
            out = (out.0.min(a), out.1.min(r));
        }
        out
    }

    /// The `n` heaviest keys by `ranking` at `now`, heaviest first (ties by text), keys
    /// whose estimate fell to 0 left out. Locks the list while copying it.
    pub fn top(&self, ranking: Ranking, n: usize, now: Nanos) -> Vec<TopKey> {
        let members: Vec<(u64, String)> = self.lists[ranking as usize]
            .members
            .lock()
            .iter()
            .map(|m| (m.key, m.text.to_string()))
            .collect();
        let mut out: Vec<TopKey> = members
            .into_iter()
            .map(|(key, text)| {
                let (admitted, rejected) = self.estimate(key, now);
                TopKey {
                    key: text,
                    admitted,
                    rejected,
                }
            })
            .filter(|t| Ranking::pick(t, ranking) > 0)
            .collect();
        out.sort_by(|a, b| {
            Ranking::pick(b, ranking)
                .cmp(&Ranking::pick(a, ranking))
                .then_with(|| a.key.cmp(&b.key))
        });
        out.truncate(n);
        out
    }
}

impl Ranking {
    fn pick(t: &TopKey, ranking: Ranking) -> u64 {
        match ranking {
            Ranking::Admitted => t.admitted,
            Ranking::Rejected => t.rejected,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::limits::testing::mixed;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn the_heaviest_key_comes_first_in_each_ranking() {
        let hh = HeavyHitters::new(3, 30 * SEC);
        for i in 0..100u64 {
            hh.record(mixed(i), false, SEC, || format!("k{i}"));
        }
        for _ in 0..50 {
            hh.record(mixed(7), false, SEC, || "k7".into());
            hh.record(mixed(9), true, SEC, || "k9".into());
        }
        for _ in 0..20 {
            hh.record(mixed(8), false, SEC, || "k8".into());
        }
        let top = hh.top(Ranking::Admitted, 2, SEC);
        assert_eq!(top[0].key, "k7");
        assert!(top[0].admitted >= 51, "{top:?}");
        assert_eq!(top[1].key, "k8");
        let top = hh.top(Ranking::Rejected, 5, SEC);
        assert_eq!(top.len(), 1, "only k9 was ever rejected: {top:?}");
        assert_eq!((top[0].key.as_str(), top[0].rejected), ("k9", 50));
    }

    #[test]
    fn text_is_built_only_when_a_key_enters_a_list() {
        let hh = HeavyHitters::new(2, 30 * SEC);
        let mut built = 0;
        for _ in 0..1000 {
            hh.record(mixed(1), false, SEC, || {
                built += 1;
                "one".into()
            });
        }
        assert_eq!(built, 1);
        // Light keys cannot beat a full list of heavy ones.
        hh.record(mixed(2), false, SEC, || "two".into());
        // Few enough light keys that none collides with others in all four rows.
        for i in 3..100 {
            hh.record(mixed(i), false, SEC, || {
                built += 1;
                String::new()
            });
        }
        assert_eq!(built, 1, "no light key's text was built");
    }

    #[test]
    fn counts_age_out_after_two_epochs() {
        let hh = HeavyHitters::new(2, 10 * SEC);
        for _ in 0..10 {
            hh.record(mixed(1), true, 5 * SEC, || "old".into());
        }
        assert_eq!(hh.estimate(mixed(1), 5 * SEC), (0, 10));
        // The next epoch still sees it (the previous epoch counts) ...
        assert_eq!(hh.estimate(mixed(1), 15 * SEC), (0, 10));
        hh.record(mixed(2), true, 15 * SEC, || "new".into());
        assert_eq!(hh.estimate(mixed(1), 15 * SEC), (0, 10));
        // ... the one after does not, whether or not a decision moved the epoch.
        assert_eq!(hh.estimate(mixed(1), 25 * SEC), (0, 0));
        hh.record(mixed(2), true, 25 * SEC, || "new".into());
        assert_eq!(hh.estimate(mixed(1), 25 * SEC), (0, 0));
        let top = hh.top(Ranking::Rejected, 5, 25 * SEC);
        assert_eq!(top.len(), 1);
        assert_eq!((top[0].key.as_str(), top[0].rejected), ("new", 2));
        // A long silence clears both epochs.
        hh.record(mixed(3), false, 500 * SEC, || "late".into());
        assert_eq!(hh.estimate(mixed(2), 500 * SEC), (0, 0));
    }

    #[test]
    fn a_new_heavy_key_displaces_the_lightest_member() {
        let hh = HeavyHitters::new(2, 30 * SEC);
        for _ in 0..5 {
            hh.record(mixed(1), false, 0, || "a".into());
        }
        hh.record(mixed(2), false, 0, || "b".into());
        for _ in 0..3 {
            hh.record(mixed(3), false, 0, || "c".into());
        }
        let top = hh.top(Ranking::Admitted, 2, 0);
        let keys: Vec<&str> = top.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["a", "c"]);
        // The filter still finds the members after many replacements (rebuilds).
        for round in 0..200u64 {
            for _ in 0..(round + 10) {
                hh.record(mixed(1000 + round), false, 0, || format!("r{round}"));
            }
        }
        let top = hh.top(Ranking::Admitted, 1, 0);
        assert_eq!(top[0].key, "r199");
    }

    #[test]
    fn memory_is_fixed_by_k() {
        assert_eq!(
            HeavyHitters::new(20, SEC).bytes(),
            2 * 4 * 1024 * 8 + 2 * 128 * 8
        );
        assert_eq!(HeavyHitters::new(1000, SEC).width(), 8192);
        for k in [1, 20, 128, 129, 1000] {
            assert_eq!(
                HeavyHitters::new(k, SEC).bytes(),
                HeavyHitters::bytes_for(k)
            );
        }
    }

    proptest! {
        /// Against an exact counter: no estimate undercounts; every key outside a list
        /// counted no more than any member's estimate (the top-k guarantee); and a key
        /// far heavier than everything else is first.
        #[test]
        fn lists_hold_every_key_heavier_than_their_members(
            stream in prop::collection::vec((0u64..60, any::<bool>()), 1..600),
            k in 1usize..8,
        ) {
            let hh = HeavyHitters::new(k, 30 * SEC);
            let mut exact: HashMap<u64, (u64, u64)> = HashMap::new();
            // Skew: key i appears with weight ~1/(i+1).
            for (i, rejected) in stream {
                let key = i * i / 60;
                hh.record(mixed(key), rejected, SEC, || key.to_string());
                let e = exact.entry(key).or_default();
                if rejected { e.1 += 1 } else { e.0 += 1 }
            }
            for (&key, &(a, r)) in &exact {
                let (ea, er) = hh.estimate(mixed(key), SEC);
                prop_assert!(ea >= a && er >= r, "{key}: ({ea},{er}) < ({a},{r})");
            }
            for ranking in [Ranking::Admitted, Ranking::Rejected] {
                let top = hh.top(ranking, k, SEC);
                prop_assert!(top.len() <= k);
                let pick = |c: &(u64, u64)| if ranking == Ranking::Admitted { c.0 } else { c.1 };
                let members: Vec<u64> = top.iter().map(|t| Ranking::pick(t, ranking)).collect();
                for (&key, c) in &exact {
                    if top.iter().any(|t| t.key == key.to_string()) {
                        continue;
                    }
                    match members.iter().min() {
                        Some(&least) if members.len() == k => {
                            prop_assert!(pick(c) <= least, "{key} ({}) left out of {top:?}", pick(c));
                        }
                        // A list with room holds every key ever counted.
                        _ => prop_assert_eq!(pick(c), 0, "{} left out of {:?}", key, top),
                    }
                }
                let mut counts: Vec<(u64, u64)> = exact.iter().map(|(&key, c)| (pick(c), key)).collect();
                counts.sort_unstable_by(|a, b| b.cmp(a));
                if counts.len() >= 2 && counts[0].0 > 2 * counts[1].0 + 1 {
                    prop_assert_eq!(&top[0].key, &counts[0].1.to_string());
                }
            }
        }
    }
}
