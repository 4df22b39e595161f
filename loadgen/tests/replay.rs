//! Trace replay end to end in the twin: every row sent in order at its time, prefix blocks
//! shared exactly as the trace's ids share them, and rows the target cannot take reported.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/traces")
        .join(name)
}

/// Runs `sim` with `args` (and a small node) and returns the summary's first run.
fn sim(dir: &Path, args: &[&str]) -> (Value, Vec<Value>) {
    let out = dir.join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_superinfer-loadgen"))
        .args(["sim", "--profile", "h200-llama-3-8b", "--policies", "wlvf"])
        .args([
            "--hbm-kv-gb",
            "2",
            "--no-progress",
            "--bootstrap-resamples",
            "10",
        ])
        .arg("--out")
        .arg(&out)
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let records = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".jsonl"))
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    (summary["runs"][0].clone(), records)
}

#[test]
fn every_row_is_sent_in_order_at_its_time() {
    let dir = tempfile::tempdir().unwrap();
    // 40 rows, 0.25 s apart, lengths from the row number; two share a timestamp.
    let mut text = String::new();
    let mut want = Vec::new();
    for i in 0..40u32 {
        let t = if i == 7 { 1.5 } else { f64::from(i) * 0.25 };
        text += &format!(
            "{{\"arrival_s\": {t}, \"prompt_tokens\": {}, \"output_tokens\": {}}}\n",
            100 + i,
            1 + i % 5
        );
        want.push((t, 100 + i, 1 + i % 5));
    }
    want.sort_by(|a, b| a.0.total_cmp(&b.0));
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, text).unwrap();
    let (run, mut records) = sim(dir.path(), &["--trace", path.to_str().unwrap()]);
    records.sort_by_key(|r| r["id"].as_u64());
    assert_eq!(run["submitted"], 40);
    assert_eq!(run["finished"], 40);
    let got: Vec<(f64, u32, u32)> = records
        .iter()
        .map(|r| {
            (
                r["arrival_s"].as_f64().unwrap(),
                r["prompt_tokens"].as_u64().unwrap() as u32,
                r["generated_tokens"].as_u64().unwrap() as u32,
            )
        })
        .collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g.0 - w.0).abs() < 1e-6 && g.1 == w.1 && g.2 == w.2,
            "{g:?} vs {w:?}"
        );
    }
}

#[test]
fn rows_sharing_k_leading_ids_share_k_blocks_in_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.jsonl");
    // Row 2 shares two leading ids with row 1 (k = 2), row 3 none.
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 1536, \"output_length\": 4, \"hash_ids\": [10, 11, 12]}\n\
         {\"timestamp\": 5000, \"input_length\": 1600, \"output_length\": 4, \"hash_ids\": [10, 11, 13, 14]}\n\
         {\"timestamp\": 9000, \"input_length\": 1536, \"output_length\": 4, \"hash_ids\": [20, 11, 12]}\n",
    )
    .unwrap();
    let (run, mut records) = sim(dir.path(), &["--trace", path.to_str().unwrap()]);
    records.sort_by_key(|r| r["id"].as_u64());
    let cached: Vec<u64> = records
        .iter()
        .map(|r| r["cached_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(cached, [0, 2 * 512, 0]);
    let replay = &run["replay"];
    assert_eq!(replay["ideal"]["infinite_tokens"], 1024);
    assert_eq!(replay["ideal"]["bounded_tokens"], 1024);
    assert!(replay["trace"]["sha256"].as_str().unwrap().len() == 64);
}

#[test]
fn a_row_above_the_cap_is_reported_not_clipped() {
    let dir = tempfile::tempdir().unwrap();
    let trace = fixture("azure-2024.csv");
    let (run, records) = sim(
        dir.path(),
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--max-prompt-tokens",
            "3000",
        ],
    );
    assert_eq!(run["submitted"], 1);
    assert_eq!(records[0]["prompt_tokens"], 2048);
    let t = &run["replay"]["trace"];
    assert_eq!(
        (t["over_cap"].as_u64(), t["longest_over_cap"].as_u64()),
        (Some(1), Some(4096))
    );
    let md = std::fs::read_to_string(dir.path().join("out/summary.md")).unwrap();
    assert!(
        md.contains("1 rows above the prompt cap (3000 tokens; longest 4096)"),
        "{md}"
    );
    // The twin's own cap: its HBM tier (2 GB of Llama-3-8B KV: 15,258 tokens) takes both.
    let (run, _) = sim(dir.path(), &["--trace", trace.to_str().unwrap()]);
    assert_eq!(run["submitted"], 2);
}

#[test]
fn replay_flags_without_a_trace_and_synthetic_flags_with_one_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_superinfer-loadgen"))
            .args(["sim", "--no-progress", "--out", out.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap()
    };
    let trace = fixture("azure-2024.csv");
    let trace = trace.to_str().unwrap();
    for (args, want) in [
        (
            &["--rps", "5", "--rate-scale", "2"][..],
            "--rate-scale needs a trace",
        ),
        (&["--trace", trace, "--rps", "5"][..], "use --rate-scale"),
        (
            &["--trace", trace, "--turns", "3"][..],
            "--turns does not apply",
        ),
        (&["--trace", trace, "--assign", "bogus"][..], "round-robin"),
        (
            &["--trace", trace, "--duration", "30"][..],
            "use --trace-duration-s",
        ),
        (
            &["--trace", trace, "--dataset", "lmsys"][..],
            "--dataset set the single default tenant",
        ),
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn the_shipped_replays_read_their_whole_traces() {
    use superinfer_loadgen::workload::prefix_ideal::ideal_hits;
    use superinfer_loadgen::workload::{load_workload, replay};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/replay");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let w = load_workload(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let spec = w.replay.expect("a replay workload");
        let file = spec.read(Path::new("")).unwrap();
        let r = replay::build(&spec, &file, &w.tenants, 1.0, None).unwrap();
        let ideal = ideal_hits(&r.requests, 16, None);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        seen.push((name, r.requests.len(), ideal.infinite_rate()));
        // Every tenant without load of its own gets rows.
        for t in (0..w.tenants.len()).filter(|&t| w.tenants[t].arrivals.is_replay()) {
            assert!(
                r.requests.iter().any(|q| q.tenant == t),
                "{}",
                path.display()
            );
        }
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    let at = |name: &str| seen.iter().find(|s| s.0 == name).expect(name).clone();
    // Azure's conversation trace: every row, no shared content.
    let azure = at("azure-conv-1-2-4.toml");
    assert_eq!((azure.1, azure.2), (19_366, 0.0), "{seen:?}");
    // Mooncake's synthetic trace: every row; about 65% of prompt blocks are reusable with an
    // infinite cache (its publishers' figure, in 512-token blocks; here in 16-token blocks).
    // Its other workloads replay the same rows (to one tenant, beside others' own load).
    for name in [
        "mooncake-1-2-4.toml",
        "mooncake-alone.toml",
        "mooncake-beside-chat.toml",
        "mooncake-beside-chat-backlogged.toml",
    ] {
        let m = at(name);
        assert_eq!(m.1, 3_993, "{seen:?}");
        assert!((0.60..0.70).contains(&m.2), "{seen:?}");
    }
    // The Azure flood: the steady tenants share every row, the flood replays eight copies of
    // the whole trace in the same time (wrapping at its end).
    let flood = at("azure-conv-flood.toml");
    assert_eq!((flood.1, flood.2), (9 * 19_366, 0.0), "{seen:?}");
    assert_eq!(seen.len(), 6, "{seen:?}");
}
