//! Targets: what a workload is run against. Each returns one [`RequestRecord`] per request it
//! was given, in any order, with times on the run's clock (0 = start of the run).
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
