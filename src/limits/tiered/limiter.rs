//! The tiered limiter's decisions: building the table and its arenas, deciding and refunding
//! a request, reading a key's state, and giving a new key a way (module doc, "Dropping and
//! eviction").

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::limits::table::{self, scan, Table, WAYS};
use crate::limits::verdict::{Verdict, NEVER};
use crate::limits::victim;

impl TieredLimiter {
    /// A limiter for `params` (normalized by [`normalize`], whose errors it returns) holding
    /// state for at most `max_keys` keys (0 is raised to 1); see the module doc for the memory
    /// it reserves up front and how much of it is touched.
    pub fn new(params: &TieredParams, max_keys: usize) -> Result<Self, TieredError> {
        let params = normalize(params)?.params;
        let shape = Shape::new(&params);
        let sets = Table::<Times>::sets_for(max_keys);
        let meta_stride = shape.meta_words().next_multiple_of(8);
        let bytes = Self::bytes_for(&shape, sets as u128 * WAYS as u128);
        let too_large = || TieredError::TooLarge { bytes };
        let ways = sets.checked_mul(WAYS).ok_or_else(too_large)?;
        // 16 spare words to start the metadata on a 128-byte line pair.
        let meta_len = ways
            .checked_mul(meta_stride)
            .and_then(|w| w.checked_add(16))
            .ok_or_else(too_large)?;
        let log_len = ways.checked_mul(shape.log_words).ok_or_else(too_large)?;
        let meta: Box<[AtomicU64]> =
            bytemuck::allocation::try_zeroed_slice_box(meta_len).map_err(|()| too_large())?;
        let logs: Box<[AtomicU32]> =
            bytemuck::allocation::try_zeroed_slice_box(log_len).map_err(|()| too_large())?;
        let meta_start = (16 - (meta.as_ptr() as usize / 8) % 16) % 16;
        let fresh = (0..shape.meta_words())
            .map(|i| AtomicU64::new(shape.fresh_word(i)))
            .collect();
        Ok(Self {
            fresh,
            entries: (0..params.tiers.len()).map(|_| AtomicU64::new(0)).collect(),
            global: params.global_limit.map(|limit| Global {
                limit,
                state: AtomicU64::new(0),
            }),
            shape,
            params,
            table: Table::new(max_keys, ()),
            hints: (0..sets).map(|_| AtomicU64::new(0)).collect(),
            meta,
            meta_start,
            meta_stride,
            logs,
        })
    }

    /// Worst-case bytes per key of `max_keys` for `params` (normalized first; 0 if they are
    /// invalid): what the config can multiply by `max_keys` to warn about memory.
    pub fn bytes_per_key(params: &TieredParams) -> u64 {
        normalize(params).map_or(0, |n| {
            let shape = Shape::new(&n.params);
            (Self::bytes_for(&shape, WAYS as u128) / WAYS as u128) as u64
        })
    }

    pub(super) fn bytes_for(shape: &Shape, ways: u128) -> u128 {
        let meta = shape.meta_words().next_multiple_of(8) as u128 * 8;
        let logs = shape.log_words as u128 * 4;
        let set = (size_of::<Set>() + size_of::<AtomicU64>()) as u128;
        ways * (meta + logs) + ways.div_ceil(WAYS as u128) * set
    }

    /// Bytes reserved for the table and the arenas (the pages touched are usually fewer).
    pub fn reserved_bytes(&self) -> usize {
        self.table.sets() * size_of::<Set>()
            + size_of_val(&*self.hints)
            + size_of_val(&*self.meta)
            + size_of_val(&*self.logs)
    }

    /// The normalized parameters it runs with.
    pub fn params(&self) -> &TieredParams {
        &self.params
    }

    /// Decides one request for `key` at `now`: [`TieredLimiter::acquire_many`] of exactly 1.
    pub fn acquire(&self, key: u64, now: Nanos) -> TieredDecision {
        self.acquire_many(key, 1, 1, now)
    }

