//! Upper bounds on everything a config can make tollgate allocate or loop over, and the
//! estimate of the memory its limiters will take.
//!
//! A config is trusted input, but a typo (`max_keys: 1000000000000`) or a generated file
//! must not be able to take the proxy down: every count and size has a ceiling here,
//! checked by `tollgate check` and by every load and reload, each listed in
//! `docs/configuration.md`. Counts bound the work a request does (limits run in turn,
//! overrides are tried in turn, wildcard hosts are tried in turn) and the time a reload
//! takes; sizes bound memory. On top of the per-limit sizes, [`state_budget`] adds up the
//! state of every limit variant of every origin (a default limit has state in each origin
//! that gets it, an override has its own) and refuses a config above
//! [`MAX_STATE_BYTES`], naming the settings that cost most.

use std::collections::HashMap;

use crate::config::model::{Limit, LimitParams};
use crate::config::report::{At, Pos, Report};
use crate::limits::{
    ConcurrencyLimiter, HeavyHitters, RateLimiter, SketchSize, SlidingLog, TieredLimiter,
    TokenBucket,
};

/// Origins in one config. Each has its own metrics series.
pub(crate) const MAX_ORIGINS: usize = 10_000;
/// Host names of one origin.
pub(crate) const MAX_HOSTS: usize = 1_000;
/// `*.suffix` hosts in the whole config: a request for a host with no exact match tries
/// each in turn.
pub(crate) const MAX_WILDCARDS: usize = 1_000;
/// Upstreams of one origin; each name is resolved at every reload.
pub(crate) const MAX_UPSTREAMS: usize = 1_000;
/// Limits one origin runs, its defaults included: every request runs each in turn.
pub(crate) const MAX_LIMITS: usize = 64;
/// Overrides of one limit: a request tries each in turn, and each has its own state.
pub(crate) const MAX_OVERRIDES: usize = 1_000;
/// Conditions in one override's `match`.
pub(crate) const MAX_MATCH: usize = 16;
/// Parts of one `key`.
pub(crate) const MAX_KEY_PARTS: usize = 16;
/// Bytes of one key part as written (`header:NAME`, `const:TEXT`): a `const` text is
/// hashed on every request.
pub(crate) const MAX_KEY_PART_BYTES: usize = 256;
/// `max_keys` of one token bucket: 16 777 216 keys, 400 MiB.
pub(crate) const MAX_KEYS: usize = TokenBucket::MAX_KEYS;
/// `top_keys` of one limit: the heavy-hitter list the admin API's `/top` reads (each
/// entry keeps its key's text).
pub(crate) const MAX_TOP_KEYS: usize = 1_000;
/// `sketch.hashes`.
pub(crate) const MAX_HASHES: usize = SketchSize::MAX_HASHES;
/// `sketch.hashes × sketch.slots`: 16 777 216 counters, 128 MiB a sketch.
pub(crate) const MAX_COUNTERS: usize = SketchSize::MAX_COUNTERS;
/// `sketch.slots` (also bounded by [`MAX_COUNTERS`] with the hashes).
pub(crate) const MAX_SLOTS: usize = SketchSize::MAX_COUNTERS;
/// All limiter state of one config: 4 GiB.
pub(crate) const MAX_STATE_BYTES: u128 = 4 << 30;

/// The "at most N" message for a list of `count` items.
pub(crate) fn too_many(what: &str, count: usize, max: usize) -> String {
    format!("{count} {what}; at most {max} are allowed")
}

/// The memory one variant (the base or one override) of `params` holds: a sketch for
/// inflight, the table of every other kind (its worst case: sliding logs and tier logs
/// count every key's full log, though only touched pages take memory).
pub(crate) fn variant_bytes(params: &LimitParams) -> u128 {
    let bytes = match params {
        LimitParams::Inflight { sketch, .. } => sketch.clamped().bytes(),
        LimitParams::Rate { max_keys, .. } => RateLimiter::table_bytes(*max_keys),
        LimitParams::TokenBucket { max_keys, .. } => TokenBucket::table_bytes(*max_keys),
        LimitParams::Concurrency { max_keys, .. } => ConcurrencyLimiter::table_bytes(*max_keys),
        LimitParams::SlidingLog {
            windows, max_keys, ..
        } => SlidingLog::memory_bytes(windows, *max_keys).unwrap_or(usize::MAX),
        LimitParams::Tiered { tiered, max_keys } => {
            let per_key = TieredLimiter::bytes_per_key(tiered);
            usize::try_from(per_key.saturating_mul(*max_keys as u64)).unwrap_or(usize::MAX)
        }
    };
    bytes as u128
}

/// The memory `limit` holds in one origin: one state per variant.
pub(crate) fn limit_bytes(limit: &Limit) -> u128 {
    let variants = 1 + limit.overrides.len() as u128;
    let top = limit.top_keys.map_or(0, HeavyHitters::bytes_for) as u128;
    variant_bytes(&limit.params) * variants + top
}

