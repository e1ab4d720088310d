//! The store's connection and its one call path: every script call goes through
//! [`RedisStore::eval`], which holds the breaker check, the budget, `NOSCRIPT` reloads, the
//! metrics and the breaker's accounting, and the repair of a key a call failed on; the
//! probe that (re)connects and closes the breaker; the store's runtime thread. The module
//! doc of `crate::store::redis` describes the rules.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::runtime::Handle;

use crate::log_budget::suppressed_note;
use crate::store::breaker::Transition;
use crate::store::budget;
use crate::store::key::RedisType;
use crate::store::redis::{gather, micros, Inner, LuaScript, Micros, RedisStore, SCRIPT_MAX};
use crate::store::StoreError;

pub(super) enum Target {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(super) async fn req(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let value = match self {
            Conn::Single(c) => c.clone().send_packed_command(cmd).await?,
            Conn::Cluster(c) => c.clone().req_packed_command(cmd).await?,
        };
        value.extract_error()
    }

    /// Sends the `count` calls of `pipe` in one write; one reply per call, a call's error
    /// in its own reply ([`super::gather`]).
    pub(super) async fn pipeline(
        &self,
        pipe: &redis::Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        match self {
            Conn::Single(c) => c.clone().send_packed_commands(pipe, 0, count).await,
            Conn::Cluster(c) => c.clone().req_packed_commands(pipe, 0, count).await,
        }
    }
}

/// One argument of a script call.
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg<'a> {
    U(u64),
    S(&'a str),
}

impl RedisStore {
    /// The budget of a decision call: the store's `timeout`, or within a request phase
    /// what is left of it ([`crate::store::budget`]).
    pub(super) fn budget(&self) -> Duration {
        budget::left(self.inner.config.tuning.timeout)
    }

    /// The timeout of calls nobody waits for (refunds, releases, renewals): as long as a
    /// probe's, since a batch of renewals can take longer than one decision's budget.
    pub(super) fn background(&self) -> Duration {
        self.inner.probe_timeout
    }

    pub(super) fn lease_micros(&self) -> u64 {
        micros(self.inner.config.tuning.lease).clamp(1_000, SCRIPT_MAX)
    }

    /// Runs `script` within `timeout`, through the breaker, with `at` appended to `args`
    /// when given; `NOSCRIPT` is answered by `EVAL` within the same budget.
    pub(super) async fn eval(
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
            match gather::req(&conn, evalsha).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    log::info!(
                        "store {}: Redis lost script {} (restart or failover); loading it again",
                        inner.config.name,
                        script.name
                    );
                    let eval = script_cmd("EVAL", script.body, keys, args, at);
                    gather::req(&conn, eval).await
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
                        inner.config.tuning.failures
                    ));
                }
                Err(StoreError::Redis(e))
            }
            Err(_) => {
                inner.metrics.timeout.inc();
                if inner.breaker.failure() == Transition::Opened {
                    inner.opened(&format!(
                        "{} consecutive failures, last: no answer within {:?}",
                        inner.config.tuning.failures, timeout
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
        let every = self.config.tuning.probe_every.as_millis() as u64;
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
            self.config.tuning.fallback
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

/// Probes while the breaker is open, closes it on success; sleeps while it is closed.
pub(super) async fn probe_loop(inner: Arc<Inner>) {
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
                tokio::time::sleep(inner.config.tuning.probe_every).await;
            }
        }
    }
}

/// Starts the store's thread and single-threaded runtime; returns its handle and the
/// sender that stops it.
pub(super) fn start_runtime(
    name: &str,
) -> Result<(Handle, tokio::sync::oneshot::Sender<()>), StoreError> {
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
