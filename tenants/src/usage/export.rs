//! The ledger as the admin API and the CLI hand it out: rows with the tenant's name and the
//! hour in UTC, the totals, JSON (serde) or CSV.

use serde::{Deserialize, Serialize};

use super::{format_hour, UsageCounts};

/// One row as exported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    /// The ledgers summed: one store's id, or every node's for a fleet's report.
    pub ledgers: Vec<String>,
    pub data: Vec<UsageReportRow>,
    pub totals: UsageCounts,
}

/// Two reports of one ledger were given to [`UsageReport::merge`]: summed, they would count
/// its usage twice.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "ledger {0} is in two of the reports (the same node listed twice?): it would be counted twice"
)]
pub struct DuplicateLedger(pub String);

impl UsageReport {
    /// A fleet's usage: the sum of its nodes' reports, each ledger exactly once (a ledger in
    /// two reports is refused). Rows are matched by tenant name and hour, since ids are each
    /// node's own; the id shown is the smallest the name has. Rows without a name (deleted
    /// tenants) are not matched across ledgers.
    pub fn merge(
        reports: impl IntoIterator<Item = UsageReport>,
    ) -> Result<UsageReport, DuplicateLedger> {
        use std::collections::BTreeMap;
        // (name, or the id in its ledger for a deleted tenant), hour → row.
        type Key = (Option<String>, Option<(usize, u32)>, u64);
        let mut rows: BTreeMap<Key, UsageReportRow> = BTreeMap::new();
        let mut out = UsageReport::default();
        for r in reports {
            let ledger = out.ledgers.len();
            for id in r.ledgers {
                if out.ledgers.contains(&id) {
                    return Err(DuplicateLedger(id));
                }
                out.ledgers.push(id);
            }
            out.totals.add(&r.totals);
            for row in r.data {
                let apart = row.tenant.is_none().then_some((ledger, row.tenant_id));
                let key = (row.tenant.clone(), apart, row.hour_unix_s);
                match rows.entry(key) {
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert(row);
                    }
                    std::collections::btree_map::Entry::Occupied(mut e) => {
                        let sum = e.get_mut();
                        sum.tenant_id = sum.tenant_id.min(row.tenant_id);
                        sum.counts.add(&row.counts);
                    }
                }
            }
        }
        out.data = rows.into_values().collect();
        out.data.sort_by_key(|r| (r.tenant_id, r.hour_unix_s));
        Ok(out)
    }
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
