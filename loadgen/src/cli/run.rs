//! Running a sweep against a target and writing its report, as both subcommands do.

use super::Sweep;
use crate::record::RequestRecord;
use crate::report::{ReportConfig, ReportMeta, ReportWriter, RunInput, RunSummary, Summary};
use crate::target::Target;
use crate::workload::prefix_ideal::{ideal_hits, IdealHits};
use crate::workload::RequestSpec;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

/// Runs every policy at every load against `target` and writes the report into `out`.
pub fn execute(
    sweep: &Sweep,
    target: &mut dyn Target,
    out: &Path,
    meta: &ReportMeta,
    cfg: ReportConfig,
    progress: bool,
) -> anyhow::Result<Summary> {
    let mut writer = ReportWriter::create(out, cfg)?;
    let total = (sweep.policies.len() * sweep.loads.len()) as u64;
    // The prefix-cache hits a replayed trace allows, at the target's block size and capacity
    // (16-token blocks where the target does not say: this project's server's).
    let (block_size, capacity) = target
        .cache_blocks()
        .map_or((16, None), |(b, c)| (b, Some(c)));
    let ideals: Vec<Option<IdealHits>> = sweep
        .loads
        .iter()
        .map(|l| {
            l.replay
                .as_ref()
                .map(|_| ideal_hits(&l.requests, block_size, capacity))
        })
        .collect();
    let bar = if progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} runs {msg} [{elapsed}<{eta}]")
            .expect("the template is a valid constant"),
    );
    for &policy in &sweep.policies {
        for (load, ideal) in sweep.loads.iter().zip(&ideals) {
            bar.set_message(format!("{policy} at {:.2} rps", load.rps));
            let records = target.run(policy, &load.tenants, &load.requests, load.duration_s)?;
            let gpu = target.tenant_gpu_seconds();
            check_records(&load.requests, &records)
                .map_err(|e| anyhow::anyhow!("{policy} at {} rps: {e}", load.rps))?;
            let summary = writer.add_run(&RunInput {
                policy: policy.as_str(),
                rps: load.rps,
                tenants: &load.tenants,
                records: &records,
                duration_s: load.duration_s,
                target: target.last_stats(),
                tenant_gpu_s: gpu.as_deref(),
                replay: load.replay.as_deref().zip(*ideal),
            })?;
            if progress {
                bar.println(one_line(summary));
            } else {
                println!("{}", one_line(summary));
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(writer.finish(meta)?)
}

/// A target's records keep the contract of [`Target`]: at most one per request, none for an
/// unknown id, and one for every request that is not a follow-up turn.
fn check_records(requests: &[RequestSpec], records: &[RequestRecord]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    let ids: std::collections::HashSet<u64> = requests.iter().map(|r| r.id).collect();
    for r in records {
        if !ids.contains(&r.id) || !seen.insert(r.id) {
            return Err(format!(
                "the target returned an unknown or repeated id {}",
                r.id
            ));
        }
    }
    let firsts = requests
        .iter()
        .filter(|r| r.turn.and_then(|t| t.after).is_none());
    if let Some(r) = firsts.clone().find(|r| !seen.contains(&r.id)) {
        return Err(format!(
            "the target returned {} records, none for request {} (of {} that must be sent)",
            records.len(),
            r.id,
            firsts.count()
        ));
    }
    Ok(())
}

fn one_line(r: &RunSummary) -> String {
    format!(
        "{:<5} {:>7.2} rps  TTFT {:>5.1}%  TBT {:>5.1}%  p99 TTFT {:>7.2} s  p99 TBT {:>6.0} ms  \
         {:>7.0} tok/s  Jain {:.3}  max wait {:.1} s  cache hits {}",
        r.policy,
        r.rps,
        100.0 * r.ttft_attainment,
        100.0 * r.tbt_attainment,
        r.p99_ttft_s,
        1e3 * r.p99_tbt_s,
        r.throughput_tokens_per_s,
        r.jain,
        r.max_wait_s,
        r.cache
            .hit_rate
            .map_or("?".into(), |h| format!("{:.1}%", 100.0 * h)),
    )
}

/// Whether to draw a progress bar (asked for, and stderr is a terminal) and the statistics
/// settings, as both subcommands read them from their flags.
pub(crate) fn report_settings(
    no_progress: bool,
    bootstrap_resamples: usize,
) -> (bool, ReportConfig) {
    let progress = !no_progress && std::io::stderr().is_terminal();
    let cfg = ReportConfig {
        bootstrap_resamples,
        ..ReportConfig::default()
    };
    (progress, cfg)
}

pub(crate) fn finish(result: anyhow::Result<()>, out: &Path) -> ExitCode {
    match result {
        Ok(()) => {
            println!("wrote {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