    /// Decides a request of between `min` and `max` copies for `key` at `now` (`min` raised
    /// to 1, `max` to `min`): grants the largest count in `[min, max]` that fits, as if that
    /// many single requests came at once (see the module doc), or rejects if fewer than `min`
    /// fit. A fixed cost `c` is `acquire_many(key, c, c, now)`.
    pub fn acquire_many(&self, key: u64, min: u64, max: u64, now: Nanos) -> TieredDecision {
        let min = min.max(1);
        let max = max.max(min);
        let key = table::stored(key);
        let set = self.table.index(key);
        self.touch(set, key);
        let mut heads = self.table.lock(set);
        let (hit, empty) = scan(&heads, |h| h.key == key);
        let live = hit < WAYS && heads[hit].value.expires > now;
        let view = if live {
            let view = self.view(set * WAYS + hit, heads[hit].value.base);
            view.rebase_if_due(now);
            heads[hit].value.base = view.base();
            view
        } else {
            self.fresh_view(now)
        };
        let n = self.shape.n;
        let hard_room = if self.shape.hard {
            view.room_now(n, now)
        } else {
            u64::MAX
        };
        if hard_room < min {
            return self.rejected(&view, min, now, DecidedBy::HardLimit);
        }
        // The common case, decided without the burst chain: a single request with room in
        // the current tier, or a key without state entering tier 1 (never cooling for it).
        let current = if live { view.current(now) } else { 0 };
        let direct = if current > 0 {
            view.room_now(current - 1, now) > 0
        } else {
            !live && self.shape.rings[0].limit > 0
        };
        if max == 1 && direct {
            if self.global.as_ref().is_some_and(|g| g.take(1, 1, now) == 0) {
                return self.rejected(&view, 1, now, DecidedBy::GlobalLimit);
            }
            let (way, tier) = if live {
                (hit, current)
            } else {
                (self.claim(&mut heads, set, key, (hit, empty), now), 1)
            };
            let view = self.view(set * WAYS + way, heads[way].value.base);
            let mut expires = heads[way].value.expires;
            if !live {
                expires = expires.max(self.enter(&view, 1, now));
            }
            expires = expires.max(view.push(tier - 1, now, 1));
            if self.shape.hard {
                expires = expires.max(view.push(n, now, 1));
            }
            heads[way].value.expires = expires;
            let (tier, remaining, reset) = view.headline_of(tier, now);
            return TieredDecision {
                verdict: Verdict::allow(remaining, reset),
                granted: 1,
                tier,
                decided_by: DecidedBy::TierWindow,
                first_tier: tier,
                at: now,
            };
        }
        let need = max.min(hard_room);
        let chain = view.chain(now, need, |tier| view.room_now(tier - 1, now));
        if chain.total < min {
            // A refusal changes nothing: no tier the burst reached is entered.
            return self.rejected(&view, min, now, chain.end);
        }
        let grant = need.min(chain.total);
        let granted = match &self.global {
            Some(g) => g.take(min, grant, now),
            None => grant,
        };
        if granted < min {
            return self.rejected(&view, min, now, DecidedBy::GlobalLimit);
        }
        // The limit that cut the grant below `max`, checked in order: the global limit
        // took less than the rest allowed, or the hard limit's room was the bound.
        let decided_by = if granted < grant {
            DecidedBy::GlobalLimit
        } else if grant < max && grant == hard_room {
            DecidedBy::HardLimit
        } else {
            DecidedBy::TierWindow
        };
        let way = if live {
            hit
        } else {
            self.claim(&mut heads, set, key, (hit, empty), now)
        };
        let view = self.view(set * WAYS + way, heads[way].value.base);
        let mut expires = heads[way].value.expires;
        let (mut left, mut first_tier, mut current) = (granted, 0, chain.current);
        for (&tier, &room) in chain.tiers[..chain.len].iter().zip(&chain.rooms) {
            if left == 0 {
                break;
            }
            let tier = usize::from(tier);
            if tier > chain.current {
                expires = expires.max(self.enter(&view, tier, now));
                current = tier;
            }
            let take = left.min(u64::from(room));
            if take > 0 {
                if first_tier == 0 {
                    first_tier = tier;
                }
                expires = expires.max(view.push(tier - 1, now, take));
                left -= take;
            }
        }
        if self.shape.hard {
            expires = expires.max(view.push(n, now, granted));
        }
        heads[way].value.expires = expires;
        // The tier the last copy reached is current, and its ring was popped by the chain.
        let (tier, remaining, reset) = view.headline_of(current, now);
        TieredDecision {
            verdict: Verdict::allow(remaining, reset),
            granted,
            tier,
            decided_by,
            first_tier,
            at: now,
        }
    }

