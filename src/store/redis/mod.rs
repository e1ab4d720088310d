//! The Redis (or Valkey) store: limit state shared by a fleet of proxies, which Redis
//! trouble can never turn into proxy trouble.
//!
//! **Connection.** One multiplexed connection per store (per node on Redis Cluster), shared
//! by every concurrent decision: requests are pipelined on it, never pooled. It and its
//! driver task live on the store's own single-threaded tokio runtime, on a thread of its
//! own that outlives any proxy worker runtime; decisions are awaited from any runtime (the
//! proxy's workers) because they only talk to the driver through channels. redis-rs'
//! defaults are not used: the standalone response timeout (500 ms) is replaced by the
//! store's own budget timer, the cluster's retries (16, waiting up to minutes) by one
//! retry within the budget, reconnection is the probe's job (a call never waits for a
//! reconnect), TCP_NODELAY is on and TCP keepalive probes after 10 s idle.
//!
//! **Budget.** Every decision has a budget (`timeout`, default 5 ms), shared by all the
//! calls of one request phase ([`crate::store::budget`]). Past it the call returns
//! [`StoreError::Timeout`] at once, whatever Redis does, and the caller falls back.
//! The budget's timer is registered with the store's runtime, so callers need no timer of
//! their own. tokio's timers have a 1 ms resolution: a call returns within budget + 1 ms.
//!
//! **Breaker.** See [`crate::store::breaker`]: `failures` consecutive failures, or one
//! connection error, open it; while open a call returns [`StoreError::BreakerOpen`] without
//! touching Redis. A background probe runs at once when it opens and then every
//! `probe_every`: (re)connect if needed, `PING`, `SCRIPT LOAD` every script, run the probe
//! script (a write, so a node out of memory or read-only stays out), and close the breaker
//! on success. A store starts open and is probed at once, so starting never fails because
//! Redis is down: it comes up by itself. Decisions resume within `probe_every` plus one
//! probe of Redis coming back.
//!
//! **Key errors.** An error about one key's data is that key's failure, not the store's:
//! `WRONGTYPE` (another type written over a state key, by hand or by another program) or
//! an error a script raised while reading a key (data no script wrote). Such a call
//! returns [`StoreError::Key`], so that decision falls back; it is counted as
//! `tollgate_store_requests_total{result="key_error"}`, it counts as an answer for the
//! breaker (which never opens for it, so no probe and no `SCRIPT LOAD` follow), and a
//! repair runs in the background (`repair.lua`): every key the call named that is not
//! what tollgate writes there (another type, a hash field that is not a finite number, an
//! infinite score) is deleted, so the key's next decision starts as a new key's (a full
//! bucket, an empty window or log; leased counts are written back by their holders' next
//! renewal). Keys holding what tollgate writes are left alone. One line per failure, at
//! most five a second (a [`LogBudget`]), names the key and Redis's answer.
//!
//! **Time.** Scripts read Redis `TIME` (one clock for the fleet) in microseconds, unless the
//! caller supplies `at` ([`Micros`], for replays). Durations come back in microseconds and
//! are returned as [`Nanos`]. Parameters are rounded to whole microseconds (the config's
//! durations are whole milliseconds).
//!
//! **Files.** `conn`: the connection, the one call path every script call takes
//! (`RedisStore::eval`: breaker, budget, `NOSCRIPT`, key repair), the probe and the
//! runtime thread. `gather`: the calls of one request phase sent as one pipeline. One file
//! per kind's calls: `token_bucket`, `rate`, `inflight`,
//! `sliding_log`, `tiered`, `counters` (concurrency). `scripts`: the Lua scripts, each
//! built with one shared prelude.

mod conn;
mod counters;
pub mod gather;
mod inflight;
mod lease;
mod rate;
mod scripts;
mod sliding_log;
mod tiered;
mod token_bucket;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::io::tcp::{socket2, TcpSettings};
use redis::IntoConnectionInfo;
use tokio::runtime::Handle;
use tokio::sync::Notify;

pub use crate::config::Fallback;
use crate::config::StoreTuning;
use crate::limits::clock::Nanos;
use crate::limits::verdict::{Grant, Verdict};
use crate::log_budget::LogBudget;
use crate::metrics::StoreMetrics;
use crate::store::breaker::Breaker;
use crate::store::key::{KeyNames, StateKind, Variant};
use crate::store::StoreError;

