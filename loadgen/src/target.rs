//! Targets: what a workload is run against. Each returns one [`RequestRecord`] per request it
//! sent, in any order, with times on the run's clock (0 = start of the run). Every request
//! that is not a follow-up turn is sent; a follow-up turn is sent only after the turn before it
//! finished, and only if that plus its think time falls inside the arrival window.
//!
//! - [`sim`]: the in-process engine on a virtual clock with a simulated GPU.
//! - [`http`]: any OpenAI-compatible server, measured from the client.

pub mod http;
pub mod sim;

use crate::record::RequestRecord;
use crate::workload::{RequestSpec, TenantSpec};
use superinfer_policies::PolicyKind;

/// Something that serves a workload under a scheduling policy.
pub trait Target {
    /// What the target measured about the last run beyond the records (the twin: prefill
    /// tokens its engine computed); `None` when it cannot see inside the server.
    fn last_stats(&self) -> Option<TargetStats> {
        None
    }

    /// Each tenant's GPU time in the last run (by index into its tenants) as the server
    /// counted it, for a target whose records carry none; `None` when it does not say.
    fn tenant_gpu_seconds(&self) -> Option<Vec<f64>> {
        None
    }

    /// The prefix cache's block size in tokens and its capacity in blocks, where known.
    fn cache_blocks(&self) -> Option<(u32, u64)> {
        None
    }

    /// Serves `requests` (sorted by arrival; `tenant` indexes `tenants`) for a run of
    /// `duration_s` seconds and reports what each one experienced.
    fn run(
        &mut self,
        policy: PolicyKind,
        tenants: &[TenantSpec],
        requests: &[RequestSpec],
        duration_s: f64,
    ) -> anyhow::Result<Vec<RequestRecord>>;
}

/// Totals a target measured inside the server during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TargetStats {
    /// Prompt tokens the engine actually prefilled (recomputes included; cache hits not).
    pub prefill_tokens_computed: u64,
}
