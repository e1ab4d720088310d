//! The snapshot metrics: writes by result, the last good write, keys written per kind,
//! and the load at start by result. Registered in tollgate's one registry.

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGaugeVec};

use crate::metrics::{Metrics, MetricsError};
use crate::snapshot::state::SavedKind;

/// The snapshot metrics, registered in tollgate's registry.
pub(super) struct SnapshotMetrics {
    /// `tollgate_snapshot_writes_total{result="ok"}`.
    pub writes_ok: IntCounter,
    /// `tollgate_snapshot_writes_total{result="error"}`.
    pub writes_error: IntCounter,
    /// `tollgate_snapshot_last_success_timestamp_seconds`.
    pub last_success: Gauge,
    /// `tollgate_snapshot_keys{kind}`.
    pub keys: IntGaugeVec,
    /// `tollgate_snapshot_loads_total{result}`: `restored`, `absent`, `refused`.
    pub loads: IntCounterVec,
}

impl SnapshotMetrics {
    /// Creates the families (every label value at 0) and registers them in `metrics`.
    pub fn register(metrics: &Metrics) -> Result<Self, MetricsError> {
        let f = metrics.families();
        let writes = f.counter_vec(
            "tollgate_snapshot_writes_total",
            "Local-state snapshot writes by result (ok, error).",
            &["result"],
        )?;
        let last_success = f.float_gauge(
            "tollgate_snapshot_last_success_timestamp_seconds",
            "Unix time of the last local-state snapshot written.",
        )?;
        let keys = f.gauge_vec(
            "tollgate_snapshot_keys",
            "Keys in the last local-state snapshot written, by kind.",
            &["kind"],
        )?;
        let loads = f.counter_vec(
            "tollgate_snapshot_loads_total",
            "Local-state snapshot loads at start by result (restored, absent, refused).",
            &["result"],
        )?;
        for result in ["restored", "absent", "refused"] {
            loads.with_label_values(&[result]);
        }
        for kind in [
            SavedKind::TokenBucket,
            SavedKind::Rate,
            SavedKind::SlidingLog,
            SavedKind::Tiered,
        ] {
            keys.with_label_values(&[kind.name()]);
        }
        Ok(Self {
            writes_ok: writes.with_label_values(&["ok"]),
            writes_error: writes.with_label_values(&["error"]),
            last_success,
            keys,
            loads,
        })
    }
}