use conn::{probe_loop, start_runtime, Arg, Conn, Target};
pub use counters::{CounterKeys, CountersOutcome};
pub use lease::{LeaseGrant, LeaseQuota};
pub use rate::RateCounts;
pub use scripts::{LuaScript, Scripts};
pub use sliding_log::LogGrant;
pub use tiered::{GlobalArg, TieredGrant};

/// Microseconds in Redis's clock (`TIME`: since the Unix epoch).
pub type Micros = u64;

/// Where the store's Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// One Redis (or Valkey): `redis://host:port/db` (config key `url`).
    Standalone(String),
    /// Redis Cluster, from any of its nodes (config keys `urls` and `cluster: true`).
    Cluster(Vec<String>),
}

/// A Redis store's settings: the `stores:` entry of the config, normalized.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    /// The store's name in the config: the `store` label of its metrics.
    pub name: String,
    /// Where Redis is.
    pub endpoint: Endpoint,
    /// This process's name in shared state (`server.instance`, default
    /// [`default_instance`]): holding limits keep their counts per instance.
    pub instance: String,
    /// How the store is used: budget, breaker, fallback, fleet size, prefix, lease.
    pub tuning: StoreTuning,
}

impl RedisStoreConfig {
    /// The defaults (the config's, [`StoreTuning::default`]) for a store called `name` at
    /// `endpoint`, this process named [`default_instance`].
    pub fn new(name: impl Into<String>, endpoint: Endpoint) -> Self {
        Self {
            name: name.into(),
            endpoint,
            instance: default_instance(),
            tuning: StoreTuning::default(),
        }
    }
}

/// `<hostname>:<pid>`, the default name of this process in shared state.
pub fn default_instance() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", std::process::id())
}

/// Counts and durations sent to the scripts stay below 2^50 (they compute in doubles).
pub const SCRIPT_MAX: u64 = 1 << 50;
/// The largest rate `max` the Redis store keeps exactly (see rate.lua): 2^25 events per
/// window; a larger `max` is clamped to it.
pub const RATE_MAX: u64 = 1 << 25;
/// The most entries one sliding-log decision records (each is a sorted-set member): larger
/// costs are clamped, so that no single script runs for long.
pub const SLIDING_LOG_MAX: u64 = 1 << 24;

/// A handle on a Redis store; clones share the connection, breaker and runtime. The
/// runtime thread stops when the last clone (and the last guard or task holding one) is
/// dropped.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
}

struct Inner {
    config: RedisStoreConfig,
    /// Connect, probe and background-call timeout: `probe_every` within [50 ms, 1 s].
    probe_timeout: Duration,
    breaker: Breaker,
    conn: ArcSwapOption<Conn>,
    target: Target,
    scripts: Scripts,
    metrics: StoreMetrics,
    handle: Handle,
    /// Wakes the probe when the breaker opens.
    wake: Notify,
    /// The next probe replaces the connection.
    reconnect: AtomicBool,
    probe_key: String,
    /// This store's part of entry ids (see [`RedisStore::entry_id`]).
    id_tag: String,
    /// Entry ids handed out so far.
    ids: AtomicU64,
    /// When the store started: the origin of `refreshed`.
    started: Instant,
    /// Milliseconds after `started` of the last cluster refresh (0: never); see
    /// [`Inner::refresh_cluster`].
    refreshed: AtomicU64,
    /// Lines about keys a decision failed on (module doc, "Key errors"), on the clock of
    /// `started`.
    key_log: LogBudget,
}

/// A name unique to one decision, which the entries (sliding log) or hits (tiered) it
/// records in Redis carry as their sorted-set members, so that a refund removes exactly
/// them: 12 hex digits that tell this store apart from every other process's (a hash of
/// the instance name, the process id, the start time and a random seed) and a counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryId(Box<str>);

