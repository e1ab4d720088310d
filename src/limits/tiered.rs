//! Charon's burst tiers: exact per-key sliding windows stacked in tiers that a customer
//! bursts up through, with an optional per-key hard limit and a limit-wide global limit, in a
//! fixed-size set-associative table.
//!
//! **Tiers.** Tier `i` (1-based, in the configured order) has a limit `L`, a window `Tw`, an
//! active time `Ta`, a cooldown `Tc` and a skippable flag `S`. For one key, a tier entered at
//! `e` is *active* during `[e, e + Ta)`, *cooling down* during `[e + Ta, e + Ta + Tc)` and
//! *inactive* otherwise (and before it is ever entered). The *current tier* is the active
//! tier with the greatest index, or a fake tier 0 (limit 0, so it always bursts) when none
//! is. Each tier keeps its own log of the hits it admitted; a hit at `h` is in the tier's
//! window while `now < h + Tw`. A request is admitted when the current tier's window holds
//! fewer than `L` hits, and recorded in that tier's log. When the window is full the request
//! *bursts* into the next tier: a cooling tier cannot be entered, and stops the burst unless
//! it is skippable, in which case the burst goes on to the tier after it; an inactive tier is
//! entered (its active period starts at `now`) and then checked against its own window, and
//! if that is full too the burst goes on from it. A burst that runs out of tiers is rejected.
//! When the current tier's active period ends, the current tier is again the greatest active
//! one: the fallback may drop several levels at once, down to the fake tier 0. A burst only
//! climbs (tiers above the current one are never active). A refusal changes nothing (the
//! Charon paper): a request rejected in the end enters none of the tiers its burst
//! reached, so a request that could not be served never moves its key up.
//!
//! **Hard and global limits.** `hard_limit: H` admits at most `H` per key in any sliding
//! second: an exact log of the last `H` admissions, like a tier's. `global_limit: G` admits at
//! most `G` per *aligned* second `[s, s + 1 s)` of the clock across all keys, in one lock-free
//! `AtomicU64` (second and count, updated by compare-and-swap). The fixed window is the
//! documented error: a sliding second that straddles a boundary can see up to `2G`. Checks run
//! in the order hard → tiers → global and the first failure decides; a rejection, by any of
//! them, leaves the key's state as it was, so a client hammering past `H` never climbs
//! tiers by it.
//!
//! **Copies.** [`TieredLimiter::acquire_many`] asks for between `min` and `max` copies at
//! once, with the semantics of that many single requests at the same instant: the current
//! tier fills first, then each burst enters the next tier and fills it, and the grant is the
//! largest count in `[min, max]` that fits under the hard limit, the tiers and the global
//! limit. A grant enters only the tiers its copies reach; a rejection (fewer than `min` fit)
//! enters none, so a bulk request refused leaves its key where it was. A grant cut below
//! `max` says which limit cut it (`decided_by`): the global limit, the hard limit, or the
//! tiers. [`TieredLimiter::available`] answers "how many would fit now" without taking,
//! and [`TieredLimiter::key_state`] reads a key's tiers (phase, window count) for the admin
//! API, writing nothing.
//!
//! **Retry-After.** If nothing else happens, the decision a key gets is a function of time
//! that changes only when a tier's active period or cooldown ends, when the global second
//! turns, and when a logged hit leaves its window. Between two consecutive changes of the first
//! two kinds (at most `2·tiers + 1` instants) the tiers a burst can reach are fixed and the
//! room in each window only grows, so the earliest instant at which `min` copies fit is the
//! latest of: when the hard limit's log has `min` free (the expiry of one known hit), and
//! when the reachable tiers' windows together have `min` free (a merge of their logs by
//! expiry, `min` steps at most); the first interval where that instant falls before its end
//! holds the answer. The answer is exact to the nanosecond for the tiers and the hard limit
//! (rejected 1 ns before, admitted at it); for the global limit it assumes no other key takes
//! the next second's slots first, so it is a lower bound. A request that can never fit (`min`
//! above `H`, `G` or the sum of the limits) is told [`NEVER`]: no retry can help it.
//!
//! **Time.** A key's logs hold `u32` offsets from a per-key base time, in units of
//! `u = 2^k` ns, the smallest power of two for which `2^30` units cover the longest window
//! (one second counts as a window when a hard limit is set). A hit is stored rounded *up* to
//! a unit, so it stays in its window at most `u - 1` ns longer than exactly, never shorter:
//! `u` is 1 ns for windows up to 1.07 s, 64 ns for a minute, 512 ns for five minutes and
//! 131 µs for a day. Retry-After is computed from the stored times, so it stays exact with
//! respect to what the limiter will decide. When an offset would pass `2^31` units, the base
//! moves forward and the live offsets move back (a rare pass over the key's logs). Entry times
//! of tiers are full `u64` nanoseconds, so active periods and cooldowns are exact.
//!
//! **Refund (no-burn).** [`TieredLimiter::refund`] takes back the hits an admitted decision
//! recorded (in its tiers, in the hard-limit log, and in the global count if the second has not
//! turned). It removes the newest hits at or after the decision's instant, which are the
//! decision's own unless another request of the same key came in the same unit of time, an
//! indistinguishable case. A tier entry the decision caused is not undone: the burst happened,
//! and undoing it could reopen a tier that another request of the key has since relied on.
//!
//! **Table and memory.** `sets = ⌈max_keys / 8⌉` sets of 8 ways, each set behind its own
//! `parking_lot::Mutex` holding each way's key, the instant its state becomes empty and its
//! base time (24 bytes a way, 200 bytes a set), picked by Lemire's multiply-high as in the
//! token bucket. Each way owns a fixed region of two arenas allocated once, zeroed: a
//! metadata block (each tier's entry time, and per ring, the tiers' and the hard limit's, its
//! head, length, oldest and newest hit: `3n + 2` `u64` words rounded up to 64-byte lines, one
//! line for up to two tiers) and a log block of `ΣL + H` `u32` ring slots. A ring's oldest
//! and newest hits live only in the metadata and the log holds the hits in between, so a
//! decision reads no log slot unless it drops a hit that leaves others behind, and a ring
//! with at most two hits in its window never touches the log at all. A word per set of key
//! fingerprints (one byte per way), read without the lock, tells which way's metadata to load
//! while the lock is taken and the set scanned (all the set's lines for a key it does not
//! hold, which will write one of them). Worst case per key of `max_keys`:
//! `26 + 64·⌈(3n + 2) / 8⌉ + 4·(ΣL + H)` bytes, e.g. 410 bytes for tiers of 20 and 50 with
//! `H = 10`, and 1 890 bytes for tiers of 100 and 300 with `H = 50` (189 MB for 100 000
//! keys). The arenas are zeroed allocations, which the allocator gets as fresh mmap'd pages:
//! only pages a key has touched use memory, and a light key (at most two hits per window and
//! ring) touches only its 64-byte metadata line, so a limit whose keys stay light costs a
//! small fraction of the worst case; slots a heavy key once wrote keep their pages. No
//! decision allocates, takes a global lock or makes a syscall.
//!
//! **Dropping and eviction.** A key whose tiers are all inactive and whose windows are empty
//! behaves exactly like a new key, so its slot is free: the set keeps the instant each way's
//! state becomes empty, and a way past it is reused as empty. A new key takes an empty or
//! expired way first; failing both it evicts the key whose forgetting would wrongly admit
//! least ([`crate::limits::victim`]): the one that can still take the most of what a new key
//! could (through its hard limit and the tiers its burst reaches), and of those the one whose
//! state empties soonest, counted by [`TieredLimiter::evictions`]. A key held in a closed or
//! top tier is thus never evicted while its set holds a key further from its limits, so a
//! flood of fresh keys cannot release it (the victim module's doc gives the flood that
//! still can). An evicted key starts again as new (no tier entered, empty windows): it fails
//! open, it is never wrongly denied. Keys hash uniformly to sets, so, as for the token
//! bucket, eviction starts before `max_keys` keys hold state (0.8% of keys beyond their
//! set's ways at half load); size `max_keys` at twice the keys expected at once.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use thiserror::Error;

use crate::limits::clock::{Nanos, NANOS_PER_SEC};
use crate::limits::restore::Restored;
use crate::limits::table::{self, scan, Table, WAYS};
use crate::limits::verdict::{Verdict, NEVER};
use crate::limits::victim;

/// Tiers a limit may have: enough for any penalty ladder, few enough that the per-key
/// metadata stays in one or a few cache lines and the decision's scratch lives on the stack.
pub const MAX_TIERS: usize = 16;

/// The largest tier limit and hard limit: a key's worst case holds this many 4-byte slots per
/// tier, so a larger one would make a single key cost megabytes.
pub const MAX_LIMIT: u64 = 1 << 20;

/// The largest global limit: the count lives in 32 bits of one atomic word.
pub const MAX_GLOBAL_LIMIT: u64 = u32::MAX as u64;

/// Durations above this (146 years) are clamped to it, so sums of durations never overflow.
pub const MAX_DURATION: Nanos = 1 << 62;

/// An entry time meaning "never entered".
const NOT_ENTERED: Nanos = Nanos::MAX;
/// `2^SPAN_BITS` time units cover the longest window.
const SPAN_BITS: u32 = 30;
/// Offsets at or past this many units trigger a rebase.
const REBASE_AT: u64 = 1 << 31;

/// One tier of the paper: `L`, `Tw`, `Ta`, `Tc` and `S`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tier {
    /// `L`: hits the tier admits per window.
    pub limit: u64,
    /// `Tw`: the sliding window's length, in nanoseconds.
    pub window: Nanos,
    /// `Ta`: how long the tier stays active once entered, in nanoseconds.
    pub active: Nanos,
    /// `Tc`: how long after its active period the tier cannot be entered again.
    pub cooldown: Nanos,
    /// `S`: a burst may pass over this tier while it cools down, instead of stopping at it.
    pub skippable: bool,
}

/// A tiered limit's parameters: tiers in order, and the optional hard and global limits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TieredParams {
    /// The tiers, tier 1 first.
    pub tiers: Vec<Tier>,
    /// `H`: at most this many admissions per key in any sliding second.
    pub hard_limit: Option<u64>,
    /// `G`: at most this many admissions per aligned second across all keys of the limit.
    pub global_limit: Option<u64>,
}

