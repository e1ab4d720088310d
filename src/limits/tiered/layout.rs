//! The arena layout: a key's metadata words (tier entry times, ring heads) and its log
//! slots, read and written through a [`View`] while the key's set is locked; time units,
//! offsets from the key's base, and rebasing (module doc, "Time" and "Table and memory").

use std::sync::atomic::Ordering;

use crate::limits::clock::{Nanos, NANOS_PER_SEC};

use super::*;

impl Shape {
    pub(super) fn new(p: &TieredParams) -> Self {
        let n = p.tiers.len();
        let hard = p.hard_limit.is_some();
        let mut offset = 0;
        let mut rings = Vec::with_capacity(n + 1);
        let limits = p.tiers.iter().map(|t| (t.limit, t.window));
        let hard_ring = (p.hard_limit.unwrap_or(0), NANOS_PER_SEC);
        for (limit, window) in limits.chain(std::iter::once(hard_ring)) {
            let limit = limit.min(MAX_LIMIT) as u32;
            rings.push(RingSpec {
                limit,
                window: window.max(1),
                offset,
            });
            offset += limit as usize;
        }
        let longest = p
            .tiers
            .iter()
            .map(|t| t.window)
            .chain(hard.then_some(NANOS_PER_SEC))
            .max()
            .unwrap_or(1);
        Self {
            n,
            tiers: p
                .tiers
                .iter()
                .map(|t| TierSpec {
                    active: t.active,
                    cooldown: t.cooldown,
                    skippable: t.skippable,
                })
                .collect(),
            rings: rings.into(),
            hard,
            shift: unit_shift(longest),
            log_words: offset,
        }
    }

    /// Metadata words per key: entry times, two per ring.
    pub(super) fn meta_words(&self) -> usize {
        2 + 3 * self.n
    }

    /// A new key's metadata word `i`: no tier entered, empty rings.
    pub(super) fn fresh_word(&self, i: usize) -> u64 {
        if i < self.n {
            NOT_ENTERED
        } else {
            0
        }
    }
}

/// The smallest `k` such that `2^(30 + k)` ns covers `longest`.
pub(super) fn unit_shift(longest: Nanos) -> u32 {
    let bits = 64 - longest.saturating_sub(1).leading_zeros();
    bits.saturating_sub(SPAN_BITS)
}

impl Ring {
    pub(super) fn unpack(a: u64, b: u64) -> Self {
        Self {
            head: (a >> 32) as u32,
            len: a as u32,
            oldest: (b >> 32) as u32,
            newest: b as u32,
        }
    }

    pub(super) fn pack(self) -> (u64, u64) {
        (
            u64::from(self.head) << 32 | u64::from(self.len),
            u64::from(self.oldest) << 32 | u64::from(self.newest),
        )
    }
}

