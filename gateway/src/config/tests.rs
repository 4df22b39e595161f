use super::*;
use crate::quota::fleet::FailureMode;
use superinfer_policies::{PolicyKind, WaitCapScope};

#[test]
fn no_settings_give_the_documented_defaults() {
    let c = ServeConfig::resolve(Settings::default()).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8000");
    assert_eq!(c.data_dir, PathBuf::from("superinfer-data"));
    assert_eq!(
        c.model,
        ModelSource::Tiny(PathBuf::from("superinfer-data/model"))
    );
    assert_eq!(c.engine.policy, PolicyKind::Wlvf);
    assert!(c.admin_token.is_none());
}

#[test]
fn higher_sources_win_field_by_field() {
    let file: Settings =
        toml::from_str("listen = \"127.0.0.1:9000\"\nmax_queue = 7\npolicy = \"lvf\"\n").unwrap();
    let flags = Settings {
        max_queue: Some(9),
        ..Settings::default()
    };
    let c = ServeConfig::resolve(flags.or(file)).unwrap();
    assert_eq!(c.listen.port(), 9000);
    assert_eq!(c.engine.max_queue, 9);
    assert_eq!(c.engine.policy, PolicyKind::Lvf);
}

#[test]
fn unknown_file_keys_and_bad_values_are_refused() {
    assert!(toml::from_str::<Settings>("listn = \"x\"").is_err());
    let s = Settings {
        admin_token: Some("short".into()),
        ..Settings::default()
    };
    assert!(ServeConfig::resolve(s)
        .unwrap_err()
        .to_string()
        .contains("16"));
}

#[test]
fn gpu_settings_need_device_cuda_and_sane_values() {
    let err = |s: Settings| ServeConfig::resolve(s).unwrap_err().to_string();
    let on_cpu = Settings {
        hbm_kv_gb: Some(4.0),
        ..Settings::default()
    };
    assert!(err(on_cpu).contains("hbm_kv_gb"));
    let random_on_cpu = Settings {
        model_dir: Some("random:llama-3-8b".into()),
        ..Settings::default()
    };
    assert!(err(random_on_cpu).contains("--device cuda"));
    let no_model = Settings {
        device: Some(ComputeDevice::Cuda),
        ..Settings::default()
    };
    assert!(err(no_model).contains("needs a model"));
    let bad = Settings {
        device: Some(ComputeDevice::Cuda),
        model_dir: Some("random:llama-3-8b".into()),
        gpu_memory_utilization: Some(1.5),
        ..Settings::default()
    };
    assert!(err(bad).contains("gpu_memory_utilization"));
    let file: Settings =
        toml::from_str("device = \"cuda\"\nmodel_dir = \"random:llama-3-8b\"\nhbm_kv_gb = 4.0\n")
            .unwrap();
    let c = ServeConfig::resolve(file).unwrap();
    assert_eq!(
        c.model,
        ModelSource::Gpu {
            model: "random:llama-3-8b".into(),
            gpu: crate::backend::GpuOptions {
                gpu_memory_utilization: 0.9,
                hbm_kv_gb: Some(4.0),
                dram_kv_gb: 32.0,
                ..crate::backend::GpuOptions::default()
            },
        }
    );
    let ModelSource::Gpu { gpu, .. } = &c.model else {
        unreachable!("checked above")
    };
    assert!(gpu.cuda_graphs, "CUDA graphs are on by default");
    let graphs_on_cpu = Settings {
        no_cuda_graphs: Some(true),
        ..Settings::default()
    };
    assert!(err(graphs_on_cpu).contains("no_cuda_graphs"));
    let off: Settings = toml::from_str(
        "device = \"cuda\"\nmodel_dir = \"random:llama-3-8b\"\nno_cuda_graphs = true\n",
    )
    .unwrap();
    let ModelSource::Gpu { gpu, .. } = ServeConfig::resolve(off).unwrap().model else {
        unreachable!("a GPU model")
    };
    assert!(!gpu.cuda_graphs, "no_cuda_graphs turns them off");
}

