//! `superinfer-loadgen http`: the sweep of `sim`, sent to an OpenAI-compatible server
//! ([`crate::target::http`]).

use super::{
    execute, finish, parse_non_negative, parse_positive, parse_rps, prepare_workload,
    report_settings, ConversationFlags, DefaultTenantFlags, ReplayFlags, WorkloadFlags,
};
use crate::report::ReportMeta;
use crate::target::http::{HttpTarget, HttpTargetConfig};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use superinfer_policies::PolicyKind;

/// Seconds of arrivals when `--duration` is not given.
const DEFAULT_DURATION_S: f64 = 60.0;

/// Flags of `superinfer-loadgen http`.
#[derive(Args, Clone, Debug)]
pub struct HttpArgs {
    /// Base URL of the server, e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub target: String,
    /// TOML file of [[tenant]] tables; each tenant's `api_key` or `api_key_env` is its key.
    #[arg(long)]
    pub tenants: Option<PathBuf>,
    /// Key for tenants without one (and for the single default tenant).
    #[arg(long, env = "SUPERINFER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Model to request; default: the first of GET /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub default_tenant: DefaultTenantFlags,
    /// Comma-separated offered loads in requests/s (see `sim --help`).
    #[arg(long, value_delimiter = ',', value_parser = parse_rps)]
    pub rps: Vec<f64>,
    /// Arrivals are generated for this many seconds [default: 60; not with a trace replay,
    /// whose rows set the length: use --trace-duration-s].
    #[arg(long, value_parser = parse_positive)]
    pub duration: Option<f64>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output directory (created if needed).
    #[arg(long)]
    pub out: PathBuf,
    /// The policy the server runs: only the report's label (the server decides).
    #[arg(long, default_value = "wlvf")]
    pub policy: PolicyKind,
    /// After the last arrival, wait at most this long for answers.
    #[arg(long, default_value_t = 60.0, value_parser = parse_non_negative)]
    pub drain_s: f64,
    #[command(flatten)]
    pub conversation: ConversationFlags,
    #[command(flatten)]
    pub replay: ReplayFlags,
    /// Bootstrap resamples for the attainment confidence intervals.
    #[arg(long, default_value_t = 1000)]
    pub bootstrap_resamples: usize,
    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

impl<'a> From<&'a HttpArgs> for WorkloadFlags<'a> {
    fn from(a: &'a HttpArgs) -> Self {
        WorkloadFlags {
            policies: std::slice::from_ref(&a.policy),
            rps: &a.rps,
            duration: a.duration.unwrap_or(DEFAULT_DURATION_S),
            duration_given: a.duration.is_some(),
            seed: a.seed,
            tenants: a.tenants.as_deref(),
            default_tenant: &a.default_tenant,
            conversation: &a.conversation,
            replay: &a.replay,
        }
    }
}

pub(super) fn run_http(args: &HttpArgs, command: String) -> ExitCode {
    let target = HttpTarget::new(HttpTargetConfig {
        base_url: args.target.clone(),
        model: args.model.clone(),
        default_api_key: args.api_key.clone(),
        drain_s: args.drain_s,
    });
    let mut target = match target {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    // A replay's prompts are capped at the served model's context by default.
    let sweep = match prepare_workload(args.into(), |tenants| target.context_tokens(tenants)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (progress, cfg) = report_settings(args.no_progress, args.bootstrap_resamples);
    let meta = http_meta(args, command);
    let result = execute(&sweep, &mut target, &args.out, &meta, cfg, progress);
    for (kind, n) in &target.last_failures {
        eprintln!("last run: {n} requests failed: {kind}");
    }
    finish(result.map(|_| ()), &args.out)
}

fn http_meta(args: &HttpArgs, command: String) -> ReportMeta {
    let workload = match &args.tenants {
        Some(p) => format!("tenants from {}", p.display()),
        None => args.default_tenant.describe(),
    };
    let workload = match args.conversation.describe() {
        d if d.is_empty() => workload,
        d => format!("{workload}; {d}"),
    };
    ReportMeta {
        command,
        context: vec![
            (
                "target".into(),
                format!(
                    "HTTP server at {} (times measured by the client)",
                    args.target
                ),
            ),
            ("workload".into(), workload),
            (
                "duration".into(),
                format!(
                    "{} s of arrivals, then at most {} s of drain",
                    args.duration.unwrap_or(DEFAULT_DURATION_S),
                    args.drain_s
                ),
            ),
            ("seed".into(), args.seed.to_string()),
            (
                "policy".into(),
                format!("{} (the server's; a label here)", args.policy),
            ),
        ],
    }
}
