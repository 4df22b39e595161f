//! `superinfer-loadgen http` against a real `superinfer` server: two tenants, each with its own
//! key from the tenants file (one literal, one through `api_key_env`), the same report as
//! `loadgen sim`, and the server's own statistics agree with what the client measured (its
//! GPU time by tenant, from `/metrics`, in the report).

use serde_json::{json, Value};
use std::ffi::OsString;
use std::path::Path;
use superinfer_tests::{TestOptions, TestServer};

/// `superinfer-loadgen http` against `s` for 2 s (20 s of drain), its report in `out`.
fn run_loadgen(s: &TestServer, tenants: &Path, out: &Path, seed: u64) {
    let seed = seed.to_string();
    let argv = [
        "superinfer-loadgen",
        "http",
        "--target",
        &s.base,
        "--tenants",
        tenants.to_str().unwrap(),
        "--duration",
        "2",
        "--drain-s",
        "20",
        "--seed",
        &seed,
        "--no-progress",
        "--bootstrap-resamples",
        "50",
        "--out",
        out.to_str().unwrap(),
    ];
    let code = superinfer_loadgen::cli::run(argv.iter().map(OsString::from));
    assert_eq!(code, std::process::ExitCode::SUCCESS);
}

#[test]
fn the_http_target_drives_a_server_with_per_tenant_keys() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Paced at a real profile, so tokens arrive as a stream with gaps.
    let s = rt.block_on(TestServer::start_with(TestOptions {
        sim_profile: Some("h200-llama-3-8b".into()),
        ..TestOptions::default()
    }));
    let (_, gold) = rt.block_on(s.create_tenant(json!({"name": "gold", "weight": 2.0})));
    let (_, bronze) = rt.block_on(s.create_tenant(json!({"name": "bronze"})));
    std::env::set_var("SUPERINFER_TEST_BRONZE_KEY", &bronze);
    let tenants = s.dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            r#"
[[tenant]]
name = "gold"
weight = 2.0
api_key = "{gold}"
dataset = "fixed:30:12"
arrivals = {{ kind = "poisson", rps = 6.0 }}

[[tenant]]
name = "bronze"
api_key_env = "SUPERINFER_TEST_BRONZE_KEY"
dataset = "fixed:20:8"
arrivals = {{ kind = "poisson", rps = 4.0 }}
"#
        ),
    )
    .unwrap();
    let out = s.dir.path().join("report");
    run_loadgen(&s, &tenants, &out, 3);
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let run = &summary["runs"][0];
    let submitted = run["submitted"].as_u64().unwrap();
    assert!(submitted >= 5, "{run}");
    assert_eq!(run["finished"], submitted, "{run}");
    assert_eq!(run["unserved"], 0);
    assert!(run["ttft_attainment"].as_f64().unwrap() > 0.99, "{run}");
    assert!(
        run["p50_tbt_s"].as_f64().unwrap() > 0.0,
        "gaps are measured: {run}"
    );
    let records = std::fs::read_to_string(out.join("requests.jsonl")).unwrap();
    assert_eq!(records.lines().count() as u64, submitted);
    // The server counted the same requests, on the right tenants.
    let served: u64 = ["gold", "bronze"]
        .iter()
        .map(|t| {
            let (_, v) = rt.block_on(s.admin("GET", &format!("/{t}/stats"), None));
            v["stats"]["sequences_finished"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(served, submitted);
    // The server's GPU time by tenant (its `/metrics`) reaches the report: both ran, and
    // gold (weight 2, more and longer requests) had more of it.
    let shares: Vec<f64> = run["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["gpu_share"].as_f64().expect("a GPU time share"))
        .collect();
    assert!(
        (shares.iter().sum::<f64>() - 1.0).abs() < 1e-9,
        "{shares:?}"
    );
    assert!(shares[0] > shares[1] && shares[1] > 0.0, "{shares:?}");
    assert!(std::fs::read_to_string(out.join("summary.md"))
        .unwrap()
        .contains("GPU time share"));
    rt.block_on(s.shutdown());
}

/// A request the server refuses (here 429: over its tenant's rate) ended at its refusal: its
/// record has the status and the time, so the report's waits are the client's, not the run's.
#[test]
fn a_refused_request_ends_at_its_refusal() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s = rt.block_on(TestServer::start());
    let (_, key) = rt.block_on(
        s.create_tenant(json!({"name": "capped", "quotas": {"requests_per_s": 0.1, "burst": 1}})),
    );
    let tenants = s.dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[[tenant]]\nname = \"capped\"\napi_key = \"{key}\"\ndataset = \"fixed:20:8\"\n\
             arrivals = {{ kind = \"poisson\", rps = 10.0 }}\n"
        ),
    )
    .unwrap();
    let out = s.dir.path().join("report");
    run_loadgen(&s, &tenants, &out, 5);
    let records: Vec<Value> = std::fs::read_to_string(out.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let refused: Vec<&Value> = records.iter().filter(|r| r["refused"] == 429).collect();
    assert!(refused.len() >= 5, "{records:?}");
    for r in refused {
        let waited =
            r["finish_s"].as_f64().expect("a finish time") - r["arrival_s"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&waited), "{r}");
    }
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let max_wait = summary["runs"][0]["max_wait_s"].as_f64().unwrap();
    assert!(max_wait < 1.0, "{}", summary["runs"][0]);
    rt.block_on(s.shutdown());
}
