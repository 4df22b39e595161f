//! What a sweep is made of (its loads, each with its tenants and requests) and the flags that
//! define its workload, shared by `sim` and `http`.

use super::parse::usage;
use super::replay_flags::ReplayFlags;
use crate::error::Error;
use crate::workload::replay::ReplayInfo;
use crate::workload::{ArrivalSpec, ConversationSpec, LengthSpec, RequestSpec, TenantSpec};
use clap::Args;
use std::path::Path;
use std::sync::Arc;
use superinfer_policies::PolicyKind;

/// Flags that make a workload multi-turn or give it system prompts. Each one given applies to
/// every tenant (the file's or the default one), replacing the file's value.
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct ConversationFlags {
    /// Multi-turn conversations with this mean number of turns (>= 1; 1 + geometric); every
    /// arrival starts a conversation.
    #[arg(long, value_parser = super::parse_positive)]
    pub turns: Option<f64>,
    /// Mean think time between an answer and the next turn, seconds (exponential; needs
    /// --turns unless the tenants file has conversations).
    #[arg(long, value_parser = super::parse_non_negative)]
    pub think_time_s: Option<f64>,
    /// Every prompt of a tenant starts with the tenant's own system prompt of this many
    /// tokens.
    #[arg(long)]
    pub system_prompt_tokens: Option<u32>,
}

impl ConversationFlags {
    pub(super) fn apply(&self, t: &mut TenantSpec) -> Result<(), Error> {
        if let Some(n) = self.system_prompt_tokens {
            t.system_prompt_tokens = n;
        }
        match (&mut t.conversation, self.turns) {
            (Some(c), Some(turns)) => c.turns_mean = turns,
            (None, Some(turns)) => t.conversation = Some(ConversationSpec::new(turns, 0.0)),
            _ => {}
        }
        if let Some(think) = self.think_time_s {
            match &mut t.conversation {
                Some(c) => c.think_time_s = think,
                None => {
                    return Err(Error::Usage(format!(
                        "--think-time-s needs --turns (tenant '{}' has no conversations)",
                        t.name
                    )))
                }
            }
        }
        Ok(())
    }

    /// The first flag given, if any.
    pub(super) fn given(&self) -> Option<&'static str> {
        if self.turns.is_some() {
            Some("--turns")
        } else if self.think_time_s.is_some() {
            Some("--think-time-s")
        } else if self.system_prompt_tokens.is_some() {
            Some("--system-prompt-tokens")
        } else {
            None
        }
    }

    /// What the flags set, for the report's header (empty when none was given).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.turns {
            parts.push(format!("--turns {t}"));
        }
        if let Some(t) = self.think_time_s {
            parts.push(format!("--think-time-s {t}"));
        }
        if let Some(n) = self.system_prompt_tokens {
            parts.push(format!("--system-prompt-tokens {n}"));
        }
        parts.join(" ")
    }
}

/// One offered load: the tenants at that load and the requests they send.
#[derive(Clone, Debug)]
pub struct Load {
    /// Sum of the tenants' mean arrival rates (a replay: requests sent over the run).
    pub rps: f64,
    pub tenants: Vec<TenantSpec>,
    pub requests: Vec<RequestSpec>,
    /// Seconds of arrivals (a replay: the window after scaling).
    pub duration_s: f64,
    /// The trace replayed, and what of it was left out.
    pub replay: Option<Arc<ReplayInfo>>,
}

/// A checked sweep: every run it will make, with its requests already generated.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub policies: Vec<PolicyKind>,
    pub loads: Vec<Load>,
    pub duration_s: f64,
}

/// The single default tenant of a run without `--tenants`: its lengths and SLOs. A run with
/// `--tenants` (or a trace) refuses them, since each tenant's entry sets its own.
#[derive(Args, Clone, Debug, Default)]
pub struct DefaultTenantFlags {
    /// Lengths of the single default tenant: sharegpt, lmsys, fixed:PROMPT:OUTPUT or
    /// trace:PATH [default: sharegpt; not with --tenants or --trace].
    #[arg(long)]
    pub dataset: Option<LengthSpec>,
    /// TTFT SLO of the single default tenant, seconds [default: 5; not with --tenants].
    #[arg(long, value_parser = super::parse_positive)]
    pub ttft_slo_s: Option<f64>,
    /// TBT SLO of the single default tenant, seconds [default: 0.1; not with --tenants].
    #[arg(long, value_parser = super::parse_positive)]
    pub tbt_slo_s: Option<f64>,
}

impl DefaultTenantFlags {
    pub fn dataset(&self) -> LengthSpec {
        self.dataset.clone().unwrap_or(LengthSpec::Sharegpt)
    }
    pub fn ttft_slo_s(&self) -> f64 {
        self.ttft_slo_s.unwrap_or(5.0)
    }
    pub fn tbt_slo_s(&self) -> f64 {
        self.tbt_slo_s.unwrap_or(0.1)
    }

    /// The default tenant with these lengths and arrivals.
    pub fn tenant(&self, lengths: LengthSpec, arrivals: ArrivalSpec) -> TenantSpec {
        TenantSpec {
            ttft_slo_s: self.ttft_slo_s(),
            tbt_slo_s: self.tbt_slo_s(),
            ..TenantSpec::new("default", lengths, arrivals)
        }
    }

    /// A usage error naming the flags given that the run does not use: all three with a
    /// tenants file (each tenant's entry sets its lengths and SLOs), `--dataset` with a trace
    /// (its rows set the lengths; the SLOs still apply to its single default tenant).
    pub fn check_unused(&self, tenants_file: bool) -> Result<(), Error> {
        let given: Vec<&str> = [
            (self.dataset.is_some(), "--dataset"),
            (tenants_file && self.ttft_slo_s.is_some(), "--ttft-slo-s"),
            (tenants_file && self.tbt_slo_s.is_some(), "--tbt-slo-s"),
        ]
        .into_iter()
        .filter_map(|(g, name)| g.then_some(name))
        .collect();
        if given.is_empty() {
            return Ok(());
        }
        Err(usage(format!(
            "{} set the single default tenant's lengths and SLOs, which a tenants file's \
             entries (and a trace's rows, for lengths) set instead",
            given.join(", ")
        )))
    }

    /// The report's description of the workload of a run without `--tenants`.
    pub fn describe(&self) -> String {
        format!(
            "one tenant, Poisson arrivals, dataset {}, TTFT SLO {} s, TBT SLO {} s",
            self.dataset().kind(),
            self.ttft_slo_s(),
            self.tbt_slo_s()
        )
    }
}

/// The flags that define a sweep's workload, shared by `sim` and `http`.
#[derive(Clone, Copy, Debug)]
pub struct WorkloadFlags<'a> {
    pub policies: &'a [PolicyKind],
    pub rps: &'a [f64],
    pub duration: f64,
    /// `--duration` was given (a replay refuses it).
    pub duration_given: bool,
    pub seed: u64,
    pub tenants: Option<&'a Path>,
    pub default_tenant: &'a DefaultTenantFlags,
    pub conversation: &'a ConversationFlags,
    pub replay: &'a ReplayFlags,
}
