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

mod counters;
mod lease;
mod scripts;
mod sliding_log;
mod tiered;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::{socket2, TcpSettings};
use redis::{Cmd, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind, Value};
use tokio::runtime::Handle;
use tokio::sync::Notify;

use crate::limits::clock::Nanos;
use crate::limits::rate::RateParams;
use crate::limits::token_bucket::TokenBucketParams;
use crate::limits::verdict::{Grant, Verdict, NEVER};
use crate::metrics::StoreMetrics;
use crate::ratelog::{suppressed_note, LogBudget};
use crate::store::breaker::{Breaker, Transition};
use crate::store::budget;
use crate::store::key::{KeyNames, RedisType, StateKind, Variant};
use crate::store::StoreError;

pub use counters::{CounterKeys, CountersOutcome};
pub use lease::LeaseGrant;
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

/// What decides while the store cannot (config key `fallback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// A local limiter of the same kind at this instance's share of the limit:
    /// `max / instances` (capacity and refill for buckets), rounded up.
    #[default]
    Local,
    /// Admit everything (fail open).
    Allow,
    /// Reject everything (fail closed).
    Deny,
}

/// A Redis store's settings: the `stores:` entry of the config, normalized.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    /// The store's name in the config: the `store` label of its metrics.
    pub name: String,
    /// Where Redis is.
    pub endpoint: Endpoint,
    /// Budget of one request phase for its calls (`timeout`, default 5 ms; see
    /// [`crate::store::budget`]), and of each call made outside a phase.
    pub timeout: Duration,
    /// Consecutive failures that open the breaker (`breaker.failures`, default 5).
    pub failures: u32,
    /// Probe interval while the breaker is open (`breaker.probe_every`, default 500 ms).
    pub probe_every: Duration,
    /// What decides while the store cannot (`fallback`, default local).
    pub fallback: Fallback,
    /// Fleet size, to share limits while falling back (`instances`, default 1).
    pub instances: u32,
    /// Key prefix (`prefix`, default `tollgate:`).
    pub prefix: String,
    /// This process's name in shared state (`server.instance`, default
    /// [`default_instance`]): inflight counts are kept per instance.
    pub instance: String,
    /// How long an instance's inflight units outlive its last renewal (`lease`, default
    /// 10 s; renewed every third of it). A crashed instance's share is gone after one.
    pub lease: Duration,
}

