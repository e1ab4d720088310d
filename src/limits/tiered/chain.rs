//! The burst chain and the retry search: where each tier of a key stands at an instant, how
//! far a burst from the current tier reaches, and the earliest instant a refused request
//! fits (module doc, "Tiers" and "Retry-After").

use crate::limits::clock::Nanos;

use super::*;

impl View<'_> {
    /// Where `tier` (1-based) stands at `t`.
    pub(super) fn phase(&self, tier: usize, t: Nanos) -> Phase {
        let e = self.entered(tier);
        if e == NOT_ENTERED {
            return Phase::Inactive;
        }
        let spec = &self.shape.tiers[tier - 1];
        let end = e.saturating_add(spec.active);
        if t < end {
            Phase::Active
        } else if t < end.saturating_add(spec.cooldown) {
            Phase::Cooling
        } else {
            Phase::Inactive
        }
    }

    /// The active tier with the greatest index at `t`, or 0.
    pub(super) fn current(&self, t: Nanos) -> usize {
        (1..=self.shape.n)
            .rev()
            .find(|&tier| self.phase(tier, t) == Phase::Active)
            .unwrap_or(0)
    }

    /// The tiers a burst from the current tier reaches at `t`, with `room(tier)`; it stops
    /// once their room reaches `need`.
    pub(super) fn chain(&self, t: Nanos, need: u64, mut room: impl FnMut(usize) -> u64) -> Chain {
        let current = self.current(t);
        let mut chain = Chain {
            current,
            tiers: [0; MAX_TIERS],
            rooms: [0; MAX_TIERS],
            len: 0,
            total: 0,
            end: DecidedBy::TierWindow,
        };
        let mut add = |chain: &mut Chain, tier: usize| {
            let r = room(tier);
            chain.tiers[chain.len] = tier as u8;
            chain.rooms[chain.len] = r as u32;
            chain.len += 1;
            chain.total += r;
            chain.end = DecidedBy::TierWindow;
            chain.total >= need
        };
        if current > 0 && add(&mut chain, current) {
            return chain;
        }
        for tier in current + 1..=self.shape.n {
            match self.phase(tier, t) {
                Phase::Cooling if self.shape.tiers[tier - 1].skippable => {
                    chain.end = DecidedBy::NoTierEnterable;
                }
                Phase::Cooling => {
                    chain.end = DecidedBy::NoTierEnterable;
                    break;
                }
                // Above the current tier, nothing is active.
                Phase::Inactive | Phase::Active => {
                    if add(&mut chain, tier) {
                        break;
                    }
                }
            }
        }
        chain
    }

    /// Copies that would fit at `t ≥` the last pop, if nothing else happens.
    pub(super) fn fits_at(&self, t: Nanos, global: Option<&Global>) -> u64 {
        let n = self.shape.n;
        let hard = if self.shape.hard {
            self.room_at(n, t)
        } else {
            u64::MAX
        };
        let global = global.map_or(u64::MAX, |g| g.room_at(t));
        let chain = self.chain(t, u64::MAX, |tier| self.room_at(tier - 1, t));
        hard.min(global).min(chain.total)
    }

    /// The first instant after `t` at which a tier's active period or cooldown ends, or the
    /// global second turns: between two of them, what fits only grows.
    pub(super) fn next_change(&self, t: Nanos, global: Option<&Global>) -> Nanos {
        let mut next = global.and_then(|g| g.turns_after(t)).unwrap_or(Nanos::MAX);
        for tier in 1..=self.shape.n {
            let e = self.entered(tier);
            if e == NOT_ENTERED {
                continue;
            }
            let spec = &self.shape.tiers[tier - 1];
            let end = e.saturating_add(spec.active);
            for at in [end, end.saturating_add(spec.cooldown)] {
                if at > t {
                    next = next.min(at);
                }
            }
        }
        next
    }

    /// The earliest instant from `now` at which `min` copies fit, if nothing else happens, or
    /// `None` if they never will.
    pub(super) fn earliest(&self, min: u64, now: Nanos, global: Option<&Global>) -> Option<Nanos> {
        let mut lo = now;
        loop {
            let hi = self.next_change(lo, global);
            if let Some(at) = self.earliest_within(min, lo, global) {
                if at < hi {
                    return Some(at);
                }
            }
            if hi == Nanos::MAX {
                return None;
            }
            lo = hi;
        }
    }

    /// The earliest instant from `lo` at which `min` copies fit if every tier kept its phase
    /// at `lo` (and the global second did not turn): each limit's room only grows then, so it
    /// is the latest of the instants at which each one alone has room.
    pub(super) fn earliest_within(
        &self,
        min: u64,
        lo: Nanos,
        global: Option<&Global>,
    ) -> Option<Nanos> {
        if global.is_some_and(|g| g.room_at(lo) < min) {
            return None;
        }
        let n = self.shape.n;
        let mut at = lo;
        if self.shape.hard {
            at = at.max(self.frees_at(n, lo, min)?);
        }
        let chain = self.chain(lo, u64::MAX, |tier| self.room_at(tier - 1, lo));
        if chain.total >= min {
            return Some(at);
        }
        // Merge the chain's rings by expiry until `min - total` more hits have left.
        let mut pos = [0u32; MAX_TIERS];
        let mut rings = [Ring::unpack(0, 0); MAX_TIERS];
        for i in 0..chain.len {
            let r = usize::from(chain.tiers[i]) - 1;
            rings[i] = self.ring(r);
            pos[i] = self.expired_at(r, rings[i], lo);
        }
        let mut last = lo;
        for _ in chain.total..min {
            let mut best: Option<(Nanos, usize)> = None;
            for i in 0..chain.len {
                if pos[i] < rings[i].len {
                    let r = usize::from(chain.tiers[i]) - 1;
                    let e = self.expiry(r, self.entry(r, rings[i], pos[i]));
                    best = Some(best.map_or((e, i), |b| b.min((e, i))));
                }
            }
            let (e, i) = best?;
            pos[i] += 1;
            last = e;
        }
        Some(at.max(last))
    }

    /// The current tier at `now` with its remaining room and the time until its window is
    /// empty.
    pub(super) fn headline(&self, now: Nanos) -> (usize, u64, Nanos) {
        let tier = self.current(now);
        if tier == 0 {
            return (0, 0, 0);
        }
        self.room_now(tier - 1, now);
        self.headline_of(tier, now)
    }

    /// [`View::headline`] of `tier`, known to be current and popped at `now`.
    pub(super) fn headline_of(&self, tier: usize, now: Nanos) -> (usize, u64, Nanos) {
        let ring = self.ring(tier - 1);
        let room = u64::from(self.shape.rings[tier - 1].limit - ring.len);
        let empty = if ring.len == 0 {
            0
        } else {
            self.expiry(tier - 1, ring.newest)
        };
        (tier, room, empty.saturating_sub(now))
    }
}
