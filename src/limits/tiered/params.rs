//! A tiered limit's parameters, their validation and the paper's load-time optimizations
//! ([`normalize`]).

use std::fmt;
use std::time::Duration;

use thiserror::Error;

use super::{MAX_DURATION, MAX_GLOBAL_LIMIT, MAX_LIMIT, MAX_TIERS};
use crate::limits::clock::Nanos;

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
