//! The inflight limiter: how many events of one key are under way right now.
//!
//! A count-min sketch (`Sketch`, below) of `h` hashes × `w` slots holds one counter per
//! (row, slot). Admission increments the key's `h` counters and reads their minimum; the
//! [`InflightGuard`] decrements them when the event ends, whatever the end was, because
//! the decrement lives in `Drop` (an early return, an error or a panic all drop it).
//!
//! The estimate never undercounts. It overcounts a key only when, in every row, some
//! other live key shares its slot, and it *rejects* a new key wrongly only when, in every
//! row, the slot it hashes to already holds `max` units of other keys. Memory is fixed at
//! `h × w × 8` bytes, however many keys appear; the price is a saturation point.
//!
//! **Saturation.** With `n` requests in flight, each of its own key, a row's slot holds
//! `Binomial(n, 1/w) ≈ Poisson(n/w)` of them, so a new key is wrongly rejected at `max` `m`
//! with odds
//!
//! ```text
//! P(Poisson(n / w) ≥ m)^h        (m = 1: (1 - e^(-n/w))^h ≈ (n/w)^h)
//! ```
//!
//! Whatever the keys (a few keys at `max` each, say), a row has at most `n / m` slots
//! holding `m`, so the odds are at most `(n / (m · w))^h`. For the default 4 × 8192 the
//! odds reach 1% of new keys (and 0.01%) at about these numbers of requests in flight:
//!
//! | `max` | 1% (formula) | 0.01% (formula) | 1% (worst-case bound) |
//! |---:|---:|---:|---:|
//! | 1 | 3 100 | 860 | 2 600 |
//! | 2 | 9 400 | 4 400 | 5 200 |
//! | 5 | 30 000 | 20 000 | 13 000 |
//! | 10 | 68 000 | 51 000 | 26 000 |
//! | 100 | 780 000 | 716 000 | 259 000 |
//! | 1 000 | 8.1 M | 7.9 M | 2.6 M |
//!
//! i.e. roughly at `n ≈ m · w` for a large `max`, and far earlier for `max` 1 or 2:
//! measured (`tests/it/key_floods.rs`), `max: 1` with 4 096 keys in flight wrongly rejects
//! 2.4% of new keys, with 8 192 16%. `tollgate check` warns when the worst-case odds pass
//! 1% at 4 096 requests in flight (`config::resolve`). Size `sketch.slots` so that
//! `max · slots` is well above the requests the proxy holds at once.
//!
//! The rows are updated one after another with relaxed atomics, so acquires of one key
//! racing on several threads may each read a smaller minimum than the final count: the
//! limit can be overshot by fewer than the number of acquires racing at that instant (one
//! per busy thread at most). An undo racing with an acquire can likewise reject one request
//! spuriously. Once every guard is dropped the counters are exactly back to zero.

use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

use crate::limits::sketch::SketchSize;

/// A lock-free count-min sketch of `hashes` rows × `slots` counters, one allocation.
///
/// Keys arrive as good 64-bit hashes (`KeySpec::hash`), so a row needs no hasher of its
/// own: row `r` mixes the key with its random seed by one folded multiply (the mixing step
/// of `ahash`'s fallback hasher) and picks its slot by Lemire's multiply-high reduction,
/// with no division. The seeds are drawn per sketch, so which keys share a slot cannot be
/// known outside the process (as with the per-row random hashers of `pingora-limits`'
/// `Estimator`, which this replaces at a third of the instructions per row).
struct Sketch {
    /// One seed per row.
    seeds: Box<[u64]>,
    /// Counters per row.
    slots: usize,
    /// The rows, one after another.
    counters: Box<[AtomicIsize]>,
}

/// `ahash`'s folded multiply: the two halves of the 128-bit product, xored.
#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

/// An odd 64-bit constant (the digits of pi, as `ahash` uses) for the folded multiply.
const MULTIPLE: u64 = 0x243f_6a88_85a3_08d3;

impl Sketch {
    fn new(size: SketchSize) -> Self {
        let random = ahash::RandomState::new();
        Self {
            seeds: (0..size.hashes).map(|row| random.hash_one(row)).collect(),
            slots: size.slots,
            counters: (0..size.counters()).map(|_| AtomicIsize::new(0)).collect(),
        }
    }

