//! Metrics that limiters keep themselves, exported by a Prometheus [`Collector`] that reads
//! the live runtime at each scrape, so the request path does no metric work for them.
//!
//! - `tollgate_limit_evictions_total{origin,limit,kind}` (`kind`: token_bucket, rate,
//!   sliding_log, tiered: every kind with a per-key table that evicts): the sum of the
//!   evictions of every variant of the limit in the runtime serving now.
//! - `tollgate_tier_entries_total{origin,limit,tier}`: bursts into each tier of a tiered
//!   limit (tiers are per key, so no per-key gauge). For a limit in a shared store: the
//!   entries this instance's decisions caused (summed over the fleet, each entry once).
//! - `tollgate_concurrency_in_use{origin,limit,group}`: copies held now, exact, per group,
//!   and `group="_all"` for every copy of the limit (bounded by the config). For a limit in
//!   a shared store: the copies this instance holds (summed over the fleet, the copies in
//!   use), read from its local truth without a store call.
//! - `tollgate_concurrency_max{origin,limit,group}`: the max each of those series is held
//!   against (`_all`: the `global` limit, when set), so an alert can compare the two.
//! - `tollgate_concurrency_untracked_total{origin,limit}`: admissions made untracked
//!   because the key's set of the table was full of holding keys (the key's own `max` was
//!   not checked against what it held: `limits::concurrency`); for a limit in a shared
//!   store, its local fallback's.
//! - `tollgate_kill_switch`: 1 while rejections are turned into grants.
//! - `tollgate_tls_certificate_expiry_timestamp_seconds{cert}`: each served certificate's
//!   `notAfter` (Unix seconds), by certificate file: a replaced certificate's new date shows
//!   at the next scrape after it is loaded. Certificates `tls.acme` manages are there too,
//!   by their file in `storage` (or `redis:STORE/HOST`), so `TollgateCertificateExpiring`
//!   fires when their renewal keeps failing.
//!
//! The limiter API's resources are exported like limits, under `origin="_api"`.
//!
//! A state carried over a reload keeps its counts; a limit whose state is rebuilt (its
//! shape changed) starts again from 0, which Prometheus reads as a counter reset, as it
//! should. Limits removed by a reload disappear from the next scrape.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec};

use crate::metrics::Families;

use crate::config::API_ORIGIN;
use crate::runtime::limiter::{Limiter, Place};
use crate::runtime::Runtime;

/// Reads limiter-held counters from the live runtime at scrape time.
pub struct RuntimeCollector {
    runtime: Arc<ArcSwap<Runtime>>,
    /// `tollgate_limit_evictions_total`.
    limit_evictions: IntCounterVec,
    /// `tollgate_tier_entries_total`.
    tier_entries: IntCounterVec,
    /// `tollgate_concurrency_in_use`.
    in_use: IntGaugeVec,
    /// `tollgate_concurrency_max`.
    max: IntGaugeVec,
    /// `tollgate_concurrency_untracked_total`.
    untracked: IntCounterVec,
    /// `tollgate_kill_switch`.
    kill: IntGauge,
    /// `tollgate_tls_certificate_expiry_timestamp_seconds`.
    cert_expiry: IntGaugeVec,
}

/// Counter totals by label values, summed over a limit's variants.
type Totals<'a> = BTreeMap<Vec<&'a str>, u64>;

impl RuntimeCollector {
    /// A collector over `runtime`, whichever config it holds at each scrape.
    pub fn new(runtime: Arc<ArcSwap<Runtime>>) -> Result<Self, prometheus::Error> {
        let f = Families::unregistered();
        let limit_evictions = f.limit_evictions()?;
        let tier_entries = f.counter_vec(
            "tollgate_tier_entries_total",
            "Entries into each tier of a tiered limit (bursts; tier 1 also counts new keys).",
            &["origin", "limit", "tier"],
        )?;
        let in_use = f.gauge_vec(
            "tollgate_concurrency_in_use",
            "Copies of a concurrency limit held now, exact, per group (`_all`: every copy).",
            &["origin", "limit", "group"],
        )?;
        let max = f.gauge_vec(
            "tollgate_concurrency_max",
            "The max each tollgate_concurrency_in_use series is held against (`_all`: the global limit, when set).",
            &["origin", "limit", "group"],
        )?;
        let untracked = f.counter_vec(
            "tollgate_concurrency_untracked_total",
            "Concurrency admissions made untracked because the key's slots in the table were full of holding keys: the key's own max was not checked (raise max_keys).",
            &["origin", "limit"],
        )?;
        let kill = f.gauge(
            "tollgate_kill_switch",
            "1 while the kill switch turns every rejection into a grant (counted as shadow_rejected).",
        )?;
        let cert_expiry = f.gauge_vec(
            "tollgate_tls_certificate_expiry_timestamp_seconds",
            "When each certificate tollgate serves expires (its notAfter), in Unix seconds, by certificate file.",
            &["cert"],
        )?;
        Ok(Self {
            cert_expiry,
            runtime,
            limit_evictions,
            tier_entries,
            in_use,
            max,
            untracked,
            kill,
        })
    }
}

