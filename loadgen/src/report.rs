//! Reports: per-run SLO attainment, latency percentiles, throughput, goodput, fairness and
//! confidence intervals, written as `summary.json`, `summary.md`, `requests.jsonl` and SVG
//! plots. Every statistic is defined in `docs/WORKLOADS.md`.
//!
//! - [`stats`]: per-request outcomes, percentiles, Jain's index, bootstrap.
//! - [`writer`]: the output directory.
//! - [`markdown`], [`plots`]: renderings.

pub mod cache;
pub mod markdown;
pub mod meta;
pub mod plots;
pub mod replay;
pub mod stats;
pub mod writer;

pub use cache::CacheSummary;
pub use meta::ReportMeta;
pub use replay::ReplaySummary;
pub use stats::Ci95;
pub use writer::ReportWriter;

use crate::error::Error;
use crate::record::RequestRecord;
use crate::target::TargetStats;
use crate::workload::prefix_ideal::IdealHits;
use crate::workload::replay::ReplayInfo;
use crate::workload::TenantSpec;
use serde::{Deserialize, Serialize};
use stats::Outcome;
use std::collections::BTreeMap;

/// One run of one policy at one load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub policy: String,
    /// Offered load: the sum of the tenants' mean arrival rates.
    pub rps: f64,
    /// Length of the arrival window; rates (throughput, goodput) are per second of it.
    pub duration_s: f64,
    /// End of the run: `duration_s`, or the last token or finish if the target served past it.
    /// Unserved requests are judged as having waited until then.
    pub end_s: f64,
    pub submitted: u64,
    pub finished: u64,
    /// Never produced a first token by the end of the run.
    pub unserved: u64,
    pub ttft_attainment: f64,
    pub ttft_attainment_ci95: Ci95,
    pub tbt_attainment: f64,
    pub tbt_attainment_ci95: Ci95,
    pub p50_ttft_s: f64,
    pub p90_ttft_s: f64,
    pub p99_ttft_s: f64,
    pub p50_tbt_s: f64,
    pub p90_tbt_s: f64,
    pub p99_tbt_s: f64,
    /// Time per output token of a request (its mean gap, vLLM's TPOT), P50 and P99 over
    /// requests with at least one gap: where pooled gaps hide a few very long stalls, this
    /// shows which requests suffered them.
    pub p50_tpot_s: f64,
    pub p99_tpot_s: f64,
    /// Generated output tokens per second of the run's duration.
    pub throughput_tokens_per_s: f64,
    /// Requests per second that met the TTFT SLO and whose every gap met the TBT SLO.
    pub goodput_rps: f64,
    /// Jain's index over tenants of served tokens divided by weight.
    pub jain: f64,
    /// Jain's index over tenants of TTFT attainment.
    pub jain_attainment: f64,
    pub max_wait_s: f64,
    pub max_stall_s: f64,
    pub preemptions: u64,
    /// Prefix cache: prompt tokens, cached tokens by tier, hit rate.
    #[serde(default)]
    pub cache: CacheSummary,
    /// Prompt tokens the engine actually prefilled (recomputes included), where the target
    /// can see it (the twin).
    #[serde(default)]
    pub prefill_tokens_computed: Option<u64>,
    /// Requests the target refused at submission, by HTTP status.
    #[serde(default)]
    pub refused: BTreeMap<String, u64>,
    /// A replayed trace: what it is, what was left out, the ideal and achieved cache hits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplaySummary>,
    pub tenants: Vec<TenantSummary>,
}

/// One tenant within a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantSummary {
    pub name: String,
    pub weight: f64,
    /// `weight` over the weights of the tenants that submitted requests.
    pub weight_share: f64,
    pub submitted: u64,
    pub finished: u64,
    pub ttft_attainment: f64,
    pub tbt_attainment: f64,
    pub p99_ttft_s: f64,
    /// Prompt tokens of its served requests plus its generated tokens.
    pub served_tokens: u64,
    /// `served_tokens` over all tenants' served tokens.
    pub share: f64,
    /// Its requests' prefix-cache statistics.
    #[serde(default)]
    pub cache: CacheSummary,
    /// Requests the target refused at submission.
    pub refused: u64,
    /// Its requests' share of the node's GPU time (their `gpu_s` over all tenants', or the
    /// server's count by tenant); `None`: the target did not report GPU time.
    #[serde(default)]
    pub gpu_share: Option<f64>,
}

