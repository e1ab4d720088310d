//! Leases: a hot key's shared quota taken from the store in slices and spent locally.
//!
//! A limit kept in a shared store costs a round trip per decision. For a key that is
//! decided often on one instance (a *hot* key), that instance instead takes a *slice* of
//! the key's quota from the store in one call (tokens out of a bucket, counts in the
//! current period of a rate, slots of a concurrency or inflight max) and admits from it
//! with no call at all, renewing it in the background before it runs out. This module is
//! the pure part: no store, no Pingora type, time passed in by the caller.
//!
//! - [`hot`]: which keys are hot on this instance ([`HotKeys`]): decisions per second above
//!   `hot_above`, lock-free, in a fixed table.
//! - [`size`]: how much one slice takes ([`SliceSizer`]): about `renew_every` worth at the
//!   key's local rate, capped at `max_share` of the limit, shrinking toward 1 as the shared
//!   remainder nears `instances × slice`.
//! - [`slice`]: one key's held slice ([`Slice`]): admission with atomics (no allocation,
//!   no lock, no syscall), the low-water mark that asks for a renewal, the idle give-back,
//!   and the blocks of slots of the holding kinds with hysteresis.
//!
//! **The bound.** Quota is taken from the store before it is spent, and a slice only ever
//! admits what was granted to it (plus, for holding kinds, the slots its own requests
//! released back to it), so the fleet never admits more than the limit: **overshoot is 0
//! by construction**. The error a lease can cause is the opposite one, under-admission:
//! quota held by one instance while another is refused. At any instant it is at most
//!
//! ```text
//!     U(t) = Σ_i held_i(t)        (quota leased to instance i and not yet spent)
//!          ≤ Σ_i slice_i ≤ n · min(⌈r_i · renew_every⌉, ⌊max_share · limit⌋)
//! ```
//!
//! over the `n` instances holding a slice of the key, where `r_i` is the key's rate on
//! instance `i`; and once the shared remainder `R` the store reports falls below
//! `n · slice`, each new slice is `max(1, ⌊R / n⌋)`, so the quota the fleet holds unused
//! is at most `R + n` when the limit is reached: the last units are handed out one by one
//! and a limit being reached is decided (nearly) exactly. An idle slice goes back after
//! `idle` (so an instance that stopped seeing the key holds nothing after `idle`), and a
//! crashed instance's slice is lost only until it would have refilled (bucket), until the
//! period ends (rate) or until its lease lapses (slots). `held_i` is what
//! `tollgate_store_leased{store,origin,limit}` exports, so an operator reads the bound
//! directly as the sum of that gauge over the fleet.
//!
//! How the runtime uses these pieces is described in `docs/architecture.md`.

pub mod hot;
pub mod size;
pub mod slice;

pub use hot::HotKeys;
pub use size::SliceSizer;
pub use slice::{Admit, Slice};

use crate::limits::clock::{Nanos, NANOS_PER_SEC};

/// Parts per million: the unit of [`LeaseParams::max_share`].
pub const PPM: u64 = 1_000_000;

/// A limit's lease settings (config `lease: {hot_above, max_share, renew_every, idle}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseParams {
    /// Decisions per second on this instance above which a key is hot and leased
    /// (`hot_above`, default 20/s): below it a slice would mostly sit idle, so cold keys
    /// keep one call per decision.
    pub hot_above: u64,
    /// The largest share of the limit one slice takes, in parts per million (`max_share`,
    /// default 1% = 10 000): what one instance can hold unused is at most this much of the
    /// limit per key.
    pub max_share: u64,
    /// How long a slice should last at the key's local rate (`renew_every`, default
    /// 100 ms): the renewal period of a steady hot key, so its calls per second are about
    /// `1 / renew_every` whatever its rate.
    pub renew_every: Nanos,
    /// A slice unused this long goes back to the store (`idle`, default 2 s).
    pub idle: Nanos,
}

impl Default for LeaseParams {
    fn default() -> Self {
        Self {
            hot_above: 20,
            max_share: PPM / 100,
            renew_every: NANOS_PER_SEC / 10,
            idle: 2 * NANOS_PER_SEC,
        }
    }
}
