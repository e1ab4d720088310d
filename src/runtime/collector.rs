//! Metrics that limiters keep themselves, exported by a Prometheus [`Collector`] that reads
//! the live runtime at each scrape, so the request path does no metric work for them.
//!
//! `tollgate_token_bucket_evictions_total{origin,limit}` is the sum of the evictions of
//! every variant of the limit in the runtime serving now. A state carried over a reload
//! keeps its count; a limit whose state is rebuilt (its bucket parameters changed) starts
//! again from 0, which Prometheus reads as a counter reset, as it should.

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
    evictions: IntCounterVec,
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
        Ok(Self { runtime, evictions })
    }
}

impl Collector for RuntimeCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.evictions.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let rt = self.runtime.load();
        let mut totals: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for origin in &rt.origins {
            for limit in origin.all_limits() {
                for variant in &limit.variants {
                    if let Limiter::TokenBucket(tb) = &variant.limiter {
                        *totals.entry((&origin.name, &limit.name)).or_default() +=
                            tb.state.evictions();
                    }
                }
            }
        }
        // A fresh family each scrape: limits removed by a reload disappear.
        self.evictions.reset();
        for ((origin, limit), total) in totals {
            self.evictions
                .with_label_values(&[origin, limit])
                .inc_by(total);
        }
        self.evictions.collect()
    }
}
