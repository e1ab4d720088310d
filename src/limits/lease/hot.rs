//! Which keys are hot on this instance: decisions per second above `hot_above`, counted
//! in a fixed table of atomic cells, lock-free.
//!
//! **Windows.** Time is cut into windows of `w = max(250 ms, 8 s / hot_above)` (so a key at
//! exactly `hot_above` makes at least 8 decisions a window and one stray burst does not make
//! it hot), and a key is hot when its count in the current window exceeds
//! `threshold = ⌈hot_above · w⌉`, or when it did in the previous window (hysteresis: a key
//! that stays hot does not flap at each window's start). A key that stops being decided
//! is cold again within two windows.
//!
//! **Cells.** One `AtomicU64` per cell, `cells` of them (a power of two) allocated once:
//! 8 bytes each, never grown. A key's cell is picked by its hash's low bits and holds the
//! key's tag (the hash's top 23 bits), the window number (mod 2¹⁶), a *was hot* bit and a
//! count (24 bits, saturating). Updated by compare-and-swap: no lock, no allocation, no
//! syscall.
//!
//! **Collisions** follow HeavyKeeper (Gong et al., USENIX ATC 2018): a key meeting another
//! key's cell decrements its count by one, and takes the cell over only once the count is 0
//! or the cell is stale (older than the previous window). A key becomes hot when its rate
//! beats `hot_above` plus the rate of the other keys mapped to its cell (about
//! `flood / cells` in a flood of distinct keys); once hot, its cell is not worn down by
//! others until it has been cold for a window, so a flood of cold keys does not hide it,
//! but a second hot key on the same cell stays cold (size `cells` at several times the hot
//! keys). A wrong answer only costs: a cold
//! key wrongly hot takes a small slice (sized by its own rate) that goes back when idle, a
//! hot key wrongly cold pays one call per decision, as with leases off. Neither changes
//! what is admitted.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::limits::clock::{Nanos, NANOS_PER_SEC};

const COUNT_BITS: u32 = 24;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const HOT_BIT: u64 = 1 << COUNT_BITS;
const WINDOW_SHIFT: u32 = COUNT_BITS + 1;
const WINDOW_MASK: u64 = 0xffff;
const TAG_SHIFT: u32 = WINDOW_SHIFT + 16;

/// The shortest window: a hot key is recognized within about two of them.
const MIN_WINDOW: Nanos = NANOS_PER_SEC / 4;
/// Decisions a key at exactly `hot_above` makes in one window, at least.
const MIN_COUNT: u64 = 8;

/// The hot-key detector of one limit.
#[derive(Debug)]
pub struct HotKeys {
    cells: Box<[AtomicU64]>,
    mask: u64,
    window: Nanos,
    threshold: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    tag: u64,
    window: u64,
    hot: bool,
    count: u64,
}

impl Cell {
    fn unpack(v: u64) -> Self {
        Self {
            tag: v >> TAG_SHIFT,
            window: (v >> WINDOW_SHIFT) & WINDOW_MASK,
            hot: v & HOT_BIT != 0,
            count: v & COUNT_MAX,
        }
    }

    fn pack(self) -> u64 {
        (self.tag << TAG_SHIFT)
            | ((self.window & WINDOW_MASK) << WINDOW_SHIFT)
            | if self.hot { HOT_BIT } else { 0 }
            | self.count.min(COUNT_MAX)
    }
}

impl HotKeys {
    /// A detector for keys decided faster than `hot_above` per second (at least 1), in
    /// `cells` cells (rounded up to a power of two, at least 64): size it at a few times
    /// the keys expected to be hot at once.
    pub fn new(hot_above: u64, cells: usize) -> Self {
        let hot_above = hot_above.max(1);
        let window = (MIN_COUNT * NANOS_PER_SEC / hot_above).max(MIN_WINDOW);
        // ⌈hot_above · w / 1 s⌉ in u128: hot_above up to u64::MAX cannot overflow.
        let threshold =
            (u128::from(hot_above) * u128::from(window)).div_ceil(u128::from(NANOS_PER_SEC));
        let threshold = u64::try_from(threshold)
            .unwrap_or(u64::MAX)
            .min(COUNT_MAX - 1);
        let n = cells.clamp(64, 1 << 24).next_power_of_two();
        Self {
            cells: (0..n).map(|_| AtomicU64::new(0)).collect(),
            mask: (n - 1) as u64,
            window,
            threshold,
        }
    }