    /// Takes back the hits an admitted `decision` for `key` recorded (a later limit rejected
    /// the request): from its tiers, newest first, from the hard-limit log, and from the
    /// global count if its second has not turned by `now`. The tiers it entered stay entered.
    /// A rejected decision, or a key evicted since, has nothing to give back.
    pub fn refund(&self, key: u64, decision: &TieredDecision, now: Nanos) {
        if decision.granted == 0 {
            return;
        }
        if let Some(g) = &self.global {
            g.refund(decision.granted, decision.at, now);
        }
        let key = table::stored(key);
        let set = self.table.index(key);
        let mut heads = self.table.lock(set);
        let (hit, _) = scan(&heads, |h| h.key == key);
        if hit == WAYS || heads[hit].value.expires <= now {
            return;
        }
        let view = self.view(set * WAYS + hit, heads[hit].value.base);
        view.rebase_if_due(now);
        heads[hit].value.base = view.base();
        if decision.at < view.base() {
            // Rebased since: the decision's hits have all left their windows.
            return;
        }
        let at = view.offset(decision.at);
        let mut left = decision.granted;
        let top = decision.tier.min(self.shape.n);
        for tier in (decision.first_tier.max(1)..=top).rev() {
            if left == 0 {
                break;
            }
            view.pop(tier - 1, now);
            left -= view.unpush(tier - 1, at, left);
        }
        if self.shape.hard {
            view.pop(self.shape.n, now);
            view.unpush(self.shape.n, at, decision.granted);
        }
    }

    /// How many single requests of `key` would be admitted now in a row, without taking any:
    /// the room of the hard limit, of the tiers a burst reaches, and of the global limit,
    /// whichever is least. `acquire_many(key, min, max, now)` grants `min(max, this)` if that
    /// is at least `min` (unless another thread takes some in between).
    pub fn available(&self, key: u64, now: Nanos) -> u64 {
        self.read(key, now, |view| view.fits_at(now, self.global.as_ref()))
    }

    /// The current tier of `key` at `now` (0 for the fake tier), without deciding anything.
    pub fn current_tier(&self, key: u64, now: Nanos) -> usize {
        self.read(key, now, |view| view.current(now))
    }

    /// `key`'s state at `now`: its current tier, what is available, each tier's phase and
    /// window count, the hard limit's count and the global limit's room. It writes nothing
    /// (hits past their window stay in the rings until a decision drops them), under the key's set lock as a decision. For the admin API:
    /// it allocates the tiers' vector.
    pub fn key_state(&self, key: u64, now: Nanos) -> TieredKeyState {
        let global = self.global.as_ref();
        self.read(key, now, |view| TieredKeyState {
            current_tier: view.current(now),
            available: view.fits_at(now, global),
            tiers: (1..=self.shape.n)
                .map(|tier| TierState {
                    phase: view.phase(tier, now),
                    count: u64::from(view.count_at(tier - 1, now)),
                })
                .collect(),
            hard_count: self
                .shape
                .hard
                .then(|| u64::from(view.count_at(self.shape.n, now))),
            global_room: global.map(|g| g.room_at(now)),
        })
    }

