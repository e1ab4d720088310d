//! Charon's burst tiers in Redis: per key a hash of tier entry times and one sorted set
//! per tier (the paper's access log) plus the hard limit's log, all under the key's hash
//! tag, decided by one script (`scripts/tiered.lua`) with the in-process limiter's
//! semantics, in Redis's microseconds.

use crate::limits::clock::Nanos;
use crate::limits::tiered::{
    DecidedBy, Phase, Tier, TierState, TieredDecision, TieredKeyState, TieredParams,
};
use crate::limits::verdict::{Verdict, NEVER};
use crate::store::key::{KeyNames, LimitState, StateKind};
use crate::store::redis::SCRIPT_MAX;
use crate::store::redis::{nanos, round_micros, scripts, Arg, EntryId, Micros, RedisStore};
use crate::store::StoreError;

/// Where a tiered decision's global limit is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalArg {
    /// No global limit.
    None,
    /// In Redis, in the script's own call: one count for the fleet (a standalone Redis,
    /// whose scripts may touch keys of any slot).
    InStore {
        /// `G`, per aligned second of Redis's clock.
        limit: u64,
    },
    /// By the caller (a Redis Cluster, where the count would be in another slot): it
    /// reserved `room` admissions of its own count, whose second turns in `turns_in`
    /// (0 when nothing is counted), and gives back what the decision did not use.
    Reserved {
        /// The caller's limit: this instance's share of `G`.
        limit: u64,
        /// Admissions reserved for this decision (at most its `max`).
        room: u64,
        /// Time until the caller's counted second ends, 0 if it counts nothing.
        turns_in: Nanos,
    },
}

/// A tiered decision made in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TieredGrant {
    /// The decision, as the in-process limiter describes it; `at` is the `now` the caller
    /// passed (its own clock), for a fallback-style refund.
    pub decision: TieredDecision,
    /// Tiers the decision entered, bit `i - 1` for tier `i` (bursts, and tier 1 for a key
    /// without state): what `tollgate_tier_entries_total` counts.
    pub entered: u32,
    /// The decision's instant in Redis's clock, µs (a refund's global count needs it).
    pub at_us: Micros,
}

impl RedisStore {
    /// The key's tiered state now, at Redis's time, deciding and entering nothing (see
    /// tiered_get.lua): one read-only call within the decision budget. `global_in_store`:
    /// the global limit is counted in the store (a standalone Redis), so its room counts.
    pub async fn tiered_get(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TieredParams,
        global_in_store: bool,
    ) -> Result<TieredKeyState, StoreError> {
        let global = match params.global_limit {
            Some(limit) if global_in_store => GlobalArg::InStore { limit },
            _ => GlobalArg::None,
        };
        let keys = tiered_keys(names, hash, params, global);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (glimit, gmode) = match global {
            GlobalArg::InStore { limit } => (limit, 1),
            _ => (0, 0),
        };
        let n = params.tiers.len();
        let mut args = Vec::with_capacity(4 + 5 * n);
        args.extend([
            Arg::U(n as u64),
            Arg::U(params.hard_limit.unwrap_or(0).min(SCRIPT_MAX)),
            Arg::U(glimit.min(SCRIPT_MAX)),
            Arg::U(gmode),
        ]);
        args.extend(params.tiers.iter().flat_map(tier_args));
        let s = &self.inner.scripts.tiered_get;
        let v = self.eval(s, &keys, &args, None, self.budget()).await?;
        let out = scripts::int_list(&v, 4 + 2 * n)?;
        let [current, available, hard, groom, ref per_tier @ ..] = out[..] else {
            return Err(StoreError::Reply(format!(
                "expected {} integers",
                4 + 2 * n
            )));
        };
        if per_tier.len() != 2 * n {
            return Err(StoreError::Reply(format!(
                "expected {} integers, got {}",
                4 + 2 * n,
                out.len()
            )));
        }
        let tiers = per_tier
            .chunks_exact(2)
            .map(|c| {
                let phase = match c[1] {
                    1 => Phase::Active,
                    2 => Phase::Cooling,
                    _ => Phase::Inactive,
                };
                TierState {
                    phase,
                    count: scripts::count(c[0]),
                }
            })
            .collect();
        Ok(TieredKeyState {
            current_tier: usize::try_from(current).unwrap_or(0),
            available: scripts::count(available),
            hard_count: (hard >= 0).then(|| scripts::count(hard)),
            global_room: (groom >= 0).then(|| scripts::count(groom)),
            tiers,
        })
    }

