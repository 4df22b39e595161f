use super::*;
use crate::record::RequestRecord;
use crate::report::ReportConfig;
use crate::target::Target;
use crate::workload::RequestSpec;
use crate::workload::{ArrivalSpec, LengthSpec, TenantSpec};

fn parse(extra: &[&str]) -> Result<SimArgs, clap::Error> {
    let argv = ["superinfer-loadgen", "sim", "--out", "/tmp/unused"]
        .iter()
        .chain(extra)
        .copied();
    Cli::try_parse_from(argv).map(|c| match c.command {
        Command::Sim(a) => a,
        Command::Http(_) => unreachable!("the argv says sim"),
    })
}

fn code(extra: &[&str]) -> ExitCode {
    let argv = ["superinfer-loadgen", "sim"]
        .iter()
        .chain(extra)
        .map(OsString::from);
    run(argv)
}

const TENANTS: &str = r#"
[[tenant]]
name = "gold"
weight = 4.0
ttft_slo_s = 5.0
tbt_slo_s = 0.1
dataset = "sharegpt"
arrivals = { kind = "hawkes", baseline_rps = 4.0, excitation = 0.5, decay_per_s = 2.0 }

[[tenant]]
name = "bronze"
weight = 1.0
ttft_slo_s = 5.0
tbt_slo_s = 0.1
dataset = "lmsys"
arrivals = { kind = "poisson", rps = 8.0 }
"#;

#[test]
fn the_issue_command_line_parses() {
    let a = parse(&[
        "--profile",
        "gh200-qwen2.5-32b",
        "--dataset",
        "sharegpt",
        "--policies",
        "fcfs,wf,sf,lvf",
        "--rps",
        "5,10,15,20",
        "--duration",
        "120",
        "--seed",
        "42",
        "--b-xfer",
        "2400",
    ])
    .unwrap();
    assert_eq!(a.profile, "gh200-qwen2.5-32b");
    assert_eq!(a.default_tenant.dataset(), LengthSpec::Sharegpt);
    assert_eq!(
        a.policies,
        vec![
            PolicyKind::Fcfs,
            PolicyKind::Wf,
            PolicyKind::Sf,
            PolicyKind::Lvf
        ]
    );
    assert_eq!(a.rps, vec![5.0, 10.0, 15.0, 20.0]);
    assert_eq!(
        (a.duration, a.seed, a.b_xfer),
        (Some(120.0), 42, Some(2400))
    );
    let c = wlvf_config(&a);
    assert_eq!(c.vlt, VltConfig::default());
    assert_eq!(c.max_wait_s, None);
}

#[test]
fn policy_knobs_reach_the_config() {
    let a = parse(&[
        "--rps",
        "1",
        "--alpha",
        "2",
        "--beta-b",
        "-0.5",
        "--beta-f",
        "0",
        "--max-wait-s",
        "30",
        "--max-rotations",
        "3",
        "--progress-tokens",
        "32",
        "--fairness-quantum",
        "1024",
    ])
    .unwrap();
    assert_eq!(sim_target_config(&a).engine.progress_tokens, 32);
    let c = wlvf_config(&a);
    assert_eq!((c.vlt.alpha, c.vlt.beta_b, c.vlt.beta_f), (2.0, -0.5, 0.0));
    assert_eq!(c.max_wait_s, Some(30.0));
    assert_eq!(c.max_consecutive_rotations, Some(3));
    assert_eq!(c.fairness_quantum_tokens, 1024.0);
}