    /// Keys holding live state at `now`. Locks each set in turn: for metrics and tests.
    pub fn len(&self, now: Nanos) -> usize {
        self.table.count(|t| t.expires > now)
    }

    /// Whether no key holds live state at `now`.
    pub fn is_empty(&self, now: Nanos) -> bool {
        self.len(now) == 0
    }

    /// Keys evicted while their state was live, since construction: each starts again as a
    /// new key and fails open once. A rising count means `max_keys` is too small. Reusing a
    /// way whose state has emptied loses nothing and is not counted.
    pub fn evictions(&self) -> u64 {
        self.table.evictions()
    }

    /// Entries into `tier` (1-based in the normalized tiers) since construction: bursts into
    /// it, and for tier 1 also new keys, whose first request enters it from the fake tier 0.
    pub fn entries(&self, tier: usize) -> u64 {
        tier.checked_sub(1)
            .and_then(|i| self.entries.get(i))
            .map_or(0, |e| e.load(Ordering::Relaxed))
    }

    /// Runs `f` on `key`'s state at `now` under the key's set lock, writing nothing at all:
    /// not even a rebase, which only a write of a new offset needs (expiries are computed
    /// in `u64` from the base).
    pub(super) fn read<R>(&self, key: u64, now: Nanos, f: impl FnOnce(&View) -> R) -> R {
        let key = table::stored(key);
        let set = self.table.index(key);
        let heads = self.table.lock(set);
        let (hit, _) = scan(&heads, |h| h.key == key);
        if hit < WAYS && heads[hit].value.expires > now {
            f(&self.view(set * WAYS + hit, heads[hit].value.base))
        } else {
            f(&self.fresh_view(now))
        }
    }

    /// A rejection by `by`, with the current tier's headline and the earliest retry computed
    /// on the key's state (which the rejection left as it was): [`NEVER`] when `min` copies
    /// never fit.
    pub(super) fn rejected(
        &self,
        view: &View,
        min: u64,
        now: Nanos,
        by: DecidedBy,
    ) -> TieredDecision {
        let (tier, remaining, reset) = view.headline(now);
        let retry = match view.earliest(min, now, self.global.as_ref()) {
            Some(at) => at.saturating_sub(now),
            None => NEVER,
        };
        TieredDecision {
            verdict: Verdict::reject(remaining, reset, retry.max(1)),
            granted: 0,
            tier,
            decided_by: by,
            first_tier: 0,
            at: now,
        }
    }

    /// Enters `tier` at `now`; returns when its cooldown ends.
    pub(super) fn enter(&self, view: &View, tier: usize, now: Nanos) -> Nanos {
        view.enter(tier, now);
        if let Some(e) = tier.checked_sub(1).and_then(|i| self.entries.get(i)) {
            e.fetch_add(1, Ordering::Relaxed);
        }
        let spec = &self.shape.tiers[tier - 1];
        now.saturating_add(spec.active)
            .saturating_add(spec.cooldown)
    }

    /// Gives a new key a way (its own expired one, an empty or expired one, or an evicted
    /// one) and writes a new key's metadata there (no tier entered, empty rings), which is
    /// what `fresh` holds: deciding on it changed nothing.
    pub(super) fn claim(
        &self,
        heads: &mut [Head; WAYS],
        set: usize,
        key: u64,
        (hit, empty): (usize, usize),
        now: Nanos,
    ) -> usize {
        let way = if hit < WAYS {
            hit
        } else {
            self.victim(heads, set, empty, now)
        };
        heads[way] = Head {
            key,
            value: Times {
                expires: 0,
                base: now,
            },
        };
        self.hint(set, way, key);
        let meta = self.meta_start + (set * WAYS + way) * self.meta_stride;
        for (i, word) in self.meta[meta..meta + self.shape.meta_words()]
            .iter()
            .enumerate()
        {
            word.store(self.shape.fresh_word(i), Ordering::Relaxed);
        }
        way
    }

