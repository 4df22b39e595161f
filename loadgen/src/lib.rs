//! SuperInfer load generator: multi-tenant workloads, targets that serve them, and SLO
//! reports.
#![forbid(unsafe_code)]

pub mod error;
pub mod record;
pub mod report;
pub mod workload;

pub use error::Error;
pub use record::RequestRecord;
pub use report::{RunSummary, Summary};
pub use workload::{generate, ArrivalSpec, LengthSpec, RequestSpec, TenantSpec};
