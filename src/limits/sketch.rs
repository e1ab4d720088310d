//! The size of a count-min sketch, shared by the inflight and rate limiters.

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
}

impl Default for SketchSize {
    fn default() -> Self {
        Self::DEFAULT
    }
}
