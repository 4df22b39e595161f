//! `superinfer usage --node URL …`: a fleet's usage, each node's ledger summed exactly once.
//!
//! Each node bills what it served in its own ledger (on its own volume: deploy/k8s), so the
//! fleet's usage is the sum of every node's export. This command reads `GET
//! /admin/v1/usage` from each node given, refuses a ledger that two of them share (one node
//! listed twice, or behind two addresses) and a node that does not answer (a sum without it
//! would be short), and prints the sum: rows matched by tenant name and hour.

use anyhow::{bail, Context};
use clap::Args;
use std::time::Duration;
use superinfer_tenants::UsageReport;

use crate::usage::{report_json, Format};

#[derive(Args, Debug)]
pub struct FleetUsageArgs {
    /// A node's base URL, e.g. http://superinfer-0.superinfer-nodes:8000; name every node of
    /// the fleet once (repeat the flag).
    #[arg(long = "node", required = true)]
    pub nodes: Vec<String>,
    /// The nodes' admin token.
    #[arg(long, env = "SUPERINFER_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: String,
    /// One tenant, by name (ids are each node's own).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Hours overlapping [from, to): Unix seconds or a UTC time like 2026-12-01T19:00:00Z.
    #[arg(long)]
    pub from: Option<String>,
    #[arg(long)]
    pub to: Option<String>,
    #[arg(long, value_enum, default_value = "json")]
    pub format: Format,
    /// Seconds each node has to answer.
    #[arg(long, default_value_t = 30.0)]
    pub timeout_s: f64,
}

pub fn run(args: FleetUsageArgs) -> anyhow::Result<()> {
    if !(args.timeout_s > 0.0 && args.timeout_s.is_finite()) {
        bail!("--timeout-s must be a positive number of seconds");
    }
    if args
        .tenant
        .as_deref()
        .is_some_and(|t| t.bytes().all(|b| b.is_ascii_digit()))
    {
        bail!("--tenant takes a name: ids are each node's own");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(fleet_report(&args))?;
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report_json(&report))?),
        Format::Csv => print!("{}", superinfer_tenants::to_csv(&report)),
    }
    Ok(())
}

/// Every node's report, summed; an error when any node fails or two share a ledger.
pub async fn fleet_report(args: &FleetUsageArgs) -> anyhow::Result<UsageReport> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(args.timeout_s))
        .build()?;
    let mut query: Vec<(&str, &str)> = Vec::new();
    for (name, v) in [
        ("tenant", &args.tenant),
        ("from", &args.from),
        ("to", &args.to),
    ] {
        if let Some(v) = v {
            query.push((name, v));
        }
    }
    let fetches = args.nodes.iter().map(|node| {
        let url = format!("{}/admin/v1/usage", node.trim_end_matches('/'));
        let req = client.get(url).query(&query).bearer_auth(&args.admin_token);
        async move {
            let resp = req.send().await.with_context(|| format!("node {node}"))?;
            let status = resp.status();
            let body = resp.text().await.with_context(|| format!("node {node}"))?;
            if !status.is_success() {
                bail!("node {node} answered {status}: {}", body.trim());
            }
            let report: UsageReport = serde_json::from_str(&body)
                .with_context(|| format!("node {node}: not a usage export"))?;
            if report.ledgers.len() != 1 {
                bail!(
                    "node {node} names {} ledgers, not one",
                    report.ledgers.len()
                );
            }
            Ok(report)
        }
    });
    let reports = futures_util::future::try_join_all(fetches).await?;
    Ok(UsageReport::merge(reports)?)
}
