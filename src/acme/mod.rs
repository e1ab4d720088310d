//! ACME (RFC 8555): certificates ordered and renewed for the hosts `tls.acme` names, as a
//! background service beside the proxy. See `docs/acme.md` for the operator's account.
//!
//! **The loop.** Every [`TICK`] (faster while waiting on the fleet or a retry), the
//! [`Manager`] looks at each host: one without a certificate, or whose certificate is two
//! thirds into its lifetime ([`schedule::renew_at`]), is ordered ([`order`]) unless its
//! last failure's backoff ([`schedule::backoff`]) has not run out. One order at a time per
//! instance. A new certificate is stored first ([`storage`]), then installed on the
//! [`Managed`] board, which the TLS acceptor reads at each handshake: the next handshake
//! serves it, no reload needed.
//!
//! **Start.** Stored certificates are installed before anything is ordered, so a restart
//! serves at once and orders nothing while they are fresh. A stored certificate that does
//! not parse or whose key does not match is logged and ordered again.
//!
//! **Safe failure.** A failed order changes nothing served: the current certificate keeps
//! serving until a new one replaces it, and a host that has none yet falls back to
//! `tls.certificates` (their default, or a refused handshake). The CA's problem document
//! is logged at `warn`, within a [`LogBudget`]; the last one is in `GET /certificates`.
//!
//! **A fleet** (`store: NAME`): before ordering, an instance takes the fleet's order lock
//! in Redis, so one instance orders at a time; the others wait (none is busy with an order
//! of its own), install the challenge the holder publishes (so that the CA's validation
//! may reach any of them), and take the certificate from the store when it appears (the
//! store's generation key is read every [`FLEET_POLL`]).
//!
//! **Reloads.** The manager follows the live runtime: a changed `tls.acme` starts a new
//! manager (stored certificates are installed again; hosts no longer listed are dropped).
//!
//! It reads the runtime and writes the TLS board; no other front end imports it.

pub mod http;
pub mod keys;
pub mod order;
pub mod schedule;
pub mod storage;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use instant_acme::{Account, AccountCredentials, NewAccount};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::acme::order::{Listeners, OrderError};
use crate::acme::storage::{Storage, Stored};
use crate::config::Acme;
use crate::limits::{Clock, MonotonicClock};
use crate::log_budget::{suppressed_note, LogBudget};
use crate::metrics::Metrics;
use crate::runtime::Runtime;
use crate::tls::certs;
use crate::tls::managed::{HostStatus, Managed};

/// The loop's period when nothing is pending.
pub const TICK: Duration = Duration::from_secs(1);

/// The loop's period while waiting on another instance's order (it polls for the
/// published challenge and the certificate).
pub const WAITING_TICK: Duration = Duration::from_millis(250);

/// How often a fleet member reads the store's generation for certificates others wrote.
pub const FLEET_POLL: Duration = Duration::from_secs(2);

/// The longest one order may take, from the new order to the chain.
pub const ORDER_TIMEOUT: Duration = Duration::from_secs(300);

/// The background service running the [`Manager`] of the live config's `tls.acme`.
pub struct AcmeService {
    runtime: Arc<ArcSwap<Runtime>>,
    metrics: Arc<Metrics>,
}

impl AcmeService {
    /// A service following `runtime`.
    pub fn new(runtime: Arc<ArcSwap<Runtime>>, metrics: Arc<Metrics>) -> Self {
        Self { runtime, metrics }
    }
}