impl View<'_> {
    pub(super) fn word(&self, i: usize) -> u64 {
        self.meta[i].load(Ordering::Relaxed)
    }

    pub(super) fn set_word(&self, i: usize, v: u64) {
        self.meta[i].store(v, Ordering::Relaxed);
    }

    pub(super) fn base(&self) -> Nanos {
        self.base.get()
    }

    /// When `tier` (1-based) was last entered, or [`NOT_ENTERED`].
    pub(super) fn entered(&self, tier: usize) -> Nanos {
        self.word(tier - 1)
    }

    pub(super) fn enter(&self, tier: usize, now: Nanos) {
        self.set_word(tier - 1, now);
    }

    pub(super) fn ring(&self, r: usize) -> Ring {
        let i = self.shape.n + 2 * r;
        let [a, b] = &self.meta[i..i + 2] else {
            unreachable!("a two-word slice")
        };
        Ring::unpack(a.load(Ordering::Relaxed), b.load(Ordering::Relaxed))
    }

    pub(super) fn set_ring(&self, r: usize, ring: Ring) {
        let i = self.shape.n + 2 * r;
        let (a, b) = ring.pack();
        if let [wa, wb] = &self.meta[i..i + 2] {
            wa.store(a, Ordering::Relaxed);
            wb.store(b, Ordering::Relaxed);
        }
    }

    /// The log slot of logical position `pos` (0 = oldest) of ring `r`; it holds the hit only
    /// for `0 < pos < len - 1`.
    pub(super) fn slot(&self, r: usize, ring: Ring, pos: u32) -> &AtomicU32 {
        let spec = &self.shape.rings[r];
        let mut p = ring.head + pos;
        if p >= spec.limit {
            p -= spec.limit;
        }
        &self.logs[spec.offset + p as usize]
    }

    /// The hit at logical position `pos < len` of ring `r`.
    pub(super) fn entry(&self, r: usize, ring: Ring, pos: u32) -> u32 {
        if pos == 0 {
            ring.oldest
        } else if pos + 1 == ring.len {
            ring.newest
        } else {
            self.slot(r, ring, pos).load(Ordering::Relaxed)
        }
    }

    /// The instant a hit stored as `q` leaves ring `r`'s window.
    pub(super) fn expiry(&self, r: usize, q: u32) -> Nanos {
        let at = self.base().saturating_add(u64::from(q) << self.shape.shift);
        at.saturating_add(self.shape.rings[r].window)
    }

    /// `now` as a stored offset, rounded up to a unit.
    pub(super) fn offset(&self, now: Nanos) -> u32 {
        let mask = (1u64 << self.shape.shift) - 1;
        ((now.saturating_sub(self.base()) + mask) >> self.shape.shift) as u32
    }

    /// Drops ring `r`'s hits that left the window by `now`; returns the hits left. Reads the
    /// log only to learn the new oldest hit after dropping one that leaves others.
    pub(super) fn pop(&self, r: usize, now: Nanos) -> u32 {
        let mut ring = self.ring(r);
        if ring.len == 0 || self.expiry(r, ring.oldest) > now {
            return ring.len;
        }
        let limit = self.shape.rings[r].limit;
        loop {
            let next = if ring.len > 1 {
                self.entry(r, ring, 1)
            } else {
                0
            };
            ring.head = if ring.head + 1 == limit {
                0
            } else {
                ring.head + 1
            };
            ring.len -= 1;
            ring.oldest = next;
            if ring.len == 0 || self.expiry(r, ring.oldest) > now {
                break;
            }
        }
        self.set_ring(r, ring);
        ring.len
    }

    /// Ring `r`'s room at `now`, dropping expired hits.
    pub(super) fn room_now(&self, r: usize, now: Nanos) -> u64 {
        u64::from(self.shape.rings[r].limit - self.pop(r, now))
    }

    /// How many of ring `r`'s hits have left the window by `t`, without changing anything.
    pub(super) fn expired_at(&self, r: usize, ring: Ring, t: Nanos) -> u32 {
        if ring.len == 0 || self.expiry(r, ring.oldest) > t {
            return 0;
        }
        if self.expiry(r, ring.newest) <= t {
            return ring.len;
        }
        // The oldest has left and the newest has not: binary search in between.
        let (mut lo, mut hi) = (1, ring.len - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.expiry(r, self.entry(r, ring, mid)) <= t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Ring `r`'s hits still in its window at `t`, without changing anything.
    pub(super) fn count_at(&self, r: usize, t: Nanos) -> u32 {
        let ring = self.ring(r);
        ring.len - self.expired_at(r, ring, t)
    }

    /// Ring `r`'s room at `t`, without changing anything.
    pub(super) fn room_at(&self, r: usize, t: Nanos) -> u64 {
        u64::from(self.shape.rings[r].limit - self.count_at(r, t))
    }

    /// The first instant from `t` at which ring `r` has room for `want`, if it ever will.
    pub(super) fn frees_at(&self, r: usize, t: Nanos, want: u64) -> Option<Nanos> {
        let ring = self.ring(r);
        let keep = u64::from(self.shape.rings[r].limit).checked_sub(want)?;
        let expired = self.expired_at(r, ring, t);
        let live = u64::from(ring.len - expired);
        if live <= keep {
            return Some(t);
        }
        // The hit whose departure brings the live count down to `keep`.
        let pos = expired + (live - keep) as u32 - 1;
        Some(self.expiry(r, self.entry(r, ring, pos)))
    }

    /// Records `count` hits at `now` in ring `r`, which has room for them; returns the
    /// instant they leave the window. Hits stay sorted: a racing thread's slightly earlier
    /// `now` is stored as the newest hit's time.
    pub(super) fn push(&self, r: usize, now: Nanos, count: u64) -> Nanos {
        let mut ring = self.ring(r);
        let mut q = self.offset(now);
        if ring.len > 0 {
            q = q.max(ring.newest);
        } else {
            ring.oldest = q;
        }
        debug_assert!(u64::from(ring.len) + count <= u64::from(self.shape.rings[r].limit));
        for _ in 0..count {
            if ring.len >= 2 {
                // The newest becomes a hit in between: into its slot.
                let last = self.slot(r, ring, ring.len - 1);
                last.store(ring.newest, Ordering::Relaxed);
            }
            ring.newest = q;
            ring.len += 1;
        }
        self.set_ring(r, ring);
        self.expiry(r, q)
    }

    /// Takes back up to `count` of ring `r`'s newest hits stored at or after `at` (already a
    /// stored offset); returns how many it took.
    pub(super) fn unpush(&self, r: usize, at: u32, count: u64) -> u64 {
        let mut ring = self.ring(r);
        let mut taken = 0;
        while taken < count && ring.len > 0 && ring.newest >= at {
            if ring.len > 1 {
                ring.newest = self.entry(r, ring, ring.len - 2);
            }
            ring.len -= 1;
            taken += 1;
        }
        self.set_ring(r, ring);
        taken
    }

    /// Moves the base forward once offsets near 2^31 units, keeping every live hit.
    #[cold]
    #[inline(never)]
    pub(super) fn rebase(&self, now: Nanos) {
        for r in 0..self.shape.rings.len() {
            self.pop(r, now);
        }
        let shift = self.shape.shift;
        let d = (now.saturating_sub(self.base()) >> shift) - (1 << SPAN_BITS);
        let back = |q: u32| u64::from(q).saturating_sub(d) as u32;
        for r in 0..self.shape.rings.len() {
            let mut ring = self.ring(r);
            for pos in 1..ring.len.saturating_sub(1) {
                let slot = self.slot(r, ring, pos);
                slot.store(back(slot.load(Ordering::Relaxed)), Ordering::Relaxed);
            }
            (ring.oldest, ring.newest) = (back(ring.oldest), back(ring.newest));
            self.set_ring(r, ring);
        }
        self.base.set(self.base() + (d << shift));
    }

    pub(super) fn rebase_if_due(&self, now: Nanos) {
        if now.saturating_sub(self.base()) >> self.shape.shift >= REBASE_AT {
            self.rebase(now);
        }
    }
}