impl RedisStoreConfig {
    /// The defaults for a store called `name` at `endpoint`.
    pub fn new(name: impl Into<String>, endpoint: Endpoint) -> Self {
        Self {
            name: name.into(),
            endpoint,
            timeout: Duration::from_millis(5),
            failures: 5,
            probe_every: Duration::from_millis(500),
            fallback: Fallback::Local,
            instances: 1,
            prefix: "tollgate:".to_string(),
            instance: default_instance(),
            lease: Duration::from_secs(10),
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
/// A window is at most 2^27 ticks (see rate.lua).
const RATE_TICKS: u64 = 1 << 27;
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

enum Target {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn req(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let value = match self {
            Conn::Single(c) => c.clone().send_packed_command(cmd).await?,
            Conn::Cluster(c) => c.clone().req_packed_command(cmd).await?,
        };
        value.extract_error()
    }
}

/// One argument of a script call.
#[derive(Debug, Clone, Copy)]
enum Arg<'a> {
    U(u64),
    S(&'a str),
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
                    .response_timeout(probe_timeout.max(config.timeout))
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
        let probe_key = KeyNames::scoped(&config.prefix, "probe").key(0, StateKind::Rate);
        let id_tag = id_tag(&config.instance);
        metrics.up.set(0);
        let inner = Arc::new(Inner {
            probe_timeout,
            breaker: Breaker::new(config.failures),
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
        KeyNames::new(&self.inner.config.prefix, origin, limit, variant)
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

    /// One token-bucket decision for the key hashed to `hash` (see token_bucket.lua), at
    /// Redis's time or `at`.
    pub async fn token_bucket(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TokenBucketParams,
        cost: u64,
        at: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        let grant = self
            .token_bucket_many(names, hash, params, cost, cost, at)
            .await?;
        Ok(grant.verdict)
    }

    /// One token-bucket decision on a request for between `min` and `want` tokens (see
    /// token_bucket.lua): the largest count in `[min, want]` the bucket holds is taken, in
    /// the same script call, or nothing. `min` above `want` is lowered to it.
    pub async fn token_bucket_many(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TokenBucketParams,
        min: u64,
        want: u64,
        at: Option<Micros>,
    ) -> Result<Grant, StoreError> {
        let p = BucketArgs::new(params);
        let key = names.key(hash, StateKind::TokenBucket);
        let (want, min) = (want.min(SCRIPT_MAX), min.min(want).min(SCRIPT_MAX));
        let args = [
            Arg::U(p.capacity),
            Arg::U(p.amount),
            Arg::U(p.every),
            Arg::U(want),
            Arg::U(u64::from(params.strict)),
            Arg::U(min),
        ];
        let s = &self.inner.scripts.token_bucket;
        let v = self.eval(s, &[&key], &args, at, self.budget()).await?;
        let [allowed, remaining, reset, retry, granted] = scripts::ints::<5>(&v)?;
        Ok(Grant {
            verdict: never_above(
                verdict(allowed, remaining, reset, retry),
                min,
                params.capacity,
            ),
            granted: scripts::count(granted),
        })
    }

    /// The tokens a bucket holds and the time until it is full, taking nothing (`RL.GET`).
    pub async fn token_bucket_get(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TokenBucketParams,
        at: Option<Micros>,
    ) -> Result<(u64, Nanos), StoreError> {
        let p = BucketArgs::new(params);
        let key = names.key(hash, StateKind::TokenBucket);
        let args = [Arg::U(p.capacity), Arg::U(p.amount), Arg::U(p.every)];
        let s = &self.inner.scripts.token_bucket_get;
        let v = self.eval(s, &[&key], &args, at, self.budget()).await?;
        let [tokens, reset] = scripts::ints::<2>(&v)?;
        Ok((scripts::count(tokens), nanos(reset)))
    }

    /// Gives back `cost` tokens taken by an admitted request; returns the tokens after.
    pub async fn token_bucket_refund(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &TokenBucketParams,
        cost: u64,
        at: Option<Micros>,
    ) -> Result<u64, StoreError> {
        let p = BucketArgs::new(params);
        let key = names.key(hash, StateKind::TokenBucket);
        let args = [
            Arg::U(p.capacity),
            Arg::U(p.amount),
            Arg::U(p.every),
            Arg::U(cost.min(SCRIPT_MAX)),
        ];
        let s = &self.inner.scripts.token_bucket_refund;
        let v = self.eval(s, &[&key], &args, at, self.background()).await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// One sliding-window rate decision (see rate.lua). `max` is clamped to [`RATE_MAX`];
    /// `per` is counted in ticks of 1, 10, 100 or 1000 µs (the finest that keeps a window
    /// within 2^27 ticks: 1 µs up to 134 s, 1 ms up to 37 h), so `retry_after` is exact to
    /// that tick.
    pub async fn rate(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &RateParams,
        cost: u64,
        at: Option<Micros>,
    ) -> Result<Verdict, StoreError> {
        let grant = self.rate_many(names, hash, params, cost, cost, at).await?;
        Ok(grant.verdict)
    }

    /// One sliding-window rate decision on a request for between `min` and `want` events
    /// (see rate.lua): the largest count in `[min, want]` that fits is counted, in the same
    /// script call, or nothing. `min` above `want` is lowered to it.
    pub async fn rate_many(
        &self,
        names: &KeyNames,
        hash: u64,
        params: &RateParams,
        min: u64,
        want: u64,
        at: Option<Micros>,
    ) -> Result<Grant, StoreError> {
        let (per, tick) = rate_window(params.per);
        let key = names.key(hash, StateKind::Rate);
        let (want, min) = (want.min(RATE_MAX + 1), min.min(want).min(RATE_MAX + 1));
        let args = [
            Arg::U(params.max.min(RATE_MAX)),
            Arg::U(per),
            Arg::U(tick),
            Arg::U(want),
            Arg::U(u64::from(params.strict)),
            Arg::U(min),
        ];
        let s = &self.inner.scripts.rate;
        let v = self.eval(s, &[&key], &args, at, self.budget()).await?;
        let [allowed, remaining, reset, retry, granted] = scripts::ints::<5>(&v)?;
        Ok(Grant {
            verdict: never_above(verdict(allowed, remaining, reset, retry), min, params.max),
            granted: scripts::count(granted),
        })
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
            previous: scripts::count(previous),
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
        let (per, tick) = rate_window(params.per);
        let key = names.key(hash, StateKind::Rate);
        let args = [Arg::U(per), Arg::U(tick), Arg::U(cost.min(RATE_MAX + 1))];
        let s = &self.inner.scripts.rate_refund;
        let v = self.eval(s, &[&key], &args, at, self.background()).await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// Takes one inflight unit for this instance if the fleet's total stays within `max`:
    /// `Ok(Ok(total))` when taken, `Ok(Err(total + 1))` when not (the estimate that was
    /// over, as the in-process limiter reports it).
    pub async fn inflight_acquire(
        &self,
        names: &KeyNames,
        hash: u64,
        max: u64,
    ) -> Result<Result<u64, u64>, StoreError> {
        let (counts, leases) = inflight_keys(names, hash);
        let args = [
            Arg::S(&self.inner.config.instance),
            Arg::U(max.min(SCRIPT_MAX)),
            Arg::U(self.lease_micros()),
        ];
        let s = &self.inner.scripts.inflight_acquire;
        let v = self
            .eval(s, &[&counts, &leases], &args, None, self.budget())
            .await?;
        let [admitted, total] = scripts::ints::<2>(&v)?;
        let total = scripts::count(total);
        Ok(if admitted == 1 { Ok(total) } else { Err(total) })
    }

    /// Gives back one unit this instance holds; returns the units it still holds.
    pub async fn inflight_release(&self, names: &KeyNames, hash: u64) -> Result<u64, StoreError> {
        let (counts, leases) = inflight_keys(names, hash);
        let args = [Arg::S(&self.inner.config.instance)];
        let s = &self.inner.scripts.inflight_release;
        let v = self
            .eval(s, &[&counts, &leases], &args, None, self.background())
            .await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// Renews this instance's lease on the key and repairs its count from `count` (the
    /// local truth): written over Redis's when `dirty` (Redis may disagree), else only if
    /// Redis lost it (see inflight_renew.lua). Returns the fleet's total.
    pub async fn inflight_renew(
        &self,
        names: &KeyNames,
        hash: u64,
        count: u64,
        dirty: bool,
    ) -> Result<u64, StoreError> {
        let (counts, leases) = inflight_keys(names, hash);
        let args = [
            Arg::S(&self.inner.config.instance),
            Arg::U(count.min(SCRIPT_MAX)),
            Arg::U(self.lease_micros()),
            Arg::U(u64::from(dirty)),
        ];
        let s = &self.inner.scripts.inflight_renew;
        let v = self
            .eval(s, &[&counts, &leases], &args, None, self.background())
            .await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// The fleet's units in flight for the key (instances with a live lease only).
    pub async fn inflight_total(&self, names: &KeyNames, hash: u64) -> Result<u64, StoreError> {
        let (counts, leases) = inflight_keys(names, hash);
        let s = &self.inner.scripts.inflight_total;
        let v = self
            .eval(s, &[&counts, &leases], &[], None, self.background())
            .await?;
        Ok(scripts::count(scripts::int(&v)?))
    }

    /// The budget of a decision call: the store's `timeout`, or within a request phase
    /// what is left of it ([`crate::store::budget`]).
    fn budget(&self) -> Duration {
        budget::left(self.inner.config.timeout)
    }

    /// The timeout of calls nobody waits for (refunds, releases, renewals): as long as a
    /// probe's, since a batch of renewals can take longer than one decision's budget.
    fn background(&self) -> Duration {
        self.inner.probe_timeout
    }

    fn lease_micros(&self) -> u64 {
        micros(self.inner.config.lease).clamp(1_000, SCRIPT_MAX)
    }

    /// Runs `script` within `timeout`, through the breaker, with `at` appended to `args`
    /// when given; `NOSCRIPT` is answered by `EVAL` within the same budget.
    async fn eval(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[Arg<'_>],
        at: Option<Micros>,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        let inner = &*self.inner;
        let conn = match inner.breaker.is_closed() {
            true => inner.conn.load_full(),
            false => None,
        };
        let Some(conn) = conn else {
            inner.metrics.breaker_open.inc();
            return Err(StoreError::BreakerOpen);
        };
        if timeout.is_zero() {
            // The request phase spent its budget on earlier calls: not sent, and no failure
            // of the store's.
            inner.metrics.timeout.inc();
            return Err(StoreError::Timeout);
        }
        let at = at.map(Arg::U);
        let evalsha = script_cmd("EVALSHA", &script.sha, keys, args, at);
        let started = Instant::now();
        let work = async {
            match conn.req(&evalsha).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    log::info!(
                        "store {}: Redis lost script {} (restart or failover); loading it again",
                        inner.config.name,
                        script.name
                    );
                    conn.req(&script_cmd("EVAL", script.body, keys, args, at))
                        .await
                }
                other => other,
            }
        };
        let timed = {
            let _rt = inner.handle.enter();
            tokio::time::timeout(timeout, work)
        };
        let out = timed.await;
        inner
            .metrics
            .latency
            .observe(started.elapsed().as_secs_f64());
        match out {
            Ok(Ok(value)) => {
                inner.metrics.ok.inc();
                inner.breaker.success();
                Ok(value)
            }
            Ok(Err(e)) if is_key_error(&e) && !std::ptr::eq(script, &inner.scripts.repair) => {
                // Redis answered: the store is fine, one key's data is not.
                inner.metrics.key_error.inc();
                inner.breaker.success();
                self.repair(script.name, keys, &e);
                Err(StoreError::Key(e))
            }
            Ok(Err(e)) => {
                inner.metrics.error.inc();
                if is_connection_error(&e) {
                    inner.reconnect.store(true, Ordering::Relaxed);
                    if inner.breaker.trip() == Transition::Opened {
                        inner.opened(&format!("connection error: {e}"));
                    }
                } else if inner.breaker.failure() == Transition::Opened {
                    inner.opened(&format!(
                        "{} consecutive failures, last: {e}",
                        inner.config.failures
                    ));
                }
                Err(StoreError::Redis(e))
            }
            Err(_) => {
                inner.metrics.timeout.inc();
                if inner.breaker.failure() == Transition::Opened {
                    inner.opened(&format!(
                        "{} consecutive failures, last: no answer within {:?}",
                        inner.config.failures, timeout
                    ));
                } else if matches!(inner.target, Target::Cluster(_)) {
                    self.inner.refresh_cluster();
                }
                Err(StoreError::Timeout)
            }
        }
    }
}

impl RedisStore {
    /// A decision by `script` failed on the data of `keys` (`error`): in the background,
    /// deletes those of them that are not what tollgate writes there (repair.lua), so the
    /// key's next decision starts afresh, and says so within the log budget. Never waited
    /// for; a repair that fails is retried by the key's next failing decision.
    fn repair(&self, script: &'static str, keys: &[&str], error: &RedisError) {
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_string()).collect();
        let error = error.to_string();
        let store = self.clone();
        self.inner.handle.spawn(async move {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let types: Vec<&str> = keys
                .iter()
                .map(|k| RedisType::of(k).map_or("", RedisType::name))
                .collect();
            let args: Vec<Arg<'_>> = types.iter().map(|t| Arg::S(t)).collect();
            let inner = &store.inner;
            let s = &inner.scripts.repair;
            let outcome = match store.eval(s, &refs, &args, None, store.background()).await {
                Ok(Value::Array(deleted)) if deleted.is_empty() => {
                    "none of its keys needed deleting".to_string()
                }
                Ok(Value::Array(deleted)) => {
                    let names: Vec<String> = deleted
                        .iter()
                        .map(|v| match v {
                            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                            other => format!("{other:?}"),
                        })
                        .collect();
                    format!(
                        "deleted {} (its next decision starts afresh)",
                        names.join(", ")
                    )
                }
                Ok(other) => format!("repair: unexpected reply {other:?}"),
                Err(e) => format!("repair failed ({e}): the key's next failure retries it"),
            };
            let now = u64::try_from(inner.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            if let Some(suppressed) = inner.key_log.admit(now) {
                log::warn!(
                    "store {}: {script} failed on the data of a key ({error}): decided by the fallback; {outcome}{}",
                    inner.config.name,
                    suppressed_note(suppressed)
                );
            }
        });
    }
}

impl Inner {
    /// A call to a Redis Cluster timed out while the breaker stays closed (other nodes
    /// answer, so failures are not consecutive): its node may be frozen or cut off, and
    /// replaced by a replica. redis-rs' cluster connection never learns that from a
    /// timeout (it retries the same node; only an error answer or a dropped connection
    /// makes it read the slots again), so the keys of that node would fail open until
    /// the node itself answers. At most once per `probe_every`, a fresh connection is
    /// built in the background from the configured nodes (`CLUSTER SLOTS` from one that
    /// answers) and replaces the current one once ready; calls in flight finish on the
    /// old one.
    fn refresh_cluster(self: &Arc<Self>) {
        let now = (self.started.elapsed().as_millis() as u64).max(1);
        let last = self.refreshed.load(Ordering::Relaxed);
        let every = self.config.probe_every.as_millis() as u64;
        if last != 0 && now < last.saturating_add(every) {
            return;
        }
        if self
            .refreshed
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let inner = Arc::clone(self);
        self.handle.spawn(async move {
            match tokio::time::timeout(inner.connect_within(), inner.connect()).await {
                Ok(Ok(conn)) => {
                    inner.conn.store(Some(Arc::new(conn)));
                    log::info!(
                        "store {}: a cluster node missed its budget; slots read again",
                        inner.config.name
                    );
                }
                Ok(Err(e)) => {
                    log::debug!("store {}: cluster refresh failed: {e}", inner.config.name)
                }
                Err(_) => log::debug!("store {}: cluster refresh timed out", inner.config.name),
            }
        });
    }

    /// The breaker just opened: say so once, and wake the probe.
    fn opened(&self, why: &str) {
        self.metrics.up.set(0);
        log::warn!(
            "store {}: down ({why}); deciding by fallback ({:?}) until a probe succeeds",
            self.config.name,
            self.config.fallback
        );
        self.wake.notify_one();
    }

    /// One probe: (re)connect if needed, PING, load the scripts, run the probe script.
    async fn probe(&self) -> Result<(), StoreError> {
        let t = self.probe_timeout;
        let within = |what: &'static str| move |_| StoreError::Probe(what);
        let existing = self.conn.load_full();
        let conn = match existing {
            Some(conn) if !self.reconnect.load(Ordering::Relaxed) => conn,
            _ => {
                let conn = tokio::time::timeout(self.connect_within(), self.connect())
                    .await
                    .map_err(within("connect"))??;
                let conn = Arc::new(conn);
                self.conn.store(Some(Arc::clone(&conn)));
                self.reconnect.store(false, Ordering::Relaxed);
                conn
            }
        };
        let result = async {
            tokio::time::timeout(t, conn.req(&redis::cmd("PING")))
                .await
                .map_err(within("PING"))??;
            for script in self.scripts.all() {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(script.body);
                tokio::time::timeout(t, conn.req(&load))
                    .await
                    .map_err(within("SCRIPT LOAD"))??;
            }
            let probe = &self.scripts.probe;
            let run = script_cmd(
                "EVALSHA",
                &probe.sha,
                &[&self.probe_key],
                &[Arg::S(&self.config.instance)],
                None,
            );
            tokio::time::timeout(t, conn.req(&run))
                .await
                .map_err(within("probe script"))??;
            Ok::<(), StoreError>(())
        }
        .await;
        if result.is_err() {
            // A connection that failed a probe is not trusted again (a silent partition,
            // a frozen peer): the next probe starts afresh.
            self.reconnect.store(true, Ordering::Relaxed);
        }
        result
    }

    /// How long a (re)connect may take. A cluster's gets four probe timeouts: it connects
    /// to every configured node at once (a frozen one costs its connect timeout, the probe
    /// timeout), reads the slots from one that answered, then connects to every node of
    /// the slot map at once (a frozen one costs it again); with one probe timeout in all,
    /// a single frozen node, even one replaced by its replica, kept the store down.
    fn connect_within(&self) -> Duration {
        match self.target {
            Target::Single(_) => self.probe_timeout,
            Target::Cluster(_) => self.probe_timeout * 4,
        }
    }

    async fn connect(&self) -> Result<Conn, StoreError> {
        Ok(match &self.target {
            Target::Single(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.probe_timeout))
                    // The store's budget bounds every call, on the store's timer.
                    .set_response_timeout(None)
                    // Room for every concurrent decision without waiting for the driver.
                    .set_pipeline_buffer_size(4096);
                Conn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                )
            }
            Target::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
        })
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

/// Probes while the breaker is open, closes it on success; sleeps while it is closed.
async fn probe_loop(inner: Arc<Inner>) {
    let mut last_error = String::new();
    loop {
        if inner.breaker.is_closed() {
            inner.wake.notified().await;
            continue;
        }
        match inner.probe().await {
            Ok(()) => {
                inner.breaker.close();
                inner.metrics.up.set(1);
                log::info!("store {}: up, decisions go to Redis", inner.config.name);
                last_error.clear();
            }
            Err(e) => {
                let e = e.to_string();
                if e != last_error {
                    log::warn!("store {}: probe failed: {e}", inner.config.name);
                    last_error = e;
                }
                tokio::time::sleep(inner.config.probe_every).await;
            }
        }
    }
}

/// Starts the store's thread and single-threaded runtime; returns its handle and the
/// sender that stops it.
fn start_runtime(name: &str) -> Result<(Handle, tokio::sync::oneshot::Sender<()>), StoreError> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (handle_tx, handle_rx) = std::sync::mpsc::channel();
    let thread_err = |e: std::io::Error| StoreError::Runtime {
        store: name.to_string(),
        reason: e.to_string(),
    };
    std::thread::Builder::new()
        .name(format!("store-{name}"))
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match rt {
                Ok(rt) => {
                    let _ = handle_tx.send(Ok(rt.handle().clone()));
                    rt.block_on(async {
                        let _ = stop_rx.await;
                    });
                }
                Err(e) => {
                    let _ = handle_tx.send(Err(e));
                }
            }
        })
        .map_err(thread_err)?;
    let handle = handle_rx
        .recv()
        .map_err(|e| StoreError::Runtime {
            store: name.to_string(),
            reason: e.to_string(),
        })?
        .map_err(thread_err)?;
    Ok((handle, stop_tx))
}

/// `VERB sha-or-body numkeys keys... args... [at]`.
fn script_cmd(
    verb: &str,
    script: &str,
    keys: &[&str],
    args: &[Arg<'_>],
    at: Option<Arg<'_>>,
) -> Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(script).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    for arg in args.iter().chain(at.as_ref()) {
        match arg {
            Arg::U(n) => cmd.arg(*n),
            Arg::S(s) => cmd.arg(*s),
        };
    }
    cmd
}

/// Whether `e` is about the data of a key the call named rather than about the store
/// (module doc, "Key errors"): `WRONGTYPE`, or an error raised while a script ran
/// (`user_script` in its text: Redis 7 reports a script's runtime errors that way, Redis 6
/// wraps every error of a script in one) that is none of the errors a whole node answers
/// (out of memory, read-only, loading, busy, no permission, cluster states).
fn is_key_error(e: &RedisError) -> bool {
    const NODE_ERRORS: [&str; 12] = [
        "OOM",
        "READONLY",
        "LOADING",
        "BUSY",
        "NOPERM",
        "MASTERDOWN",
        "MISCONF",
        "NOREPLICAS",
        "CLUSTERDOWN",
        "CROSSSLOT",
        "TRYAGAIN",
        "NOSCRIPT",
    ];
    match e.code() {
        Some("WRONGTYPE") => true,
        Some("ERR") => e.detail().is_some_and(|d| {
            d.contains("user_script") && !NODE_ERRORS.iter().any(|n| d.contains(n))
        }),
        _ => false,
    }
}

/// Whether `e` means the connection itself is gone (refused, reset, closed): the breaker
/// opens at once and the probe reconnects.
fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
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

/// A token bucket's parameters in the scripts' units.
struct BucketArgs {
    capacity: u64,
    amount: u64,
    every: u64,
}

impl BucketArgs {
    fn new(p: &TokenBucketParams) -> Self {
        Self {
            capacity: p.capacity.min(SCRIPT_MAX),
            amount: p.amount.clamp(1, SCRIPT_MAX),
            every: round_micros(p.every).clamp(1, SCRIPT_MAX),
        }
    }
}

/// A window of `per` nanoseconds as (ticks, tick in µs): the finest tick of 1, 10, 100,
/// 1000... µs that keeps the window within 2^27 ticks.
fn rate_window(per: Nanos) -> (u64, u64) {
    let per_us = round_micros(per).clamp(1, SCRIPT_MAX);
    let mut tick = 1u64;
    while per_us.div_ceil(tick) > RATE_TICKS {
        tick *= 10;
    }
    let ticks = ((per_us + tick / 2) / tick).max(1);
    (ticks, tick)
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

fn verdict(allowed: i64, remaining: i64, reset: i64, retry: i64) -> Verdict {
    let (remaining, reset) = (scripts::count(remaining), nanos(reset));
    if allowed == 1 {
        Verdict::allow(remaining, reset)
    } else {
        Verdict::reject(remaining, reset, nanos(retry).max(1))
    }
}

/// A cost above what the limit can ever hold (`capacity: 0` or `max: 0`: a block) never
/// passes: its rejection says [`NEVER`], as the in-process limiters do, so no retry is
/// invited.
fn never_above(v: Verdict, cost: u64, limit: u64) -> Verdict {
    if !v.allowed && cost > limit {
        Verdict {
            retry_after: NEVER,
            ..v
        }
    } else {
        v
    }
}

fn inflight_keys(names: &KeyNames, hash: u64) -> (String, String) {
    (
        names.key(hash, StateKind::InflightCounts),
        names.key(hash, StateKind::InflightLeases),
    )
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
