//! Sliding-window rates in Redis: one hash per key (the current and previous periods'
//! counts), decided exactly by one script (`scripts/rate.lua`), with its read and refund
//! scripts; a fixed window (`RateWindow::Fixed`) is decided by `scripts/fixed_window.lua`
//! on the same hash, so the read and refund serve both.

use crate::limits::clock::Nanos;
use crate::limits::rate::{RateParams, RateWindow};
use crate::limits::verdict::Grant;
use crate::store::key::{KeyNames, StateKind};
use crate::store::redis::{
    grant, round_micros, scripts, Arg, Micros, RedisStore, RATE_MAX, SCRIPT_MAX,
};
use crate::store::StoreError;

/// A window is at most 2^27 ticks (see rate.lua).
const RATE_TICKS: u64 = 1 << 27;

impl RedisStore {
    /// One sliding-window rate decision on a request for between `min` and `want` events
    /// (see rate.lua): the largest count in `[min, want]` that fits is counted, in the same
    /// script call, or nothing (`min == want`: one request of that cost). `min` above
    /// `want` is lowered to it. `max` is clamped to [`RATE_MAX`]; `per` is counted in ticks
    /// of 1, 10, 100 or 1000 µs (the finest that keeps a window within 2^27 ticks: 1 µs up
    /// to 134 s, 1 ms up to 37 h), so `retry_after` is exact to that tick.
    pub async fn rate_many(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &RateParams,
        min: u64,
        want: u64,
        at: Option<Micros>,
    ) -> Result<Grant, StoreError> {
        let key = names.key(hash, StateKind::Rate);
        let min = clamp_count(min.min(want));
        let [max, per, tick, want] = RateArgs::new(params).and(want);
        let strict = u64::from(params.strict);
        let args = [max, per, tick, want, strict, min].map(Arg::U);
        let s = match params.window {
            RateWindow::Sliding => &self.inner.scripts.rate,
            RateWindow::Fixed => &self.inner.scripts.fixed_window,
        };
        let v = self.eval(s, &[&key], &args, at, self.budget()).await?;
        grant(&v, min > params.max)
    }

    /// The window's counts now, at Redis's time, counting nothing (see rate_get.lua): one
    /// read-only call within the decision budget.
    pub async fn rate_get(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &RateParams,
    ) -> Result<RateCounts, StoreError> {
        let (per, tick) = rate_window(params.per);
        let key = names.key(hash, StateKind::Rate);
        let args = [Arg::U(per), Arg::U(tick)];
        let s = &self.inner.scripts.rate_get;
        let v = self.eval(s, &[&key], &args, None, self.budget()).await?;
        let [previous, current, elapsed] = scripts::ints::<3>(&v)?;
        Ok(RateCounts {
            // A fixed window's previous period weighs nothing.
            previous: match params.window {
                RateWindow::Sliding => scripts::count(previous),
                RateWindow::Fixed => 0,
            },
            current: scripts::count(current),
            elapsed: scripts::count(elapsed).min(per),
            per,
        })
    }

    /// Takes back an admitted event; returns the current period's count after.
    pub async fn rate_refund(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &RateParams,
        cost: u64,
        at: Option<Micros>,
    ) -> Result<u64, StoreError> {
        let key = names.key(hash, StateKind::Rate);
        let args = RateArgs::new(params).window_and(cost).map(Arg::U);
        let s = &self.inner.scripts.rate_refund;
        let v = self.eval(s, &[&key], &args, at, self.background()).await?;
        Ok(scripts::count(scripts::int(&v)?))
    }
}

/// A shared rate window read by [`RedisStore::rate_get`]: the counts of the previous and
/// current periods, and how far into the current one Redis's clock is, in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateCounts {
    /// The previous period's count.
    pub previous: u64,
    /// The current period's count.
    pub current: u64,
    /// Ticks of the current period elapsed (`e`), in `[0, per]`.
    pub elapsed: u64,
    /// Ticks in a period (`per`, at least 1).
    pub per: u64,
}