#[test]
fn bad_flags_are_rejected_with_a_clear_message_and_status_2() {
    let cases: [(&[&str], &str); 15] = [
        (&["--policies", "fcfs,lifo"], "unknown policy 'lifo'"),
        (&["--rps", "5,x,15"], "'x' is not a number"),
        (&["--rps", "5,0"], "must be positive"),
        (&["--rps", "5,,10"], "is not a number"),
        (&["--gpu-memory-utilization", "1.5"], "(0, 1]"),
        (&["--dataset", "alpaca"], "unknown dataset 'alpaca'"),
        (&["--hbm-kv-gb", "0"], "must be positive"),
        (&["--hbm-kv-gb=-4"], "must be positive"),
        (&["--hbm-kv-gb", "4GB"], "'4GB' is not a number"),
        (&["--hbm-kv-gb", "inf"], "must be positive and finite"),
        (
            &["--hbm-kv-gb", "4", "--gpu-memory-utilization", "0.5"],
            "cannot be used with",
        ),
        (
            &["--dram-gb", "32", "--dram-gib", "32"],
            "cannot be used with",
        ),
        (&["--max-num-seqs", "0"], "--max-num-seqs"),
        (&["--max-batched-tokens", "0"], "--max-batched-tokens"),
        (&["--progress-tokens", "0"], "--progress-tokens"),
    ];
    for (flags, want) in cases {
        let e = parse(flags).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{flags:?}");
        assert!(e.to_string().contains(want), "{flags:?}: {e}");
        let mut argv = vec!["--out", "/tmp/unused"];
        argv.extend_from_slice(flags);
        assert_eq!(code(&argv), ExitCode::from(2), "{flags:?}");
    }
}

#[test]
fn the_gpu_experiment_flags_reach_the_engine() {
    let a = parse(&[
        "--rps",
        "1",
        "--profile",
        "h200-llama-3-8b",
        "--hbm-kv-gb",
        "4",
        "--dram-gb",
        "32",
        "--max-batched-tokens",
        "2048",
        "--max-num-seqs",
        "256",
    ])
    .unwrap();
    assert_eq!((a.hbm_kv_gb, a.dram_gb), (Some(4.0), Some(32.0)));
    let t = SimTarget::new(sim_target_config(&a)).unwrap();
    let e = t.engine_config();
    assert_eq!(
        (
            e.hbm_blocks,
            e.dram_blocks,
            e.max_batched_tokens,
            e.max_num_seqs
        ),
        (1907, 15_258, 2048, 256),
        "4e9 and 32e9 bytes of 2 MiB blocks"
    );
    let m = meta(&a, &t, String::new());
    let tiers = &m.context.iter().find(|(k, _)| k == "KV tiers").unwrap().1;
    assert!(
        tiers.contains("HBM 1907 blocks = 3.999 GB (--hbm-kv-gb 4)"),
        "{tiers}"
    );
    let b = parse(&["--rps", "1", "--dram-kv-gb", "48"]).unwrap();
    assert_eq!(b.dram_gb, Some(48.0), "the server's spelling");
    // Without the new flags nothing changes: the twin's defaults.
    let d = parse(&["--rps", "1"]).unwrap();
    assert_eq!((d.hbm_kv_gb, d.dram_gb, d.dram_gib), (None, None, 400.0));
    assert_eq!((d.max_batched_tokens, d.max_num_seqs), (16384, 1024));
}

#[test]
fn kv_tiers_that_do_not_fit_exit_2_before_any_run() {
    for (gb, want) in [("500", "does not fit"), ("0.001", "holds no KV block")] {
        let a = parse(&[
            "--rps",
            "1",
            "--profile",
            "h200-llama-3-8b",
            "--hbm-kv-gb",
            gb,
        ])
        .unwrap();
        let e = format!("{:#}", SimTarget::new(sim_target_config(&a)).unwrap_err());
        assert!(e.contains(want) && e.contains("--hbm-kv-gb"), "{gb}: {e}");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let argv = [
            "--out",
            out.to_str().unwrap(),
            "--rps",
            "1",
            "--profile",
            "h200-llama-3-8b",
            "--hbm-kv-gb",
            gb,
        ];
        assert_eq!(code(&argv), ExitCode::from(2), "{gb}");
        assert!(!out.exists(), "nothing ran");
    }
}

