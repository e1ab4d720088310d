//! Downstream connection accounting and the caps on it (`server.max_connections`,
//! `server.max_connections_per_ip`).
//!
//! Every connection costs a file descriptor (two while it is proxied, three with a pooled
//! upstream connection) and about 90 KB. Without a cap, slow clients can hold descriptors
//! until `accept` fails with `EMFILE` and every client times out.
//!
//! A connection is counted from the moment Pingora's accept loop asks the listener's
//! connection filter ([`AcceptFilter`]) until its handler ends (the drop of its [`Slot`]).
//! At the global cap the filter **waits** for a slot instead of refusing: the accept loop
//! pauses and new connections queue in the kernel's listen backlog, to be served in arrival
//! order as slots free up (what nginx and HAProxy do at their caps). It also asks every
//! connection that is only waiting for a request (idle keep-alive, or new and silent) to
//! give its slot up ([`Connections::reclaim`]), as nginx reuses such connections when it
//! runs out: so idle clients cannot hold the cap, only clients in the middle of a request,
//! which the header deadline bounds. Above the per-IP cap a connection is closed at once:
//! waiting would stall the accept loop for every other client because of one.
//!
//! The filter admits a connection before its handler exists; in between it is *pending*,
//! and the handler claims one pending entry of its IP ([`Connections::claim`]). An entry
//! that is never claimed (the connection died between the two, e.g. a failed `setsockopt`)
//! expires after [`PENDING_TTL`], so the count cannot leak.
//!
//! Memory: one map entry (about 40 bytes) per client IP with an open connection, so at
//! most one per open connection. Each admission, claim and release takes one uncontended
//! mutex: per connection, never per request.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::listeners::ConnectionFilter;
use prometheus::{IntCounter, IntGauge};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use crate::limits::{Clock, MonotonicClock};
use crate::log_budget::{suppressed_note, LogBudget};
use crate::metrics::Metrics;

/// How long an admitted connection may stay unclaimed before it is presumed dead: above
/// Pingora's 60 s handshake timeout, the longest a live connection can take from accept to
/// its handler.
pub const PENDING_TTL: Duration = Duration::from_secs(90);

/// The caps in force, read from the live config at each admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Open connections at most.
    pub max: usize,
    /// Open connections per client IP at most.
    pub per_ip: Option<u32>,
}

/// What the table says to a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Counted as pending: go on.
    Yes,
    /// `max` connections are open or pending: wait for one to close.
    Full {
        /// Open and pending connections.
        open: usize,
    },
    /// The client IP has `per_ip` connections: refuse.
    IpFull {
        /// The IP's open and pending connections.
        open: u32,
    },
}

/// The counts, under one lock.
#[derive(Default)]
struct Table {
    /// Connections whose handler runs.
    open: usize,
    /// Admitted, not yet claimed: the IP (if any) and when.
    pending: Vec<(Option<IpAddr>, Instant)>,
    /// Open and pending connections per client IP; IPs with none are removed.
    per_ip: HashMap<IpAddr, u32, ahash::RandomState>,
}

impl Table {
    fn try_admit(&mut self, ip: Option<IpAddr>, caps: Caps, now: Instant) -> Admit {
        if let (Some(ip), Some(cap)) = (ip, caps.per_ip) {
            let open = self.per_ip.get(&ip).copied().unwrap_or(0);
            if open >= cap {
                return Admit::IpFull { open };
            }
        }
        if self.open + self.pending.len() >= caps.max {
            self.expire(now);
            if self.open + self.pending.len() >= caps.max {
                return Admit::Full {
                    open: self.open + self.pending.len(),
                };
            }
        }
        self.pending.push((ip, now));
        if let Some(ip) = ip {
            *self.per_ip.entry(ip).or_insert(0) += 1;
        }
        Admit::Yes
    }

    /// Drops pending entries older than [`PENDING_TTL`] and their per-IP counts.
    fn expire(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.pending.len() {
            let (ip, at) = self.pending[i];
            if now.saturating_duration_since(at) > PENDING_TTL {
                self.pending.swap_remove(i);
                if let Some(ip) = ip {
                    self.forget_ip(ip);
                }
            } else {
                i += 1;
            }
        }
    }

    fn claim(&mut self, ip: Option<IpAddr>) {
        self.open += 1;
        match self.pending.iter().position(|(p, _)| *p == ip) {
            Some(i) => {
                self.pending.swap_remove(i);
            }
            // Not admitted by the filter (or expired): count it now, even above a cap.
            None => {
                if let Some(ip) = ip {
                    *self.per_ip.entry(ip).or_insert(0) += 1;
                }
            }
        }
    }