/// Why a tiered limit's parameters are unusable; the config reports it as an error.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TieredError {
    /// No tier at all.
    #[error("a tiered limit needs at least one tier")]
    NoTiers,
    /// Every tier has zero active time, so all were removed.
    #[error("every tier has zero active time, so none is left")]
    NoActiveTier,
    /// More tiers than [`MAX_TIERS`] remain.
    #[error("{count} tiers, but at most {MAX_TIERS} are supported")]
    TooManyTiers {
        /// Tiers left after removing those with zero active time.
        count: usize,
    },
    /// A zero window (tier numbers are 1-based positions in the given list).
    #[error("tier {tier}: window must be longer than 0")]
    ZeroWindow {
        /// 1-based position in the given list.
        tier: usize,
    },
    /// A tier limit above [`MAX_LIMIT`].
    #[error("tier {tier}: limit {limit} is above the maximum of {MAX_LIMIT}")]
    LimitTooLarge {
        /// 1-based position in the given list.
        tier: usize,
        /// The limit given.
        limit: u64,
    },
    /// A hard limit of 0 or above [`MAX_LIMIT`].
    #[error("hard_limit must be between 1 and {MAX_LIMIT}, got {0}")]
    HardLimit(u64),
    /// A global limit of 0 or above [`MAX_GLOBAL_LIMIT`].
    #[error("global_limit must be between 1 and {MAX_GLOBAL_LIMIT}, got {0}")]
    GlobalLimit(u64),
    /// The arenas for `max_keys` keys cannot be allocated.
    #[error("state for max_keys keys would take {bytes} bytes, which cannot be allocated")]
    TooLarge {
        /// The bytes asked for.
        bytes: u128,
    },
}

/// A change [`normalize`] made to the tiers, for the config to report.
///
/// Tier numbers are 1-based positions in the list given to [`normalize`]; after a removal the
/// limiter's tier numbers (in [`TieredDecision::tier`]) are positions in the normalized list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierChange {
    /// A tier with zero active time could never be entered, so it was removed (a warning).
    Removed {
        /// 1-based position in the given list.
        tier: usize,
    },
    /// A window longer than the active time was shortened to it: the tier cannot admit
    /// after its active period anyway, so nothing changes (a note, not a warning).
    WindowShortened {
        /// 1-based position in the given list.
        tier: usize,
        /// The window given.
        from: Nanos,
        /// The window used: the active time.
        to: Nanos,
    },
    /// An active time that is not a multiple of the window was trimmed down to one (a
    /// warning: a partial last window would let a customer take a full window's limit in a
    /// fraction of it, and burst again right after).
    ActiveTrimmed {
        /// 1-based position in the given list.
        tier: usize,
        /// The active time given.
        from: Nanos,
        /// The active time used.
        to: Nanos,
    },
    /// A tier with limit 0 admits nothing: every request entering it bursts on (a warning).
    ZeroLimit {
        /// 1-based position in the given list.
        tier: usize,
    },
}

impl TierChange {
    /// Whether the config should show it as a warning; [`TierChange::WindowShortened`] is
    /// harmless, so it is a note.
    pub fn is_warning(&self) -> bool {
        !matches!(self, TierChange::WindowShortened { .. })
    }
}

impl fmt::Display for TierChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = |n: Nanos| humantime::format_duration(Duration::from_nanos(n));
        match *self {
            TierChange::Removed { tier } => write!(
                f,
                "tier {tier} has zero active time, so it could never be entered: removed"
            ),
            TierChange::WindowShortened { tier, from, to } => write!(
                f,
                "tier {tier}: window {} is longer than the active time, shortened to {}",
                d(from),
                d(to)
            ),
            TierChange::ActiveTrimmed { tier, from, to } => write!(
                f,
                "tier {tier}: active time {} is not a multiple of the window, trimmed to {} \
                 (a partial last window would let a customer over the limit)",
                d(from),
                d(to)
            ),
            TierChange::ZeroLimit { tier } => write!(
                f,
                "tier {tier} has limit 0: it admits nothing, every request entering it bursts on"
            ),
        }
    }
}

/// Normalized parameters and what normalizing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The parameters the limiter runs with.
    pub params: TieredParams,
    /// The changes, in tier order.
    pub changes: Vec<TierChange>,
}

/// Validates a tiered limit's parameters and applies the paper's load-time optimizations.
///
/// In order, per tier: a tier with zero active time is removed ([`TierChange::Removed`]); a
/// window longer than the active time is shortened to it ([`TierChange::WindowShortened`]); an
/// active time that is not a multiple of the window is trimmed down to one
/// ([`TierChange::ActiveTrimmed`]). A limit of 0 is kept with a warning. Durations above
/// [`MAX_DURATION`] are clamped to it. Errors: no tier, no tier left, more than
/// [`MAX_TIERS`], a zero window, a limit above [`MAX_LIMIT`], a hard or global limit of 0 or
/// above its maximum. [`TieredLimiter::new`] runs it too, so the config calls it to report the
/// changes and errors, and passes the original parameters on.
pub fn normalize(params: &TieredParams) -> Result<Normalized, TieredError> {
    if params.tiers.is_empty() {
        return Err(TieredError::NoTiers);
    }
    if let Some(h) = params.hard_limit {
        if h == 0 || h > MAX_LIMIT {
            return Err(TieredError::HardLimit(h));
        }
    }
    if let Some(g) = params.global_limit {
        if g == 0 || g > MAX_GLOBAL_LIMIT {
            return Err(TieredError::GlobalLimit(g));
        }
    }
    let mut tiers = Vec::with_capacity(params.tiers.len());
    let mut changes = Vec::new();
    for (i, given) in params.tiers.iter().enumerate() {
        let tier = i + 1;
        if given.window == 0 {
            return Err(TieredError::ZeroWindow { tier });
        }
        if given.limit > MAX_LIMIT {
            return Err(TieredError::LimitTooLarge {
                tier,
                limit: given.limit,
            });
        }
        let mut t = Tier {
            window: given.window.min(MAX_DURATION),
            active: given.active.min(MAX_DURATION),
            cooldown: given.cooldown.min(MAX_DURATION),
            ..*given
        };
        if t.active == 0 {
            changes.push(TierChange::Removed { tier });
            continue;
        }
        if t.limit == 0 {
            changes.push(TierChange::ZeroLimit { tier });
        }
        if t.window > t.active {
            changes.push(TierChange::WindowShortened {
                tier,
                from: t.window,
                to: t.active,
            });
            t.window = t.active;
        }
        let trimmed = t.active / t.window * t.window;
        if trimmed != t.active {
            changes.push(TierChange::ActiveTrimmed {
                tier,
                from: t.active,
                to: trimmed,
            });
            t.active = trimmed;
        }
        tiers.push(t);
    }
    if tiers.is_empty() {
        return Err(TieredError::NoActiveTier);
    }
    if tiers.len() > MAX_TIERS {
        return Err(TieredError::TooManyTiers { count: tiers.len() });
    }
    Ok(Normalized {
        params: TieredParams {
            tiers,
            hard_limit: params.hard_limit,
            global_limit: params.global_limit,
        },
        changes,
    })
}

/// Which limit decided a [`TieredDecision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecidedBy {
    /// A tier's window: it admitted the request (all of `max`, or as many as the tiers
    /// held), or (rejected) the burst reached the last tier and every window in its way was
    /// full.
    TierWindow,
    /// The burst was stopped by a cooling tier that is not skippable, or skipped cooling
    /// tiers up to the last one: no tier with room could be entered.
    NoTierEnterable,
    /// The key's hard limit (per sliding second) rejected it, whatever its tier, or cut
    /// its grant below `max`.
    HardLimit,
    /// The limit's global limit (per aligned second, all keys) rejected it, whatever its
    /// tier, or cut its grant below `max`.
    GlobalLimit,
}

/// What the tiered limiter decided for one request, with what the headers and the refund
/// need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TieredDecision {
    /// Admitted or rejected. `remaining` and `reset_after` describe the current tier's window
    /// after the decision (the RateLimit headers describe the current tier: `q` is its limit,
    /// `w` its window): hits it can still take, and the time until it is empty. For the fake
    /// tier 0 both are 0. A rejection's `retry_after` is as the module doc says.
    pub verdict: Verdict,
    /// Copies granted: in `[min, max]` when admitted, 0 when rejected.
    pub granted: u64,
    /// The current tier after the decision, 1-based in the normalized tiers; 0 is the fake
    /// tier (nothing active).
    pub tier: usize,
    /// Which limit decided.
    pub decided_by: DecidedBy,
    /// The lowest tier that took a granted copy (0 when rejected): with `tier`, the tiers a
    /// refund takes hits back from.
    pub first_tier: usize,
    /// The decision's instant, from which a refund takes hits back.
    pub at: Nanos,
}

/// Exact Charon burst tiers per key, with hard and global limits.
pub struct TieredLimiter {
    shape: Shape,
    params: TieredParams,
    /// Entries into each tier (bursts, and a new key entering tier 1), since construction:
    /// the `tollgate_tier_entries_total` counter. Written only when a tier is entered.
    entries: Box<[AtomicU64]>,
    /// The ways' heads; each way owns a region of the arenas below.
    table: Table<Times>,
    /// One fingerprint byte per way (the key's low byte), a word per set, read without the
    /// lock to start loading the metadata of the way the key probably holds before the set
    /// is scanned: a hint, so a stale one costs one wasted load.
    hints: Box<[AtomicU64]>,
    /// Metadata words, `meta_stride` per way from `meta_start` (64-byte aligned).
    meta: Box<[AtomicU64]>,
    meta_start: usize,
    meta_stride: usize,
    /// Log slots, `shape.log_words` per way.
    logs: Box<[AtomicU32]>,
    /// A new key's metadata, read-only: deciding for a key without state reads it, and writes
    /// it to a way only if the decision changes something.
    fresh: Box<[AtomicU64]>,
    global: Option<Global>,
}

/// One set: its lock and its ways' heads, 200 bytes.
type Set = table::Set<Times>;

/// A way's key (0 = empty) and its [`Times`].
type Head = table::Slot<Times>;

/// The instant a way's state becomes equal to a new key's, and the base time its log
/// offsets count from.
#[derive(Debug, Clone, Copy, Default)]
struct Times {
    expires: Nanos,
    base: Nanos,
}

/// The global limit: `(second as u32) << 32 | count` of the aligned second being counted, on
/// its own cache-line pair since every admission of every key writes it.
#[repr(align(128))]
struct Global {
    limit: u64,
    state: AtomicU64,
}

/// The parameters compiled for the decision path.
struct Shape {
    /// Tier count `n`.
    n: usize,
    /// Tiers 1..=n at indices 0..n.
    tiers: Box<[TierSpec]>,
    /// Rings: tiers' at 0..n, the hard log's at n (limit 0 without a hard limit).
    rings: Box<[RingSpec]>,
    hard: bool,
    /// log2 of the time unit.
    shift: u32,
    /// Log slots per way.
    log_words: usize,
}

#[derive(Debug, Clone, Copy)]
struct TierSpec {
    active: Nanos,
    cooldown: Nanos,
    skippable: bool,
}

#[derive(Debug, Clone, Copy)]
struct RingSpec {
    limit: u32,
    window: Nanos,
    offset: usize,
}

