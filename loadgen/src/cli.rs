//! The `superinfer-loadgen` command line.
//!
//! `sim` sweeps policies × offered loads against the simulated engine and writes a report;
//! `http` sends the same workloads to an OpenAI-compatible server and writes the same report.
//! Bad input (an unknown policy, a bad `--rps` list, a missing or invalid tenants file, an
//! unknown profile or KV tiers that do not fit) exits with status 2 before anything runs; a
//! failure while running exits with status 1.

use crate::error::Error;
use crate::report::ReportMeta;
use crate::target::sim::{SimTarget, SimTargetConfig};
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use superinfer_engine::EngineConfig;
use superinfer_policies::{PolicyKind, VltConfig, WaitCapScope, WlvfConfig};

mod http;
mod parse;
mod replay;
mod replay_flags;
mod run;
mod sweep;
mod workload;

use http::run_http;
pub use http::HttpArgs;
use parse::parse_fraction;
pub(crate) use parse::{parse_non_negative, parse_positive, parse_rps};
pub use replay_flags::ReplayFlags;
pub use run::execute;
pub(crate) use run::{finish, report_settings};
pub use sweep::{ConversationFlags, DefaultTenantFlags, Load, Sweep, WorkloadFlags};
pub use workload::prepare_workload;

/// Seconds of arrivals when `--duration` is not given.
const DEFAULT_DURATION_S: f64 = 120.0;

#[derive(Parser, Debug)]
#[command(
    name = "superinfer-loadgen",
    version,
    about = "SuperInfer load generator"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Sweep policies × offered loads against the simulated engine and write a report.
    Sim(SimArgs),
    /// Send the workload at each offered load to an OpenAI-compatible server and write a
    /// report (times measured on the client).
    Http(HttpArgs),
}

