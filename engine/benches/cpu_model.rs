//! CPU model path throughput: prefill and decode tokens per second of the candle runner
//! (paged attention over the block-first arena, host sampling) for the embedded tiny model
//! and a ~100M-parameter Llama-shaped random model.
//!
//! `cargo bench -p superinfer-engine --bench cpu_model` (add `-- quick` for fewer repeats, or
//! `-- tiny` / `-- llama-100m` for one model).
//! Results go in docs/BENCHMARKS.md, section "CPU model path".

use std::time::{Duration, Instant};
use superinfer_engine::kv::{BlockState, HbmBlock, LogicalBlock};
use superinfer_engine::model::tiny::{write_random_llama, RandomLlama};
use superinfer_engine::runner::cpu::{CpuRunner, CpuRunnerConfig};
use superinfer_engine::runner::{BatchEntry, ModelRunner, StepBatch};
use superinfer_engine::SamplingParams;
use superinfer_policies::RequestId;

const BS: u32 = 16;

fn table(first: u32, n: u32) -> Vec<LogicalBlock> {
    (first..first + n)
        .map(|b| LogicalBlock {
            hbm: Some(HbmBlock(b)),
            dram: None,
            state: BlockState::Dirty,
            inflight: None,
            entry: None,
        })
        .collect()
}

/// Runs `f` until `min` has passed (at least `reps` times); seconds per call.
fn time(reps: u32, min: Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let start = Instant::now();
    let mut n = 0;
    while n < reps || start.elapsed() < min {
        f();
        n += 1;
    }
    start.elapsed().as_secs_f64() / f64::from(n)
}

fn bench(name: &str, spec: &RandomLlama, quick: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    write_random_llama(dir.path(), spec, 0).expect("write the model");
    let max_seqs = 32u32;
    let ctx = 512u32;
    let blocks_per_seq = (ctx + 64).div_ceil(BS);
    let mut runner = CpuRunner::load(
        dir.path(),
        &CpuRunnerConfig {
            block_size: BS,
            hbm_blocks: max_seqs * blocks_per_seq,
            seed: Some(0),
            ..CpuRunnerConfig::default()
        },
    )
    .expect("load");
    let params_m = spec.params() as f64 / 1e6;
    let sp = SamplingParams::default();
    let (reps, min) = if quick {
        (2, Duration::from_millis(300))
    } else {
        (5, Duration::from_secs(2))
    };
    let seqs: Vec<Vec<u32>> = (0..max_seqs)
        .map(|s| {
            (0..ctx + 64)
                .map(|i| (s * 31 + i * 7) % 2000 + 10)
                .collect()
        })
        .collect();
    let tables: Vec<Vec<LogicalBlock>> = (0..max_seqs)
        .map(|s| table(s * blocks_per_seq, blocks_per_seq))
        .collect();
    println!("## {name} ({params_m:.1} M parameters)");
    for prompt in [128u32, 512] {
        let t = time(reps, min, || {
            let e = BatchEntry {
                id: RequestId(0),
                tokens: &seqs[0][..prompt as usize],
                prompt_len: prompt,
                pos: 0,
                end: prompt,
                blocks: &tables[0],
                sample: true,
                sampling: &sp,
                mask: None,
            };
            runner
                .step(&StepBatch { entries: vec![e] })
                .expect("prefill");
        });
        println!(
            "prefill {prompt:>4} tokens: {:>8.1} ms/step  {:>9.0} tokens/s",
            t * 1e3,
            f64::from(prompt) / t
        );
    }
    // Fill every sequence's cache to `ctx` once, then decode at that context length.
    for s in 0..max_seqs as usize {
        let e = BatchEntry {
            id: RequestId(s as u64),
            tokens: &seqs[s][..ctx as usize],
            prompt_len: ctx,
            pos: 0,
            end: ctx,
            blocks: &tables[s],
            sample: false,
            sampling: &sp,
            mask: None,
        };
        runner.step(&StepBatch { entries: vec![e] }).expect("fill");
    }
    for batch in [1usize, 8, 32] {
        let t = time(reps * 4, min, || {
            let entries = (0..batch)
                .map(|s| BatchEntry {
                    id: RequestId(s as u64),
                    tokens: &seqs[s][..ctx as usize + 1],
                    prompt_len: ctx,
                    pos: ctx,
                    end: ctx + 1,
                    blocks: &tables[s],
                    sample: true,
                    sampling: &sp,
                    mask: None,
                })
                .collect();
            runner.step(&StepBatch { entries }).expect("decode");
        });
        println!(
            "decode batch {batch:>2} @ctx {ctx}: {:>8.1} ms/step  {:>9.0} tokens/s",
            t * 1e3,
            batch as f64 / t
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; anything else named "quick" shortens the runs.
    let quick = std::env::args().any(|a| a == "quick");
    superinfer_engine::serve::pin_cpu_threads(None);
    println!(
        "threads: {}",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_default()
    );
    // A model name ("tiny", "llama-100m") runs only that model.
    let only: Vec<String> = std::env::args()
        .filter(|a| !a.starts_with('-'))
        .skip(1)
        .collect();
    let wanted = |name: &str| only.iter().all(|a| a == "quick") || only.iter().any(|a| a == name);
    if wanted("tiny") {
        bench("tiny", &RandomLlama::TINY, quick);
    }
    if wanted("llama-100m") {
        bench("llama-100m", &RandomLlama::SMALL_100M, quick);
    }
}
