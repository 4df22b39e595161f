//! Pure scheduling decisions for SuperInfer.
//!
//! Given a snapshot of live requests ([`ReqView`]) and what the KV pool can give
//! ([`Capacity`]), a [`Policy`] decides one iteration ([`Plan`]): which waiting requests to
//! admit, which rotary requests to restore, and which running requests to rotate out or
//! recompute. Policies own both the admission order and the victim choice.
//!
//! This crate does no I/O, reads no clock and knows nothing of GPUs or async runtimes: time
//! comes in as `now`, service as [`Policy::on_service`].
//!
//! - [`vlt`]: Virtual Lag Time (PAPER.md §3).
//! - [`lvf`]: Largest-VLT-First (PAPER.md §4).
//! - [`wlvf`]: weighted LVF for many tenants, with starvation caps (docs/SCHEDULING.md).
//! - [`baselines`]: FCFS (vLLM-like), Waiting-First, Swapped-First, EDF.
//! - [`greedy`]: the take-from-the-head, free-from-the-tail machinery they share.
//! - [`registry`]: policies by command-line name.
#![forbid(unsafe_code)]

pub mod baselines;
pub mod greedy;
pub mod lvf;
pub mod registry;
pub mod types;
pub mod vlt;
pub mod wlvf;

#[cfg(test)]
mod test_support;

pub use lvf::Lvf;
pub use registry::{PolicyKind, UnknownPolicy};
pub use types::{Capacity, Phase, Plan, Policy, ReqView, RequestId, Service, Slo, TenantId};
pub use vlt::VltConfig;
pub use wlvf::{WaitCapScope, Wlvf, WlvfConfig};
