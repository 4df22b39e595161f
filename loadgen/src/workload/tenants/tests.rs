use super::*;
use crate::workload::file::{load_tenants, parse_tenants};
use std::path::Path;

const EXAMPLE: &str = r#"
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

fn parse(text: &str) -> Result<Vec<TenantSpec>, Error> {
    parse_tenants(text, Path::new("tenants.toml"))
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn the_issue_example_parses() {
    let t = parse(EXAMPLE).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].name, "gold");
    assert_eq!(t[0].weight, 4.0);
    assert_eq!(t[0].dataset, LengthSpec::Sharegpt);
    assert_eq!(
        t[0].arrivals,
        ArrivalSpec::Hawkes {
            baseline_rps: 4.0,
            excitation: 0.5,
            decay_per_s: 2.0
        }
    );
    assert_eq!(t[0].arrivals.mean_rps().unwrap(), 8.0);
    assert_eq!(t[1].dataset, LengthSpec::Lmsys);
    assert_eq!(t[1].arrivals, ArrivalSpec::Poisson { rps: 8.0 });
    assert_eq!(t[1].limits(), LengthLimits::default());
}

#[test]
fn every_documented_form_parses() {
    let text = r#"
[[tenant]]
name = "a"
dataset = { kind = "fixed", prompt = 512, output = 64 }
arrivals = { kind = "gamma", rps = 2.0, cv = 4.0 }
api_key_env = "TENANT_A_KEY"
max_prompt_tokens = 1024
max_output_tokens = 512

[[tenant]]
name = "b"
dataset = { kind = "lognormal", prompt = { mean = 300.0, sigma = 1.1 }, output = { mean = 200.0, sigma = 0.8 } }
arrivals = { kind = "onoff", rps_on = 10.0, on_s = 5.0, off_s = 20.0 }

[[tenant]]
name = "c"
dataset = { kind = "trace", path = "lengths.jsonl" }
arrivals = { kind = "trace", path = "arrivals.jsonl", time_scale = 2.0 }
"#;
    let t = parse(text).unwrap();
    assert_eq!(t[0].weight, 1.0, "weight defaults to 1");
    assert_eq!(
        (t[0].ttft_slo_s, t[0].tbt_slo_s),
        (5.0, 0.1),
        "paper SLOs by default"
    );
    assert_eq!(t[0].max_prompt_tokens, 1024);
    assert_eq!(t[0].api_key_env.as_deref(), Some("TENANT_A_KEY"));
    assert!(matches!(t[1].dataset, LengthSpec::Lognormal { .. }));
    assert!(matches!(t[1].arrivals, ArrivalSpec::OnOff { .. }));
    assert!(matches!(t[2].arrivals, ArrivalSpec::Trace { time_scale, .. } if time_scale == 2.0));
}

#[test]
fn bad_values_name_the_tenant_and_the_field() {
    let cases = [
        (
            EXAMPLE.replace("weight = 4.0", "weight = 0.0"),
            "gold",
            "weight",
        ),
        (
            EXAMPLE.replace("weight = 1.0", "weight = -2.0"),
            "bronze",
            "weight",
        ),
        (
            EXAMPLE.replacen("ttft_slo_s = 5.0", "ttft_slo_s = 0.0", 1),
            "gold",
            "ttft_slo_s",
        ),
        (
            EXAMPLE.replacen("tbt_slo_s = 0.1", "tbt_slo_s = -0.1", 2),
            "gold",
            "tbt_slo_s",
        ),
        (
            EXAMPLE.replace("excitation = 0.5", "excitation = 1.2"),
            "gold",
            "excitation",
        ),
        (EXAMPLE.replace("rps = 8.0", "rps = 0.0"), "bronze", "rps"),
    ];
    for (text, tenant, field) in cases {
        let e = err(&text);
        assert!(
            e.contains(&format!("'{tenant}'")) && e.contains(field),
            "{e}"
        );
    }
}

#[test]
fn duplicate_names_and_empty_files_are_rejected() {
    let e = err(&EXAMPLE.replace("\"bronze\"", "\"gold\""));
    assert!(e.contains("gold") && e.contains("more than once"), "{e}");
    assert!(err("").contains("at least one [[tenant]]"));
    assert!(err("# nothing\n").contains("at least one [[tenant]]"));
}

