//! The size of the inflight limiter's count-min sketch, and its
//! bounds: the config refuses a larger sketch, and a limiter handed one anyway builds
//! [`SketchSize::clamped`] instead, so no value can make it allocate more.

/// Rows × columns of a count-min sketch.
///
/// With `h` hashes and `w` slots a key's estimate never undercounts, and overcounts only
/// when, in every one of the `h` rows, another key landed in its slot. When `n` distinct
/// keys are live at once, the odds that one key's estimate is inflated at all are about
/// `(1 - e^(-n/w))^h ≈ (n/w)^h` for `n ≪ w`: 4 × 8192 with 1 000 live keys gives ≈ 2e-4.
/// Memory is `h × w × 8` bytes (256 KiB for 4 × 8192), fixed whatever the number of keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SketchSize {
    /// Rows, each with its own hash function.
    pub hashes: usize,
    /// Counters per row.
    pub slots: usize,
}

impl SketchSize {
    /// pingora-limits' `Inflight` size: 4 hashes × 8192 slots.
    pub const DEFAULT: SketchSize = SketchSize {
        hashes: 4,
        slots: 8192,
    };

    /// The most rows a sketch may have: beyond 16 rows a collision is already
    /// astronomically unlikely, and every row costs each decision a hash and an atomic.
    pub const MAX_HASHES: usize = 16;

    /// The most counters (`hashes × slots`) one sketch may have: 2²⁴, 128 MiB. Room for
    /// millions of live keys at negligible overcounting odds.
    pub const MAX_COUNTERS: usize = 1 << 24;

    /// Bytes per counter (an `AtomicIsize`).
    pub const COUNTER_BYTES: usize = std::mem::size_of::<std::sync::atomic::AtomicIsize>();

    /// `hashes × slots`, saturating.
    pub fn counters(self) -> usize {
        self.hashes.saturating_mul(self.slots)
    }

    /// The memory the sketch's counters take, saturating.
    pub fn bytes(self) -> usize {
        self.counters().saturating_mul(Self::COUNTER_BYTES)
    }

    /// This size brought within bounds: each dimension at least 1, at most
    /// [`Self::MAX_HASHES`] rows, and at most [`Self::MAX_COUNTERS`] counters in all
    /// (slots are cut, rows kept). A size within bounds is returned unchanged, so a valid
    /// config's sketches are exactly what it asked for.
    pub fn clamped(self) -> SketchSize {
        let hashes = self.hashes.clamp(1, Self::MAX_HASHES);
        let slots = self.slots.clamp(1, Self::MAX_COUNTERS / hashes);
        SketchSize { hashes, slots }
    }
}

impl Default for SketchSize {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamping_keeps_valid_sizes_and_bounds_the_rest() {
        for valid in [
            SketchSize::DEFAULT,
            SketchSize {
                hashes: 1,
                slots: 1,
            },
            SketchSize {
                hashes: 16,
                slots: 1 << 20,
            },
            SketchSize {
                hashes: 1,
                slots: 1 << 24,
            },
        ] {
            assert_eq!(valid.clamped(), valid);
        }
        let huge = SketchSize {
            hashes: usize::MAX,
            slots: usize::MAX,
        };
        assert_eq!(huge.counters(), usize::MAX);
        assert_eq!(
            huge.clamped(),
            SketchSize {
                hashes: 16,
                slots: 1 << 20
            }
        );
        assert_eq!(huge.clamped().bytes(), 128 << 20);
        assert_eq!(
            SketchSize {
                hashes: 0,
                slots: 0
            }
            .clamped(),
            SketchSize {
                hashes: 1,
                slots: 1
            }
        );
    }
}