impl EntryId {
    /// The id as sent to Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Stops the runtime thread when dropped.
struct Owner {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl RedisStore {
    /// Starts a store: its runtime thread, and the probe that connects it. Never fails
    /// because Redis is down or unreachable (the store starts down and comes up by
    /// itself); a malformed URL, or no URL, is an error.
    pub fn new(config: RedisStoreConfig, metrics: StoreMetrics) -> Result<Self, StoreError> {
        let bad = |url: &str, e: &dyn std::fmt::Display| StoreError::BadUrl {
            store: config.name.clone(),
            // Never the password: the error reaches logs and `check`.
            url: crate::config::secret::redact_url(url).into_owned(),
            reason: e.to_string(),
        };
        let probe_timeout = config
            .tuning
            .probe_every
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        let tcp = TcpSettings::default().set_nodelay(true).set_keepalive(
            socket2::TcpKeepalive::new()
                .with_time(Duration::from_secs(10))
                .with_interval(Duration::from_secs(5)),
        );
        let target = match &config.endpoint {
            Endpoint::Standalone(url) => {
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(|e| bad(url, &e))?
                    .set_tcp_settings(tcp);
                Target::Single(redis::Client::open(info).map_err(|e| bad(url, &e))?)
            }
            Endpoint::Cluster(urls) => {
                if urls.is_empty() {
                    return Err(bad("", &"a cluster needs at least one URL"));
                }
                for url in urls {
                    url.as_str()
                        .into_connection_info()
                        .map_err(|e| bad(url, &e))?;
                }
                let client = redis::cluster::ClusterClientBuilder::new(urls.clone())
                    .tcp_settings(tcp)
                    .connection_timeout(probe_timeout)
                    // Per node, inside the cluster's own task: a backstop that clears
                    // requests a frozen node never answers. Callers have the budget.
                    .response_timeout(probe_timeout.max(config.tuning.timeout))
                    // Applied in the caller's runtime: replaced by the store's budget.
                    .overall_response_timeout(None)
                    .retries(1)
                    .min_retry_wait(1)
                    .max_retry_wait(10)
                    .build()
                    .map_err(|e| bad(&urls.join(","), &e))?;
                Target::Cluster(Box::new(client))
            }
        };
        let (handle, stop) = start_runtime(&config.name)?;
        let probe_key = KeyNames::scoped(&config.tuning.prefix, "probe").key(0, StateKind::Rate);
        let id_tag = id_tag(&config.instance);
        metrics.up.set(0);
        let inner = Arc::new(Inner {
            probe_timeout,
            breaker: Breaker::new(config.tuning.failures),
            conn: ArcSwapOption::empty(),
            target,
            scripts: Scripts::new(),
            metrics,
            handle: handle.clone(),
            wake: Notify::new(),
            reconnect: AtomicBool::new(true),
            probe_key,
            id_tag,
            ids: AtomicU64::new(0),
            started: Instant::now(),
            refreshed: AtomicU64::new(0),
            key_log: LogBudget::new(),
            config,
        });
        handle.spawn(probe_loop(Arc::clone(&inner)));
        Ok(Self {
            inner,
            _owner: Arc::new(Owner { stop: Some(stop) }),
        })
    }

    /// The store's settings.
    pub fn config(&self) -> &RedisStoreConfig {
        &self.inner.config
    }

    /// Whether `other` is a clone of this store (the same connection, breaker and
    /// runtime), not merely one with the same name or settings.
    pub fn same_as(&self, other: &RedisStore) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The store's name (its metrics label).
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// Whether the store is a Redis Cluster: state that spans keys (a global limit, a
    /// group's count) is then in another slot than a key's, and cannot share its script.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.config.endpoint, Endpoint::Cluster(_))
    }

    /// A new id, unique to this decision across the fleet (see [`EntryId`]).
    pub fn entry_id(&self) -> EntryId {
        let n = self.inner.ids.fetch_add(1, Ordering::Relaxed);
        EntryId(format!("{}{n:x}", self.inner.id_tag).into())
    }

    /// Whether the breaker is closed: decisions go to Redis.
    pub fn is_up(&self) -> bool {
        self.inner.breaker.is_closed()
    }