    fn release(&mut self, ip: Option<IpAddr>) {
        self.open = self.open.saturating_sub(1);
        if let Some(ip) = ip {
            self.forget_ip(ip);
        }
    }

    fn forget_ip(&mut self, ip: IpAddr) {
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
    }
}

/// The connection counts of one proxy service, with its caps and metrics.
pub struct Connections {
    table: Mutex<Table>,
    released: Notify,
    reclaim: Notify,
    caps: Box<dyn Fn() -> Caps + Send + Sync>,
    open_gauge: IntGauge,
    limited_max: IntCounter,
    limited_ip: IntCounter,
    full_log: LogBudget,
    ip_log: LogBudget,
    clock: MonotonicClock,
}

impl fmt::Debug for Connections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connections")
            .field("open", &self.table.lock().open)
            .finish_non_exhaustive()
    }
}

impl Connections {
    /// An empty table whose caps `caps` reads at each admission (so that a reload applies
    /// them to the next connection).
    pub fn new(metrics: &Metrics, caps: impl Fn() -> Caps + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Table::default()),
            released: Notify::new(),
            reclaim: Notify::new(),
            caps: Box::new(caps),
            open_gauge: metrics.connections_open.clone(),
            limited_max: metrics
                .connections_limited_total
                .with_label_values(&["max_connections"]),
            limited_ip: metrics
                .connections_limited_total
                .with_label_values(&["max_connections_per_ip"]),
            full_log: LogBudget::new(),
            ip_log: LogBudget::new(),
            clock: MonotonicClock::new(),
        })
    }

    /// Connections whose handler runs.
    pub fn open(&self) -> usize {
        self.table.lock().open
    }

    /// Completes when the cap is reached while the caller waits: a connection waiting for
    /// a request then closes, so that a new one can have its slot.
    pub fn reclaim(&self) -> Notified<'_> {
        self.reclaim.notified()
    }

    /// Admits a new connection from `ip`: `true` once it is counted (after waiting for a
    /// slot while `max_connections` are open), `false` if its IP is at its cap.
    pub async fn admit(&self, ip: Option<IpAddr>) -> bool {
        let ip = ip.map(|ip| ip.to_canonical());
        let mut waited = false;
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let caps = (self.caps)();
            match self.table.lock().try_admit(ip, caps, Instant::now()) {
                Admit::Yes => return true,
                Admit::IpFull { open } => {
                    self.limited_ip.inc();
                    if let Some(suppressed) = self.ip_log.admit(self.clock.now()) {
                        log::info!(
                            "closed a connection from {}: it has {open} open (server.max_connections_per_ip = {}){}",
                            ip.map_or_else(String::new, |ip| ip.to_string()),
                            caps.per_ip.unwrap_or(0),
                            suppressed_note(suppressed)
                        );
                    }
                    return false;
                }
                Admit::Full { open } => {
                    self.reclaim.notify_waiters();
                    if !waited {
                        waited = true;
                        self.limited_max.inc();
                        if let Some(suppressed) = self.full_log.admit(self.clock.now()) {
                            log::warn!(
                                "connection limit reached: {open} connections open (server.max_connections = {}); new connections wait in the listen backlog, idle ones are closed to make room{}",
                                caps.max,
                                suppressed_note(suppressed)
                            );
                        }
                    }
                }
            }
            // Woken by a release; at the latest after PENDING_TTL, when stale entries expire.
            let _ = tokio::time::timeout(PENDING_TTL, notified).await;
        }
    }

    /// Counts the connection from `ip` as open until the returned slot drops.
    pub fn claim(self: &Arc<Self>, ip: Option<IpAddr>) -> Slot {
        let ip = ip.map(|ip| ip.to_canonical());
        let open = {
            let mut t = self.table.lock();
            t.claim(ip);
            t.open
        };
        self.open_gauge.set(i64::try_from(open).unwrap_or(i64::MAX));
        Slot {
            table: self.clone(),
            ip,
        }
    }
}

/// One open connection; dropping it gives the slot back and wakes a waiting accept.
pub struct Slot {
    table: Arc<Connections>,
    ip: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let open = {
            let mut t = self.table.table.lock();
            t.release(self.ip);
            t.open
        };
        self.table
            .open_gauge
            .set(i64::try_from(open).unwrap_or(i64::MAX));
        self.table.released.notify_waiters();
    }
}