/// `summary.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub runs: Vec<RunSummary>,
}

/// What a run is summarized from.
#[derive(Clone, Copy, Debug)]
pub struct RunInput<'a> {
    pub policy: &'a str,
    pub rps: f64,
    /// SLOs and weights come from here; `records[i].tenant` indexes it.
    pub tenants: &'a [TenantSpec],
    pub records: &'a [RequestRecord],
    pub duration_s: f64,
    /// What the target measured inside the server, if it can.
    pub target: Option<TargetStats>,
    /// Each tenant's GPU time as the server counted it, where the records carry none
    /// ([`crate::target::Target::tenant_gpu_seconds`]).
    pub tenant_gpu_s: Option<&'a [f64]>,
    /// A replayed trace and the prefix-cache hits its requests allow.
    pub replay: Option<(&'a ReplayInfo, IdealHits)>,
}

/// Knobs of the statistics.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportConfig {
    pub bootstrap_resamples: usize,
    pub bootstrap_seed: u64,
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            bootstrap_resamples: 1000,
            bootstrap_seed: 0x5eed,
        }
    }
}

/// Summarizes one run.
pub fn summarize(input: &RunInput<'_>, cfg: &ReportConfig) -> Result<RunSummary, Error> {
    Ok(analyze(input, cfg)?.0)
}

/// End of the run: its duration, or the last event if the target ran past it.
fn end_of_run(input: &RunInput<'_>) -> f64 {
    input
        .records
        .iter()
        .flat_map(|r| {
            r.finish_s
                .into_iter()
                .chain(r.token_times_s.last().copied())
        })
        .fold(input.duration_s, f64::max)
}

/// The summary and the per-request outcomes it came from.
pub(crate) fn analyze(
    input: &RunInput<'_>,
    cfg: &ReportConfig,
) -> Result<(RunSummary, Vec<Outcome>), Error> {
    if !(input.duration_s.is_finite() && input.duration_s > 0.0) {
        return Err(Error::Duration(input.duration_s));
    }
    if let Some(r) = input
        .records
        .iter()
        .find(|r| r.tenant >= input.tenants.len())
    {
        return Err(Error::Report(format!(
            "request {} names tenant index {}, but the run has {} tenants",
            r.id,
            r.tenant,
            input.tenants.len()
        )));
    }
    let end_s = end_of_run(input);
    let outcomes: Vec<Outcome> = input
        .records
        .iter()
        .map(|r| {
            let t = &input.tenants[r.tenant];
            stats::judge(r, t.ttft_slo_s, t.tbt_slo_s, end_s)
        })
        .collect();
    let (ttft_ci, tbt_ci) =
        stats::bootstrap_attainment(&outcomes, cfg.bootstrap_resamples, cfg.bootstrap_seed);
    let ttfts = sorted(outcomes.iter().map(|o| o.ttft_censored_s));
    let gaps = sorted(outcomes.iter().flat_map(|o| o.gaps_s.iter().copied()));
    let tpots = sorted(
        outcomes
            .iter()
            .filter(|o| !o.gaps_s.is_empty())
            .map(|o| o.gaps_s.iter().sum::<f64>() / o.gaps_s.len() as f64),
    );
    let tenants = tenant_summaries(input, &outcomes);
    let active: Vec<&TenantSummary> = tenants.iter().filter(|t| t.submitted > 0).collect();
    let normalized: Vec<f64> = active
        .iter()
        .map(|t| t.served_tokens as f64 / t.weight)
        .collect();
    let attainments: Vec<f64> = active.iter().map(|t| t.ttft_attainment).collect();
    let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count() as u64;
    let max = |f: fn(&Outcome) -> f64| outcomes.iter().map(f).fold(0.0, f64::max);
    let summary = RunSummary {
        policy: input.policy.to_string(),
        rps: input.rps,
        duration_s: input.duration_s,
        end_s,
        submitted: outcomes.len() as u64,
        finished: count(|o| o.finished),
        unserved: count(|o| o.ttft_s.is_none()),
        ttft_attainment: stats::ttft_attainment(&outcomes),
        ttft_attainment_ci95: ttft_ci,
        tbt_attainment: stats::tbt_attainment(&outcomes),
        tbt_attainment_ci95: tbt_ci,
        p50_ttft_s: stats::percentile(&ttfts, 0.50),
        p90_ttft_s: stats::percentile(&ttfts, 0.90),
        p99_ttft_s: stats::percentile(&ttfts, 0.99),
        p50_tbt_s: stats::percentile(&gaps, 0.50),
        p90_tbt_s: stats::percentile(&gaps, 0.90),
        p99_tbt_s: stats::percentile(&gaps, 0.99),
        p50_tpot_s: stats::percentile(&tpots, 0.50),
        p99_tpot_s: stats::percentile(&tpots, 0.99),
        throughput_tokens_per_s: outcomes.iter().map(|o| o.generated_tokens).sum::<u64>() as f64
            / input.duration_s,
        goodput_rps: count(Outcome::good) as f64 / input.duration_s,
        jain: stats::jain(&normalized),
        jain_attainment: stats::jain(&attainments),
        max_wait_s: max(|o| o.max_wait_s),
        max_stall_s: max(|o| o.max_stall_s),
        preemptions: outcomes.iter().map(|o| u64::from(o.preemptions)).sum(),
        cache: CacheSummary::of(input.records.iter()),
        refused: refusals(input.records.iter()),
        replay: input.replay.map(|(info, ideal)| {
            ReplaySummary::new(info, ideal, &CacheSummary::of(input.records.iter()))
        }),
        prefill_tokens_computed: input.target.map(|t| t.prefill_tokens_computed),
        tenants,
    };
    Ok((summary, outcomes))
}