/// Flags of `superinfer-loadgen sim`.
#[derive(Args, Clone, Debug)]
pub struct SimArgs {
    /// Hardware + model profile of the simulated engine.
    #[arg(long, default_value = "gh200-qwen2.5-32b")]
    pub profile: String,
    #[command(flatten)]
    pub default_tenant: DefaultTenantFlags,
    /// Comma-separated policies: fcfs, wf, sf, edf, lvf, wlvf.
    #[arg(long, value_delimiter = ',', default_value = "fcfs,wf,sf,lvf")]
    pub policies: Vec<PolicyKind>,
    /// Comma-separated offered loads in requests/s. Required without --tenants; with
    /// --tenants, each tenant's rate is scaled so that the rates sum to each value.
    #[arg(long, value_delimiter = ',', value_parser = parse_rps)]
    pub rps: Vec<f64>,
    /// Arrivals are generated for this many seconds [default: 120; not with a trace replay,
    /// whose rows set the length: use --trace-duration-s].
    #[arg(long, value_parser = parse_positive)]
    pub duration: Option<f64>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output directory (created if needed).
    #[arg(long)]
    pub out: PathBuf,
    /// TOML file of [[tenant]] tables (docs/WORKLOADS.md).
    #[arg(long)]
    pub tenants: Option<PathBuf>,
    /// Rotation budget in KV blocks per iteration [default: automatic, the profile's link rate
    /// × the mean iteration time, at least the largest live request].
    #[arg(long)]
    pub b_xfer: Option<u32>,
    /// With the automatic budget: the share of one iteration's link capacity the scheduler
    /// may plan.
    #[arg(long, default_value_t = EngineConfig::default().b_xfer_link_share, value_parser = parse_positive)]
    pub b_xfer_share: f64,
    /// A prompt with more tokens left than this is a long prefill: chunked at most this much
    /// per iteration while others want tokens, one at a time [default: half of
    /// --max-batched-tokens].
    #[arg(long)]
    pub long_prefill_tokens: Option<u32>,
    /// VLT weight of TBT urgency against TTFT urgency.
    #[arg(long, default_value_t = VltConfig::default().alpha, allow_negative_numbers = true)]
    pub alpha: f64,
    /// VLT tolerance window of rotary requests, as a fraction of the TBT SLO.
    #[arg(long, default_value_t = VltConfig::default().beta_b, allow_negative_numbers = true)]
    pub beta_b: f64,
    /// VLT tolerance window of waiting requests, as a fraction of the TTFT SLO.
    #[arg(long, default_value_t = VltConfig::default().beta_f, allow_negative_numbers = true)]
    pub beta_f: f64,
    /// Weighted LVF: promote a request that has waited this long, seconds.
    #[arg(long, value_parser = parse_positive)]
    pub max_wait_s: Option<f64>,
    /// Weighted LVF: what the wait cap promotes an overdue request past: `global` (every
    /// request) or `tenant` (its own tenant's only, so isolation holds).
    #[arg(long, default_value = "global")]
    pub wait_cap_scope: WaitCapScope,
    /// Weighted LVF: cap on consecutive rotations (and recomputes) of one request
    /// (default 1, weighted LVF's default).
    #[arg(long)]
    pub max_rotations: Option<u32>,
    /// Weighted LVF's rotation cap: tokens a request must produce in one running period
    /// before its consecutive-rotation count resets.
    #[arg(long, default_value_t = EngineConfig::default().progress_tokens, value_parser = clap::value_parser!(u32).range(1..))]
    pub progress_tokens: u32,
    /// Refuse a request at submit when its tenant has requests waiting and its recent
    /// requests waited more than this fraction of their TTFT SLO to start (a refused request
    /// counts as a miss). Off by default.
    #[arg(long, value_parser = parse_positive)]
    pub shed_late: Option<f64>,
    /// Shed a request still waiting for its first admission this many times its TTFT target
    /// after it arrived (counted as refused with 503, and a miss); 0: never [default: 10].
    #[arg(long, value_parser = parse_non_negative)]
    pub queue_deadline_ttfts: Option<f64>,
    /// Keep each step's modelled time within this share of the tightest TBT target of the
    /// requests decoding in it (long contexts take turns); 0: off [default: 0.8].
    #[arg(long, value_parser = parse_non_negative)]
    pub step_tbt_share: Option<f64>,
    /// Write one JSON line per engine step to this file (what the step ran, its modelled
    /// time), as `superinfer serve --step-trace` does; one policy at one offered load.
    #[arg(long)]
    pub step_trace: Option<std::path::PathBuf>,
    /// Weighted LVF: fairness band in cost units (prompt tokens) per unit of weight.
    #[arg(long, default_value_t = WlvfConfig::default().fairness_quantum_tokens, value_parser = parse_positive)]
    pub fairness_quantum: f64,
    /// Weighted LVF: cost of one generated token in prompt tokens (the fairness counter's
    /// charge ratio).
    #[arg(long, default_value_t = WlvfConfig::default().decode_cost, value_parser = parse_positive)]
    pub decode_cost: f64,
    /// Weighted LVF: serve first what can still meet its TTFT SLO (`false`: LVF's order).
    #[arg(long, default_value_t = WlvfConfig::default().defer_late, action = clap::ArgAction::Set)]
    pub defer_late: bool,
    /// Weighted LVF: let a candidate displace running requests for a seat (max_num_seqs)
    /// while HBM has room, as LVF does.
    #[arg(long, default_value_t = WlvfConfig::default().preempt_for_seats, action = clap::ArgAction::Set)]
    pub preempt_for_seats: bool,
    /// Host DRAM tier size in GiB (2^30 bytes).
    #[arg(long, default_value_t = 400.0, value_parser = parse_non_negative)]
    pub dram_gib: f64,
    /// Host DRAM tier size in GB (10^9 bytes), instead of --dram-gib (alias --dram-kv-gb,
    /// as `superinfer serve` spells it).
    #[arg(long, visible_alias = "dram-kv-gb", value_parser = parse_non_negative, conflicts_with = "dram_gib")]
    pub dram_gb: Option<f64>,
    /// Share of HBM the engine may use (weights + KV + activation reserve), in (0, 1].
    #[arg(long, default_value_t = 0.9, value_parser = parse_fraction)]
    pub gpu_memory_utilization: f64,
    /// HBM KV tier size in GB (10^9 bytes), instead of what HBM × --gpu-memory-utilization
    /// leaves after the weights and the activation reserve. Must hold one KV block and fit in
    /// HBM next to the weights.
    #[arg(long, value_parser = parse_positive, conflicts_with = "gpu_memory_utilization")]
    pub hbm_kv_gb: Option<f64>,
    /// Token budget per iteration (decode tokens plus prefill chunks), as `superinfer serve`'s.
    #[arg(long, default_value_t = EngineConfig::default().max_batched_tokens, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_batched_tokens: u32,
    /// At most this many requests resident in HBM (running or restoring) at once, as
    /// `superinfer serve`'s.
    #[arg(long, default_value_t = EngineConfig::default().max_num_seqs, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_num_seqs: u32,
    /// After the last arrival, keep serving at most this long; requests not served by then
    /// count as misses.
    #[arg(long, default_value_t = SimTargetConfig::default().drain_s, value_parser = parse_non_negative)]
    pub drain_s: f64,
    /// Run without the prefix cache (every prompt token is prefilled).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Keep the prefix cache in HBM only (as vLLM's automatic prefix caching does), not in
    /// DRAM.
    #[arg(long, conflicts_with = "no_prefix_cache")]
    pub prefix_cache_hbm_only: bool,
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

/// The policy knobs shared by LVF and weighted LVF.
pub fn wlvf_config(args: &SimArgs) -> WlvfConfig {
    WlvfConfig {
        vlt: VltConfig {
            alpha: args.alpha,
            beta_b: args.beta_b,
            beta_f: args.beta_f,
        },
        max_wait_s: args.max_wait_s,
        max_consecutive_rotations: args
            .max_rotations
            .or(WlvfConfig::default().max_consecutive_rotations),
        fairness_quantum_tokens: args.fairness_quantum,
        decode_cost: args.decode_cost,
        cached_cost: WlvfConfig::default().cached_cost,
        defer_late: args.defer_late,
        preempt_for_seats: args.preempt_for_seats,
        wait_cap_scope: args.wait_cap_scope,
    }
}

/// The simulated node's settings from the flags.
pub fn sim_target_config(args: &SimArgs) -> SimTargetConfig {
    SimTargetConfig {
        profile: args.profile.clone(),
        engine: EngineConfig {
            b_xfer: args.b_xfer,
            b_xfer_link_share: args.b_xfer_share,
            long_prefill_tokens: args.long_prefill_tokens,
            max_batched_tokens: args.max_batched_tokens,
            max_num_seqs: args.max_num_seqs,
            progress_tokens: args.progress_tokens,
            shed_late: args.shed_late,
            // Non-negative and finite (the parser): 0 is off, unset the default.
            queue_deadline_ttfts: EngineConfig::queue_deadline_setting(args.queue_deadline_ttfts)
                .unwrap_or_default(),
            step_tbt_share: EngineConfig::step_tbt_share_setting(args.step_tbt_share)
                .unwrap_or_default(),
            prefix_cache: !args.no_prefix_cache,
            prefix_cache_dram: !args.prefix_cache_hbm_only,
            step_trace: args.step_trace.clone(),
            ..EngineConfig::default()
        },
        dram_gib: args.dram_gib,
        dram_gb: args.dram_gb,
        gpu_memory_utilization: args.gpu_memory_utilization,
        hbm_kv_gb: args.hbm_kv_gb,
        policy: wlvf_config(args),
        drain_s: args.drain_s,
    }
}

impl<'a> From<&'a SimArgs> for WorkloadFlags<'a> {
    fn from(a: &'a SimArgs) -> Self {
        WorkloadFlags {
            policies: &a.policies,
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

/// Checks the flags, reads the workload file and builds every load's requests; a replay's
/// prompts are capped at the twin's HBM KV tier by default.
pub fn prepare(args: &SimArgs) -> Result<Sweep, Error> {
    prepare_workload(args.into(), |_| {
        SimTarget::new(sim_target_config(args))
            .ok()
            .map(|t| t.context_tokens())
    })
}

fn meta(args: &SimArgs, target: &SimTarget, command: String) -> ReportMeta {
    let workload = match &args.tenants {
        Some(p) => format!("tenants from {}", p.display()),
        None => args.default_tenant.describe(),
    };
    let workload = match args.conversation.describe() {
        d if d.is_empty() => workload,
        d => format!("{workload}; {d}"),
    };
    let e = target.engine_config();
    let prefix_cache = match (e.prefix_cache, e.prefix_cache_dram, e.dram_blocks > 0) {
        (false, _, _) => "off (--no-prefix-cache)",
        (true, false, _) => "HBM only (--prefix-cache-hbm-only)",
        (true, true, false) => "HBM only (no DRAM tier)",
        (true, true, true) => "two tiers (HBM + DRAM)",
    };
    let b_xfer = args
        .b_xfer
        .map_or("automatic (link rate × iteration time)".to_string(), |b| {
            b.to_string()
        });
    ReportMeta {
        command,
        context: vec![
            (
                "target".into(),
                format!("simulated engine, profile {}", args.profile),
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
            ("B_xfer".into(), b_xfer),
            ("KV tiers".into(), kv_tiers(args, target)),
            ("prefix cache".into(), prefix_cache.into()),
            (
                "batching".into(),
                format!(
                    "max batched tokens {}, max num seqs {}, block size {}",
                    e.max_batched_tokens, e.max_num_seqs, e.block_size
                ),
            ),
        ],
    }
}

/// The tier sizes in blocks and bytes, and where each came from.
fn kv_tiers(args: &SimArgs, target: &SimTarget) -> String {
    let e = target.engine_config();
    let gb = |blocks: u32| f64::from(blocks) * target.block_bytes() as f64 / 1e9;
    let hbm_from = match args.hbm_kv_gb {
        Some(x) => format!("--hbm-kv-gb {x}"),
        None => format!("--gpu-memory-utilization {}", args.gpu_memory_utilization),
    };
    let dram_from = match args.dram_gb {
        Some(x) => format!("--dram-gb {x}"),
        None => format!("--dram-gib {}", args.dram_gib),
    };
    format!(
        "HBM {} blocks = {:.3} GB ({hbm_from}), DRAM {} blocks = {:.3} GB ({dram_from}), {} bytes per block",
        e.hbm_blocks,
        gb(e.hbm_blocks),
        e.dram_blocks,
        gb(e.dram_blocks),
        target.block_bytes()
    )
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    run(std::env::args_os())
}

/// Parses `argv` and runs; returns the process exit status.
pub fn run<I: IntoIterator<Item = OsString>>(argv: I) -> ExitCode {
    let argv: Vec<OsString> = argv.into_iter().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    let command = command_line(&argv);
    match cli.command {
        Command::Sim(args) => run_sim(&args, command),
        Command::Http(args) => run_http(&args, command),
    }
}

fn run_sim(args: &SimArgs, command: String) -> ExitCode {
    if args.step_trace.is_some() && (args.policies.len() > 1 || args.rps.len() > 1) {
        eprintln!("error: --step-trace traces one run: give one policy and at most one --rps");
        return ExitCode::from(2);
    }
    // An unknown profile or KV tiers that do not fit are bad input too.
    let mut target = match SimTarget::new(sim_target_config(args)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let sweep = match prepare_workload(args.into(), |_| Some(target.context_tokens())) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (progress, cfg) = report_settings(args.no_progress, args.bootstrap_resamples);
    let meta = meta(args, &target, command);
    let result = execute(&sweep, &mut target, &args.out, &meta, cfg, progress);
    finish(result.map(|_| ()), &args.out)
}

/// The command line as the report shows it, with secrets (the value of `--api-key`) redacted.
pub fn command_line(argv: &[OsString]) -> String {
    let mut out: Vec<String> = Vec::with_capacity(argv.len());
    for a in argv {
        let a = a.to_string_lossy();
        if out.last().is_some_and(|prev| prev == "--api-key") {
            out.push("<redacted>".into());
        } else if a.starts_with("--api-key=") {
            out.push("--api-key=<redacted>".into());
        } else {
            out.push(a.into_owned());
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests;
