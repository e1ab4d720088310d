//! Metrics that limiters keep themselves, exported by a Prometheus [`Collector`] that reads
//! the live runtime at each scrape, so the request path does no metric work for them.
//!
//! `tollgate_token_bucket_evictions_total{origin,limit}` and
//! `tollgate_rate_evictions_total{origin,limit}` are each the sum of the evictions of
//! every variant of the limit in the runtime serving now. A state carried over a reload
//! keeps its count; a limit whose state is rebuilt (its bucket parameters, or its window
//! or `max_keys`, changed) starts again from 0, which Prometheus reads as a counter reset,
//! as it should.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts};

use crate::runtime::limit::Limiter;
use crate::runtime::Runtime;

/// Reads limiter-held counters from the live runtime at scrape time.
pub struct RuntimeCollector {
    runtime: Arc<ArcSwap<Runtime>>,
    /// `tollgate_token_bucket_evictions_total`.
    evictions: IntCounterVec,
    /// `tollgate_rate_evictions_total`.
    rate_evictions: IntCounterVec,
}

impl RuntimeCollector {
    /// A collector over `runtime`, whichever config it holds at each scrape.
    pub fn new(runtime: Arc<ArcSwap<Runtime>>) -> Result<Self, prometheus::Error> {
        let evictions = IntCounterVec::new(
            Opts::new(
                "tollgate_token_bucket_evictions_total",
                "Token buckets evicted before they were full because the table was full (raise max_keys).",
            ),
            &["origin", "limit"],
        )?;
        let rate_evictions = IntCounterVec::new(
            Opts::new(
                "tollgate_rate_evictions_total",
                "Rate-limit keys evicted while their window still counted events because the table was full; each restarts at 0, more lenient, never stricter (raise max_keys, or a key flood is under way).",
            ),
            &["origin", "limit"],
        )?;
        Ok(Self {
            runtime,
            evictions,
            rate_evictions,
        })
    }
}

impl Collector for RuntimeCollector {
    fn desc(&self) -> Vec<&Desc> {
        let mut desc = self.evictions.desc();
        desc.extend(self.rate_evictions.desc());
        desc
    }

    /// The token-bucket family first, then the rate family.
    fn collect(&self) -> Vec<MetricFamily> {
        let rt = self.runtime.load();
        let mut buckets: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        let mut rates: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for origin in &rt.origins {
            for limit in origin.all_limits() {
                let at = (origin.name.as_str(), limit.name.as_str());
                for variant in &limit.variants {
                    match &variant.limiter {
                        Limiter::TokenBucket(tb) => {
                            *buckets.entry(at).or_default() += tb.state.evictions();
                        }
                        Limiter::Rate(rate) => {
                            *rates.entry(at).or_default() += rate.state.evictions();
                        }
                        Limiter::Inflight(_) => {}
                    }
                }
            }
        }
        let mut families = Vec::new();
        for (family, totals) in [(&self.evictions, buckets), (&self.rate_evictions, rates)] {
            // A fresh family each scrape: limits removed by a reload disappear.
            family.reset();
            for ((origin, limit), total) in totals {
                family.with_label_values(&[origin, limit]).inc_by(total);
            }
            families.extend(family.collect());
        }
        families
    }
}