    /// The counters of `key`, one per row.
    #[inline(always)]
    fn of(&self, key: u64) -> impl Iterator<Item = &AtomicIsize> {
        let slots = self.slots;
        self.seeds
            .iter()
            .enumerate()
            .filter_map(move |(row, seed)| {
                let mixed = folded_multiply(key ^ seed, MULTIPLE);
                let slot = ((u128::from(mixed) * slots as u128) >> 64) as usize;
                self.counters.get(row * slots + slot)
            })
    }

    /// Adds `value` to `key`'s counters; the new estimate (their minimum). Overflow wraps:
    /// a negative estimate is read as 0 by the caller.
    #[inline]
    fn incr(&self, key: u64, value: isize) -> isize {
        self.of(key).fold(isize::MAX, |min, counter| {
            let current = counter.fetch_add(value, Ordering::Relaxed);
            min.min(current.wrapping_add(value))
        })
    }

    /// Takes `value` from `key`'s counters.
    #[inline]
    fn decr(&self, key: u64, value: isize) {
        for counter in self.of(key) {
            counter.fetch_sub(value, Ordering::Relaxed);
        }
    }

    /// `key`'s estimate.
    fn get(&self, key: u64) -> isize {
        self.of(key)
            .fold(isize::MAX, |min, c| min.min(c.load(Ordering::Relaxed)))
    }
}

/// Count-min estimate of events in flight per key.
///
/// The sketch is shared with every live guard through an `Arc`, so a guard outlives a
/// config reload that replaces the limiter and still gives its unit back to the sketch it
/// took it from.
pub struct InflightLimiter {
    estimator: Arc<Sketch>,
}

/// Holds one unit of a key's inflight count; dropping it gives the unit back exactly once.
pub struct InflightGuard {
    estimator: Arc<Sketch>,
    key: u64,
}

impl InflightLimiter {
    /// A limiter with a sketch of `size`.
    ///
    /// The size is [`SketchSize::clamped`]: a zero dimension is raised to 1, so a bad size
    /// degrades accuracy instead of panicking on the hot path, and an oversized one is cut
    /// to at most [`SketchSize::MAX_COUNTERS`] counters, so no value can make it allocate
    /// more than 128 MiB (the config refuses such sizes anyway).
    pub fn new(size: SketchSize) -> Self {
        Self {
            estimator: Arc::new(Sketch::new(size.clamped())),
        }
    }

    /// Increments `key`; if the estimate after the increment exceeds `max`, undoes it and
    /// returns `Err(estimate)`. Otherwise returns the guard and the estimate.
    ///
    /// Incrementing first and undoing on rejection costs one extra pass over the rows on a
    /// rejection, but keeps the admitted path to a single pass. `max == 0` always rejects.
    pub fn acquire(&self, key: u64, max: u64) -> Result<(InflightGuard, u64), u64> {
        let estimate = self.take(key, 1, max)?;
        let guard = InflightGuard {
            estimator: Arc::clone(&self.estimator),
            key,
        };
        Ok((guard, estimate))
    }

    /// [`acquire`](Self::acquire) of `n` units with no guard: the caller gives them back
    /// with [`put`](Self::put) (a fleet-wide limit's fallback, whose own guard owns them).
    #[inline]
    pub fn take(&self, key: u64, n: u64, max: u64) -> Result<u64, u64> {
        let n = isize::try_from(n).unwrap_or(isize::MAX);
        let estimate = clamp(self.estimator.incr(key, n));
        if estimate > max {
            self.estimator.decr(key, n);
            return Err(estimate);
        }
        Ok(estimate)
    }

    /// Gives back `n` units [`take`](Self::take) took.
    pub fn put(&self, key: u64, n: u64) {
        self.estimator
            .decr(key, isize::try_from(n).unwrap_or(isize::MAX));
    }

    /// The current estimate for `key`.
    ///
    /// Counters are signed; a transiently negative minimum (a decrement racing an
    /// increment of a colliding key) reads as 0.
    pub fn get(&self, key: u64) -> u64 {
        clamp(self.estimator.get(key))
    }
}