    /// One tiered decision for the key hashed to `hash` (see tiered.lua): grants the
    /// largest count in `[min, max]` that fits the hard limit, the burst tiers and the
    /// global limit, as [`TieredLimiter::acquire_many`] does, with hits named after `id`
    /// (a fresh [`RedisStore::entry_id`]), at Redis's time or `at`. `params` must be
    /// normalized ([`crate::limits::tiered::normalize`]); durations are rounded to whole
    /// microseconds. `now` is only copied into the decision.
    ///
    /// [`TieredLimiter::acquire_many`]: crate::limits::tiered::TieredLimiter::acquire_many
    // The key's names and hash, the limit, the decision's id, its range, the global limit's
    // place and the two clocks: each is needed, none belongs with another.
    #[allow(clippy::too_many_arguments)]
    pub async fn tiered(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TieredParams,
        id: &EntryId,
        (min, max): (u64, u64),
        global: GlobalArg,
        now: Nanos,
        at: Option<Micros>,
    ) -> Result<TieredGrant, StoreError> {
        let keys = tiered_keys(names, hash, params, global);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (glimit, gmode, groom, gturn) = match global {
            GlobalArg::None => (0, 0, 0, 0),
            GlobalArg::InStore { limit } => (limit, 1, 0, 0),
            GlobalArg::Reserved {
                limit,
                room,
                turns_in,
            } => (
                limit,
                2,
                room,
                round_micros(turns_in).max(u64::from(turns_in > 0)),
            ),
        };
        let mut args = Vec::with_capacity(9 + 5 * params.tiers.len());
        args.extend([
            Arg::S(id.as_str()),
            Arg::U(min.clamp(1, SCRIPT_MAX)),
            Arg::U(max.clamp(1, SCRIPT_MAX)),
            Arg::U(params.tiers.len() as u64),
            Arg::U(params.hard_limit.unwrap_or(0).min(SCRIPT_MAX)),
            Arg::U(glimit.min(SCRIPT_MAX)),
            Arg::U(gmode),
            Arg::U(groom.min(SCRIPT_MAX)),
            Arg::U(gturn.min(SCRIPT_MAX)),
        ]);
        args.extend(params.tiers.iter().flat_map(tier_args));
        let s = &self.inner.scripts.tiered;
        let v = self.eval(s, &keys, &args, at, self.budget()).await?;
        let [allowed, granted, tier, by, first, remaining, reset, retry, entered, at_us] =
            scripts::ints::<10>(&v)?;
        let (remaining, reset) = (scripts::count(remaining), nanos(reset));
        let verdict = if allowed == 1 {
            Verdict::allow(remaining, reset)
        } else if retry < 0 {
            // Never fits: no retry can help it.
            Verdict::reject(remaining, reset, NEVER)
        } else {
            Verdict::reject(remaining, reset, nanos(retry).max(1))
        };
        let decided_by = match by {
            2 => DecidedBy::NoTierEnterable,
            3 => DecidedBy::HardLimit,
            4 => DecidedBy::GlobalLimit,
            _ => DecidedBy::TierWindow,
        };
        Ok(TieredGrant {
            decision: TieredDecision {
                verdict,
                granted: scripts::count(granted),
                tier: usize::try_from(tier).unwrap_or(0),
                decided_by,
                first_tier: usize::try_from(first).unwrap_or(0),
                at: now,
            },
            entered: u32::try_from(entered).unwrap_or(0),
            at_us: scripts::count(at_us),
        })
    }

    /// Takes back exactly the hits a [`RedisStore::tiered`] decision recorded under `id`
    /// (and its global admissions if `global` is [`GlobalArg::InStore`] and its second is
    /// still counted); the tiers it entered stay entered. Returns the tier hits removed.
    // As for `tiered`: the refund names the same things.
    #[allow(clippy::too_many_arguments)]
    pub async fn tiered_refund(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TieredParams,
        id: &EntryId,
        grant: &TieredGrant,
        global: GlobalArg,
        at: Option<Micros>,
    ) -> Result<u64, StoreError> {
        let keys = tiered_keys(names, hash, params, global);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let d = &grant.decision;
        let args = [
            Arg::S(id.as_str()),
            Arg::U(d.granted.min(SCRIPT_MAX)),
            Arg::U(d.first_tier as u64),
            Arg::U(d.tier as u64),
            Arg::U(params.tiers.len() as u64),
            Arg::U(u64::from(params.hard_limit.is_some())),
            Arg::U(u64::from(matches!(global, GlobalArg::InStore { .. }))),
            Arg::U(grant.at_us),
        ];
        let s = &self.inner.scripts.tiered_refund;
        let v = self.eval(s, &keys, &args, at, self.background()).await?;
        Ok(scripts::count(scripts::int(&v)?))
    }
}

/// The keys of one decision: state, the tier logs, the hard log, the global count.
fn tiered_keys(
    names: &KeyNames,
    hash: u64,
    params: &TieredParams,
    global: GlobalArg,
) -> Vec<String> {
    let mut keys = Vec::with_capacity(params.tiers.len() + 3);
    keys.push(names.key(hash, StateKind::TieredState));
    for i in 1..=params.tiers.len() {
        keys.push(names.key(hash, StateKind::TierLog(i as u8)));
    }
    if params.hard_limit.is_some() {
        keys.push(names.key(hash, StateKind::TieredHard));
    }
    if matches!(global, GlobalArg::InStore { .. }) {
        keys.push(names.limit_key(LimitState::TieredGlobal));
    }
    keys
}

/// A tier's five arguments to the tiered scripts: limit, window, active, cooldown (µs)
/// and whether it may be skipped.
fn tier_args<'a>(t: &Tier) -> [Arg<'a>; 5] {
    [
        Arg::U(t.limit.min(SCRIPT_MAX)),
        Arg::U(duration(t.window).max(1)),
        Arg::U(duration(t.active)),
        Arg::U(duration(t.cooldown)),
        Arg::U(u64::from(t.skippable)),
    ]
}

/// A duration in whole microseconds, clamped for the script's doubles.
fn duration(n: Nanos) -> u64 {
    round_micros(n).min(SCRIPT_MAX)
}
