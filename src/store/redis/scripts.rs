//! The Lua scripts of the Redis store, one file each under `scripts/`, compiled into the
//! binary. Each decision is one script run atomically by Redis; the store calls them by
//! `EVALSHA` and falls back to `EVAL` (which also caches the script) when Redis answers
//! `NOSCRIPT` (it restarted, or a failover reached a node that never saw the script). The
//! breaker's probe `SCRIPT LOAD`s them all after every (re)connection.
//!
//! **One prelude.** `scripts/prelude.lua` is prepended to every script at build time
//! (`script!`): the decision's clock (Redis `TIME`, or a replay's `at`), the integer
//! helpers (`fdiv`, `cdiv`, `str`, `numbers`), the arguments of a bucket's or a rate's
//! decision (`request_args`), the 2^52 cap (`CAP`), key expiry, the token bucket's refill
//! and wait (`bucket_*`), the rate window's periods and room (`window_*`) and the leased
//! counts' helpers (`counter_*`), each under one name. A script uses them and declares
//! none of its own (a test below holds that).

use redis::Value;

use crate::store::StoreError;

/// One script: its source and its SHA1, the name `EVALSHA` calls it by.
#[derive(Debug)]
pub struct LuaScript {
    /// The file name, for logs.
    pub name: &'static str,
    /// The Lua source.
    pub body: &'static str,
    /// Lower-case hex SHA1 of `body`.
    pub sha: String,
}

/// The script `scripts/<file>` with the prelude prepended, both read at build time.
macro_rules! script {
    ($file:literal) => {
        LuaScript::new(
            $file,
            concat!(
                include_str!("scripts/prelude.lua"),
                include_str!(concat!("scripts/", $file))
            ),
        )
    };
}

impl LuaScript {
    fn new(name: &'static str, body: &'static str) -> Self {
        Self {
            name,
            body,
            sha: redis::Script::new(body).get_hash().to_string(),
        }
    }
}

/// Every script the store runs.
#[derive(Debug)]
pub struct Scripts {
    /// Token bucket acquire.
    pub token_bucket: LuaScript,
    /// Token bucket read (`RL.GET`).
    pub token_bucket_get: LuaScript,
    /// Token bucket refund.
    pub token_bucket_refund: LuaScript,
    /// Sliding-window rate acquire.
    pub rate: LuaScript,
    /// Sliding-window rate refund.
    pub rate_refund: LuaScript,
    /// Fixed-window rate acquire (its refund and read are the sliding rate's).
    pub fixed_window: LuaScript,
    /// Sliding-window rate counts (read only).
    pub rate_get: LuaScript,
    /// Sliding log acquire (several windows, partial grants).
    pub sliding_log: LuaScript,
    /// Sliding log refund (exactly one admission's entries).
    pub sliding_log_refund: LuaScript,
    /// Sliding log per-window counts (read only).
    pub sliding_log_get: LuaScript,
    /// Tiered acquire (burst tiers, hard and global limits).
    pub tiered: LuaScript,
    /// Tiered refund (exactly one admission's hits).
    pub tiered_refund: LuaScript,
    /// Tiered current tier, phases and window counts (read only).
    pub tiered_get: LuaScript,
    /// Concurrency: take copies from several leased counters, all or nothing.
    pub counters_acquire: LuaScript,
    /// Concurrency: give copies back.
    pub counters_release: LuaScript,
    /// Concurrency: lease renewal and repair.
    pub counters_renew: LuaScript,
    /// Concurrency: the fleet's copies per counter (read only).
    pub counters_total: LuaScript,
    /// Lease: tokens out of a bucket.
    pub lease_bucket_take: LuaScript,
    /// Lease: counts in a rate's current period.
    pub lease_rate_take: LuaScript,
    /// Lease: unspent counts back to their period.
    pub lease_rate_return: LuaScript,
    /// Lease: a block of slots from several counters.
    pub lease_slots_take: LuaScript,
    /// The breaker's probe: a write and TIME.
    pub probe: LuaScript,
    /// Deletes the keys of a failed decision that are not what tollgate writes there.
    pub repair: LuaScript,
}

impl Scripts {
    /// Loads the sources and hashes them.
    pub fn new() -> Self {
        Self {
            token_bucket: script!("token_bucket.lua"),
            token_bucket_get: script!("token_bucket_get.lua"),
            token_bucket_refund: script!("token_bucket_refund.lua"),
            rate: script!("rate.lua"),
            rate_refund: script!("rate_refund.lua"),
            fixed_window: script!("fixed_window.lua"),
            rate_get: script!("rate_get.lua"),
            sliding_log: script!("sliding_log.lua"),
            sliding_log_refund: script!("sliding_log_refund.lua"),
            sliding_log_get: script!("sliding_log_get.lua"),
            tiered: script!("tiered.lua"),
            tiered_refund: script!("tiered_refund.lua"),
            tiered_get: script!("tiered_get.lua"),
            counters_acquire: script!("counters_acquire.lua"),
            counters_release: script!("counters_release.lua"),
            counters_renew: script!("counters_renew.lua"),
            counters_total: script!("counters_total.lua"),
            probe: script!("probe.lua"),
            repair: script!("repair.lua"),
            lease_bucket_take: script!("lease_bucket_take.lua"),
            lease_rate_take: script!("lease_rate_take.lua"),
            lease_rate_return: script!("lease_rate_return.lua"),
            lease_slots_take: script!("lease_slots_take.lua"),
        }
    }