#[async_trait]
impl BackgroundService for AcmeService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut manager: Option<Manager> = None;
        loop {
            let rt = self.runtime.load_full();
            let acme = rt.config.tls.acme.clone();
            match acme {
                None => {
                    if manager.take().is_some() {
                        rt.managed.retain(&[]);
                    }
                }
                Some(a) if manager.as_ref().is_some_and(|m| m.acme == a) => {}
                Some(a) => match Manager::new(a, &rt, self.metrics.clone()) {
                    Ok(mut m) => {
                        rt.managed.retain(&m.acme.hosts);
                        tokio::select! {
                            () = m.load_stored() => {}
                            _ = shutdown.changed() => return,
                        }
                        manager = Some(m);
                    }
                    Err(e) => {
                        log::error!("tls.acme: {e}; nothing is ordered until the config changes");
                        manager = None;
                    }
                },
            }
            let wait = match manager.as_mut() {
                Some(m) => tokio::select! {
                    wait = m.step() => wait,
                    _ = shutdown.changed() => return,
                },
                None => TICK,
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Unix time in milliseconds.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A random u64 (jitter, lock tokens); 0 if the OS has none to give.
fn random() -> u64 {
    getrandom::u64().unwrap_or(0)
}

/// What the manager knows of one host.
#[derive(Debug, Default)]
struct HostState {
    /// The served certificate's `notBefore` and `notAfter` (Unix seconds).
    validity: Option<(i64, i64)>,
    /// Failed orders in a row.
    failures: u32,
    /// No order before this (Unix ms): a failure's backoff, or a wait on the fleet.
    next_attempt: i64,
    /// The last failure.
    last_error: Option<String>,
    /// `waiting` on another instance's order.
    waiting: bool,
    /// HTTP-01 tokens of another instance's challenge installed here.
    borrowed: Vec<String>,
}

impl HostState {
    /// When the host needs an order (Unix ms): now without a certificate, else two thirds
    /// into its lifetime.
    fn due_at(&self) -> i64 {
        self.validity.map_or(0, |(nb, na)| {
            schedule::renew_at(nb, na).saturating_mul(1000)
        })
    }
}

/// One `tls.acme`: its storage, account and hosts.
pub struct Manager {
    acme: Acme,
    storage: Storage,
    account: Option<Account>,
    hosts: BTreeMap<String, HostState>,
    managed: Arc<Managed>,
    metrics: Arc<Metrics>,
    listeners: Listeners,
    generation: Option<i64>,
    next_fleet_poll: i64,
    log: LogBudget,
    clock: MonotonicClock,
}

impl Manager {
    /// A manager for `acme` on the board of `rt`.
    pub fn new(
        acme: Acme,
        rt: &Runtime,
        metrics: Arc<Metrics>,
    ) -> Result<Manager, storage::StorageError> {
        let storage = Storage::open(&acme, &rt.config)?;
        let listen = &rt.config.server.listen;
        let listeners = Listeners {
            tls: listen.iter().any(|l| l.tls),
            plain: listen.iter().any(|l| !l.tls),
        };
        let hosts = acme
            .hosts
            .iter()
            .map(|h| (h.clone(), HostState::default()))
            .collect();
        Ok(Manager {
            acme,
            storage,
            account: None,
            hosts,
            managed: rt.managed.clone(),
            metrics,
            listeners,
            generation: None,
            next_fleet_poll: 0,
            log: LogBudget::new(),
            clock: MonotonicClock::new(),
        })
    }

    /// Installs every stored certificate (a restart serves at once and orders nothing
    /// while they are fresh).
    pub async fn load_stored(&mut self) {
        if let Ok(g) = self.storage.generation().await {
            self.generation = g;
        }
        let hosts: Vec<String> = self.hosts.keys().cloned().collect();
        for host in hosts {
            match self.storage.load_cert(&host).await {
                Ok(Some(stored)) => {
                    if let Err(e) = self.install(&host, &stored) {
                        log::warn!("tls.acme: the stored certificate of {host} cannot be used ({e}); a new one is ordered");
                    } else if let Some(s) = self.hosts.get(&host) {
                        if let Some((_, na)) = s.validity {
                            log::info!(
                                "tls.acme: {host}: serving the stored certificate (valid until {})",
                                humantime::format_rfc3339_seconds(
                                    UNIX_EPOCH + Duration::from_secs(na.max(0).unsigned_abs())
                                )
                            );
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => log::warn!("tls.acme: cannot read the stored certificate of {host}: {e}"),
            }
            self.publish(&host, None);
        }
    }

    /// Parses `stored` and serves it for `host`.
    fn install(&mut self, host: &str, stored: &Stored) -> Result<(), String> {
        let label = self.storage.label(host);
        let key_label = label.with_extension("key");
        let cert = certs::parse(
            &label,
            stored.chain.as_bytes(),
            &key_label,
            stored.key.as_bytes(),
        )
        .map_err(|e| e.to_string())?;
        if !cert.names.iter().any(|n| n.eq_ignore_ascii_case(host)) {
            return Err(format!(
                "it does not name {host} (it names {})",
                cert.names.join(", ")
            ));
        }
        let validity = (cert.not_before, cert.not_after);
        self.managed
            .install(host, cert)
            .map_err(|e| e.to_string())?;
        if let Some(s) = self.hosts.get_mut(host) {
            s.validity = Some(validity);
        }
        Ok(())
    }

    /// Records the status of `host` on the board (`state`: what it is doing, else derived).
    fn publish(&self, host: &str, state: Option<&str>) {
        let Some(s) = self.hosts.get(host) else {
            return;
        };
        let now = now_ms();
        let derived = if s.waiting {
            "waiting"
        } else if s.failures > 0 {
            "failed"
        } else if s.validity.is_none() {
            "missing"
        } else {
            "valid"
        };
        let stored = s
            .validity
            .map(|_| self.storage.label(host).display().to_string());
        self.managed.set_status(HostStatus {
            host: host.to_string(),
            state: state.unwrap_or(derived).to_string(),
            not_before: s.validity.map(|v| v.0),
            not_after: s.validity.map(|v| v.1),
            renew_at: s.validity.map(|(nb, na)| schedule::renew_at(nb, na)),
            next_attempt: (s.next_attempt > now).then_some(s.next_attempt / 1000),
            failures: s.failures,
            last_error: s.last_error.clone(),
            stored,
        });
    }

    /// One pass over the hosts; how long to wait before the next.
    pub async fn step(&mut self) -> Duration {
        if self.storage.shared() && now_ms() >= self.next_fleet_poll {
            self.next_fleet_poll = now_ms() + FLEET_POLL.as_millis() as i64;
            self.poll_fleet().await;
        }
        let hosts: Vec<String> = self.hosts.keys().cloned().collect();
        for host in &hosts {
            let now = now_ms();
            let Some(s) = self.hosts.get(host) else {
                continue;
            };
            if now < s.due_at() || now < s.next_attempt {
                continue;
            }
            self.attempt(host).await;
        }
        let now = now_ms();
        let next = self
            .hosts
            .values()
            .map(|s| s.due_at().max(s.next_attempt))
            .min()
            .unwrap_or(i64::MAX);
        let until = Duration::from_millis(
            next.saturating_sub(now)
                .clamp(20, TICK.as_millis() as i64)
                .unsigned_abs(),
        );
        if self.hosts.values().any(|s| s.waiting) {
            until.min(WAITING_TICK)
        } else {
            until
        }
    }

    /// Reads the fleet's generation; when it moved, installs the certificates others
    /// wrote that are newer than those served.
    async fn poll_fleet(&mut self) {
        let generation = match self.storage.generation().await {
            Ok(g) => g,
            Err(e) => {
                self.note(&format!("cannot read the fleet's certificates: {e}"));
                return;
            }
        };
        if generation == self.generation {
            return;
        }
        self.generation = generation;
        let hosts: Vec<String> = self.hosts.keys().cloned().collect();
        for host in hosts {
            self.adopt(&host).await;
        }
    }

    /// Installs the stored certificate of `host` if it is newer than the served one and
    /// not due; whether it did.
    async fn adopt(&mut self, host: &str) -> bool {
        let Ok(Some(stored)) = self.storage.load_cert(host).await else {
            return false;
        };
        let Ok(cert) = certs::parse(
            Path::new(host),
            stored.chain.as_bytes(),
            Path::new(host),
            stored.key.as_bytes(),
        ) else {
            return false;
        };
        let served = self
            .hosts
            .get(host)
            .and_then(|s| s.validity)
            .map_or(i64::MIN, |v| v.1);
        let fresh =
            now_ms() < schedule::renew_at(cert.not_before, cert.not_after).saturating_mul(1000);
        if cert.not_after <= served || !fresh {
            return false;
        }
        if self.install(host, &stored).is_err() {
            return false;
        }
        self.metrics
            .acme_orders_total
            .with_label_values(&[host, "shared"])
            .inc();
        log::info!("tls.acme: {host}: serving the certificate another instance ordered");
        self.end_wait(host);
        if let Some(s) = self.hosts.get_mut(host) {
            s.failures = 0;
            s.last_error = None;
            s.next_attempt = 0;
        }
        self.publish(host, None);
        true
    }

    /// Stops answering a challenge borrowed from another instance.
    fn end_wait(&mut self, host: &str) {
        if let Some(s) = self.hosts.get_mut(host) {
            if s.waiting || !s.borrowed.is_empty() {
                self.managed.clear_challenges(host, &s.borrowed);
                s.borrowed.clear();
                s.waiting = false;
            }
        }
    }

    /// Orders a certificate for `host` (in a fleet: if no other instance is, and none
    /// has stored a fresh one).
    async fn attempt(&mut self, host: &str) {
        let shared = self.storage.shared();
        let token = format!("{:016x}{:016x}", random(), random());
        if shared {
            if self.adopt(host).await {
                return;
            }
            match self.storage.lock(host, &token).await {
                Ok(true) => {
                    self.end_wait(host);
                    // Another instance may have stored it just before releasing the lock.
                    if self.adopt(host).await {
                        let _ = self.storage.unlock(host, &token).await;
                        return;
                    }
                }
                Ok(false) => {
                    self.wait_on_fleet(host).await;
                    return;
                }
                Err(e) => {
                    self.failed(host, format!("cannot take the order lock: {e}"));
                    return;
                }
            }
        }
        let renewing = self.hosts.get(host).is_some_and(|s| s.validity.is_some());
        self.publish(host, Some(if renewing { "renewing" } else { "ordering" }));
        log::info!(
            "tls.acme: {host}: ordering a certificate from {}",
            self.acme.directory
        );
        let result = match self.account().await {
            Ok(account) => {
                let ctx = order::Ctx {
                    account: &account,
                    managed: &self.managed,
                    storage: &self.storage,
                    challenge: self.acme.challenge,
                    listeners: self.listeners,
                };
                match tokio::time::timeout(ORDER_TIMEOUT, order::order(&ctx, host)).await {
                    Ok(r) => r,
                    Err(_) => Err(OrderError::Other(format!(
                        "the order took longer than {}s",
                        ORDER_TIMEOUT.as_secs()
                    ))),
                }
            }
            Err(e) => Err(e),
        };
        let result = match result {
            Ok(stored) => match self.storage.save_cert(host, &stored).await {
                Ok(()) => self.install(host, &stored).map_err(|e| {
                    OrderError::Other(format!("the CA's certificate cannot be served: {e}"))
                }),
                Err(e) => Err(OrderError::Other(format!(
                    "cannot store the certificate: {e}"
                ))),
            },
            Err(e) => Err(e),
        };
        if shared {
            if let Err(e) = self.storage.unlock(host, &token).await {
                log::warn!(
                    "tls.acme: {host}: cannot release the order lock (it expires by itself): {e}"
                );
            }
        }
        match result {
            Ok(()) => {
                self.metrics
                    .acme_orders_total
                    .with_label_values(&[host, "success"])
                    .inc();
                if let Some(s) = self.hosts.get_mut(host) {
                    s.failures = 0;
                    s.last_error = None;
                    s.next_attempt = 0;
                    if let Some((_, na)) = s.validity {
                        log::info!(
                            "tls.acme: {host}: new certificate installed, valid until {}",
                            humantime::format_rfc3339_seconds(
                                UNIX_EPOCH + Duration::from_secs(na.max(0).unsigned_abs())
                            )
                        );
                    }
                }
                self.publish(host, None);
            }
            Err(e) => {
                if e.account_unknown() {
                    self.account = None;
                    if let Err(e) = self.storage.forget_account().await {
                        log::warn!("tls.acme: cannot forget the stored account: {e}");
                    }
                }
                self.failed(host, e.to_string());
            }
        }
    }

    /// Another instance holds the lock: answer its published challenge here too, and
    /// look again soon.
    async fn wait_on_fleet(&mut self, host: &str) {
        let published = self.storage.load_challenge(host).await.ok().flatten();
        let Some(s) = self.hosts.get_mut(host) else {
            return;
        };
        s.waiting = true;
        s.next_attempt = now_ms() + WAITING_TICK.as_millis() as i64;
        match published {
            Some(ch) => {
                if let Some((token, key_auth)) = &ch.http {
                    if !s.borrowed.contains(token) {
                        self.managed.add_http(token, key_auth);
                        s.borrowed.push(token.clone());
                    }
                }
                if let Some(digest) = ch.alpn_digest.as_deref().and_then(order::unhex) {
                    if !self.managed.has_alpn_challenge(host) {
                        if let Ok(cert) = keys::challenge_cert(host, &digest) {
                            self.managed.add_alpn(host, cert);
                        }
                    }
                }
            }
            None => {
                self.managed.clear_challenges(host, &s.borrowed);
                s.borrowed.clear();
            }
        }
        self.publish(host, None);
    }

    /// Records a failed order: counted, logged within the budget, retried after a
    /// jittered backoff; nothing served changes.
    fn failed(&mut self, host: &str, error: String) {
        self.metrics
            .acme_orders_total
            .with_label_values(&[host, "failure"])
            .inc();
        let (min, max) = (self.acme.retry_min, self.acme.retry_max);
        let Some(s) = self.hosts.get_mut(host) else {
            return;
        };
        s.failures = s.failures.saturating_add(1);
        let wait = schedule::backoff(s.failures, min, max, random());
        s.next_attempt = now_ms() + i64::try_from(wait.as_millis()).unwrap_or(i64::MAX / 2);
        s.last_error = Some(error.clone());
        let serving = if s.validity.is_some() {
            "the current certificate keeps serving"
        } else {
            "no certificate yet: tls.certificates (or a refused handshake) serves it"
        };
        let failures = s.failures;
        self.note(&format!(
            "{host}: order failed ({failures} in a row), next try in {}; {serving}: {error}",
            humantime::format_duration(Duration::from_secs(wait.as_secs().max(1)))
        ));
        self.publish(host, None);
    }

    fn note(&self, what: &str) {
        if let Some(suppressed) = self.log.admit(self.clock.now()) {
            log::warn!("tls.acme: {what}{}", suppressed_note(suppressed));
        }
    }

    /// The account: cached, else stored, else created (and stored).
    async fn account(&mut self) -> Result<Account, OrderError> {
        if let Some(a) = &self.account {
            return Ok(a.clone());
        }
        let client = || {
            http::Client::new(self.acme.ca_roots.as_deref())
                .map(|c| Box::new(c) as Box<dyn instant_acme::HttpClient>)
                .map_err(|e| OrderError::Other(e.to_string()))
        };
        let stored = self
            .storage
            .load_account()
            .await
            .map_err(|e| OrderError::Other(format!("cannot read the stored account: {e}")))?;
        let json = match stored {
            Some(json) => json,
            None => {
                let contact = self.acme.email.as_ref().map(|e| format!("mailto:{e}"));
                let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
                let (_, credentials) = Account::builder_with_http(client()?)
                    .create(
                        &NewAccount {
                            contact: &contacts,
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        self.acme.directory.clone(),
                        None,
                    )
                    .await?;
                let json = serde_json::to_string(&credentials)
                    .map_err(|e| OrderError::Other(format!("cannot write the account: {e}")))?;
                log::info!("tls.acme: created an account at {}", self.acme.directory);
                self.storage
                    .save_account(&json)
                    .await
                    .map_err(|e| OrderError::Other(format!("cannot store the account: {e}")))?
            }
        };
        let credentials: AccountCredentials = serde_json::from_str(&json)
            .map_err(|e| OrderError::Other(format!("the stored account does not parse: {e}")))?;
        let account = Account::builder_with_http(client()?)
            .from_credentials(credentials)
            .await?;
        self.account = Some(account.clone());
        Ok(account)
    }
}
