//! SuperInfer load generator: multi-tenant workloads, targets that serve them, and SLO
//! reports.
//!
//! A workload is a set of tenants, each with an arrival process, a length distribution, SLOs
//! and a weight ([`workload`]). It becomes a deterministic list of requests, a [`Target`]
//! serves them under a policy and returns one [`RequestRecord`] each, and [`report`] turns
//! the records of a sweep over policies and loads into `summary.json`, `summary.md`,
//! `requests.jsonl` and SVG plots. The `superinfer-loadgen` binary ([`cli`]) wires the three.
//!
//! This crate does not schedule or serve anything itself: the simulated target drives the
//! engine crate's `Engine` on a virtual clock.
#![forbid(unsafe_code)]

pub mod cli;
pub mod error;
pub mod record;
pub mod report;
pub mod target;
pub mod workload;

pub use error::Error;
pub use record::RequestRecord;
pub use report::{RunSummary, Summary};
pub use target::Target;
pub use workload::{generate, ArrivalSpec, LengthSpec, RequestSpec, TenantSpec};