/// A ring's head slot, length, and its oldest and newest hits (valid when `len > 0`). The
/// two ends live only here, the log slots hold the hits in between: a ring with at most two
/// hits in its window (every light key) never touches the log arena.
#[derive(Debug, Clone, Copy)]
struct Ring {
    head: u32,
    len: u32,
    oldest: u32,
    newest: u32,
}

/// Where one key's tier stands at an instant (module doc, "Tiers").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Never entered, or its active period and cooldown are over.
    Inactive,
    /// Within its active period.
    Active,
    /// Within its cooldown: a burst stops here unless the tier is skippable.
    Cooling,
}

impl Phase {
    /// The phase's name in the admin API.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Inactive => "inactive",
            Phase::Active => "active",
            Phase::Cooling => "cooling",
        }
    }
}

/// One tier of a key at an instant, in [`TieredKeyState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierState {
    /// The tier's phase.
    pub phase: Phase,
    /// Hits in the tier's window.
    pub count: u64,
}

/// One key's state at an instant, read by [`TieredLimiter::key_state`] for the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TieredKeyState {
    /// The current tier, 1-based in the normalized tiers; 0 for the fake tier.
    pub current_tier: usize,
    /// What [`TieredLimiter::available`] answers.
    pub available: u64,
    /// Per tier of the normalized tiers, tier 1 first.
    pub tiers: Vec<TierState>,
    /// Hits in the hard limit's sliding second, if there is a hard limit.
    pub hard_count: Option<u64>,
    /// Room left in the global limit's aligned second (assuming no other key takes any), if
    /// there is a global limit.
    pub global_room: Option<u64>,
}

/// The tiers a burst from the current tier reaches at one instant, with their room.
struct Chain {
    current: usize,
    tiers: [u8; MAX_TIERS],
    rooms: [u32; MAX_TIERS],
    len: usize,
    total: u64,
    end: DecidedBy,
}

/// One key's state: its metadata words and its log slots (empty for a new key, whose rings
/// are all empty).
struct View<'a> {
    shape: &'a Shape,
    meta: &'a [AtomicU64],
    logs: &'a [AtomicU32],
    /// The base time, a copy of the head's: the caller stores it back after a rebase.
    base: Cell<Nanos>,
}

impl Shape {
    fn new(p: &TieredParams) -> Self {
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
    fn meta_words(&self) -> usize {
        2 + 3 * self.n
    }

    /// A new key's metadata word `i`: no tier entered, empty rings.
    fn fresh_word(&self, i: usize) -> u64 {
        if i < self.n {
            NOT_ENTERED
        } else {
            0
        }
    }
}

/// The smallest `k` such that `2^(30 + k)` ns covers `longest`.
fn unit_shift(longest: Nanos) -> u32 {
    let bits = 64 - longest.saturating_sub(1).leading_zeros();
    bits.saturating_sub(SPAN_BITS)
}

impl Ring {
    fn unpack(a: u64, b: u64) -> Self {
        Self {
            head: (a >> 32) as u32,
            len: a as u32,
            oldest: (b >> 32) as u32,
            newest: b as u32,
        }
    }

    fn pack(self) -> (u64, u64) {
        (
            u64::from(self.head) << 32 | u64::from(self.len),
            u64::from(self.oldest) << 32 | u64::from(self.newest),
        )
    }
}

impl View<'_> {
    fn word(&self, i: usize) -> u64 {
        self.meta[i].load(Ordering::Relaxed)
    }

    fn set_word(&self, i: usize, v: u64) {
        self.meta[i].store(v, Ordering::Relaxed);
    }

    fn base(&self) -> Nanos {
        self.base.get()
    }

    /// When `tier` (1-based) was last entered, or [`NOT_ENTERED`].
    fn entered(&self, tier: usize) -> Nanos {
        self.word(tier - 1)
    }

    fn enter(&self, tier: usize, now: Nanos) {
        self.set_word(tier - 1, now);
    }

    fn ring(&self, r: usize) -> Ring {
        let i = self.shape.n + 2 * r;
        let [a, b] = &self.meta[i..i + 2] else {
            unreachable!("a two-word slice")
        };
        Ring::unpack(a.load(Ordering::Relaxed), b.load(Ordering::Relaxed))
    }

    fn set_ring(&self, r: usize, ring: Ring) {
        let i = self.shape.n + 2 * r;
        let (a, b) = ring.pack();
        if let [wa, wb] = &self.meta[i..i + 2] {
            wa.store(a, Ordering::Relaxed);
            wb.store(b, Ordering::Relaxed);
        }
    }

    /// The log slot of logical position `pos` (0 = oldest) of ring `r`; it holds the hit only
    /// for `0 < pos < len - 1`.
    fn slot(&self, r: usize, ring: Ring, pos: u32) -> &AtomicU32 {
        let spec = &self.shape.rings[r];
        let mut p = ring.head + pos;
        if p >= spec.limit {
            p -= spec.limit;
        }
        &self.logs[spec.offset + p as usize]
    }

    /// The hit at logical position `pos < len` of ring `r`.
    fn entry(&self, r: usize, ring: Ring, pos: u32) -> u32 {
        if pos == 0 {
            ring.oldest
        } else if pos + 1 == ring.len {
            ring.newest
        } else {
            self.slot(r, ring, pos).load(Ordering::Relaxed)
        }
    }

    /// The instant a hit stored as `q` leaves ring `r`'s window.
    fn expiry(&self, r: usize, q: u32) -> Nanos {
        let at = self.base().saturating_add(u64::from(q) << self.shape.shift);
        at.saturating_add(self.shape.rings[r].window)
    }

    /// `now` as a stored offset, rounded up to a unit.
    fn offset(&self, now: Nanos) -> u32 {
        let mask = (1u64 << self.shape.shift) - 1;
        ((now.saturating_sub(self.base()) + mask) >> self.shape.shift) as u32
    }