/// Refusals at submission by HTTP status.
fn refusals<'a>(records: impl Iterator<Item = &'a RequestRecord>) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for s in records.filter_map(|r| r.refused) {
        *m.entry(s.to_string()).or_default() += 1;
    }
    m
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v
}

fn tenant_summaries(input: &RunInput, outcomes: &[Outcome]) -> Vec<TenantSummary> {
    let (tenants, records) = (input.tenants, input.records);
    let mine = |i: usize| outcomes.iter().filter(move |o| o.tenant == i);
    let served: Vec<u64> = (0..tenants.len())
        .map(|i| mine(i).map(|o| o.served_tokens).sum())
        .collect();
    let total_served: u64 = served.iter().sum();
    let gpu: Vec<f64> = (0..tenants.len())
        .map(|i| {
            records
                .iter()
                .filter(|r| r.tenant == i)
                .filter_map(|r| r.gpu_s)
                .sum()
        })
        .collect();
    let gpu = match input.tenant_gpu_s {
        Some(server) if records.iter().all(|r| r.gpu_s.is_none()) => server.to_vec(),
        _ => gpu,
    };
    let total_gpu: f64 = gpu.iter().sum();
    let gpu_known = (input.tenant_gpu_s.is_some() || records.iter().any(|r| r.gpu_s.is_some()))
        && total_gpu > 0.0;
    let active_weight: f64 = tenants
        .iter()
        .enumerate()
        .filter(|(i, _)| mine(*i).next().is_some())
        .map(|(_, t)| t.weight)
        .sum();
    tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let submitted = mine(i).count() as u64;
            let ttfts = sorted(mine(i).map(|o| o.ttft_censored_s));
            TenantSummary {
                name: t.name.clone(),
                weight: t.weight,
                weight_share: if submitted > 0 {
                    t.weight / active_weight
                } else {
                    0.0
                },
                submitted,
                finished: mine(i).filter(|o| o.finished).count() as u64,
                ttft_attainment: stats::ttft_attainment(mine(i)),
                tbt_attainment: stats::tbt_attainment(mine(i)),
                p99_ttft_s: stats::percentile(&ttfts, 0.99),
                served_tokens: served[i],
                share: if total_served > 0 {
                    served[i] as f64 / total_served as f64
                } else {
                    0.0
                },
                cache: CacheSummary::of(records.iter().filter(|r| r.tenant == i)),
                refused: records
                    .iter()
                    .filter(|r| r.tenant == i && r.refused.is_some())
                    .count() as u64,
                gpu_share: gpu_known.then(|| gpu[i] / total_gpu),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