impl RateCounts {
    /// The sliding-window estimate `previous · (per − e) / per + current`, as rate.lua
    /// decides against `max`.
    pub fn estimate(&self) -> f64 {
        let per = self.per.max(1) as f64;
        self.previous as f64 * (per - self.elapsed as f64) / per + self.current as f64
    }
}

/// A rate's parameters in the scripts' units: its `max` (clamped to [`RATE_MAX`]) and its
/// window as `per` ticks of `tick` µs ([`rate_window`]).
pub(super) struct RateArgs {
    max: u64,
    per: u64,
    tick: u64,
}

impl RateArgs {
    pub(super) fn new(p: &RateParams) -> Self {
        let (per, tick) = rate_window(p.per);
        Self {
            max: p.max.min(RATE_MAX),
            per,
            tick,
        }
    }

    /// The arguments of a script that counts `n` against the limit (a decision's `want`,
    /// a lease's): max, per, tick, `n` ([`clamp_count`]).
    pub(super) fn and(&self, n: u64) -> [u64; 4] {
        let [per, tick, n] = self.window_and(n);
        [self.max, per, tick, n]
    }

    /// The arguments of a script that gives `n` back to the window (a refund, a lease's
    /// return): per, tick, `n` ([`clamp_count`]).
    pub(super) fn window_and(&self, n: u64) -> [u64; 3] {
        [self.per, self.tick, clamp_count(n)]
    }
}

/// A count sent to the rate scripts: at most one past [`RATE_MAX`] (enough to say "over
/// any limit"), so that the scripts' arithmetic stays exact.
fn clamp_count(n: u64) -> u64 {
    n.min(RATE_MAX + 1)
}

/// A window of `per` nanoseconds as (ticks, tick in µs): the finest tick of 1, 10, 100,
/// 1000... µs that keeps the window within 2^27 ticks.
pub(super) fn rate_window(per: Nanos) -> (u64, u64) {
    let per_us = round_micros(per).clamp(1, SCRIPT_MAX);
    let mut tick = 1u64;
    while per_us.div_ceil(tick) > RATE_TICKS {
        tick *= 10;
    }
    let ticks = ((per_us + tick / 2) / tick).max(1);
    (ticks, tick)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const SEC: Nanos = 1_000 * MS;

    #[test]
    fn a_rate_window_estimate_weighs_the_previous_period_by_what_is_left() {
        let w = |previous, current, elapsed| RateCounts {
            previous,
            current,
            elapsed,
            per: 100,
        };
        assert_eq!(w(0, 0, 0).estimate(), 0.0);
        assert_eq!(w(10, 3, 0).estimate(), 13.0);
        assert_eq!(w(10, 3, 25).estimate(), 10.5);
        assert_eq!(w(10, 3, 100).estimate(), 3.0);
    }

    #[test]
    fn windows_keep_within_2_27_ticks() {
        assert_eq!(rate_window(100 * MS), (100_000, 1));
        assert_eq!(rate_window(SEC), (1_000_000, 1));
        assert_eq!(rate_window(134 * SEC), (134_000_000, 1));
        assert_eq!(rate_window(135 * SEC), (13_500_000, 10));
        assert_eq!(rate_window(3_600 * SEC), (36_000_000, 100));
        assert_eq!(rate_window(86_400 * SEC), (86_400_000, 1_000));
        assert_eq!(rate_window(0), (1, 1));
        assert_eq!(rate_window(1_499), (1, 1));
        // Every allowed window: max * per <= 2^52 (see rate.lua).
        for per in [100 * MS, 134 * SEC, 135 * SEC, 86_400 * SEC] {
            let (ticks, _) = rate_window(per);
            assert!(ticks <= RATE_TICKS && RATE_MAX * ticks <= 1 << 52);
        }
    }
}