#[test]
fn syntax_and_schema_errors_point_at_the_file() {
    let e = err("[[tenant]\nname = 1");
    assert!(e.starts_with("tenants.toml"), "{e}");
    let e = err(&EXAMPLE.replace("decay_per_s", "decay"));
    assert!(e.contains("decay"), "{e}");
    let e = err(&EXAMPLE.replace("kind = \"poisson\"", "kind = \"weibull\""));
    assert!(e.contains("weibull") && e.contains("poisson"), "{e}");
    let e = err(&EXAMPLE.replace("\"lmsys\"", "\"alpaca\""));
    assert!(e.contains("alpaca") && e.contains("sharegpt"), "{e}");
    let e = err(&EXAMPLE.replace("weight = 4.0", "weight = 4.0\ncolour = \"gold\""));
    assert!(e.contains("colour"), "{e}");
    let e = err(&EXAMPLE.replace("name = \"gold\"\n", ""));
    assert!(e.contains("name"), "{e}");
}

#[test]
fn api_key_sources_are_exclusive_and_the_key_is_not_printed() {
    let text = EXAMPLE.replace(
        "name = \"gold\"",
        "name = \"gold\"\napi_key = \"sk-secret\"\napi_key_env = \"GOLD_KEY\"",
    );
    let e = err(&text);
    assert!(e.contains("'gold'") && e.contains("api_key"), "{e}");
    let text = EXAMPLE.replace(
        "name = \"gold\"",
        "name = \"gold\"\napi_key = \"sk-secret\"",
    );
    let t = parse(&text).unwrap();
    let debug = format!("{:?}", t[0]);
    assert!(
        !debug.contains("sk-secret") && debug.contains("redacted"),
        "{debug}"
    );
}

#[test]
fn load_resolves_trace_paths_next_to_the_file_and_reports_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.toml");
    let text = r#"
[[tenant]]
name = "t"
dataset = { kind = "trace", path = "lengths.jsonl" }
arrivals = { kind = "trace", path = "/abs/arrivals.jsonl" }
"#;
    std::fs::write(&path, text).unwrap();
    let t = load_tenants(&path).unwrap();
    assert_eq!(
        t[0].dataset,
        LengthSpec::Trace {
            path: dir.path().join("lengths.jsonl")
        }
    );
    assert!(
        matches!(&t[0].arrivals, ArrivalSpec::Trace { path, .. } if path == Path::new("/abs/arrivals.jsonl"))
    );
    let e = load_tenants(&dir.path().join("missing.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.toml"), "{e}");
}

#[test]
fn every_shipped_workload_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let t = load_tenants(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!t.is_empty(), "{}", path.display());
            n += 1;
        }
    }
    assert!(n >= 8, "{n} workload files");
}

#[test]
fn the_sharegpt_chat_workload_has_its_cited_shape() {
    use crate::workload::ConversationSpec;
    use rand::SeedableRng;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/chat-sharegpt-1-2-4.toml");
    let t = load_tenants(&path).unwrap();
    let names: Vec<_> = t.iter().map(|t| (t.name.as_str(), t.weight)).collect();
    assert_eq!(names, [("w1", 1.0), ("w2", 2.0), ("w4", 4.0)]);
    for tenant in &t {
        assert_eq!(tenant.dataset, LengthSpec::Sharegpt);
        assert_eq!(tenant.system_prompt_tokens, 1024);
        assert_eq!(tenant.conversation, Some(ConversationSpec::new(3.51, 30.0)));
    }
    // ShareGPT: 3.51 turns per conversation (ShareChat, Table 1); the geometric shape then has
    // about 71.5 % multi-turn conversations, near CachedAttention's 73 %.
    let spec = t[0].conversation.unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let n = 200_000;
    let turns: Vec<u32> = (0..n).map(|_| spec.sample_turns(&mut rng)).collect();
    let mean = turns.iter().map(|&x| f64::from(x)).sum::<f64>() / f64::from(n);
    let multi = turns.iter().filter(|&&x| x > 1).count() as f64 / f64::from(n);
    assert!((mean - 3.51).abs() < 0.05, "mean turns {mean}");
    assert!((multi - 0.73).abs() < 0.02, "multi-turn share {multi}");
}