/// What a started process holds besides its origins and limits (code, the runtimes'
/// threads, Pingora's services, the metrics registry): 41 MB measured for a debug build
/// with one origin (a release build holds less).
pub(crate) const BASE_BYTES: u128 = 40 << 20;

/// What each origin holds besides its limits: its metric series (`tollgate_requests_total`'s
/// table of 600 status-code slots, 9.6 KB, the duration histogram, the inflight gauge), its
/// route and its runtime. 28 KB measured per origin (2 000 origins without limits: 97 MB).
pub(crate) const ORIGIN_BYTES: u128 = 28 << 10;

/// Each of an origin's host names and upstreams: a route or a resolved address.
const NAME_BYTES: u128 = 128;

/// What each limit variant (the base or an override) holds besides its table: its decision
/// counters and its runtime. 11 KB measured (2 000 origins, one inflight limit each with a
/// sketch of 16 counters: 114 MB more than without).
pub(crate) const VARIANT_BYTES: u128 = 12 << 10;

/// Bytes per key of the limiter API's ad-hoc bucket table (`api.max_keys`), built when
/// `server.limiter_api` is set.
const API_KEY_BYTES: u128 = 49;

/// The memory a process started on `config` takes, about: [`BASE_BYTES`], each origin's
/// [`ORIGIN_BYTES`] (and its names), each limit variant's [`VARIANT_BYTES`] and table
/// ([`variant_bytes`], allocated whole at start: the tables are written when built, but
/// for the large arenas of sliding logs and tiers, whose pages are taken as keys arrive),
/// and the limiter API's bucket table. `tollgate check` prints it; a test compares it with
/// the resident memory of the started binary. What dominates per origin is its limits'
/// tables: an inflight limit's default sketch is 256 KiB (328 KB resident, measured), so
/// 10 000 origins with one take about 3 GB; without limits an origin costs 28 KB.
pub fn memory_estimate(config: &crate::config::Config) -> u128 {
    let origins = config.origins.iter().chain(config.unmatched.as_ref());
    let mut total = BASE_BYTES;
    for origin in origins {
        let names = (origin.hosts.len() + origin.upstreams.len()) as u128;
        total = total.saturating_add(ORIGIN_BYTES + names * NAME_BYTES);
        for limit in &origin.limits {
            total = total.saturating_add(limit_memory(limit));
        }
    }
    for limit in &config.resources {
        total = total.saturating_add(limit_memory(limit));
    }
    if config.server.limiter_api.is_some() {
        total = total.saturating_add(config.api.max_keys as u128 * API_KEY_BYTES);
    }
    total
}

/// A limit's table and its variants' own costs.
fn limit_memory(limit: &Limit) -> u128 {
    let variants = 1 + limit.overrides.len() as u128;
    limit_bytes(limit).saturating_add(variants * VARIANT_BYTES)
}

/// `bytes` for people: `2.4 MiB`.
pub fn human(bytes: u128) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// What one place in the file costs: the states sized by it and their bytes.
#[derive(Debug)]
struct Cost {
    pos: Pos,
    states: u128,
    bytes: u128,
}

/// Refuses a config whose limiter state would exceed [`MAX_STATE_BYTES`]. Each limit comes
/// located at the field that sizes its state (`max_keys`, `sketch.slots`, ...; the limit
/// itself when the size is the default), so a default limit's cost in every origin adds up
/// at the default's line. The error points at the costliest place and names the three
/// costliest.
pub(crate) fn state_budget<'a>(r: &mut Report, limits: impl IntoIterator<Item = &'a At<Limit>>) {
    let mut total: u128 = 0;
    let mut by_place: HashMap<&str, Cost> = HashMap::new();
    for limit in limits {
        let bytes = limit_bytes(&limit.v);
        total = total.saturating_add(bytes);
        let cost = by_place.entry(limit.path.as_str()).or_insert(Cost {
            pos: limit.pos,
            states: 0,
            bytes: 0,
        });
        cost.states += 1 + limit.v.overrides.len() as u128;
        cost.bytes = cost.bytes.saturating_add(bytes);
    }
    if total <= MAX_STATE_BYTES {
        return;
    }
    let mut costs: Vec<(&str, Cost)> = by_place.into_iter().collect();
    costs.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
    let named: Vec<String> = costs
        .iter()
        .take(3)
        .map(|(path, c)| {
            let states = if c.states == 1 {
                "1 state".to_string()
            } else {
                format!("{} states", c.states)
            };
            format!("`{path}` ({states}, {})", human(c.bytes))
        })
        .collect();
    let Some((path, top)) = costs.first() else {
        return;
    };
    r.error(
        top.pos,
        path,
        format!(
            "the limiters' state would take {}, above the ceiling of {}; the costliest: {}. Lower `max_keys` or `sketch`, or use fewer overrides or origins",
            human(total),
            human(MAX_STATE_BYTES),
            named.join(", ")
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_well() {
        assert_eq!(human(10), "10 B");
        assert_eq!(human(2_500_000), "2.4 MiB");
        assert_eq!(human(4 << 30), "4.0 GiB");
        assert_eq!(human(22 << 40), "22.0 TiB");
    }
}
