//! The flags of a trace replay (`--trace` and the options over a workload file's `[replay]`).

use super::parse::usage;
use crate::error::Error;
use crate::workload::replay::{Assign, ReplaySpec};
use crate::workload::trace::TraceFormat;
use clap::Args;
use std::path::PathBuf;

/// Flags of a trace replay. Each one given overrides the `[replay]` table of `--tenants`.
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct ReplayFlags {
    /// Replay this trace, every row one request at its time, for one tenant (the SLO flags
    /// give its targets): Azure or BurstGPT CSV, Mooncake or this project's JSONL
    /// (docs/WORKLOADS.md). With --tenants, give the trace in its [replay] table instead.
    #[arg(long, conflicts_with = "tenants")]
    pub trace: Option<PathBuf>,
    /// The trace's format: azure, mooncake, burstgpt or jsonl [default: from its first line].
    #[arg(long)]
    pub trace_format: Option<TraceFormat>,
    /// Comma-separated rate scales, one run each: 2 sends the trace's rows twice as fast
    /// (the same shape) [default: 1].
    #[arg(long, value_delimiter = ',', value_parser = super::parse_positive)]
    pub rate_scale: Vec<f64>,
    /// Trace times are multiplied by this [default: 1].
    #[arg(long, value_parser = super::parse_positive)]
    pub time_scale: Option<f64>,
    /// The replayed window starts this many trace seconds after the first row [default: 0].
    #[arg(long, value_parser = super::parse_non_negative)]
    pub trace_start_s: Option<f64>,
    /// The replayed window lasts this many trace seconds [default: to the end].
    #[arg(long, value_parser = super::parse_positive)]
    pub trace_duration_s: Option<f64>,
    /// Rows with longer prompts are counted and reported, not sent [default: the target's
    /// context: the served model's max_model_len, the twin's HBM KV tier].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_prompt_tokens: Option<u32>,
    /// Rows to tenants: round-robin, hash:COLUMN (rows with equal values go to one tenant;
    /// hash:hash_ids hashes a Mooncake row's first block) or one:TENANT [default:
    /// round-robin].
    #[arg(long)]
    pub assign: Option<Assign>,
}

impl ReplayFlags {
    /// The flags given, as `--flag value` words, for errors about flags without a replay.
    fn given(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut note = |set: bool, name| {
            if set {
                v.push(name)
            }
        };
        note(self.trace_format.is_some(), "--trace-format");
        note(!self.rate_scale.is_empty(), "--rate-scale");
        note(self.time_scale.is_some(), "--time-scale");
        note(self.trace_start_s.is_some(), "--trace-start-s");
        note(self.trace_duration_s.is_some(), "--trace-duration-s");
        note(self.max_prompt_tokens.is_some(), "--max-prompt-tokens");
        note(self.assign.is_some(), "--assign");
        v
    }

    pub(super) fn apply(&self, spec: &mut ReplaySpec) {
        if let Some(f) = self.trace_format {
            spec.format = Some(f);
        }
        if let Some(t) = self.time_scale {
            spec.time_scale = t;
        }
        if let Some(s) = self.trace_start_s {
            spec.start_s = s;
        }
        if let Some(d) = self.trace_duration_s {
            spec.duration_s = Some(d);
        }
        if let Some(m) = self.max_prompt_tokens {
            spec.max_prompt_tokens = Some(m);
        }
        if let Some(a) = &self.assign {
            spec.assign = a.clone();
        }
    }

    /// An error when replay flags were given to a workload that replays nothing.
    pub(super) fn check_unused(&self) -> Result<(), Error> {
        match self.given().first() {
            Some(flag) => Err(usage(format!(
                "{flag} needs a trace: --trace, or a --tenants file with a [replay] table"
            ))),
            None => Ok(()),
        }
    }
}