#[test]
fn vlt_knobs_reach_the_policy_and_bad_ones_are_refused() {
    let c = ServeConfig::resolve(Settings::default()).unwrap();
    assert_eq!(c.engine.wlvf.vlt, VltConfig::default());
    let s = Settings {
        alpha: Some(2.0),
        beta_b: Some(-0.5),
        beta_f: Some(0.0),
        ..Settings::default()
    };
    let c = ServeConfig::resolve(s).unwrap();
    let v = c.engine.wlvf.vlt;
    assert_eq!((v.alpha, v.beta_b, v.beta_f), (2.0, -0.5, 0.0));
    for (bad, want) in [
        (
            Settings {
                alpha: Some(0.0),
                ..Settings::default()
            },
            "alpha must be a number above 0",
        ),
        (
            Settings {
                beta_f: Some(f64::NAN),
                ..Settings::default()
            },
            "beta_f must be a finite number",
        ),
        (
            Settings {
                beta_b: Some(f64::INFINITY),
                ..Settings::default()
            },
            "beta_b must be a finite number",
        ),
    ] {
        let e = ServeConfig::resolve(bad).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn fairness_knobs_and_shedding_reach_the_engine_and_bad_ones_are_refused() {
    let s: Settings = toml::from_str(
        "fairness_quantum = 256.0\ndecode_cost = 2.0\ndefer_late = false\nshed_late = 0.5\npreempt_for_seats = true\nwait_cap_scope = \"tenant\"\n",
    )
    .unwrap();
    let c = ServeConfig::resolve(s).unwrap();
    assert_eq!(c.engine.wlvf.wait_cap_scope, WaitCapScope::Tenant);
    let bad = toml::from_str::<Settings>("wait_cap_scope = \"everyone\"\n").unwrap_err();
    assert!(bad.to_string().contains("global"), "{bad}");
    assert_eq!(c.engine.wlvf.fairness_quantum_tokens, 256.0);
    assert_eq!(c.engine.wlvf.decode_cost, 2.0);
    assert!(!c.engine.wlvf.defer_late);
    assert!(c.engine.wlvf.preempt_for_seats);
    assert_eq!(c.engine.config.shed_late, Some(0.5));
    let d = ServeConfig::resolve(Settings::default()).unwrap();
    assert_eq!(d.engine.wlvf.max_consecutive_rotations, Some(1));
    assert!(d.engine.wlvf.defer_late);
    assert!(!d.engine.wlvf.preempt_for_seats);
    assert_eq!(d.engine.wlvf.wait_cap_scope, WaitCapScope::Global);
    assert_eq!(d.engine.config.shed_late, None);
    for (bad, want) in [
        (
            Settings {
                fairness_quantum: Some(0.0),
                ..Settings::default()
            },
            "fairness_quantum must be a number above 0",
        ),
        (
            Settings {
                decode_cost: Some(f64::NAN),
                ..Settings::default()
            },
            "decode_cost must be a number above 0",
        ),
        (
            Settings {
                shed_late: Some(-1.0),
                ..Settings::default()
            },
            "shed_late must be a fraction",
        ),
    ] {
        let e = ServeConfig::resolve(bad).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn starvation_caps_reach_the_policy_and_bad_ones_are_refused() {
    let s = Settings {
        max_rotations: Some(1),
        max_wait_s: Some(10.0),
        progress_tokens: Some(32),
        ..Settings::default()
    };
    let c = ServeConfig::resolve(s).unwrap();
    assert_eq!(c.engine.wlvf.max_consecutive_rotations, Some(1));
    assert_eq!(c.engine.wlvf.max_wait_s, Some(10.0));
    assert_eq!(c.engine.config.progress_tokens, 32);
    for bad in [
        Settings {
            max_rotations: Some(0),
            ..Settings::default()
        },
        Settings {
            progress_tokens: Some(0),
            ..Settings::default()
        },
        Settings {
            max_wait_s: Some(-1.0),
            ..Settings::default()
        },
    ] {
        assert!(ServeConfig::resolve(bad).is_err());
    }
}

#[test]
fn edge_limits_have_defaults_and_bad_ones_are_refused() {
    let c = ServeConfig::resolve(Settings::default()).unwrap();
    assert_eq!(c.edge, EdgeConfig::default());
    assert_eq!(c.edge.header_timeout, Duration::from_secs(10));
    let s: Settings = toml::from_str(
        "header_timeout_s = 2.5\nmax_connections = 10\nmax_connections_per_ip = 3\n\
         text_workers = 1\ntext_queue = 0\n",
    )
    .unwrap();
    let c = ServeConfig::resolve(s).unwrap();
    assert_eq!(c.edge.header_timeout, Duration::from_millis(2500));
    assert_eq!(
        (c.edge.max_connections, c.edge.max_connections_per_ip),
        (10, 3)
    );
    assert_eq!(
        c.edge.text_pool,
        crate::text::TextPoolConfig {
            workers: 1,
            queue: 0
        }
    );
    for (bad, want) in [
        ("max_queue = 0", "max_queue must be at least 1"),
        ("header_timeout_s = 0.0", "header_timeout_s must be"),
        (
            "max_connections = 2\nmax_connections_per_ip = 3",
            "must not exceed",
        ),
        ("text_workers = 0", "text_workers must be at least 1"),
        ("max_headers = 5000", "max_headers must be at most"),
    ] {
        let s: Settings = toml::from_str(bad).unwrap();
        let e = ServeConfig::resolve(s).unwrap_err().to_string();
        assert!(e.contains(want), "{bad}: {e}");
    }
}

#[test]
fn serve_help_gives_the_engine_defaults_that_docs_operations_gives() {
    use clap::CommandFactory;
    let mut cmd = crate::cli::Cli::command();
    let help = cmd
        .find_subcommand_mut("serve")
        .expect("a serve command")
        .render_long_help()
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    // One set of defaults: the engine's, whatever runs it (a model on the CPU or GPU, the
    // simulated runner, the twin).
    let d = superinfer_engine::EngineConfig::default();
    assert_eq!(superinfer_engine::serve::EngineOptions::default().config, d);
    assert_eq!(
        ServeConfig::resolve(Settings::default())
            .unwrap()
            .engine
            .config,
        d
    );
    let ops = include_str!("../../../docs/OPERATIONS.md");
    // The rotation budget is automatic unless fixed.
    assert_eq!(d.b_xfer, None);
    assert!(
        help.contains("[default: automatic"),
        "--b-xfer: not automatic in serve --help"
    );
    let row = ops
        .lines()
        .find(|l| l.starts_with("| `--b-xfer`"))
        .expect("a row in docs/OPERATIONS.md");
    assert!(row.contains("| automatic |"), "{row}");
    for (flag, what, value) in [
        (
            "--max-batched-tokens",
            "Token budget per iteration",
            d.max_batched_tokens,
        ),
        (
            "--max-num-seqs",
            "Sequences running at once",
            d.max_num_seqs,
        ),
    ] {
        let at = help
            .find(what)
            .unwrap_or_else(|| panic!("{flag} in serve --help"));
        let text = &help[at..];
        let text = &text[..text.find(']').expect("a [default: …]") + 1];
        assert!(
            text.ends_with(&format!("[default: {value}]")),
            "{flag}: `{text}` in serve --help"
        );
        let row = ops
            .lines()
            .find(|l| l.starts_with(&format!("| `{flag}`")))
            .expect("a row in docs/OPERATIONS.md");
        assert!(row.contains(&format!("| {value} |")), "{row}");
    }
}

#[test]
fn the_prefix_cache_is_on_by_default_and_each_source_can_turn_it_off() {
    use clap::Parser;
    let d = ServeConfig::resolve(Settings::default()).unwrap();
    assert!(d.engine.config.prefix_cache && d.engine.config.prefix_cache_dram);
    let parse = |args: &[&str]| match crate::cli::Cli::try_parse_from(args).unwrap().command {
        crate::cli::Command::Serve(s) => s.settings,
        _ => unreachable!("a serve command"),
    };
    let flags = parse(&["superinfer", "serve", "--no-prefix-cache"]);
    assert_eq!(flags.no_prefix_cache, Some(true));
    let c = ServeConfig::resolve(flags).unwrap();
    assert!(!c.engine.config.prefix_cache);
    let hbm = ServeConfig::resolve(parse(&["superinfer", "serve", "--prefix-cache-hbm-only"]));
    let hbm = hbm.unwrap();
    assert!(hbm.engine.config.prefix_cache && !hbm.engine.config.prefix_cache_dram);
    let file: Settings = toml::from_str("no_prefix_cache = true\n").unwrap();
    assert!(
        !ServeConfig::resolve(file)
            .unwrap()
            .engine
            .config
            .prefix_cache
    );
    let file: Settings = toml::from_str("prefix_cache_hbm_only = true\n").unwrap();
    // A flag given `false` wins over the file.
    let flags = parse(&["superinfer", "serve", "--prefix-cache-hbm-only", "false"]);
    assert!(
        ServeConfig::resolve(flags.or(file))
            .unwrap()
            .engine
            .config
            .prefix_cache_dram
    );
    let both = Settings {
        no_prefix_cache: Some(true),
        prefix_cache_hbm_only: Some(true),
        ..Settings::default()
    };
    let e = ServeConfig::resolve(both).unwrap_err().to_string();
    assert!(e.contains("prefix_cache_hbm_only"), "{e}");
}

#[test]
fn trusted_proxies_and_objectives_come_from_the_file_and_flags() {
    let c = ServeConfig::resolve(Settings::default()).unwrap();
    assert!(c.proxy.trusted.is_empty() && c.proxy.objectives.is_empty());
    let file: Settings = toml::from_str(
        "trusted_proxy = [\"10.0.0.0/8\", \"192.0.2.7\"]\nobjective = [\"critical=500:50\"]\n",
    )
    .unwrap();
    let c = ServeConfig::resolve(file).unwrap();
    assert_eq!(c.proxy.trusted.len(), 2);
    assert!(c.proxy.trusted[0].contains("10.9.8.7".parse().unwrap()));
    assert_eq!(c.proxy.objectives["critical"].ttft_ms, 500);
    assert!(toml::from_str::<Settings>("trusted_proxy = [\"10.0.0.0/40\"]").is_err());
    assert!(toml::from_str::<Settings>("objective = [\"critical=fast\"]").is_err());
    let twice: Settings = toml::from_str("objective = [\"a=1:1\", \"a=2:2\"]").unwrap();
    let e = ServeConfig::resolve(twice).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
}

#[test]
fn the_quota_store_defaults_and_its_checks() {
    let err = |s: Settings| ServeConfig::resolve(s).unwrap_err().to_string();
    assert_eq!(
        ServeConfig::resolve(Settings::default())
            .unwrap()
            .quota_store,
        None
    );
    let file: Settings = toml::from_str(
        "quota_store = \"redis://10.0.0.5:6379/2\"\nquota_store_failure = \"closed\"\n",
    )
    .unwrap();
    let c = ServeConfig::resolve(file).unwrap().quota_store.unwrap();
    assert_eq!(c.url, "redis://10.0.0.5:6379/2");
    assert_eq!(c.failure, FailureMode::Closed);
    assert_eq!(c.timeout, Duration::from_millis(100));
    assert_eq!(c.lease_ttl, Duration::from_secs(30));
    let alone = Settings {
        quota_store_failure: Some(FailureMode::Closed),
        ..Settings::default()
    };
    assert!(err(alone).contains("set quota_store too"));
    let tls = Settings {
        quota_store: Some("rediss://h:6380".into()),
        ..Settings::default()
    };
    assert!(err(tls).contains("redis://host:port"));
    let bad_port = Settings {
        quota_store: Some("redis://h:notaport".into()),
        ..Settings::default()
    };
    assert!(err(bad_port).contains("quota_store"));
    let short_lease = Settings {
        quota_store: Some("redis://h:6379".into()),
        quota_store_timeout_ms: Some(200),
        quota_store_lease_ttl_ms: Some(500),
        ..Settings::default()
    };
    assert!(err(short_lease).contains("at least 4 x"));
    assert!(toml::from_str::<Settings>("quota_store_failure = \"maybe\"").is_err());
}

#[test]
fn the_tool_call_parser_is_named_or_refused() {
    use crate::tools::ToolFormat;
    let with = |name: &str| {
        ServeConfig::resolve(Settings {
            tool_call_parser: Some(name.into()),
            ..Settings::default()
        })
    };
    assert_eq!(
        with("llama3_json").unwrap().engine.tool_call_parser,
        Some(ToolFormat::Llama3Json)
    );
    assert_eq!(
        with("hermes").unwrap().engine.tool_call_parser,
        Some(ToolFormat::Hermes)
    );
    let e = with("xml").unwrap_err().to_string();
    assert!(e.contains("tool_call_parser"), "{e}");
    let d = ServeConfig::resolve(Settings::default()).unwrap();
    assert_eq!(d.engine.tool_call_parser, None);
}