    /// Every script, for `SCRIPT LOAD`.
    pub fn all(&self) -> [&LuaScript; 23] {
        [
            &self.token_bucket,
            &self.token_bucket_get,
            &self.token_bucket_refund,
            &self.rate,
            &self.rate_refund,
            &self.fixed_window,
            &self.rate_get,
            &self.sliding_log,
            &self.sliding_log_refund,
            &self.sliding_log_get,
            &self.tiered,
            &self.tiered_refund,
            &self.tiered_get,
            &self.counters_acquire,
            &self.counters_release,
            &self.counters_renew,
            &self.counters_total,
            &self.lease_bucket_take,
            &self.lease_rate_take,
            &self.lease_rate_return,
            &self.lease_slots_take,
            &self.probe,
            &self.repair,
        ]
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

/// An integer reply.
pub fn int(value: &Value) -> Result<i64, StoreError> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(StoreError::Reply(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

/// An array reply of exactly `N` integers.
pub fn ints<const N: usize>(value: &Value) -> Result<[i64; N], StoreError> {
    let Value::Array(items) = value else {
        return Err(StoreError::Reply(format!(
            "expected an array, got {value:?}"
        )));
    };
    if items.len() != N {
        return Err(StoreError::Reply(format!(
            "expected {N} integers, got {value:?}"
        )));
    }
    let mut out = [0i64; N];
    for (slot, item) in out.iter_mut().zip(items) {
        *slot = int(item)?;
    }
    Ok(out)
}

/// An array reply of integers, at most `limit` of them.
pub fn int_list(value: &Value, limit: usize) -> Result<Vec<i64>, StoreError> {
    let Value::Array(items) = value else {
        return Err(StoreError::Reply(format!(
            "expected an array, got {value:?}"
        )));
    };
    if items.len() > limit {
        return Err(StoreError::Reply(format!(
            "expected at most {limit} integers, got {}",
            items.len()
        )));
    }
    items.iter().map(int).collect()
}

/// An array reply of exactly `n` counts (see [`count`]).
pub fn counts(value: &Value, n: usize) -> Result<Vec<u64>, StoreError> {
    let counts = int_list(value, n)?;
    if counts.len() != n {
        return Err(StoreError::Reply(format!(
            "expected {n} counts, got {}",
            counts.len()
        )));
    }
    Ok(counts.into_iter().map(count).collect())
}

/// A non-negative integer reply as `u64` (negative values, which the scripts never
/// return, read as 0).
pub fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_hash_to_sha1_and_decode_replies() {
        let s = Scripts::new();
        let shas: std::collections::HashSet<_> = s.all().iter().map(|s| s.sha.clone()).collect();
        assert_eq!(shas.len(), 23, "distinct scripts");
        assert!(s.all().iter().all(|s| s.sha.len() == 40));
        assert_eq!(
            redis::Script::new("return 1").get_hash(),
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
        let v = Value::Array(vec![Value::Int(1), Value::Int(-2)]);
        assert_eq!(ints::<2>(&v).unwrap(), [1, -2]);
        assert!(ints::<3>(&v).is_err());
        assert_eq!(int_list(&v, 2).unwrap(), vec![1, -2]);
        assert!(int_list(&v, 1).is_err());
        assert!(int_list(&Value::Int(1), 4).is_err());
        assert_eq!(counts(&v, 2).unwrap(), vec![1, 0]);
        assert!(counts(&v, 3).is_err());
        assert!(int(&Value::Nil).is_err());
        assert_eq!((count(-2), count(7)), (0, 7));
    }

    #[test]
    fn every_script_starts_with_the_prelude_and_redeclares_none_of_it() {
        let prelude = include_str!("scripts/prelude.lua");
        let s = Scripts::new();
        // The names the prelude declares, and what they replaced.
        let declared = [
            "local CAP",
            "local function clock",
            "local function fdiv",
            "local function cdiv",
            "local function str",
            "local function numbers",
            "local function expire_in",
            "local function member",
            "local function drop_ended",
            "local function held_total",
            "local function expire_with_leases",
            "local function bucket_refill",
            "local function bucket_load",
            "local function bucket_wait",
            "local function bucket_put",
            "local function window_load",
            "local function window_room",
            "local function window_put",
            "local function counter_rooms",
            "local function counter_take",
        ];
        for name in declared {
            assert_eq!(prelude.matches(name).count(), 1, "{name}");
        }
        for script in s.all() {
            let own = script
                .body
                .strip_prefix(prelude)
                .unwrap_or_else(|| panic!("{} does not start with the prelude", script.name));
            for name in declared {
                assert!(!own.contains(name), "{} declares {name}", script.name);
            }
            for redeclared in ["redis.call('TIME')", "4503599627370496", "local LIMIT"] {
                assert!(!own.contains(redeclared), "{}: {redeclared}", script.name);
            }
        }
    }
}
