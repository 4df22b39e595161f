//! The ledger as the admin API and the CLI hand it out: rows with the tenant's name and the
//! hour in UTC, the totals, JSON (serde) or CSV.

use serde::Serialize;

use super::{format_hour, UsageCounts};

/// One row as exported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UsageReportRow {
    pub tenant_id: u32,
    /// The tenant's current name; `None` once it was deleted (ids are never reused).
    pub tenant: Option<String>,
    /// Start of the UTC hour, `2026-12-01T19:00:00Z`.
    pub hour: String,
    /// The same, in Unix seconds.
    pub hour_unix_s: u64,
    #[serde(flatten)]
    pub counts: UsageCounts,
}

/// The rows a query selected and their sum.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UsageReport {
    pub data: Vec<UsageReportRow>,
    pub totals: UsageCounts,
}

impl UsageReportRow {
    pub fn new(tenant_id: u32, tenant: Option<String>, hour: u64, counts: UsageCounts) -> Self {
        UsageReportRow {
            tenant_id,
            tenant,
            hour: format_hour(hour),
            hour_unix_s: hour * 3600,
            counts,
        }
    }
}

/// CSV with a header line; names are quoted when they need it (they cannot hold `"` or `,`
/// today, but the output stays valid CSV whatever a name holds).
pub fn to_csv(report: &UsageReport) -> String {
    let mut out = String::from(
        "tenant_id,tenant,hour,requests,sequences,prompt_tokens,cached_tokens,completion_tokens,errors\n",
    );
    for r in &report.data {
        let name = r.tenant.as_deref().unwrap_or("");
        let name = if name.contains([',', '"', '\n']) {
            format!("\"{}\"", name.replace('"', "\"\""))
        } else {
            name.to_string()
        };
        let c = &r.counts;
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            r.tenant_id,
            name,
            r.hour,
            c.requests,
            c.sequences,
            c.prompt_tokens,
            c.cached_tokens,
            c.completion_tokens,
            c.errors
        ));
    }
    out
}