impl InflightGuard {
    /// The key whose unit this guard holds, so that callers can log what they hold.
    pub fn key(&self) -> u64 {
        self.key
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.estimator.decr(self.key, 1);
    }
}

/// A sketch estimate as a count: negative values read as 0.
fn clamp(estimate: isize) -> u64 {
    u64::try_from(estimate).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    fn limiter() -> InflightLimiter {
        InflightLimiter::new(SketchSize {
            hashes: 4,
            slots: 1024,
        })
    }

    #[test]
    fn an_oversized_sketch_is_clamped_not_allocated() {
        // usize::MAX rows of one slot would overflow a Vec's capacity (a panic); clamped,
        // it is 16 rows of one slot, and still counts.
        let l = InflightLimiter::new(SketchSize {
            hashes: usize::MAX,
            slots: 1,
        });
        let (_guard, estimate) = l.acquire(7, 1).unwrap();
        assert_eq!(estimate, 1);
        assert!(l.acquire(8, 1).is_err(), "one slot: every key collides");
    }

    #[test]
    fn admits_up_to_max_then_rejects_without_counting() {
        let l = limiter();
        let mut guards = Vec::new();
        for i in 1..=3 {
            let (g, est) = l.acquire(7, 3).expect("admitted");
            assert_eq!(est, i);
            guards.push(g);
        }
        assert_eq!(l.acquire(7, 3).err(), Some(4));
        assert_eq!(l.acquire(7, 3).err(), Some(4));
        assert_eq!(l.get(7), 3, "a rejection undoes its increment");
        drop(guards.pop());
        assert_eq!(l.get(7), 2);
        let (_g, est) = l.acquire(7, 3).expect("room again");
        assert_eq!(est, 3);
    }

    #[test]
    fn guard_drop_returns_to_zero() {
        let l = limiter();
        let guards: Vec<_> = (0..5).map(|_| l.acquire(1, 10).expect("ok").0).collect();
        assert_eq!(guards[0].key(), 1);
        assert_eq!(l.get(1), 5);
        drop(guards);
        assert_eq!(l.get(1), 0);
    }

    #[test]
    fn max_zero_always_rejects() {
        let l = limiter();
        assert_eq!(l.acquire(9, 0).err(), Some(1));
        assert_eq!(l.get(9), 0);
    }

    #[test]
    fn keys_are_independent() {
        let l = limiter();
        let _a = l.acquire(1, 1).expect("a");
        assert_eq!(l.acquire(1, 1).err(), Some(2));
        let (_b, est) = l.acquire(2, 1).expect("b is its own key");
        assert_eq!(est, 1);
        assert_eq!((l.get(1), l.get(2), l.get(3)), (1, 1, 0));
    }

    #[test]
    fn zero_sized_sketch_does_not_panic() {
        let l = InflightLimiter::new(SketchSize {
            hashes: 0,
            slots: 0,
        });
        let (g, est) = l.acquire(5, 1).expect("ok");
        assert_eq!(est, 1);
        drop(g);
        assert_eq!(l.get(5), 0);
    }

    #[test]
    fn threads_account_exactly_and_return_to_zero() {
        const THREADS: usize = 8;
        let l = limiter();
        let barrier = Barrier::new(THREADS + 1);
        let held = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..2_000 {
                        if let Ok((g, est)) = l.acquire(42, 4) {
                            assert!((1..=4).contains(&est));
                            drop(g);
                        }
                    }
                    let mine: Vec<_> = (0..50).filter_map(|_| l.acquire(42, 100).ok()).collect();
                    held.fetch_add(mine.len(), Ordering::SeqCst);
                    barrier.wait();
                    barrier.wait();
                });
            }
            barrier.wait();
            // Every thread holds its guards here, and every rejection was undone.
            let held = held.load(Ordering::SeqCst);
            assert!((1..=100 + THREADS).contains(&held), "held {held}");
            assert_eq!(l.get(42), held as u64);
            barrier.wait();
        });
        assert_eq!(l.get(42), 0, "every guard gave its unit back");
    }
}