#[test]
fn inconsistent_sweeps_are_usage_errors() {
    let e = prepare(&parse(&[]).unwrap()).unwrap_err();
    assert!(
        matches!(e, Error::Usage(_)) && e.to_string().contains("--rps is required"),
        "{e}"
    );
    let e = prepare(&parse(&["--rps", "5", "--policies", "lvf,fcfs,lvf"]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("'lvf' twice"), "{e}");
    let e = prepare(&parse(&["--rps", "5,10,5"]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("5 twice"), "{e}");
    let e = prepare(&parse(&["--tenants", "/nonexistent/tenants.toml"]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/tenants.toml"), "{e}");
    let argv = [
        "--out",
        "/tmp/unused",
        "--tenants",
        "/nonexistent/tenants.toml",
    ];
    assert_eq!(code(&argv), ExitCode::from(2));
}

#[test]
fn without_tenants_one_default_tenant_per_load() {
    let a = parse(&[
        "--rps",
        "5,10",
        "--duration",
        "60",
        "--dataset",
        "lmsys",
        "--ttft-slo-s",
        "2",
    ])
    .unwrap();
    let s = prepare(&a).unwrap();
    assert_eq!(s.loads.len(), 2);
    for (load, rps) in s.loads.iter().zip([5.0, 10.0]) {
        assert_eq!(load.rps, rps);
        assert_eq!(load.tenants.len(), 1);
        let t = &load.tenants[0];
        assert_eq!(
            (t.name.as_str(), t.ttft_slo_s, t.tbt_slo_s),
            ("default", 2.0, 0.1)
        );
        assert_eq!(t.dataset, LengthSpec::Lmsys);
        assert_eq!(t.arrivals, ArrivalSpec::Poisson { rps });
        let n = load.requests.len() as f64;
        assert!(
            (n / 60.0 - rps).abs() < 0.35 * rps,
            "{n} requests at {rps} rps"
        );
    }
}

#[test]
fn tenant_rates_come_from_the_file_or_are_scaled_to_each_rps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.toml");
    std::fs::write(&path, TENANTS).unwrap();
    let p = path.to_str().unwrap();
    let s = prepare(&parse(&["--tenants", p]).unwrap()).unwrap();
    assert_eq!(s.loads.len(), 1);
    assert_eq!(
        s.loads[0].rps, 16.0,
        "8 (hawkes 4 / (1 - 0.5)) + 8 (poisson)"
    );
    // The default tenant's flags are refused with a file, never accepted and unused.
    for flag in ["--dataset", "--ttft-slo-s", "--tbt-slo-s"] {
        let value = if flag == "--dataset" { "lmsys" } else { "2" };
        let e = prepare(&parse(&["--tenants", p, flag, value]).unwrap()).unwrap_err();
        assert!(
            e.to_string().contains(flag) && e.to_string().contains("tenants file"),
            "{flag}: {e}"
        );
    }
    let s = prepare(&parse(&["--tenants", p, "--rps", "8,32"]).unwrap()).unwrap();
    for (load, rps) in s.loads.iter().zip([8.0, 32.0]) {
        let rates: Vec<f64> = load
            .tenants
            .iter()
            .map(|t| t.arrivals.mean_rps().unwrap())
            .collect();
        assert!((rates.iter().sum::<f64>() - rps).abs() < 1e-9);
        assert!((rates[0] - rates[1]).abs() < 1e-9, "the mix is kept");
        assert_eq!(load.tenants[0].weight, 4.0);
    }
}

/// Serves every request at once: first token 10 ms after arrival, then one every 20 ms.
struct Instant;

impl Target for Instant {
    fn run(
        &mut self,
        _policy: PolicyKind,
        _tenants: &[TenantSpec],
        requests: &[RequestSpec],
        _duration_s: f64,
    ) -> anyhow::Result<Vec<RequestRecord>> {
        Ok(requests
            .iter()
            .map(|q| {
                let times: Vec<f64> = (0..q.output_tokens)
                    .map(|k| q.arrival_s + 0.01 + 0.02 * f64::from(k))
                    .collect();
                RequestRecord {
                    first_token_s: times.first().copied(),
                    finish_s: times.last().copied(),
                    generated_tokens: q.output_tokens,
                    token_times_s: times,
                    ..RequestRecord::unserved(q)
                }
            })
            .collect())
    }
}

#[test]
fn a_sweep_writes_one_run_per_policy_and_load() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let a = parse(&["--rps", "2,4", "--duration", "20", "--policies", "fcfs,lvf"]).unwrap();
    let sweep = prepare(&a).unwrap();
    let meta = ReportMeta::default();
    let cfg = ReportConfig::default();
    let summary = execute(&sweep, &mut Instant, &out, &meta, cfg, false).unwrap();
    let runs: Vec<(&str, f64)> = summary
        .runs
        .iter()
        .map(|r| (r.policy.as_str(), r.rps))
        .collect();
    assert_eq!(
        runs,
        vec![("fcfs", 2.0), ("fcfs", 4.0), ("lvf", 2.0), ("lvf", 4.0)]
    );
    for r in &summary.runs {
        assert_eq!(
            (r.ttft_attainment, r.tbt_attainment, r.jain),
            (1.0, 1.0, 1.0)
        );
        assert_eq!(r.unserved, 0);
    }
    for f in [
        "summary.json",
        "summary.md",
        "requests.jsonl",
        "attainment_vs_rps.svg",
        "ttft_cdf.svg",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
}

#[test]
fn a_target_that_loses_requests_fails_the_sweep() {
    struct Lossy;
    impl Target for Lossy {
        fn run(
            &mut self,
            _: PolicyKind,
            _: &[TenantSpec],
            requests: &[RequestSpec],
            _: f64,
        ) -> anyhow::Result<Vec<RequestRecord>> {
            Ok(requests
                .iter()
                .skip(1)
                .map(RequestRecord::unserved)
                .collect())
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let sweep = prepare(&parse(&["--rps", "2", "--duration", "20"]).unwrap()).unwrap();
    let cfg = ReportConfig::default();
    let e = execute(
        &sweep,
        &mut Lossy,
        dir.path(),
        &ReportMeta::default(),
        cfg,
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("none for request"), "{e}");
}

#[test]
fn api_keys_never_reach_the_report() {
    let argv: Vec<OsString> = [
        "superinfer-loadgen",
        "http",
        "--api-key",
        "sk-si-secret",
        "--api-key=sk-si-other",
        "--out",
        "x",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let line = command_line(&argv);
    assert!(
        !line.contains("secret") && !line.contains("other"),
        "{line}"
    );
    assert!(
        line.contains("--api-key <redacted>") && line.contains("--out x"),
        "{line}"
    );
}

#[test]
fn vlt_knobs_that_make_no_ranking_exit_2_before_any_run() {
    for (flag, value, want) in [
        ("--alpha", "0", "alpha must be a number above 0"),
        ("--beta-f", "inf", "beta_f must be a finite number"),
    ] {
        let a = parse(&["--rps", "1", flag, value]).unwrap();
        let e = format!("{:#}", SimTarget::new(sim_target_config(&a)).unwrap_err());
        assert!(e.contains(want), "{flag}: {e}");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let argv = ["--out", out.to_str().unwrap(), "--rps", "1", flag, value];
        assert_eq!(code(&argv), ExitCode::from(2), "{flag}");
        assert!(!out.exists(), "nothing ran");
    }
}

#[test]
fn a_tenant_with_load_of_its_own_runs_beside_a_replayed_trace() {
    // The shipped long-context isolation workload: every trace row goes to "long"; "chat"
    // sends its own Poisson load over the replay's length.
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/workloads/replay/mooncake-beside-chat.toml"
    );
    let args = parse(&[
        "--tenants",
        p,
        "--trace-duration-s",
        "60",
        "--rate-scale",
        "1,2",
    ])
    .unwrap();
    let s = prepare(&args).unwrap();
    assert_eq!(s.loads.len(), 2);
    for load in &s.loads {
        let chat = load.requests.iter().filter(|r| r.tenant == 1).count() as f64;
        let run_s = load.duration_s;
        assert!(
            (chat / run_s - 2.0).abs() < 0.8,
            "{chat} chats in {run_s} s"
        );
        assert!(load
            .requests
            .iter()
            .any(|r| r.tenant == 0 && r.blocks.is_some()));
        assert!(load
            .requests
            .iter()
            .all(|r| (r.tenant == 1) == r.blocks.is_none()));
        assert!(load
            .requests
            .windows(2)
            .all(|w| w[0].arrival_s <= w[1].arrival_s));
        assert!(load
            .requests
            .iter()
            .enumerate()
            .all(|(i, r)| r.id == i as u64));
        assert_eq!(load.tenants[1].arrivals, ArrivalSpec::Poisson { rps: 2.0 });
    }
    // A tenant with only one of arrivals / dataset is refused.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(p).unwrap();
    let half = dir.path().join("half.toml");
    std::fs::write(&half, text.replace("dataset = \"sharegpt\"\n", "")).unwrap();
    let e = prepare(&parse(&["--tenants", half.to_str().unwrap()]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("arrivals"), "{e}");
}

#[test]
fn the_deadline_and_step_budget_flags_reach_the_config_and_0_turns_them_off() {
    let d = sim_target_config(&parse(&["--rps", "1"]).unwrap());
    assert_eq!(d.engine.queue_deadline_ttfts, Some(10.0));
    assert_eq!(
        d.engine.step_tbt_share,
        Some(0.8),
        "the step budget is on by default"
    );
    let on = sim_target_config(
        &parse(&[
            "--rps",
            "1",
            "--queue-deadline-ttfts",
            "3",
            "--step-tbt-share",
            "0.5",
        ])
        .unwrap(),
    );
    assert_eq!(
        (on.engine.queue_deadline_ttfts, on.engine.step_tbt_share),
        (Some(3.0), Some(0.5))
    );
    let off = sim_target_config(
        &parse(&[
            "--rps",
            "1",
            "--queue-deadline-ttfts",
            "0",
            "--step-tbt-share",
            "0",
        ])
        .unwrap(),
    );
    assert_eq!(
        (off.engine.queue_deadline_ttfts, off.engine.step_tbt_share),
        (None, None)
    );
    assert!(parse(&["--rps", "1", "--step-tbt-share", "-1"]).is_err());
}

#[test]
fn a_step_trace_takes_one_run_and_writes_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("steps.jsonl");
    let out = dir.path().join("out");
    let (trace_s, out_s) = (trace.to_str().unwrap(), out.to_str().unwrap());
    let base = [
        "--profile",
        "h100-llama-3.1-8b",
        "--duration",
        "5",
        "--seed",
        "1",
    ];
    let with = |more: &[&'static str]| -> Vec<String> {
        base.iter()
            .chain(more)
            .map(|s| s.to_string())
            .chain([
                "--out".into(),
                out_s.into(),
                "--step-trace".into(),
                trace_s.into(),
            ])
            .collect()
    };
    // Two policies or two loads: refused, nothing written.
    for more in [
        &["--policies", "fcfs,wlvf", "--rps", "2"][..],
        &["--policies", "wlvf", "--rps", "1,2"],
    ] {
        let argv = with(more);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert_eq!(code(&argv), ExitCode::from(2), "{more:?}");
        assert!(!trace.exists());
    }
    let argv = with(&["--policies", "wlvf", "--rps", "2", "--no-progress"]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    assert_eq!(code(&argv), ExitCode::SUCCESS);
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.lines().count() > 10, "{text}");
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(first["predicted_s"].as_f64().unwrap() > 0.0, "{first}");
}