/// The listener's connection filter: [`Connections::admit`] for each accepted connection.
#[derive(Debug)]
pub struct AcceptFilter(pub Arc<Connections>);

#[async_trait]
impl ConnectionFilter for AcceptFilter {
    async fn should_accept(&self, addr: Option<&SocketAddr>) -> bool {
        self.0.admit(addr.map(SocketAddr::ip)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    const CAPS: Caps = Caps {
        max: 3,
        per_ip: Some(2),
    };

    #[test]
    fn counts_pending_and_open_against_both_caps() {
        let now = Instant::now();
        let mut t = Table::default();
        assert_eq!(t.try_admit(ip(1), CAPS, now), Admit::Yes);
        assert_eq!(t.try_admit(ip(1), CAPS, now), Admit::Yes);
        assert_eq!(t.try_admit(ip(1), CAPS, now), Admit::IpFull { open: 2 });
        t.claim(ip(1));
        assert_eq!((t.open, t.pending.len()), (1, 1));
        assert_eq!(t.try_admit(ip(2), CAPS, now), Admit::Yes);
        assert_eq!(t.try_admit(ip(3), CAPS, now), Admit::Full { open: 3 });
        t.release(ip(1));
        assert_eq!(t.try_admit(ip(3), CAPS, now), Admit::Yes);
        assert_eq!(t.per_ip.get(&IpAddr::from([10, 0, 0, 1])), Some(&1));
        // No per-IP cap, no IP (a Unix socket): only the total counts.
        let open = Caps {
            max: 10,
            per_ip: None,
        };
        assert_eq!(t.try_admit(ip(1), open, now), Admit::Yes);
        assert_eq!(t.try_admit(None, open, now), Admit::Yes);
        t.claim(None);
        t.release(None);
    }

    #[test]
    fn releases_forget_ips_and_never_underflow() {
        let now = Instant::now();
        let mut t = Table::default();
        assert_eq!(t.try_admit(ip(1), CAPS, now), Admit::Yes);
        t.claim(ip(1));
        t.release(ip(1));
        assert!(t.per_ip.is_empty());
        assert_eq!(t.open, 0);
        t.release(ip(1));
        assert_eq!(t.open, 0);
        // A claim the filter never admitted still counts, and is given back.
        t.claim(ip(9));
        assert_eq!((t.open, t.per_ip.len()), (1, 1));
        t.release(ip(9));
        assert_eq!((t.open, t.per_ip.len()), (0, 0));
    }

    #[test]
    fn an_unclaimed_admission_expires_instead_of_leaking() {
        let start = Instant::now();
        let mut t = Table::default();
        for _ in 0..3 {
            assert_eq!(
                t.try_admit(ip(1), CAPS.with_per_ip(None), start),
                Admit::Yes
            );
        }
        assert_eq!(
            t.try_admit(ip(2), CAPS, start + PENDING_TTL),
            Admit::Full { open: 3 }
        );
        let later = start + PENDING_TTL + Duration::from_nanos(1);
        assert_eq!(t.try_admit(ip(2), CAPS, later), Admit::Yes);
        assert_eq!(t.pending.len(), 1);
        assert_eq!(
            t.per_ip.len(),
            1,
            "the dead IP's count went with its entries"
        );
    }

    impl Caps {
        fn with_per_ip(self, per_ip: Option<u32>) -> Self {
            Self { per_ip, ..self }
        }
    }

    #[tokio::test]
    async fn a_full_table_waits_for_a_release() {
        let metrics = Metrics::new().unwrap();
        let conns = Connections::new(&metrics, || Caps {
            max: 1,
            per_ip: None,
        });
        assert!(conns.admit(ip(1)).await);
        let slot = conns.claim(ip(1));
        assert_eq!(conns.open(), 1);
        let waiting = tokio::spawn({
            let conns = conns.clone();
            async move { conns.admit(ip(2)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(slot);
        assert!(waiting.await.unwrap());
        assert_eq!(metrics.connections_open.get(), 0);
        // At the cap again, a connection waiting for a request is asked for its slot.
        let slot = conns.claim(ip(2));
        let reclaim = conns.reclaim();
        tokio::pin!(reclaim);
        reclaim.as_mut().enable();
        let waiting = tokio::spawn({
            let conns = conns.clone();
            async move { conns.admit(ip(3)).await }
        });
        reclaim.await;
        drop(slot);
        assert!(waiting.await.unwrap());
        assert_eq!(
            metrics
                .connections_limited_total
                .with_label_values(&["max_connections"])
                .get(),
            2
        );
    }
}