    /// Waits until the store is up, at most `within`; returns whether it is. For startup
    /// logs and tests; decisions never wait for it.
    pub async fn wait_up(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.is_up() {
            if Instant::now() >= deadline {
                return false;
            }
            self.sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// The store's runtime, where background work (releases, refunds, renewals) runs.
    pub fn handle(&self) -> &Handle {
        &self.inner.handle
    }

    /// The store's metric children.
    pub fn metrics(&self) -> &StoreMetrics {
        &self.inner.metrics
    }

    /// The key names of `origin`'s `limit`, `variant`, under this store's prefix.
    pub fn names(&self, origin: &str, limit: &str, variant: Variant) -> KeyNames {
        KeyNames::new(&self.inner.config.tuning.prefix, origin, limit, variant)
    }

    /// Runs `work` for at most `d`, on the store's timer (usable from any runtime, or none
    /// with a timer); `None` past it.
    pub(crate) async fn within<F: std::future::Future>(
        &self,
        d: Duration,
        work: F,
    ) -> Option<F::Output> {
        let timed = {
            let _rt = self.inner.handle.enter();
            tokio::time::timeout(d, work)
        };
        timed.await.ok()
    }

    /// What a decision call may wait now: the store's budget, or what is left of it in the
    /// running request phase ([`crate::store::budget`]).
    pub(crate) fn decision_budget(&self) -> Duration {
        self.budget()
    }

    /// Sleeps on the store's timer (usable from any runtime, or none with a timer).
    pub(crate) async fn sleep(&self, d: Duration) {
        let sleep = {
            let _rt = self.inner.handle.enter();
            tokio::time::sleep(d)
        };
        sleep.await;
    }
}

/// 12 hex digits naming this store among every process that ever shares its Redis: a
/// hash of the instance name, the process id, the wall clock and a random seed, so that a
/// restarted instance (same name, counter from 0) never reuses an earlier life's ids.
fn id_tag(instance: &str) -> String {
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let random = ahash::RandomState::new().hash_one(instance);
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(random);
    h.update(instance.as_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&clock.to_le_bytes());
    format!("{:012x}", h.digest() >> 16)
}

fn round_micros(n: Nanos) -> u64 {
    n / 1_000 + u64::from(n % 1_000 >= 500)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Script microseconds as nanoseconds.
fn nanos(us: i64) -> Nanos {
    scripts::count(us).saturating_mul(1_000)
}

/// A counter script's reply (`token_bucket.lua`, `rate.lua`, `fixed_window.lua`): allowed,
/// remaining, reset, retry and granted; `never`: a rejection can never turn (a `min` above
/// what the limit ever holds, `0`: a block), so no retry is invited, as in process.
fn grant(v: &::redis::Value, never: bool) -> Result<Grant, StoreError> {
    let [allowed, remaining, reset, retry, granted] = scripts::ints::<5>(v)?;
    Ok(Grant {
        verdict: verdict(allowed, remaining, reset, retry).never_if(never),
        granted: scripts::count(granted),
    })
}

fn verdict(allowed: i64, remaining: i64, reset: i64, retry: i64) -> Verdict {
    let (remaining, reset) = (scripts::count(remaining), nanos(reset));
    if allowed == 1 {
        Verdict::allow(remaining, reset)
    } else {
        Verdict::reject(remaining, reset, nanos(retry).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_errors_and_unreachable_ones_are_not() {
        let metrics = || StoreMetrics::unregistered("t").unwrap();
        let single = |url: &str| Endpoint::Standalone(url.to_string());
        for url in ["", "http://x", "redis://host:notaport/0", "redis://[::1/0"] {
            let e = RedisStore::new(RedisStoreConfig::new("t", single(url)), metrics());
            assert!(matches!(e, Err(StoreError::BadUrl { .. })), "{url}");
        }
        let e = RedisStore::new(
            RedisStoreConfig::new("t", Endpoint::Cluster(vec![])),
            metrics(),
        );
        assert!(matches!(e, Err(StoreError::BadUrl { .. })));
        let e = RedisStore::new(
            RedisStoreConfig::new("t", Endpoint::Cluster(vec!["nope".into()])),
            metrics(),
        );
        assert!(matches!(e, Err(StoreError::BadUrl { .. })));
        // Unreachable (a closed port) starts down, without an error.
        let s = RedisStore::new(
            RedisStoreConfig::new("t", single("redis://127.0.0.1:1/0")),
            metrics(),
        )
        .unwrap();
        assert!(!s.is_up());
        assert_eq!(s.metrics().up.get(), 0);
    }

    #[test]
    fn default_instance_is_host_and_pid() {
        let me = default_instance();
        assert!(me.ends_with(&format!(":{}", std::process::id())), "{me}");
        assert!(me.len() > 2 + std::process::id().to_string().len());
    }
}
