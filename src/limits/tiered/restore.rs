//! Carrying a tiered limiter's keys out and back in ([`crate::limits::restore`]).

use std::sync::atomic::Ordering;

use crate::limits::clock::Nanos;
use crate::limits::restore::Restored;
use crate::limits::table::{self, scan, WAYS};

use super::*;

/// One key's tiered state, as [`TieredLimiter::export`] reads it and
/// [`TieredLimiter::import`] takes it back. Reused from key to key, so an export allocates
/// only while its buffers grow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TieredEntry {
    /// The key's hash (never 0: key 0 is stored as 1).
    pub key: u64,
    /// When each tier (tier 1 first) was last entered; `Nanos::MAX` for never.
    pub entered: Vec<Nanos>,
    /// Each ring's hits, oldest first: the tiers' (tier 1 first), then the hard limit's
    /// (empty without one). A hit's instant is the one it is counted from (rounded up to
    /// the limiter's time unit, so at or after the real one).
    pub hits: Vec<Vec<Nanos>>,
}

impl TieredLimiter {
    /// Calls `f` for every key holding state (state empty by now is included until its way
    /// is reused; [`TieredLimiter::import`] drops it). One way at a time is copied under its
    /// set's lock (its metadata and at most `ΣL + H` hits), and `f` runs with no lock held;
    /// `entry` is the buffer reused between keys.
    pub fn export(&self, entry: &mut TieredEntry, mut f: impl FnMut(&TieredEntry)) {
        let rings = self.shape.rings.len();
        entry.entered.resize(self.shape.n, NOT_ENTERED);
        entry.hits.resize_with(rings, Vec::new);
        for set in 0..self.table.sets() {
            for way in 0..WAYS {
                {
                    let heads = self.table.lock(set);
                    let head = heads[way];
                    if head.key == 0 {
                        continue;
                    }
                    let view = self.view(set * WAYS + way, head.value.base);
                    entry.key = head.key;
                    for (tier, at) in entry.entered.iter_mut().enumerate() {
                        *at = view.entered(tier + 1);
                    }
                    for (r, hits) in entry.hits.iter_mut().enumerate() {
                        let ring = view.ring(r);
                        hits.clear();
                        hits.extend((0..ring.len).map(|pos| {
                            let q = u64::from(view.entry(r, ring, pos));
                            head.value.base.saturating_add(q << self.shape.shift)
                        }));
                    }
                }
                f(entry);
            }
        }
    }

    /// Puts a saved key back at `now`: instants after `now` are taken as `now`, hits that
    /// left their windows by `now` are dropped and each ring keeps at most its limit of the
    /// newest. The key is stored unless its state equals a new key's by `now` (no tier
    /// active or cooling down, every window empty). It replaces the key's state if it has
    /// some, else takes an empty way or one whose state has emptied; it never evicts (see
    /// [`crate::limits::restore`]). Tiers and rings missing from `entry` are taken as never
    /// entered and empty; extra ones are ignored.
    ///
    /// A hit is stored rounded up to the limiter's unit, so it stays in its window at least
    /// as long as the saved one would have.
    pub fn import(&self, entry: &mut TieredEntry, now: Nanos) -> Restored {
        let shift = self.shape.shift;
        let mut base = now;
        for (r, spec) in self.shape.rings.iter().enumerate() {
            let Some(hits) = entry.hits.get_mut(r) else {
                break;
            };
            for t in hits.iter_mut() {
                *t = (*t).min(now);
            }
            hits.sort_unstable();
            let live = hits.partition_point(|&t| t.saturating_add(spec.window) <= now);
            let keep = hits.len().saturating_sub(spec.limit as usize).max(live);
            hits.drain(..keep);
            if let Some(&oldest) = hits.first() {
                base = base.min(oldest);
            }
        }
        // A hit's stored offset, rounded up to a unit: within the window of `now`, so below
        // 2^31 units.
        let unit = (1u64 << shift) - 1;
        let q = |t: Nanos| ((t - base + unit) >> shift) as u32;
        let mut expires = 0;
        for (hits, spec) in entry.hits.iter().zip(self.shape.rings.iter()) {
            if let Some(&newest) = hits.last() {
                let at = base.saturating_add(u64::from(q(newest)) << shift);
                expires = expires.max(at.saturating_add(spec.window));
            }
        }
        for (tier, spec) in self.shape.tiers.iter().enumerate() {
            match entry.entered.get_mut(tier) {
                Some(at) if *at != NOT_ENTERED => {
                    *at = (*at).min(now);
                    let ends = at.saturating_add(spec.active).saturating_add(spec.cooldown);
                    expires = expires.max(ends);
                }
                _ => {}
            }
        }
        let key = table::stored(entry.key);
        let set = self.table.index(key);
        let mut heads = self.table.lock(set);
        let (hit, _) = scan(&heads, |h| h.key == key);
        if expires <= now {
            if hit < WAYS {
                heads[hit] = Head::default();
            }
            return Restored::Empty;
        }
        let Some(way) = table::room(&heads, hit, |t| t.expires <= now) else {
            return Restored::NoRoom;
        };
        heads[way] = Head {
            key,
            value: Times { expires, base },
        };
        self.hint(set, way, key);
        let view = self.view(set * WAYS + way, base);
        for i in 0..self.shape.meta_words() {
            view.set_word(i, self.shape.fresh_word(i));
        }
        for tier in 1..=self.shape.n {
            if let Some(&at) = entry.entered.get(tier - 1) {
                view.set_word(tier - 1, at);
            }
        }
        for (r, hits) in entry.hits.iter().enumerate().take(self.shape.rings.len()) {
            let (Some(&oldest), Some(&newest)) = (hits.first(), hits.last()) else {
                continue;
            };
            let ring = Ring {
                head: 0,
                len: hits.len() as u32,
                oldest: q(oldest),
                newest: q(newest),
            };
            for (pos, &t) in hits.iter().enumerate().skip(1) {
                if pos + 1 < hits.len() {
                    view.slot(r, ring, pos as u32)
                        .store(q(t), Ordering::Relaxed);
                }
            }
            view.set_ring(r, ring);
        }
        Restored::Stored
    }
}