    /// The way a new key takes: `empty` if it is a way, else the way of least
    /// [`Score`](victim::Score) (see [`TieredLimiter::score`]); taking a live one is counted.
    pub(super) fn victim(
        &self,
        heads: &[Head; WAYS],
        set: usize,
        empty: usize,
        now: Nanos,
    ) -> usize {
        let fresh = self.fresh_view(now).fits_at(now, None);
        self.table.victim(heads, empty, 0, |way, times| {
            self.score(set, way, times, fresh, now)
        })
    }

    /// What forgetting the key in `way` of `set` would wrongly admit at `now`: its loss is
    /// what a new key could take at once (`fresh`: the hard limit and every tier a burst
    /// reaches) minus what this key can take (its current tier, the tiers its burst can still
    /// enter, its hard limit's room), so a key in a closed tier or at the top of its tiers
    /// loses everything and a key with one hit in tier 1 loses 1; it empties when its head
    /// says (every tier inactive, every window empty). The global limit is the same for every
    /// key and is left out.
    pub(super) fn score(
        &self,
        set: usize,
        way: usize,
        t: &Times,
        fresh: u64,
        now: Nanos,
    ) -> victim::Score {
        if t.expires <= now {
            return victim::Score::FREE;
        }
        let room = self.view(set * WAYS + way, t.base).fits_at(now, None);
        victim::Score::new(fresh.saturating_sub(room), t.expires, now)
    }

    /// Loads the metadata of the way whose fingerprint matches `key`'s, or of every way of
    /// the set if none does (a new key, which will write one of them), so that those cache
    /// misses overlap with the lock's and the scan's instead of following them: a prefetch
    /// without `unsafe`. (Issuing it after the lock, whose locked instruction waits for earlier
    /// loads, measured no better.)
    pub(super) fn touch(&self, set: usize, key: u64) {
        const LOW: u64 = 0x0101_0101_0101_0101;
        let hints = self.hints[set].load(Ordering::Relaxed);
        // SWAR: the lowest byte equal to the fingerprint is found exactly.
        let x = hints ^ (LOW * (key & 0xff));
        let found = x.wrapping_sub(LOW) & !x & (LOW << 7);
        let first = self.meta_start + set * WAYS * self.meta_stride;
        let (from, len) = if found != 0 {
            let way = found.trailing_zeros() as usize / 8;
            (first + way * self.meta_stride, self.meta_stride)
        } else {
            (first, WAYS * self.meta_stride)
        };
        if let Some(block) = self.meta.get(from..from + len) {
            let lines = block.chunks_exact(8);
            let sum = lines.fold(0u64, |sum, line| {
                sum.wrapping_add(line[0].load(Ordering::Relaxed))
            });
            std::hint::black_box(sum);
        }
    }

    /// Records `key`'s fingerprint for `way` of `set`; the set's lock is held, so this is its
    /// only writer.
    pub(super) fn hint(&self, set: usize, way: usize, key: u64) {
        let hints = &self.hints[set];
        let shift = 8 * way;
        let old = hints.load(Ordering::Relaxed) & !(0xff << shift);
        hints.store(old | (key & 0xff) << shift, Ordering::Relaxed);
    }

    pub(super) fn view(&self, way: usize, base: Nanos) -> View<'_> {
        let meta = self.meta_start + way * self.meta_stride;
        let logs = way * self.shape.log_words;
        View {
            shape: &self.shape,
            meta: &self.meta[meta..meta + self.shape.meta_words()],
            logs: &self.logs[logs..logs + self.shape.log_words],
            base: Cell::new(base),
        }
    }

    /// A new key's state at `now`, read from the shared template: nothing is stored unless
    /// the decision changes it, and then in the key's own way. Nothing writes through this
    /// view (its rings are empty, so pops change nothing).
    pub(super) fn fresh_view(&self, now: Nanos) -> View<'_> {
        View {
            shape: &self.shape,
            meta: &self.fresh,
            logs: &[],
            base: Cell::new(now),
        }
    }
}
