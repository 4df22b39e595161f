//! Per-step histograms of the engine thread (`HandleConfig::step_metrics`): how long each
//! iteration took, how many requests its batch held and how many bytes of KV its attention
//! read. The handles are `metrics` histograms the caller registered with its own recorder
//! (the gateway's Prometheus registry); the loop records into them after every step that ran.

use crate::engine::StepReport;
use metrics::Histogram;

/// The engine thread's per-step histograms.
#[derive(Clone)]
pub struct StepMetrics {
    /// Seconds of one iteration: planning, issuing copies, the model step and turning its
    /// output into events (with a paced simulated runner, the step's simulated time).
    pub step_seconds: Histogram,
    /// Requests in the step's batch (decodes and prompt chunks).
    pub batch_size: Histogram,
    /// Bytes of KV the step's attention read ([`StepReport::kv_read_bytes`]).
    pub kv_read_bytes: Histogram,
}

impl std::fmt::Debug for StepMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StepMetrics")
    }
}

impl StepMetrics {
    /// Records one step that ran, which took `seconds`.
    pub(super) fn observe(&self, report: &StepReport, seconds: f64) {
        self.step_seconds.record(seconds);
        self.batch_size.record(report.batch_size as f64);
        self.kv_read_bytes.record(report.kv_read_bytes as f64);
    }
}
