//! `scripts/fit_steps.py` against a step trace of the twin itself: its port of the twin's step
//! time (`SimRunner::step_time`) must put every traced step at the runner's time, so that on a
//! GPU's trace what it reports is the GPU's difference, not the script's.

use std::process::Command;
use superinfer_engine::profile::Profile;
use superinfer_engine::sim::sim_engine_with;
use superinfer_engine::{EngineConfig, EngineRequest};
use superinfer_policies::{PolicyKind, RequestId, Slo, TenantId, WlvfConfig};

const PROFILE: &str = "h100-llama-3.1-8b";

#[test]
fn the_fit_script_reads_the_twins_own_trace_as_the_twin() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("steps.jsonl");
    let cfg = EngineConfig {
        hbm_blocks: 25_000,
        dram_blocks: 50_000,
        b_xfer: Some(512),
        step_tbt_share: Some(0.8),
        // Chunks of up to 16,384 tokens: the first steps' (no decode yet) run the wide kernel.
        max_batched_tokens: 16_384,
        step_trace: Some(trace.clone()),
        ..EngineConfig::default()
    };
    let policy = PolicyKind::Wlvf.build(&WlvfConfig::default());
    let mut e = sim_engine_with(Profile::builtin(PROFILE).unwrap(), cfg, policy).unwrap();
    // Long prompts (chunked, deep attention), short chats beside them (mixed and decode-only
    // steps, CUDA-graph sizes and past them).
    let mut id = 0u64;
    let mut submit = |e: &mut superinfer_engine::sim::SimEngine, prompt: u32, out: u32| {
        id += 1;
        let mut r = EngineRequest::new(
            RequestId(id),
            TenantId((id % 2) as u32),
            (0..prompt).map(|i| (id as u32) * 100_000 + i).collect(),
            out,
        );
        r.ignore_eos = true;
        r.slo = Slo {
            ttft_s: 30.0,
            tbt_s: 0.1,
        };
        e.submit(r).unwrap();
    };
    for _ in 0..3 {
        submit(&mut e, 40_000, 30);
    }
    for _ in 0..150 {
        submit(&mut e, 300, 40);
    }
    for _ in 0..200_000 {
        if e.is_empty() {
            break;
        }
        let r = e.step().unwrap();
        if let Some(t) = r.idle_until.filter(|_| !r.ran) {
            use superinfer_engine::clock::Clock;
            e.clock_mut().skip_to(t);
        }
        e.take_events();
    }
    assert!(e.is_empty(), "every request finished");
    drop(e);
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new("python3")
        .arg(format!("{root}/scripts/fit_steps.py"))
        .arg(&trace)
        .args(["--profile", PROFILE])
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every kind of step at the twin's time.
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| decode") || l.starts_with("| mixed"))
        .collect();
    assert!(rows.len() >= 2, "{text}");
    for row in &rows {
        let ratio = row.split('|').nth(4).unwrap().trim();
        assert_eq!(ratio, "1.00, 1.00", "{row}");
    }
    // And the fit of the runner's time: each term at 1.
    let fit = text
        .lines()
        .find(|l| l.starts_with("elapsed_s"))
        .unwrap_or_else(|| panic!("{text}"));
    for term in ["fixed", "kv", "gemm", "attention"] {
        assert!(fit.contains(&format!("1.00·{term}")), "{term}: {fit}");
    }
}