/// `value` as a gauge's `i64`, saturating (a max is at most 2⁶⁴ − 1 in the config).
fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Replaces `family`'s children with `totals` and returns it for the scrape.
fn counters(family: &IntCounterVec, totals: Totals<'_>) -> Vec<MetricFamily> {
    family.reset();
    for (labels, total) in totals {
        family.with_label_values(&labels).inc_by(total);
    }
    family.collect()
}

impl Collector for RuntimeCollector {
    fn desc(&self) -> Vec<&Desc> {
        let mut desc = self.limit_evictions.desc();
        desc.extend(self.tier_entries.desc());
        desc.extend(self.in_use.desc());
        desc.extend(self.max.desc());
        desc.extend(self.untracked.desc());
        desc.extend(self.kill.desc());
        desc.extend(self.cert_expiry.desc());
        desc
    }

    /// The token-bucket family first, then the rate family, then the others.
    fn collect(&self) -> Vec<MetricFamily> {
        let rt = self.runtime.load();
        let mut others = Totals::new();
        let mut untracked = Totals::new();
        let mut tiers: BTreeMap<(&str, &str, usize), u64> = BTreeMap::new();
        self.in_use.reset();
        self.max.reset();
        // Origins' limits, then the limiter API's resources (origin `_api`).
        let limits = rt
            .origins
            .iter()
            .flat_map(|o| o.all_limits().map(move |l| (o.name.as_str(), l)))
            .chain(rt.resources.iter().map(|r| (API_ORIGIN, &r.limit)));
        for (origin, limit) in limits {
            let at = [origin, limit.name.as_str()];
            for variant in &limit.variants {
                match &variant.limiter {
                    Limiter::TokenBucket(tb) => match &tb.state {
                        Place::Local(s) => {
                            let key = vec![at[0], at[1], "token_bucket"];
                            *others.entry(key).or_default() += s.evictions();
                        }
                        // In a store: no table here but the fallback's, not reported.
                        Place::Store(_) => {}
                    },
                    Limiter::Rate(rate) => match &rate.state {
                        Place::Local(s) => {
                            let key = vec![at[0], at[1], "rate"];
                            *others.entry(key).or_default() += s.evictions();
                        }
                        Place::Store(_) => {}
                    },
                    Limiter::Tiered(t) => {
                        let key = vec![at[0], at[1], "tiered"];
                        *others.entry(key).or_default() += match &t.state {
                            Place::Local(s) => s.evictions(),
                            Place::Store(s) => s.limiter.evictions(),
                        };
                        for tier in 1..=t.params.tiers.len() {
                            *tiers.entry((at[0], at[1], tier)).or_default() += match &t.state {
                                Place::Local(s) => s.entries(tier),
                                Place::Store(s) => s.limiter.entries(tier),
                            };
                        }
                    }
                    Limiter::SlidingLog(l) => {
                        let key = vec![at[0], at[1], "sliding_log"];
                        *others.entry(key).or_default() += match &l.state {
                            Place::Local(s) => s.evictions(),
                            Place::Store(s) => s.limiter.evictions(),
                        };
                    }
                    Limiter::Concurrency(c) => {
                        // In a store, this instance's copies (exact): the fleet's is their
                        // sum.
                        let (untracked_total, all) = match &c.state {
                            Place::Local(s) => (s.untracked_total(), s.in_use_global() as i64),
                            Place::Store(s) => {
                                (s.limiter.untracked_total(), gauge(s.limiter.in_use_here()))
                            }
                        };
                        *untracked.entry(at.to_vec()).or_default() += untracked_total;
                        self.in_use
                            .with_label_values(&[at[0], at[1], "_all"])
                            .add(all);
                        if let Some(global) = c.params.global {
                            self.max
                                .with_label_values(&[at[0], at[1], "_all"])
                                .set(gauge(global));
                        }
                        for (i, g) in c.groups.iter().enumerate() {
                            let labels = [at[0], at[1], g.name.as_str()];
                            let in_group = match &c.state {
                                Place::Local(s) => s.in_use(i) as i64,
                                Place::Store(s) => gauge(s.limiter.group_in_use_here(i)),
                            };
                            self.in_use.with_label_values(&labels).add(in_group);
                            if let Some(&max) = c.params.groups.get(i) {
                                self.max.with_label_values(&labels).set(gauge(max));
                            }
                        }
                    }
                    Limiter::Inflight(_) => {}
                }
            }
        }
        self.kill.set(i64::from(rt.kill.on()));
        let mut families = counters(&self.limit_evictions, others);
        families.extend(counters(&self.untracked, untracked));
        self.tier_entries.reset();
        for ((origin, limit, tier), total) in tiers {
            let tier = tier.to_string();
            self.tier_entries
                .with_label_values(&[origin, limit, &tier])
                .inc_by(total);
        }
        families.extend(self.tier_entries.collect());
        families.extend(self.in_use.collect());
        families.extend(self.max.collect());
        families.extend(self.kill.collect());
        self.cert_expiry.reset();
        let managed = rt.managed.certs();
        for cert in rt.tls.iter().flat_map(|t| &t.certs).chain(&managed) {
            let file = cert.file.display().to_string();
            self.cert_expiry
                .with_label_values(&[file.as_str()])
                .set(cert.not_after);
        }
        families.extend(self.cert_expiry.collect());
        families
    }
}
