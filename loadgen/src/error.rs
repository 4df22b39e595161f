//! The crate's one error type. Variants carry the context a user needs to fix the input: the
//! tenant, the field, the file and line.

use std::path::PathBuf;

/// Everything that can go wrong while building a workload or writing a report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tenant field is out of range; `field` is the TOML key.
    #[error("tenant '{tenant}': {field} {problem}")]
    TenantField {
        tenant: String,
        field: &'static str,
        problem: String,
    },
    /// A tenant's arrival process or length distribution is invalid.
    #[error("tenant '{tenant}': {source}")]
    Tenant {
        tenant: String,
        #[source]
        source: Box<Error>,
    },
    #[error("tenant name '{0}' appears more than once; names must be unique")]
    DuplicateTenant(String),
    #[error("no tenants: a tenants file needs at least one [[tenant]] table")]
    NoTenants,
    /// An arrival process parameter is out of range.
    #[error("arrivals ({kind}): {problem}")]
    Arrivals { kind: &'static str, problem: String },
    /// A length distribution parameter is out of range.
    #[error("dataset ({kind}): {problem}")]
    Lengths { kind: &'static str, problem: String },
    #[error("unknown dataset '{0}': expected sharegpt, lmsys, fixed:PROMPT:OUTPUT or trace:PATH")]
    UnknownDataset(String),
    /// A command-line flag or combination of flags is invalid.
    #[error("{0}")]
    Usage(String),
    #[error("duration must be positive and finite, got {0} s")]
    Duration(f64),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {problem}")]
    TraceLine {
        path: PathBuf,
        line: usize,
        problem: String,
    },
    #[error("{path}: trace has no usable entries")]
    EmptyTrace { path: PathBuf },
    #[error("{path}: {source}")]
    Toml {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A record does not fit the run it is reported in (e.g. an unknown tenant index).
    #[error("report: {0}")]
    Report(String),
    #[error("plot {path}: {problem}")]
    Plot { path: PathBuf, problem: String },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// Wraps an error about a tenant's arrivals or dataset so that it names the tenant.
    pub(crate) fn in_tenant(self, tenant: &str) -> Error {
        Error::Tenant {
            tenant: tenant.to_string(),
            source: Box::new(self),
        }
    }
}
