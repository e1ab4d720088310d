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
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::limits::clock::Nanos;
use crate::limits::table::{self, Table};
use crate::limits::verdict::Verdict;

mod chain;
mod global;
mod layout;
mod limiter;
mod params;
mod restore;
#[cfg(test)]
mod tests;

pub use params::{normalize, Normalized, Tier, TierChange, TieredError, TieredParams};
pub use restore::TieredEntry;

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
