//! Which key a full set of a per-key table forgets to make room for a new one.
//!
//! The per-key tables (token bucket, rate, sliding log, tiered) are set-associative: a key
//! hashes to one set of 8 ways, and a new key that finds its set full must take a way from a
//! key holding state. Forgetting a key's state makes that key start again as new: it fails
//! open (it is never wrongly denied) and may be wrongly admitted until its state would have
//! emptied anyway. So each kind scores a way by what forgetting it would wrongly admit, and
//! the newcomer takes the way of least [`Score`]:
//!
//! - [`Score::loss`]: the admissions a new key gets at once that this key's state refuses
//!   now: the room a new key has minus the room this key has left (for a sliding log, the
//!   smallest window `max` minus the smallest room over the windows; for tiered, what a new
//!   key could take through the hard limit and the tiers a burst reaches minus what this key
//!   can). A key with one hit in a long window loses 1, a key at its cap loses the whole
//!   cap: a capped key is never forgotten while its set holds a key further from its cap.
//! - [`Score::empties_at`] on equal loss: the instant the key's state equals a new key's
//!   (its last entry leaves its window, its tiers' cooldowns end). The key that empties
//!   soonest is forgotten first: its wrong admissions can happen only until then.
//!
//! A way whose state has already emptied scores [`Score::FREE`]: taking it loses nothing and
//! is not an eviction.
//!
//! **What a key flood can still do.** With `S = ⌈max_keys / 8⌉` sets and keys spread
//! uniformly over them, a key whose loss is `c` (`c` = the cap for a capped key) is forgotten
//! only when the 7 other ways of its set all hold keys of loss at least `c` (which empty
//! later, for an idle key) and one more new key arrives in the set. A flood key reaches loss
//! `c` only by being admitted `c` times. So:
//!
//! - a flood of fresh keys sent once each never frees a key capped at `c ≥ 2`, however
//!   large the flood (each flood key loses 1 and is forgotten first);
//! - a flood of keys each sent `c` times frees it once 7 of them land in its set while
//!   their state lives: about `7·S` flood keys, `7·S·c ≈ 0.875 · max_keys · c` admitted
//!   requests (with `max_keys: 1000` and a cap of 3 a day: about 875 keys sent 3 times each,
//!   2 600 requests, within the day);
//! - with a cap of 1 (`c = 1`) every admitted key is capped, so a flood of about
//!   `0.875 · max_keys` fresh keys frees an idle capped key, as it would any other key: size
//!   `max_keys` well above the keys expected within the longest window.
//!
//! Scoring reads each way of the set once, only when a new key finds its set full; a
//! decision for a key already in the table never scores anything.

use crate::limits::clock::Nanos;

/// What forgetting one key's state would wrongly admit; ordered field by field, and the
/// least is the victim (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Score {
    /// Admissions a new key would get at once that this key's state refuses now.
    pub loss: u64,
    /// When this key's state would equal a new key's anyway.
    pub empties_at: Nanos,
}

impl Score {
    /// A way whose state equals a new key's: taking it loses nothing.
    pub const FREE: Score = Score {
        loss: 0,
        empties_at: 0,
    };

    /// The score of a key whose state refuses `loss` admissions a new key would get, and
    /// empties at `empties_at`; [`Score::FREE`] if that is not after `now`.
    pub fn new(loss: u64, empties_at: Nanos, now: Nanos) -> Score {
        if empties_at <= now {
            Score::FREE
        } else {
            Score { loss, empties_at }
        }
    }

    /// Whether taking the way loses nothing.
    pub fn is_free(self) -> bool {
        self == Score::FREE
    }
}

/// How a kind ranks a way for eviction: the least rank is taken. Every free rank (a way
/// whose state equals a new key's) is equal to every other free one and below every rank
/// that is not free, so the first free way is the least.
pub trait Rank: Ord + Copy {
    /// Whether taking the way loses nothing.
    fn is_free(self) -> bool;
}

impl Rank for Score {
    fn is_free(self) -> bool {
        Score::is_free(self)
    }
}

/// The way of least rank among `scores` (the first of equals), and whether taking it
/// forgets live state (an eviction, to be counted). Stops at the first free way.
pub fn choose<R: Rank>(scores: impl IntoIterator<Item = R>) -> (usize, bool) {
    let mut best: Option<(R, usize)> = None;
    for (way, score) in scores.into_iter().enumerate() {
        if score.is_free() {
            return (way, false);
        }
        if best.is_none_or(|(b, _)| score < b) {
            best = Some((score, way));
        }
    }
    best.map_or((0, false), |(_, way)| (way, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loss_goes_first_then_the_soonest_to_empty() {
        let s = |loss, empties_at| Score::new(loss, empties_at, 10);
        // A capped key (loss 3) outlives keys with one hit, whenever they empty.
        assert_eq!(choose([s(3, 11), s(1, 1_000), s(1, 500)]), (2, true));
        // On equal loss, the one that empties soonest.
        assert_eq!(choose([s(3, 900), s(3, 11), s(3, 500)]), (1, true));
        // A way that has emptied is taken at once, and is no eviction.
        assert_eq!(choose([s(0, 20), s(5, 10), s(0, 30)]), (1, false));
        assert!(s(7, 10).is_free() && !s(0, 11).is_free());
    }
}
