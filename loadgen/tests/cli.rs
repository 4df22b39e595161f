//! The binary as the automated checks run it: exit statuses and the output files.

use std::path::Path;
use std::process::{Command, Output};

fn loadgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_superinfer-loadgen"))
        .arg("sim")
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--policies", "fcfs,lifo", "--rps", "5"],
            "unknown policy 'lifo'",
        ),
        (&["--rps", "5,ten"], "'ten' is not a number"),
        (&["--tenants", "/nonexistent/t.toml"], "/nonexistent/t.toml"),
        (&[], "--rps is required"),
        (&["--rps", "5", "--policies", "lvf,lvf"], "twice"),
    ];
    for (args, want) in cases {
        let mut argv = vec!["--out", out, "--no-progress"];
        argv.extend_from_slice(args);
        let o = loadgen(&argv);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn an_invalid_tenants_file_exits_2_naming_tenant_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.toml");
    let text = "[[tenant]]\nname = \"gold\"\nweight = -1.0\ndataset = \"sharegpt\"\n\
                arrivals = { kind = \"poisson\", rps = 1.0 }\n";
    std::fs::write(&path, text).unwrap();
    let o = loadgen(&["--tenants", path.to_str().unwrap(), "--out", "/tmp/unused"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("'gold'") && stderr(&o).contains("weight"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_small_sweep_writes_the_checked_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = loadgen(&[
        "--profile",
        "gh200-qwen2.5-32b",
        "--dataset",
        "sharegpt",
        "--policies",
        "fcfs,lvf",
        "--rps",
        "1,2",
        "--duration",
        "5",
        "--seed",
        "42",
        "--out",
        out.to_str().unwrap(),
        "--no-progress",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for f in [
        "summary.json",
        "summary.md",
        "requests.jsonl",
        "attainment_vs_rps.svg",
        "ttft_cdf.svg",
    ] {
        assert!(Path::new(&out).join(f).is_file(), "{f}");
    }
    let text = std::fs::read_to_string(out.join("summary.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for r in runs {
        for k in [
            "ttft_attainment",
            "tbt_attainment",
            "p99_ttft_s",
            "p99_tbt_s",
            "throughput_tokens_per_s",
            "jain",
            "max_wait_s",
            "rps",
        ] {
            assert!(r[k].is_number(), "{k}");
        }
        let a = r["ttft_attainment"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&a));
        let t = &r["tenants"][0];
        assert_eq!(t["name"], "default");
        for k in [
            "weight",
            "ttft_attainment",
            "tbt_attainment",
            "served_tokens",
            "share",
        ] {
            assert!(t[k].is_number(), "tenant {k}");
        }
    }
}

#[test]
fn the_example_workloads_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
    let mut loaded = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        // Workload files; folders beside them hold their traces.
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        loaded += 1;
        let tenants = superinfer_loadgen::workload::load_tenants(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let reqs = superinfer_loadgen::generate(&tenants, 60.0, 1).unwrap();
        assert!(!reqs.is_empty(), "{}", path.display());
    }
    assert!(loaded >= 6, "only {loaded} workload files");
}
