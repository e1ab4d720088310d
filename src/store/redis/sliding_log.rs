//! Sliding logs in Redis (Grab's frequency caps): one sorted set per key, pruned and
//! counted per window by one script (`scripts/sliding_log.lua`), exact to Redis's
//! microsecond.

use crate::limits::clock::Nanos;
use crate::limits::sliding_log::LogWindow;
use crate::limits::verdict::Verdict;
use crate::store::key::{KeyNames, StateKind};
use crate::store::redis::{nanos, round_micros, scripts, Arg, EntryId, Micros, RedisStore};
use crate::store::redis::{SCRIPT_MAX, SLIDING_LOG_MAX};
use crate::store::StoreError;

/// A sliding-log decision: the verdict and how many entries it recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogGrant {
    /// Admitted or rejected; `remaining` is the smallest room left over the windows,
    /// `reset_after` the time until the key's log is empty, `retry_after` (rejected) the
    /// time until every window has room for `min` (a window whose `max` is below `min`
    /// never has: its `per` is given as a hint).
    pub verdict: Verdict,
    /// Entries recorded: in `[min, cost]` when admitted, 0 when rejected.
    pub granted: u64,
}

impl RedisStore {
    /// One sliding-log decision for the key hashed to `hash` (see sliding_log.lua): grants
    /// the largest `n` in `[min, cost]` that every window has room for (the proxy passes
    /// `min = cost`), recording `n` entries named after `id` (a fresh
    /// [`RedisStore::entry_id`]), at Redis's time or `at`. Windows are rounded to whole
    /// microseconds. A cost is that many sorted-set members, so costs are clamped to
    /// [`SLIDING_LOG_MAX`]; a `min` above it is the caller's to refuse
    /// ([`crate::store::SharedSlidingLog`] does: it can never be recorded).
    pub async fn sliding_log(
        &self,
        names: &KeyNames,
        hash: u64,
        windows: &[LogWindow],
        id: &EntryId,
        (min, cost): (u64, u64),
        at: Option<Micros>,
    ) -> Result<LogGrant, StoreError> {
        let key = names.key(hash, StateKind::SlidingLog);
        let cost = cost.min(SLIDING_LOG_MAX);
        let mut args = Vec::with_capacity(4 + 2 * windows.len());
        args.extend([
            Arg::S(id.as_str()),
            Arg::U(min.min(cost)),
            Arg::U(cost),
            Arg::U(windows.len() as u64),
        ]);
        for w in windows {
            args.push(Arg::U(w.max.min(SCRIPT_MAX)));
            args.push(Arg::U(log_per(w.per)));
        }
        let s = &self.inner.scripts.sliding_log;
        let v = self.eval(s, &[&key], &args, at, self.budget()).await?;
        let [allowed, granted, remaining, reset, retry] = scripts::ints::<5>(&v)?;
        let (remaining, reset) = (scripts::count(remaining), nanos(reset));
        let verdict = if allowed == 1 {
            Verdict::allow(remaining, reset)
        } else {
            Verdict::reject(remaining, reset, nanos(retry).max(1))
        };
        Ok(LogGrant {
            verdict,
            granted: scripts::count(granted),
        })
    }

    /// Each window's count of the key's log now, at Redis's time, recording nothing (see
    /// sliding_log_get.lua): one read-only call within the decision budget.
    pub async fn sliding_log_get(
        &self,
        names: &KeyNames,
        hash: u64,
        windows: &[LogWindow],
    ) -> Result<Vec<u64>, StoreError> {
        let key = names.key(hash, StateKind::SlidingLog);
        let mut args = Vec::with_capacity(1 + windows.len());
        args.push(Arg::U(windows.len() as u64));
        args.extend(windows.iter().map(|w| Arg::U(log_per(w.per))));
        let s = &self.inner.scripts.sliding_log_get;
        let v = self.eval(s, &[&key], &args, None, self.budget()).await?;
        scripts::counts(&v, windows.len())
    }

    /// Removes the `count` entries a [`RedisStore::sliding_log`] decision recorded under
    /// `id`; returns how many were still there.
    pub async fn sliding_log_refund(
        &self,
        names: &KeyNames,
        hash: u64,
        windows: &[LogWindow],
        id: &EntryId,
        count: u64,
        at: Option<Micros>,
    ) -> Result<u64, StoreError> {
        let key = names.key(hash, StateKind::SlidingLog);
        let longest = windows.iter().map(|w| log_per(w.per)).max().unwrap_or(1);
        let args = [
            Arg::S(id.as_str()),
            Arg::U(count.min(SLIDING_LOG_MAX)),
            Arg::U(longest),
        ];
        let s = &self.inner.scripts.sliding_log_refund;
        let v = self.eval(s, &[&key], &args, at, self.background()).await?;
        Ok(scripts::count(scripts::int(&v)?))
    }
}

/// A window's `per` in whole microseconds, at least 1.
fn log_per(per: Nanos) -> u64 {
    round_micros(per).clamp(1, SCRIPT_MAX)
}