    /// The window's length.
    pub fn window(&self) -> Nanos {
        self.window
    }

    /// Decisions in one window above which a key is hot.
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// Bytes the table takes (fixed at construction).
    pub fn memory(&self) -> usize {
        self.cells.len() * std::mem::size_of::<AtomicU64>()
    }

    /// Whether the cell's key is hot in `window`: it was in the previous window, or it
    /// is over the threshold in this one.
    fn hot_now(&self, c: Cell, window: u64, previous: u64) -> bool {
        (c.window == window && (c.hot || c.count > self.threshold))
            || (c.window == previous && c.count > self.threshold)
    }

    /// Counts one decision of the key hashed to `hash` at `now`, and says whether the key
    /// is hot (its rate above `hot_above` in this window or the previous one).
    pub fn observe(&self, hash: u64, now: Nanos) -> bool {
        let tag = hash >> TAG_SHIFT;
        let window = (now / self.window) & WINDOW_MASK;
        let previous = window.wrapping_sub(1) & WINDOW_MASK;
        // The low bits pick the cell; the tag is the top bits, independent of them.
        let cell = &self.cells[(hash & self.mask) as usize];
        let mut current = cell.load(Ordering::Relaxed);
        loop {
            let c = Cell::unpack(current);
            let (next, hot) = if c.tag == tag {
                if c.window == window {
                    let count = (c.count + 1).min(COUNT_MAX);
                    (Cell { count, ..c }, c.hot || count > self.threshold)
                } else {
                    // A new window: remember whether the last one was hot.
                    let was = c.window == previous && c.count > self.threshold;
                    let next = Cell {
                        tag,
                        window,
                        hot: was,
                        count: 1,
                    };
                    (next, was || 1 > self.threshold)
                }
            } else if c.count == 0 || (c.window != window && c.window != previous) {
                let next = Cell {
                    tag,
                    window,
                    hot: false,
                    count: 1,
                };
                (next, 1 > self.threshold)
            } else if self.hot_now(c, window, previous) {
                // A hot key's cell is not worn down by others.
                return false;
            } else {
                // Another key's cell: wear it down (HeavyKeeper's decay).
                let next = Cell {
                    count: c.count - 1,
                    ..c
                };
                (next, false)
            };
            match cell.compare_exchange_weak(
                current,
                next.pack(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return hot,
                Err(actual) => current = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    /// Decides `key` at `per_sec` from `from` for `for_ns`, returning whether the last
    /// decision was hot and when it first was.
    fn drive(
        h: &HotKeys,
        key: u64,
        per_sec: u64,
        from: Nanos,
        for_ns: Nanos,
    ) -> (bool, Option<Nanos>) {
        let step = NANOS_PER_SEC / per_sec;
        let (mut last, mut first) = (false, None);
        let mut t = from;
        while t < from + for_ns {
            last = h.observe(key, t);
            if last && first.is_none() {
                first = Some(t);
            }
            t += step;
        }
        (last, first)
    }

    #[test]
    fn windows_and_threshold_follow_hot_above() {
        let h = HotKeys::new(20, 100);
        assert_eq!(h.window(), 400 * MS, "8 decisions at 20/s");
        assert_eq!(h.threshold(), 8);
        assert_eq!(h.memory(), 128 * 8, "rounded up to a power of two, fixed");
        let h = HotKeys::new(1000, 1);
        assert_eq!((h.window(), h.threshold()), (250 * MS, 250));
        assert_eq!(h.memory(), 64 * 8);
        let h = HotKeys::new(0, 64);
        assert_eq!((h.window(), h.threshold()), (8 * NANOS_PER_SEC, 8));
        // A huge hot_above cannot overflow.
        let h = HotKeys::new(u64::MAX, 64);
        assert_eq!(h.threshold(), COUNT_MAX - 1);
    }

    #[test]
    fn a_key_above_hot_above_becomes_hot_and_one_below_never_does() {
        let h = HotKeys::new(20, 256);
        let (hot, first) = drive(&h, 0xdead_beef_0000_0001, 40, 0, 3 * NANOS_PER_SEC);
        assert!(hot, "40/s against 20/s");
        assert!(
            first.unwrap() <= 2 * h.window(),
            "within two windows: {first:?}"
        );
        let (hot, first) = drive(&h, 0x1234_5678_0000_0002, 10, 0, 10 * NANOS_PER_SEC);
        assert!(!hot && first.is_none(), "10/s is cold");
        // Exactly at hot_above is not above it.
        let (_, first) = drive(&h, 0x4321_0000_0000_0003, 20, 0, 10 * NANOS_PER_SEC);
        assert!(first.is_none(), "20/s is not above 20/s");
    }

    #[test]
    fn a_hot_key_stays_hot_across_windows_then_cools_within_two() {
        let h = HotKeys::new(20, 64);
        let key = 0xabcd_0000_0000_0007;
        let (hot, _) = drive(&h, key, 100, 0, 2 * NANOS_PER_SEC);
        assert!(hot);
        // Every decision after the first hot one stays hot while the rate holds,
        // including the first ones of each new window.
        let mut t = 2 * NANOS_PER_SEC;
        while t < 6 * NANOS_PER_SEC {
            assert!(h.observe(key, t), "hot at {t}");
            t += NANOS_PER_SEC / 100;
        }
        // It pauses for two windows, then comes back slowly: cold.
        let back = t + 2 * h.window();
        assert!(!h.observe(key, back), "cold after a pause of two windows");
        let (_, first) = drive(&h, key, 5, back + 1, 10 * NANOS_PER_SEC);
        assert!(first.is_none(), "5/s stays cold");
    }

    #[test]
    fn a_flood_of_cold_keys_does_not_hide_a_hot_key() {
        // 64 cells, one hot key at 1000/s, 20 000 distinct cold keys a second: about 312
        // a cell a second, all colliding with the hot key's cell's neighbours, and about
        // 312/s on its own cell, below its rate.
        let h = HotKeys::new(100, 64);
        let hot_key = 0x5555_0000_0000_0011u64;
        let mut hot_seen = 0;
        let mut cold_hot = 0;
        let mut cold = 0x9e37_79b9_7f4a_7c15u64;
        for ms in 0..3_000u64 {
            let now = ms * MS;
            if h.observe(hot_key, now) && ms >= 1_000 {
                hot_seen += 1;
            }
            for _ in 0..20 {
                cold = cold
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if h.observe(cold, now) {
                    cold_hot += 1;
                }
            }
        }
        assert_eq!(hot_seen, 2_000, "hot at every decision of the last 2 s");
        assert_eq!(cold_hot, 0, "no key seen once is hot");
    }

    #[test]
    fn concurrent_observers_agree_without_locks() {
        // Four threads share one clock, as a proxy's workers do: 40 000 decisions in 1 s
        // of it (40 000/s against `hot_above` 50/s, threshold 13 a 250 ms window).
        let h = std::sync::Arc::new(HotKeys::new(50, 64));
        let clock = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let key = 0x7777_0000_0000_0001u64;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (h, clock) = (h.clone(), clock.clone());
                std::thread::spawn(move || {
                    let mut hot = 0u64;
                    for _ in 0..10_000u64 {
                        let tick = clock.fetch_add(1, Ordering::Relaxed);
                        if h.observe(key, tick * (NANOS_PER_SEC / 40_000)) {
                            hot += 1;
                        }
                    }
                    hot
                })
            })
            .collect();
        let hot: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        // Cold are the first 13 decisions, and after each of the 4 window starts at most
        // what a late observer (a thread preempted between reading the clock and
        // observing, so its time is one window behind) can reset: 13 more per thread.
        let cold_bound = 13 + 4 * 4 * (13 + 4);
        assert!(
            40_000 - hot <= cold_bound,
            "{} of 40 000 decisions cold, bound {cold_bound}",
            40_000 - hot
        );
    }

    #[test]
    fn cells_round_trip() {
        let c = Cell {
            tag: (1 << 23) - 1,
            window: 0xffff,
            hot: true,
            count: COUNT_MAX,
        };
        assert_eq!(Cell::unpack(c.pack()), c);
        let c = Cell {
            tag: 5,
            window: 3,
            hot: false,
            count: 9,
        };
        assert_eq!(Cell::unpack(c.pack()), c);
    }
}