    /// Drops ring `r`'s hits that left the window by `now`; returns the hits left. Reads the
    /// log only to learn the new oldest hit after dropping one that leaves others.
    fn pop(&self, r: usize, now: Nanos) -> u32 {
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
    fn room_now(&self, r: usize, now: Nanos) -> u64 {
        u64::from(self.shape.rings[r].limit - self.pop(r, now))
    }

    /// How many of ring `r`'s hits have left the window by `t`, without changing anything.
    fn expired_at(&self, r: usize, ring: Ring, t: Nanos) -> u32 {
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
    fn count_at(&self, r: usize, t: Nanos) -> u32 {
        let ring = self.ring(r);
        ring.len - self.expired_at(r, ring, t)
    }

    /// Ring `r`'s room at `t`, without changing anything.
    fn room_at(&self, r: usize, t: Nanos) -> u64 {
        u64::from(self.shape.rings[r].limit - self.count_at(r, t))
    }

    /// The first instant from `t` at which ring `r` has room for `want`, if it ever will.
    fn frees_at(&self, r: usize, t: Nanos, want: u64) -> Option<Nanos> {
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
    fn push(&self, r: usize, now: Nanos, count: u64) -> Nanos {
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
    fn unpush(&self, r: usize, at: u32, count: u64) -> u64 {
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
    fn rebase(&self, now: Nanos) {
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

    fn rebase_if_due(&self, now: Nanos) {
        if now.saturating_sub(self.base()) >> self.shape.shift >= REBASE_AT {
            self.rebase(now);
        }
    }

    /// Where `tier` (1-based) stands at `t`.
    fn phase(&self, tier: usize, t: Nanos) -> Phase {
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
    fn current(&self, t: Nanos) -> usize {
        (1..=self.shape.n)
            .rev()
            .find(|&tier| self.phase(tier, t) == Phase::Active)
            .unwrap_or(0)
    }

    /// The tiers a burst from the current tier reaches at `t`, with `room(tier)`; it stops
    /// once their room reaches `need`.
    fn chain(&self, t: Nanos, need: u64, mut room: impl FnMut(usize) -> u64) -> Chain {
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
    fn fits_at(&self, t: Nanos, global: Option<&Global>) -> u64 {
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
    fn next_change(&self, t: Nanos, global: Option<&Global>) -> Nanos {
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
    fn earliest(&self, min: u64, now: Nanos, global: Option<&Global>) -> Option<Nanos> {
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
    fn earliest_within(&self, min: u64, lo: Nanos, global: Option<&Global>) -> Option<Nanos> {
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
    fn headline(&self, now: Nanos) -> (usize, u64, Nanos) {
        let tier = self.current(now);
        if tier == 0 {
            return (0, 0, 0);
        }
        self.room_now(tier - 1, now);
        self.headline_of(tier, now)
    }

    /// [`View::headline`] of `tier`, known to be current and popped at `now`.
    fn headline_of(&self, tier: usize, now: Nanos) -> (usize, u64, Nanos) {
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

impl Global {
    fn unpack(v: u64) -> (u32, u64) {
        ((v >> 32) as u32, v & u64::from(u32::MAX))
    }

    /// The aligned second of `t`, as stored (clocks run from boot or from the epoch, so real
    /// instants stay far below 2^32 seconds).
    fn second(t: Nanos) -> u32 {
        (t / NANOS_PER_SEC) as u32
    }

    /// Whether `t` is in a second after the stored second `s`.
    fn later(t: Nanos, s: u32) -> bool {
        t / NANOS_PER_SEC > u64::from(s)
    }

    /// Takes between `min` and `want` admissions at `now`; returns how many (0 if fewer than
    /// `min` are left).
    fn take(&self, min: u64, want: u64, now: Nanos) -> u64 {
        let second = Self::second(now);
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let (mut s, mut c) = Self::unpack(cur);
            if Self::later(now, s) {
                (s, c) = (second, 0);
            }
            let room = self.limit.saturating_sub(c);
            if room < min {
                return 0;
            }
            let take = want.min(room);
            let next = u64::from(s) << 32 | (c + take);
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return take,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Gives back `count` admissions taken at `at`, if their second is still the counted one
    /// at `now`.
    fn refund(&self, count: u64, at: Nanos, now: Nanos) {
        let second = Self::second(at);
        if Self::second(now) != second {
            return;
        }
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let (s, c) = Self::unpack(cur);
            if s != second || c == 0 {
                return;
            }
            let next = u64::from(s) << 32 | (c - c.min(count));
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Room at `t`, assuming no other key takes any.
    fn room_at(&self, t: Nanos) -> u64 {
        let (s, c) = Self::unpack(self.state.load(Ordering::Relaxed));
        if Self::later(t, s) {
            self.limit
        } else {
            self.limit.saturating_sub(c)
        }
    }

    /// When the counted second ends, if it is after `t` and holds admissions.
    fn turns_after(&self, t: Nanos) -> Option<Nanos> {
        let (s, c) = Self::unpack(self.state.load(Ordering::Relaxed));
        let end = (u64::from(s) + 1).saturating_mul(NANOS_PER_SEC);
        (c > 0 && end > t).then_some(end)
    }
}

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

    fn bytes_for(shape: &Shape, ways: u128) -> u128 {
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
    fn read<R>(&self, key: u64, now: Nanos, f: impl FnOnce(&View) -> R) -> R {
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
    fn rejected(&self, view: &View, min: u64, now: Nanos, by: DecidedBy) -> TieredDecision {
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
    fn enter(&self, view: &View, tier: usize, now: Nanos) -> Nanos {
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
    fn claim(
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
    fn victim(&self, heads: &[Head; WAYS], set: usize, empty: usize, now: Nanos) -> usize {
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
    fn score(&self, set: usize, way: usize, t: &Times, fresh: u64, now: Nanos) -> victim::Score {
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
    fn touch(&self, set: usize, key: u64) {
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
    fn hint(&self, set: usize, way: usize, key: u64) {
        let hints = &self.hints[set];
        let shift = 8 * way;
        let old = hints.load(Ordering::Relaxed) & !(0xff << shift);
        hints.store(old | (key & 0xff) << shift, Ordering::Relaxed);
    }

    fn view(&self, way: usize, base: Nanos) -> View<'_> {
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
    fn fresh_view(&self, now: Nanos) -> View<'_> {
        View {
            shape: &self.shape,
            meta: &self.fresh,
            logs: &[],
            base: Cell::new(now),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const SEC: Nanos = NANOS_PER_SEC;
    const MS: Nanos = 1_000_000;
    const MINUTE: Nanos = 60 * SEC;
    const HOUR: Nanos = 60 * MINUTE;
    const DAY: Nanos = 24 * HOUR;

    fn tier(limit: u64, window: Nanos, active: Nanos, cooldown: Nanos) -> Tier {
        Tier {
            limit,
            window,
            active,
            cooldown,
            skippable: false,
        }
    }

    fn skippable(t: Tier) -> Tier {
        Tier {
            skippable: true,
            ..t
        }
    }

    fn params(tiers: &[Tier], hard_limit: Option<u64>, global_limit: Option<u64>) -> TieredParams {
        TieredParams {
            tiers: tiers.to_vec(),
            hard_limit,
            global_limit,
        }
    }

    fn limiter(tiers: &[Tier]) -> TieredLimiter {
        TieredLimiter::new(&params(tiers, None, None), 1024).unwrap()
    }

    /// Spreads small test keys over the sets, as real (hashed) keys are.
    fn spread(i: u64) -> u64 {
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// (allowed, tier, decided_by) of one decision.
    fn brief(d: TieredDecision) -> (bool, usize, DecidedBy) {
        (d.verdict.allowed, d.tier, d.decided_by)
    }

    const ADMIT: DecidedBy = DecidedBy::TierWindow;

    /// Replays `script` (which ends with a rejection of `min` copies of `key`) on two fresh
    /// limiters: a retry one nanosecond before `retry_after` is rejected, one at it admitted.
    /// Returns the rejection.
    fn assert_retry_exact(
        build: impl Fn() -> TieredLimiter,
        script: impl Fn(&TieredLimiter) -> TieredDecision,
        key: u64,
        min: u64,
    ) -> TieredDecision {
        let early = build();
        let d = script(&early);
        assert!(!d.verdict.allowed, "the script must end with a rejection");
        let at = d.at + d.verdict.retry_after;
        assert!(
            !early.acquire_many(key, min, min, at - 1).verdict.allowed,
            "admitted 1 ns before retry_after: {d:?}"
        );
        let on_time = build();
        script(&on_time);
        assert!(
            on_time.acquire_many(key, min, min, at).verdict.allowed,
            "rejected at retry_after: {d:?}"
        );
        d
    }

    #[test]
    fn a_first_request_bursts_from_tier_zero_into_tier_one() {
        let l = limiter(&[tier(3, SEC, 10 * SEC, 0)]);
        assert_eq!((l.current_tier(7, 0), l.available(7, 0)), (0, 3));
        assert!(l.is_empty(0), "reading holds no state");
        let d = l.acquire(7, 0);
        assert_eq!(brief(d), (true, 1, ADMIT));
        assert_eq!(d.verdict, Verdict::allow(2, SEC));
        assert_eq!((d.granted, d.first_tier, d.at), (1, 1, 0));
        assert_eq!(l.acquire(7, 400 * MS).verdict, Verdict::allow(1, SEC));
        assert_eq!(l.acquire(7, 500 * MS).verdict, Verdict::allow(0, SEC));
        // The last tier is full: nothing to burst into. Its oldest hit leaves at 1 s.
        let d = l.acquire(7, 600 * MS);
        assert_eq!(brief(d), (false, 1, DecidedBy::TierWindow));
        assert_eq!(d.verdict, Verdict::reject(0, 900 * MS, 400 * MS));
        assert_eq!(l.acquire(7, SEC).verdict, Verdict::allow(0, SEC));
        // The active period ends at 10 s; the next request enters tier 1 again.
        assert_eq!(l.current_tier(7, 10 * SEC - 1), 1);
        assert_eq!(l.current_tier(7, 10 * SEC), 0);
        assert_eq!(
            l.len(10 * SEC),
            0,
            "no tier active, windows empty: state dropped"
        );
        assert_eq!(brief(l.acquire(7, 10 * SEC)), (true, 1, ADMIT));
        assert_eq!(l.len(10 * SEC), 1);
        // Key 0 marks empty ways, so it is stored as key 1: a harmless hash collision.
        assert!(l.acquire(0, 10 * SEC).verdict.allowed);
        assert_eq!(l.available(1, 10 * SEC), 2);
    }

    #[test]
    fn penalty_pattern_stacks_tiers_with_proportional_cooldowns() {
        let l = limiter(&[
            tier(10, MINUTE, HOUR, 0),
            tier(5, MINUTE, 10 * MINUTE, 10 * MINUTE),
            tier(1, MINUTE, 20 * MINUTE, 20 * MINUTE),
        ]);
        let k = 42;
        for _ in 0..10 {
            assert_eq!(brief(l.acquire(k, 0)), (true, 1, ADMIT));
        }
        // Tier 1 is full: the 11th bursts into the penalty tier of 5.
        assert_eq!(l.acquire(k, 0).verdict, Verdict::allow(4, MINUTE));
        for _ in 0..4 {
            assert_eq!(brief(l.acquire(k, 0)), (true, 2, ADMIT));
        }
        // Then into the harshest, 1 per minute.
        assert_eq!(brief(l.acquire(k, 0)), (true, 3, ADMIT));
        let d = l.acquire(k, 2 * SEC);
        assert_eq!(brief(d), (false, 3, DecidedBy::TierWindow));
        assert_eq!(d.verdict.retry_after, MINUTE - 2 * SEC);
        // Tier 1's window is empty again, but tier 3 is current for 20 minutes.
        assert_eq!(l.available(k, 5 * MINUTE), 1);
        assert_eq!(brief(l.acquire(k, 5 * MINUTE)), (true, 3, ADMIT));
        assert!(!l.acquire(k, 5 * MINUTE).verdict.allowed);
        // Tier 3 ends at 20 min and cools until 40 min; tier 2 ended at 10 min and cooled
        // until 20 min: back in tier 1, a burst may enter tier 2 again but not tier 3.
        assert_eq!(l.current_tier(k, 20 * MINUTE), 1);
        for _ in 0..10 {
            assert_eq!(brief(l.acquire(k, 20 * MINUTE)), (true, 1, ADMIT));
        }
        for _ in 0..5 {
            assert_eq!(brief(l.acquire(k, 20 * MINUTE)), (true, 2, ADMIT));
        }
        let d = l.acquire(k, 20 * MINUTE);
        assert_eq!(brief(d), (false, 2, DecidedBy::NoTierEnterable));
        // The earliest pass: tier 2's oldest hit leaves its window at 21 min.
        assert_eq!(d.verdict.retry_after, MINUTE);
        // Tier 2 ends at 30 min; with tier 1 full again, a burst at 30 min meets tier 2
        // cooling (until 40 min) and stops there.
        for _ in 0..10 {
            assert!(l.acquire(k, 30 * MINUTE).verdict.allowed);
        }
        let d = l.acquire(k, 30 * MINUTE);
        assert_eq!(brief(d), (false, 1, DecidedBy::NoTierEnterable));
        assert_eq!(d.verdict.retry_after, MINUTE, "tier 1's window frees first");
    }

    #[test]
    fn prison_tier_lets_nothing_through_until_it_ends() {
        let build = || limiter(&[tier(5, MINUTE, HOUR, 0), tier(1, DAY, DAY, 0)]);
        let enter_prison = |l: &TieredLimiter| {
            for _ in 0..5 {
                assert_eq!(brief(l.acquire(9, 0)), (true, 1, ADMIT));
            }
            // The burst into the prison is its one admission.
            let d = l.acquire(9, 0);
            assert_eq!(brief(d), (true, 2, ADMIT));
            assert_eq!(d.verdict, Verdict::allow(0, DAY));
            // Tier 1 has room again after a minute, but the prison is current all day.
            assert_eq!(l.available(9, 2 * MINUTE), 0);
            let d = l.acquire(9, 2 * MINUTE);
            assert_eq!(brief(d), (false, 2, DecidedBy::TierWindow));
            d
        };
        let d = assert_retry_exact(build, enter_prison, 9, 1);
        assert_eq!(d.verdict.retry_after, DAY - 2 * MINUTE);
        let l = build();
        enter_prison(&l);
        assert_eq!(l.current_tier(9, DAY - 1), 2);
        // At its end: tier 1 ended long ago, so from tier 0 the request enters tier 1 again.
        assert_eq!(brief(l.acquire(9, DAY)), (true, 1, ADMIT));
    }

    #[test]
    fn batch_pattern_then_nothing_for_a_day() {
        // One tier: 5000 per 5 minutes, active 5 minutes, then a day of cooldown.
        let build = || limiter(&[tier(5000, 5 * MINUTE, 5 * MINUTE, DAY)]);
        let batch = |l: &TieredLimiter| {
            for i in 0..5000 {
                assert!(l.acquire(3, i * 12 * MS).verdict.allowed, "request {i}");
            }
            let d = l.acquire(3, MINUTE);
            assert_eq!(brief(d), (false, 1, DecidedBy::TierWindow));
            d
        };
        let d = assert_retry_exact(build, batch, 3, 1);
        // The first hit leaves the window at 5 min, exactly when the active period ends and
        // the cooldown starts: the next pass is the cooldown's end.
        assert_eq!(d.at + d.verdict.retry_after, 5 * MINUTE + DAY);
        let l = build();
        batch(&l);
        let d = l.acquire(3, 5 * MINUTE);
        assert_eq!(brief(d), (false, 0, DecidedBy::NoTierEnterable));
        assert_eq!(d.verdict, Verdict::reject(0, 0, DAY));
        assert!(!l.acquire(3, 5 * MINUTE + DAY - 1).verdict.allowed);
        let d = l.acquire(3, 5 * MINUTE + DAY);
        assert_eq!(brief(d), (true, 1, ADMIT));
        assert_eq!(d.verdict.remaining, 4999);
        // A whole batch at once: 5000 copies granted in one decision.
        let l = build();
        let d = l.acquire_many(3, 5000, 5000, 0);
        assert_eq!((d.granted, d.verdict.remaining), (5000, 0));
        assert!(!l.acquire(3, 0).verdict.allowed);
    }

    #[test]
    fn a_cooling_tier_blocks_the_burst_unless_skippable() {
        let t2 = tier(2, SEC, 2 * SEC, 5 * SEC);
        for skip in [false, true] {
            let t2 = if skip { skippable(t2) } else { t2 };
            let build = || limiter(&[tier(2, SEC, 20 * SEC, 0), t2, tier(2, SEC, 10 * SEC, 0)]);
            let script = |l: &TieredLimiter| {
                assert!(l.acquire_many(1, 2, 2, 0).verdict.allowed);
                // Tier 2 is entered at 0: active until 2 s, cooling until 7 s.
                assert_eq!(brief(l.acquire(1, 0)), (true, 2, ADMIT));
                assert_eq!(l.current_tier(1, 2 * SEC), 1);
                assert!(l.acquire_many(1, 2, 2, 3 * SEC).verdict.allowed);
                l.acquire(1, 3 * SEC)
            };
            if skip {
                // The burst passes over cooling tier 2 into tier 3.
                let l = build();
                let d = script(&l);
                assert_eq!(brief(d), (true, 3, ADMIT));
                assert_eq!(d.first_tier, 3);
                continue;
            }
            let d = assert_retry_exact(build, script, 1, 1);
            assert_eq!(brief(d), (false, 1, DecidedBy::NoTierEnterable));
            // Tier 1's oldest hit (3 s) leaves at 4 s, before tier 2's cooldown ends at 7 s.
            assert_eq!(d.verdict.retry_after, SEC);
        }
        // Skipping up to the last tier still finds no tier to enter.
        let l = limiter(&[
            tier(1, SEC, 20 * SEC, 0),
            skippable(tier(1, SEC, SEC, 10 * SEC)),
        ]);
        assert!(l.acquire(5, 0).verdict.allowed);
        assert_eq!(brief(l.acquire(5, 0)), (true, 2, ADMIT));
        assert!(l.acquire(5, 2 * SEC).verdict.allowed);
        let d = l.acquire(5, 2 * SEC);
        assert_eq!(brief(d), (false, 1, DecidedBy::NoTierEnterable));
        assert_eq!(d.verdict.retry_after, SEC);
    }

    #[test]
    fn fallback_drops_several_levels_at_once() {
        let l = limiter(&[
            tier(1, SEC, 100 * SEC, 0),
            tier(1, SEC, 10 * SEC, 0),
            tier(1, SEC, 20 * SEC, 0),
        ]);
        let tiers: Vec<usize> = (0..3).map(|_| l.acquire(8, 0).tier).collect();
        assert_eq!(tiers, [1, 2, 3]);
        // Tier 2 ends at 10 s, under tier 3: nothing changes.
        assert_eq!(l.current_tier(8, 15 * SEC), 3);
        // Tier 3 ends at 20 s: straight down to tier 1, past the ended tier 2.
        assert_eq!(l.current_tier(8, 20 * SEC - 1), 3);
        assert_eq!(l.current_tier(8, 20 * SEC), 1);
        assert_eq!(brief(l.acquire(8, 20 * SEC)), (true, 1, ADMIT));
        // A burst from tier 1 enters tier 2 again (no cooldown), at a new active period.
        assert_eq!(brief(l.acquire(8, 20 * SEC)), (true, 2, ADMIT));
        assert_eq!(l.current_tier(8, 30 * SEC - 1), 2);
        assert_eq!(l.current_tier(8, 30 * SEC), 1);
        assert_eq!(l.current_tier(8, 100 * SEC), 0);
        // With two levels ending at the same instant, the fallback is to tier 0.
        let l = limiter(&[tier(1, SEC, 10 * SEC, 0), tier(1, SEC, 10 * SEC, 0)]);
        assert_eq!(l.acquire(8, 0).tier, 1);
        assert_eq!(l.acquire(8, 0).tier, 2);
        assert_eq!(l.current_tier(8, 10 * SEC), 0);
    }

    #[test]
    fn hard_limit_rejects_whatever_the_tier_and_never_bursts() {
        let tiers = [tier(2, MINUTE, HOUR, 0), tier(100, MINUTE, HOUR, 0)];
        let build = || TieredLimiter::new(&params(&tiers, Some(3), None), 64).unwrap();
        let l = build();
        assert_eq!(brief(l.acquire(1, 0)), (true, 1, ADMIT));
        assert_eq!(brief(l.acquire(1, 0)), (true, 1, ADMIT));
        assert_eq!(
            l.available(1, 0),
            1,
            "the hard limit leaves room for one more"
        );
        assert_eq!(brief(l.acquire(1, 0)), (true, 2, ADMIT));
        let script = |l: &TieredLimiter| {
            for _ in 0..3 {
                assert!(l.acquire(1, 0).verdict.allowed);
            }
            l.acquire(1, 500 * MS)
        };
        let d = assert_retry_exact(build, script, 1, 1);
        // In tier 2, with 99 free, the hard limit rejects until the first hit is a second old.
        assert_eq!(brief(d), (false, 2, DecidedBy::HardLimit));
        assert_eq!(d.verdict, Verdict::reject(99, MINUTE - 500 * MS, 500 * MS));
        // A rejection by the hard limit does not burst: tier 1 full, tier 2 never entered.
        let l = TieredLimiter::new(&params(&tiers, Some(2), None), 64).unwrap();
        assert!(l.acquire_many(1, 2, 2, 0).verdict.allowed);
        let d = l.acquire(1, 0);
        assert_eq!(brief(d), (false, 1, DecidedBy::HardLimit));
        assert_eq!(l.current_tier(1, 0), 1);
        assert_eq!(brief(l.acquire(1, SEC)), (true, 2, ADMIT));
    }

    #[test]
    fn global_limit_counts_all_keys_whatever_their_tier() {
        let tiers = [tier(1, MINUTE, HOUR, 0), tier(10, MINUTE, HOUR, 0)];
        let build = || TieredLimiter::new(&params(&tiers, None, Some(3)), 64).unwrap();
        let script = |l: &TieredLimiter| {
            assert_eq!(brief(l.acquire(1, 100 * MS)), (true, 1, ADMIT));
            assert_eq!(brief(l.acquire(1, 100 * MS)), (true, 2, ADMIT));
            assert!(l.acquire(2, 200 * MS).verdict.allowed);
            // Key 1 (tier 2, 9 free) and key 2 are both over the global limit.
            let d = l.acquire(2, 300 * MS);
            assert_eq!(brief(d), (false, 1, DecidedBy::GlobalLimit));
            assert_eq!(
                l.current_tier(2, 300 * MS),
                1,
                "a global rejection does not burst"
            );
            let d = l.acquire(1, 300 * MS);
            assert_eq!(brief(d), (false, 2, DecidedBy::GlobalLimit));
            d
        };
        let d = assert_retry_exact(build, script, 1, 1);
        assert_eq!(d.verdict.retry_after, 700 * MS, "the next aligned second");
        assert_eq!(d.verdict.remaining, 9);
        // A refund gives a global admission back within its second.
        let l = build();
        script(&l);
        let d = l.acquire(1, SEC);
        assert!(d.verdict.allowed);
        assert!(l.acquire(3, SEC).verdict.allowed);
        assert!(l.acquire(4, SEC).verdict.allowed);
        assert!(!l.acquire(5, SEC).verdict.allowed);
        l.refund(1, &d, SEC + 1);
        assert!(l.acquire(5, SEC + 2).verdict.allowed);
        // A refund in a later second changes nothing: that second has its own count.
        let d = l.acquire(6, 2 * SEC);
        l.refund(6, &d, 3 * SEC);
        assert_eq!(l.available(7, 2 * SEC), 2);
    }

    #[test]
    fn key_state_shows_phases_and_window_counts_and_changes_nothing() {
        let p = params(
            &[tier(2, SEC, 10 * SEC, 5 * SEC), tier(3, SEC, 20 * SEC, 0)],
            Some(10),
            Some(100),
        );
        let build = || TieredLimiter::new(&p, 1024).unwrap();
        let (l, twin) = (build(), build());
        let at = |phase, count| TierState { phase, count };
        let fresh = l.key_state(7, 0);
        assert_eq!(
            fresh,
            TieredKeyState {
                current_tier: 0,
                available: 5,
                tiers: vec![at(Phase::Inactive, 0), at(Phase::Inactive, 0)],
                hard_count: Some(0),
                global_room: Some(100),
            }
        );
        assert!(l.is_empty(0), "reading holds no state");
        // Two fill tier 1, the third bursts into tier 2 (entered at 200 ms).
        for t in [0, 100 * MS, 200 * MS] {
            assert!(l.acquire(7, t).verdict.allowed);
            assert!(twin.acquire(7, t).verdict.allowed);
        }
        let s = l.key_state(7, 300 * MS);
        assert_eq!(
            s,
            TieredKeyState {
                current_tier: 2,
                available: 2,
                tiers: vec![at(Phase::Active, 2), at(Phase::Active, 1)],
                hard_count: Some(3),
                global_room: Some(97),
            }
        );
        assert_eq!(l.key_state(7, 300 * MS), s, "a read is repeatable");
        assert_eq!(s.available, l.available(7, 300 * MS));
        // The hit at 0 has left tier 1's window and the hard second; a new global second.
        let later = l.key_state(7, SEC + 50 * MS);
        assert_eq!(
            later.tiers,
            [at(Phase::Active, 1), at(Phase::Active, 1)],
            "{later:?}"
        );
        assert_eq!(
            (later.hard_count, later.global_room, later.available),
            (Some(2), Some(100), 2)
        );
        // The later read dropped no hit: read at 300 ms again, the state is as it was.
        assert_eq!(l.key_state(7, 300 * MS), s);
        // Tier 1 cools down from 10 s to 15 s; tier 2 is active until 20.2 s.
        let cooling = l.key_state(7, 12 * SEC);
        assert_eq!(
            (cooling.current_tier, &cooling.tiers[..]),
            (2, &[at(Phase::Cooling, 0), at(Phase::Active, 0)][..])
        );
        assert_eq!(l.key_state(7, 16 * SEC).tiers[0].phase, Phase::Inactive);
        let over = l.key_state(7, 21 * SEC);
        assert_eq!(over.current_tier, 0);
        assert_eq!(over.tiers, [at(Phase::Inactive, 0), at(Phase::Inactive, 0)]);
        // Every read left the decisions as a limiter never read makes them.
        for t in [
            SEC + 100 * MS,
            SEC + 150 * MS,
            SEC + 200 * MS,
            SEC + 250 * MS,
        ] {
            assert_eq!(l.acquire(7, t), twin.acquire(7, t), "at {t}");
        }
        // Neither a hard nor a global limit: none shown.
        let plain = limiter(&[tier(2, SEC, SEC, 0)]).key_state(7, 0);
        assert_eq!((plain.hard_count, plain.global_room), (None, None));
        assert_eq!(Phase::Cooling.name(), "cooling");
    }

    #[test]
    fn refund_takes_back_hits_but_not_tier_entries() {
        let tiers = [
            tier(2, MINUTE, 10 * MINUTE, 0),
            tier(5, MINUTE, 10 * MINUTE, HOUR),
        ];
        let l = TieredLimiter::new(&params(&tiers, Some(4), None), 64).unwrap();
        assert!(l.acquire(1, 0).verdict.allowed);
        let d = l.acquire(1, 0);
        l.refund(1, &d, 10 * MS);
        assert_eq!(brief(l.acquire(1, 20 * MS)), (true, 1, ADMIT));
        // The burst into tier 2 is refunded: its hit comes back, its active period stays.
        let d = l.acquire(1, 30 * MS);
        assert_eq!(brief(d), (true, 2, ADMIT));
        l.refund(1, &d, 40 * MS);
        assert_eq!(l.current_tier(1, 40 * MS), 2);
        // Hard limit: 2 of 4 taken in this second, tier 2 all free.
        assert_eq!(l.available(1, 40 * MS), 2);
        assert_eq!(l.acquire(1, 40 * MS).verdict, Verdict::allow(4, MINUTE));
        // A rejected decision has nothing to give back.
        assert!(l.acquire(1, 50 * MS).verdict.allowed);
        let d = l.acquire(1, 60 * MS);
        assert_eq!(brief(d), (false, 2, DecidedBy::HardLimit));
        l.refund(1, &d, 60 * MS);
        assert_eq!(l.available(1, 60 * MS), 0);
        // A batch's refund takes back every copy, across the tiers it filled.
        let l = limiter(&tiers);
        assert!(l.acquire(2, 0).verdict.allowed);
        let d = l.acquire_many(2, 1, 4, 0);
        assert_eq!((d.granted, d.first_tier, d.tier), (4, 1, 2));
        l.refund(2, &d, 0);
        // Tier 2 stays current with its 5 back; tier 1's freed slot is below it.
        assert_eq!((l.current_tier(2, 0), l.available(2, 0)), (2, 5));
        assert_eq!(
            l.available(2, 10 * MINUTE),
            2,
            "back in tier 0, then tier 1"
        );
        // A key evicted or emptied since: nothing to do, nothing breaks.
        l.refund(99, &d, 0);
        l.refund(2, &d, 2 * HOUR);
        assert_eq!(l.available(2, 2 * HOUR), 7);
    }

    #[test]
    fn copies_fill_the_current_tier_then_burst() {
        let tiers = [tier(5, SEC, 10 * SEC, 0), tier(3, SEC, 10 * SEC, 10 * SEC)];
        let l = TieredLimiter::new(&params(&tiers, Some(20), None), 64).unwrap();
        assert_eq!(l.available(1, 0), 8);
        let d = l.acquire_many(1, 1, 4, 0);
        assert_eq!((d.granted, d.tier, d.verdict.remaining), (4, 1, 1));
        // 1 left in tier 1 and 3 in tier 2: the largest count in [3, 10] that fits is 4.
        let d = l.acquire_many(1, 3, 10, 0);
        assert_eq!(
            (d.granted, d.first_tier, d.tier, d.verdict.remaining),
            (4, 1, 2, 0)
        );
        let d = l.acquire_many(1, 1, 1, 0);
        assert_eq!(brief(d), (false, 2, DecidedBy::TierWindow));
        // Exactly filling tier 1 does not enter tier 2.
        let d = l.acquire_many(2, 5, 5, 0);
        assert_eq!((d.granted, d.tier), (5, 1));
        assert_eq!(l.current_tier(2, 0), 1);
        // More than can ever fit: rejected, and a refusal changes nothing (no tier entered,
        // the key as fresh as before); no retry can help it.
        let d = l.acquire_many(3, 9, 9, 0);
        assert_eq!(brief(d), (false, 0, DecidedBy::TierWindow));
        assert_eq!(
            (d.granted, l.available(3, 0), l.current_tier(3, 0)),
            (0, 8, 0)
        );
        assert_eq!(d.verdict.retry_after, NEVER, "never fits");
        // A grant the hard limit cut says so: 20 wanted, 8 in the tiers, then a key whose
        // hard limit (20 a second) is the smaller room.
        let d = l.acquire_many(5, 1, 20, 0);
        assert_eq!((d.granted, d.decided_by), (8, DecidedBy::TierWindow));
        let hard = TieredLimiter::new(&params(&tiers, Some(3), None), 64).unwrap();
        let d = hard.acquire_many(1, 1, 20, 0);
        assert_eq!((d.granted, d.decided_by), (3, DecidedBy::HardLimit));
        let d = hard.acquire_many(2, 4, 20, 0);
        assert_eq!(
            (d.granted, d.decided_by, d.verdict.retry_after),
            (0, DecidedBy::HardLimit, NEVER),
            "MIN above the hard limit never fits"
        );
        let global = TieredLimiter::new(&params(&tiers, Some(20), Some(2)), 64).unwrap();
        let d = global.acquire_many(1, 1, 20, 0);
        assert_eq!((d.granted, d.decided_by), (2, DecidedBy::GlobalLimit));
        // Retry-After of a batch is exact too: 3 copies fit once tier 1 has 3 free.
        let build = || TieredLimiter::new(&params(&tiers, Some(20), None), 64).unwrap();
        let script = |l: &TieredLimiter| {
            assert!(l.acquire_many(4, 2, 2, 0).verdict.allowed);
            assert!(l.acquire_many(4, 2, 2, 100 * MS).verdict.allowed);
            assert!(l.acquire_many(4, 1, 1, 200 * MS).verdict.allowed);
            assert!(l.acquire_many(4, 2, 2, 300 * MS).verdict.allowed);
            l.acquire_many(4, 3, 3, 400 * MS)
        };
        let d = assert_retry_exact(build, script, 4, 3);
        // Tier 2 is current (1 free) until its two hits of 300 ms leave at 1.3 s.
        assert_eq!(d.verdict.retry_after, SEC - 100 * MS);
    }

    #[test]
    fn retry_after_is_exact_with_coarse_time_units() {
        // A day-long window: 131 072 ns units, hits rounded up to them.
        let tiers = [tier(2, DAY, 2 * DAY, 0), tier(1, HOUR, HOUR, DAY)];
        let build = || TieredLimiter::new(&params(&tiers, Some(3), None), 64).unwrap();
        assert_eq!(build().shape.shift, 17);
        for offsets in [[0, 1, 2], [12_345, 999_999, 1_000_001], [7, 7, 131_073]] {
            let script = |l: &TieredLimiter| {
                for (i, o) in offsets.iter().enumerate() {
                    assert!(l.acquire(6, i as Nanos * HOUR + o).verdict.allowed);
                }
                l.acquire(6, 3 * HOUR)
            };
            let d = assert_retry_exact(build, script, 6, 1);
            // Hits count at most one unit longer than exactly, never shorter.
            let exact = DAY + offsets[0] - 3 * HOUR;
            assert!((exact..exact + (1 << 17)).contains(&d.verdict.retry_after));
        }
    }

    #[test]
    fn offsets_rebase_without_losing_hits() {
        // 1 ns units: the base moves every ~1.07 s of a key's continuous traffic.
        let l = limiter(&[tier(3, SEC, 1000 * SEC, 0)]);
        let mut model: Vec<Nanos> = Vec::new();
        for i in 0..400u64 {
            let now = i * 77 * MS;
            model.retain(|&h| h + SEC > now);
            let d = l.acquire(2, now);
            assert_eq!(d.verdict.allowed, model.len() < 3, "at {now}");
            if d.verdict.allowed {
                model.push(now);
            } else {
                assert_eq!(d.verdict.retry_after, model[0] + SEC - now);
            }
        }
    }

    #[test]
    fn the_table_never_holds_more_than_its_slots() {
        let tiers = [tier(10, SEC, 10 * SEC, 0)];
        let l = TieredLimiter::new(&params(&tiers, None, None), 1_000).unwrap();
        for i in 0..200_000 {
            assert!(l.acquire(spread(i), 0).verdict.allowed);
            if i % 997 == 0 {
                assert!(l.len(0) <= 1_000, "len {}", l.len(0));
            }
        }
        // Every set filled up, then each newcomer evicted exactly one key.
        assert_eq!((l.len(0), l.evictions()), (1_000, 199_000));
        assert_eq!(size_of::<Set>(), 200);
        // 26 bytes of table and hints, a 64-byte metadata line and 4 bytes per log slot, per
        // key.
        let p = |tiers: &[Tier], hard| params(tiers, hard, None);
        let (small, design) = (
            [tier(20, SEC, 10 * SEC, 0), tier(50, SEC, 5 * SEC, MINUTE)],
            [
                tier(100, MINUTE, 10 * MINUTE, 0),
                tier(300, MINUTE, 5 * MINUTE, HOUR),
            ],
        );
        assert_eq!(TieredLimiter::bytes_per_key(&p(&small, Some(10))), 410);
        assert_eq!(TieredLimiter::bytes_per_key(&p(&design, Some(50))), 1_890);
        let three = [small[0], small[1], small[0]];
        assert_eq!(
            TieredLimiter::bytes_per_key(&p(&three, None)),
            26 + 128 + 360
        );
        assert_eq!(TieredLimiter::bytes_per_key(&p(&[], None)), 0);
        let l = TieredLimiter::new(&p(&design, Some(50)), 100_000).unwrap();
        assert_eq!(
            l.reserved_bytes(),
            2_500_000 + 100_000 + 6_400_128 + 180_000_000
        );
        // max_keys 0 is 1: one set of 8 ways.
        let l = TieredLimiter::new(&p(&tiers, None), 0).unwrap();
        for key in 1..=9 {
            assert!(l.acquire(key, 0).verdict.allowed);
        }
        assert_eq!((l.len(0), l.evictions()), (8, 1));
        assert!(matches!(
            TieredLimiter::new(&p(&design, None), usize::MAX),
            Err(TieredError::TooLarge { .. })
        ));
    }

    #[test]
    fn light_keys_never_touch_the_log_arena() {
        let tiers = [tier(5, SEC, 10 * SEC, 0), tier(5, SEC, 10 * SEC, 0)];
        let l = TieredLimiter::new(&params(&tiers, Some(5), None), 64).unwrap();
        let untouched = |l: &TieredLimiter| l.logs.iter().all(|w| w.load(Ordering::Relaxed) == 0);
        // Two hits per window at most: both ends of each ring live in the metadata.
        for i in 0..40 {
            assert!(l.acquire(spread(i % 8), i * 300 * MS).verdict.allowed);
        }
        assert!(untouched(&l));
        // A third hit in a window turns the newest into a hit in between: a slot is written.
        // (Offsets count from the key's first hit, so an earlier hit makes them non-zero.)
        let at = 40 * 300 * MS;
        assert!(l.acquire(spread(9), at - 100 * MS).verdict.allowed);
        assert!(l.acquire_many(spread(9), 3, 3, at).verdict.allowed);
        assert!(!untouched(&l));
        assert_eq!(l.available(spread(9), at), 1);
        assert_eq!(l.available(spread(9), at + SEC), 5);
    }

    #[test]
    fn emptied_state_is_reused_and_eviction_fails_open() {
        // max_keys 8: one set, shared by every key.
        let tiers = [tier(2, MINUTE, 10 * MINUTE, 0)];
        let l = TieredLimiter::new(&params(&tiers, None, None), 8).unwrap();
        assert!(l.acquire_many(1, 2, 2, 0).verdict.allowed);
        assert!(!l.acquire(1, 0).verdict.allowed);
        for key in 2..=8 {
            assert!(l.acquire(key, SEC).verdict.allowed);
        }
        // Key 9 evicts the key whose forgetting admits least: one of those with one hit
        // (key 8, in the first way of equals), never key 1, at its limit.
        assert!(l.acquire(9, SEC).verdict.allowed);
        assert_eq!((l.len(SEC), l.evictions()), (8, 1));
        assert!(!l.acquire(1, SEC).verdict.allowed);
        // Key 8 starts again as new: it fails open, never wrongly denied.
        assert_eq!(l.available(8, SEC), 2);
        assert_eq!(brief(l.acquire(8, SEC)), (true, 1, ADMIT));
        assert_eq!(l.evictions(), 2);
        assert_eq!(l.available(1, SEC), 0);
        // At 10 min 1 s every state has emptied: newcomers reuse ways without evicting.
        let later = 10 * MINUTE + SEC;
        assert!(l.is_empty(later));
        for key in 10..=17 {
            assert!(l.acquire(key, later).verdict.allowed);
        }
        assert_eq!((l.len(later), l.evictions()), (8, 2));
    }

    /// Requests of new keys, each sent `times` times 10 µs apart from `from`, until `user`
    /// would be admitted again; `None` if it is still refused after `most`.
    fn flood_frees(
        l: &TieredLimiter,
        user: u64,
        times: u64,
        most: u64,
        from: Nanos,
    ) -> Option<u64> {
        let mut sent = 0;
        for i in 0.. {
            let key = spread(1_000_000 + i);
            for _ in 0..times {
                l.acquire(key, from + sent * 10_000);
                sent += 1;
            }
            if l.available(user, from + sent * 10_000) > 0 {
                return Some(sent);
            }
            if sent >= most {
                return None;
            }
        }
        None
    }

    #[test]
    fn a_flood_of_new_keys_never_frees_a_capped_key() {
        // A user at its limit of 3 a day, then a flood of fresh keys. Before victims were
        // scored, the idle capped key was the one emptying first, so it was evicted: after
        // 940 requests with max_keys 1 000, 92 545 with 100 000 (this test on the old
        // choice).
        let capped = [tier(3, DAY, DAY, 0)];
        // Or held in a closed penalty tier: 2 more in a minute, then closed for an hour.
        let penalty = [tier(3, DAY, DAY, 0), tier(2, MINUTE, MINUTE, HOUR)];
        for (tiers, needed) in [(&capped[..], 3), (&penalty[..], 5)] {
            for max_keys in [1_000, 100_000] {
                let l = TieredLimiter::new(&params(tiers, None, None), max_keys).unwrap();
                let user = spread(7);
                for i in 0..needed {
                    assert!(l.acquire(user, i * MINUTE / 10).verdict.allowed);
                }
                assert!(!l.acquire(user, 2 * MINUTE).verdict.allowed);
                let freed = flood_frees(&l, user, 1, 350_000, 3 * MINUTE);
                assert_eq!(freed, None, "max_keys {max_keys}, {} tiers", tiers.len());
                assert!(
                    l.evictions() > 350_000 - max_keys as u64,
                    "{}",
                    l.evictions()
                );
                assert!(!l.acquire(user, 4 * MINUTE).verdict.allowed);
            }
        }
    }

    #[test]
    fn normalize_removes_shortens_and_trims_with_warnings() {
        let given = params(
            &[
                tier(10, MINUTE, 0, 0),
                tier(20, 10 * MINUTE, 5 * MINUTE, 0),
                tier(30, MINUTE, 10 * MINUTE + 30 * SEC, HOUR),
                tier(0, SEC, SEC, 0),
            ],
            Some(5),
            Some(100),
        );
        let n = normalize(&given).unwrap();
        assert_eq!(
            n.params,
            params(
                &[
                    tier(20, 5 * MINUTE, 5 * MINUTE, 0),
                    tier(30, MINUTE, 10 * MINUTE, HOUR),
                    tier(0, SEC, SEC, 0),
                ],
                Some(5),
                Some(100),
            )
        );
        assert_eq!(
            n.changes,
            [
                TierChange::Removed { tier: 1 },
                TierChange::WindowShortened {
                    tier: 2,
                    from: 10 * MINUTE,
                    to: 5 * MINUTE
                },
                TierChange::ActiveTrimmed {
                    tier: 3,
                    from: 10 * MINUTE + 30 * SEC,
                    to: 10 * MINUTE
                },
                TierChange::ZeroLimit { tier: 4 },
            ]
        );
        let warnings: Vec<bool> = n.changes.iter().map(TierChange::is_warning).collect();
        assert_eq!(warnings, [true, false, true, true]);
        assert_eq!(
            n.changes[2].to_string(),
            "tier 3: active time 10m 30s is not a multiple of the window, trimmed to 10m \
             (a partial last window would let a customer over the limit)"
        );
        assert_eq!(
            n.changes[1].to_string(),
            "tier 2: window 10m is longer than the active time, shortened to 5m"
        );
        // The limiter runs on the normalized tiers: tier 1 is the given tier 2.
        let l = TieredLimiter::new(&given, 64).unwrap();
        assert_eq!(l.params(), &n.params);
        assert_eq!(l.acquire_many(1, 5, 5, 0).tier, 1);
        // A tier of limit 0 passes every burst on.
        let l = limiter(&[tier(0, SEC, SEC, 0), tier(1, SEC, SEC, 0)]);
        assert_eq!(brief(l.acquire(1, 0)), (true, 2, ADMIT));
        assert_eq!(l.current_tier(1, 0), 2);
        // Durations are clamped, not overflowed.
        let huge = normalize(&params(
            &[tier(1, u64::MAX, u64::MAX, u64::MAX)],
            None,
            None,
        ));
        assert_eq!(huge.unwrap().params.tiers[0].cooldown, MAX_DURATION);
    }

    #[test]
    fn normalize_rejects_unusable_parameters() {
        let ok = tier(1, SEC, SEC, 0);
        let err = |tiers: &[Tier], hard, global| normalize(&params(tiers, hard, global)).err();
        assert_eq!(err(&[], None, None), Some(TieredError::NoTiers));
        assert_eq!(
            err(&[tier(1, SEC, 0, 0)], None, None),
            Some(TieredError::NoActiveTier)
        );
        assert_eq!(
            err(&[ok; MAX_TIERS + 1], None, None),
            Some(TieredError::TooManyTiers { count: 17 })
        );
        assert!(err(&[ok; MAX_TIERS], None, None).is_none());
        assert_eq!(
            err(&[ok, tier(1, 0, SEC, 0)], None, None),
            Some(TieredError::ZeroWindow { tier: 2 })
        );
        assert_eq!(
            err(&[tier(MAX_LIMIT + 1, SEC, SEC, 0)], None, None),
            Some(TieredError::LimitTooLarge {
                tier: 1,
                limit: MAX_LIMIT + 1
            })
        );
        assert_eq!(err(&[ok], Some(0), None), Some(TieredError::HardLimit(0)));
        assert_eq!(err(&[ok], None, Some(0)), Some(TieredError::GlobalLimit(0)));
        assert_eq!(
            err(&[ok], None, Some(MAX_GLOBAL_LIMIT + 1)),
            Some(TieredError::GlobalLimit(MAX_GLOBAL_LIMIT + 1))
        );
        assert_eq!(
            TieredError::ZeroWindow { tier: 2 }.to_string(),
            "tier 2: window must be longer than 0"
        );
        assert!(TieredLimiter::new(&params(&[], None, None), 8).is_err());
    }

    #[test]
    fn threads_share_one_key_exactly() {
        let tiers = [tier(600, DAY, DAY, 0), tier(400, DAY, DAY, 0)];
        let l = TieredLimiter::new(&params(&tiers, None, Some(5_000)), 64).unwrap();
        let admitted: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|t| {
                    let l = &l;
                    s.spawn(move || {
                        (0..500)
                            .filter(|i| l.acquire(9, t * 1_000 + i).verdict.allowed)
                            .count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        assert_eq!(admitted, 1_000);
        assert_eq!((l.current_tier(9, 10_000), l.available(9, 10_000)), (2, 0));
    }

    #[test]
    fn threads_on_many_keys_keep_the_bound() {
        let tiers = [tier(2, SEC, 10 * SEC, 0), tier(2, SEC, 10 * SEC, 0)];
        let l = TieredLimiter::new(&params(&tiers, Some(3), Some(1 << 30)), 64).unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let l = &l;
                s.spawn(move || {
                    assert!((0..20_000).all(|i| l.acquire(spread(t << 20 | i), i).verdict.allowed))
                });
            }
        });
        assert!(l.len(20_000) <= 64 && l.evictions() > 0);
    }

    // -------------------------------------------------------------------------------------
    // The semantics written literally, with no table, no eviction and no compact log: the
    // oracle of the proptests.

    #[derive(Debug, Clone)]
    struct Model {
        tiers: Vec<Tier>,
        hard: Option<u64>,
        entered: Vec<Option<Nanos>>,
        logs: Vec<Vec<Nanos>>,
        hard_log: Vec<Nanos>,
    }

    #[derive(Debug, Clone)]
    struct GlobalModel {
        limit: Option<u64>,
        second: u64,
        count: u64,
    }

    impl GlobalModel {
        fn room(&self, now: Nanos) -> u64 {
            match self.limit {
                None => u64::MAX,
                Some(g) if now / SEC > self.second => g,
                Some(g) => g - self.count,
            }
        }

        fn take(&mut self, n: u64, now: Nanos) {
            if now / SEC > self.second {
                (self.second, self.count) = (now / SEC, 0);
            }
            self.count += n;
        }

        fn refund(&mut self, n: u64, at: Nanos, now: Nanos) {
            if self.limit.is_some() && now / SEC == at / SEC && self.second == at / SEC {
                self.count -= n.min(self.count);
            }
        }
    }

    impl Model {
        fn new(p: &TieredParams) -> Self {
            Self {
                tiers: p.tiers.clone(),
                hard: p.hard_limit,
                entered: vec![None; p.tiers.len()],
                logs: vec![Vec::new(); p.tiers.len()],
                hard_log: Vec::new(),
            }
        }

        /// Phase of tier `i` (0-based) at `t`.
        fn phase(&self, i: usize, t: Nanos) -> Phase {
            let Some(e) = self.entered[i] else {
                return Phase::Inactive;
            };
            let tier = &self.tiers[i];
            if t < e + tier.active {
                Phase::Active
            } else if t < e + tier.active + tier.cooldown {
                Phase::Cooling
            } else {
                Phase::Inactive
            }
        }

        fn current(&self, t: Nanos) -> usize {
            (1..=self.tiers.len())
                .rev()
                .find(|&j| self.phase(j - 1, t) == Phase::Active)
                .unwrap_or(0)
        }

        fn count(&self, i: usize, t: Nanos) -> u64 {
            let w = self.tiers[i].window;
            self.logs[i].iter().filter(|&&h| h + w > t).count() as u64
        }

        fn hard_room(&self, t: Nanos) -> u64 {
            self.hard.map_or(u64::MAX, |h| {
                h - self.hard_log.iter().filter(|&&x| x + SEC > t).count() as u64
            })
        }

        /// One request through the tiers, exactly as the paper puts it.
        fn unit(&mut self, now: Nanos) -> Result<usize, DecidedBy> {
            let c = self.current(now);
            if c > 0 && self.count(c - 1, now) < self.tiers[c - 1].limit {
                self.logs[c - 1].push(now);
                return Ok(c);
            }
            let mut end = DecidedBy::TierWindow;
            for j in c + 1..=self.tiers.len() {
                if self.phase(j - 1, now) == Phase::Cooling {
                    if self.tiers[j - 1].skippable {
                        end = DecidedBy::NoTierEnterable;
                        continue;
                    }
                    return Err(DecidedBy::NoTierEnterable);
                }
                self.entered[j - 1] = Some(now);
                if self.count(j - 1, now) < self.tiers[j - 1].limit {
                    self.logs[j - 1].push(now);
                    return Ok(j);
                }
                end = DecidedBy::TierWindow;
            }
            Err(end)
        }

        /// `min..=max` copies: hard limit, then the copies one at a time through the tiers,
        /// then the global limit.
        fn acquire(
            &mut self,
            g: &mut GlobalModel,
            min: u64,
            max: u64,
            now: Nanos,
        ) -> (u64, DecidedBy) {
            let hard_room = self.hard_room(now);
            if hard_room < min {
                return (0, DecidedBy::HardLimit);
            }
            let want = max.min(hard_room);
            let mut trial = self.clone();
            let mut placed = Vec::new();
            let mut failed = DecidedBy::TierWindow;
            while (placed.len() as u64) < want {
                match trial.unit(now) {
                    Ok(tier) => placed.push(tier),
                    Err(by) => {
                        failed = by;
                        break;
                    }
                }
            }
            let fit = placed.len() as u64;
            if fit < min {
                // A refusal changes nothing: the trial, tiers entered and all, is dropped.
                return (0, failed);
            }
            let room = g.room(now);
            if room < min {
                return (0, DecidedBy::GlobalLimit);
            }
            let take = fit.min(room);
            for _ in 0..take {
                self.unit(now).unwrap();
            }
            self.hard_log.extend((0..take).map(|_| now));
            g.take(take, now);
            // Which limit cut the grant below `max`: the global limit, else the hard one.
            let by = if take < fit {
                DecidedBy::GlobalLimit
            } else if fit < max && fit == hard_room {
                DecidedBy::HardLimit
            } else {
                DecidedBy::TierWindow
            };
            (take, by)
        }

        fn available(&self, g: &GlobalModel, now: Nanos) -> u64 {
            let mut trial = self.clone();
            let mut fit = 0;
            while trial.unit(now).is_ok() {
                fit += 1;
            }
            fit.min(self.hard_room(now)).min(g.room(now))
        }

        fn headline(&self, now: Nanos) -> (usize, u64, Nanos) {
            let c = self.current(now);
            if c == 0 {
                return (0, 0, 0);
            }
            let w = self.tiers[c - 1].window;
            let reset = self.logs[c - 1].iter().map(|&h| h + w).max().unwrap_or(0);
            (
                c,
                self.tiers[c - 1].limit - self.count(c - 1, now),
                reset.saturating_sub(now),
            )
        }

        fn refund(&mut self, g: &mut GlobalModel, d: &TieredDecision, now: Nanos) {
            g.refund(d.granted, d.at, now);
            let mut left = d.granted;
            for tier in (d.first_tier..=d.tier).rev() {
                let w = self.tiers[tier - 1].window;
                let log = &mut self.logs[tier - 1];
                log.retain(|&h| h + w > now);
                while left > 0 && log.last().is_some_and(|&h| h >= d.at) {
                    log.pop();
                    left -= 1;
                }
            }
            self.hard_log.retain(|&h| h + SEC > now);
            for _ in 0..d.granted {
                if self.hard_log.last().is_some_and(|&h| h >= d.at) {
                    self.hard_log.pop();
                }
            }
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Acquire { min: u64, max: u64 },
        Refund,
        Peek,
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => Just(Step::Acquire { min: 1, max: 1 }),
            2 => (1u64..4, 0u64..5).prop_map(|(min, more)| Step::Acquire { min, max: min + more }),
            1 => Just(Step::Refund),
            1 => Just(Step::Peek),
        ]
    }

    /// Parameters whose durations are multiples of `unit` ns.
    fn arb_params(unit: Nanos, spans: u64) -> impl Strategy<Value = TieredParams> {
        let tier = (0u64..5, 1..spans, 1..4 * spans, 0..4 * spans, any::<bool>()).prop_map(
            move |(limit, window, active, cooldown, skippable)| Tier {
                limit,
                window: window * unit,
                active: active * unit,
                cooldown: cooldown * unit,
                skippable,
            },
        );
        (
            prop::collection::vec(tier, 1..4),
            prop::option::of(1u64..7),
            prop::option::of(1u64..13),
        )
            .prop_map(|(tiers, hard_limit, global_limit)| TieredParams {
                tiers,
                hard_limit,
                global_limit,
            })
    }

    /// Steps of (key, advance in grid steps, step).
    fn arb_steps(keys: u64) -> impl Strategy<Value = Vec<(u64, u64, Step)>> {
        prop::collection::vec((0..keys, 0u64..30, arb_step()), 1..150)
    }

    fn check_against_model(
        given: &TieredParams,
        steps: &[(u64, u64, Step)],
        grid: Nanos,
    ) -> Result<(), TestCaseError> {
        let l = TieredLimiter::new(given, 1 << 12).unwrap();
        let p = l.params().clone();
        // Times on the grid are whole time units: the stored hits are exact.
        let grid = grid.next_multiple_of(1 << l.shape.shift);
        let cap = p.tiers.iter().map(|t| t.limit).sum::<u64>();
        let cap = cap.min(p.hard_limit.unwrap_or(u64::MAX));
        let cap = cap.min(p.global_limit.unwrap_or(u64::MAX));
        let mut models: HashMap<u64, Model> = HashMap::new();
        let mut last: HashMap<u64, TieredDecision> = HashMap::new();
        let mut g = GlobalModel {
            limit: p.global_limit,
            second: 0,
            count: 0,
        };
        let mut now = 0;
        for &(key, advance, step) in steps {
            now += advance * grid;
            let model = models.entry(key).or_insert_with(|| Model::new(&p));
            let k = spread(key);
            match step {
                Step::Peek => {
                    prop_assert_eq!(l.available(k, now), model.available(&g, now));
                    prop_assert_eq!(l.current_tier(k, now), model.current(now));
                }
                Step::Refund => {
                    if let Some(d) = last.remove(&key) {
                        l.refund(k, &d, now);
                        model.refund(&mut g, &d, now);
                        prop_assert_eq!(l.available(k, now), model.available(&g, now));
                    }
                }
                Step::Acquire { min, max } => {
                    let (before, g_before) = (model.clone(), g.clone());
                    let d = l.acquire_many(k, min, max, now);
                    let (granted, by) = model.acquire(&mut g, min, max, now);
                    prop_assert_eq!((d.granted, d.decided_by), (granted, by), "{:?}", d);
                    prop_assert_eq!(d.verdict.allowed, granted > 0);
                    let (tier, remaining, reset) = model.headline(now);
                    prop_assert_eq!(
                        (d.tier, d.verdict.remaining, d.verdict.reset_after),
                        (tier, remaining, reset)
                    );
                    if granted > 0 {
                        last.insert(key, d);
                    } else if min > cap {
                        prop_assert_eq!(d.verdict.retry_after, NEVER, "never fits");
                    } else {
                        // Retry-After against the oracle: 1 ns early fails, on time passes.
                        let (mut m, mut gm) = (before.clone(), g_before.clone());
                        m.acquire(&mut gm, min, max, now);
                        let at = now + d.verdict.retry_after;
                        let (mut early, mut ge) = (m.clone(), gm.clone());
                        prop_assert_eq!(early.acquire(&mut ge, min, min, at - 1).0, 0);
                        prop_assert!(m.acquire(&mut gm, min, min, at).0 >= min);
                    }
                }
            }
        }
        prop_assert_eq!(l.evictions(), 0);
        Ok(())
    }

    proptest! {
        #[test]
        fn matches_the_model_for_one_key(p in arb_params(10 * MS, 60), steps in arb_steps(1)) {
            check_against_model(&p, &steps, 10 * MS)?;
        }

        #[test]
        fn matches_the_model_for_several_keys(
            p in arb_params(10 * MS, 60),
            steps in arb_steps(4),
        ) {
            check_against_model(&p, &steps, 10 * MS)?;
        }

        #[test]
        fn matches_the_model_with_coarse_units(p in arb_params(SEC, 600), steps in arb_steps(2)) {
            check_against_model(&p, &steps, 7 * SEC)?;
        }
    }
}
