//! Mixed steps (prompt chunks beside decodes, what a served step under load is) against the
//! twin's step model for the same spans (`SimRunner::step_time`, profile `h200-MODEL`):
//! the data a calibration of the twin's prefill needs (docs/BENCHMARKS.md at commit c02d485,
//! "A prefill fit, tried and not kept": a fit to single chunks did not carry over to served
//! traffic).

use candle_core::Device;
use superinfer_engine::profile::Profile;
use superinfer_engine::runner::gpu::GpuRunner;
use superinfer_engine::runner::sim::SimRunner;
use superinfer_engine::runner::{BatchEntry, ModelRunner, StepBatch};
use superinfer_engine::SamplingParams;
use superinfer_policies::RequestId;

/// Decode contexts of the section (tokens of KV per decoding sequence).
const CONTEXT: u32 = 513;

pub fn run(runner: &mut GpuRunner, dev: &Device, model: &str, iters: usize) {
    let name = format!("h200-{model}");
    let Ok(profile) = Profile::builtin(&name) else {
        println!("\n(mixed steps skipped: the twin has no profile {name})");
        return;
    };
    let twin = SimRunner::new(profile, 16);
    let greedy = SamplingParams::default();
    let arena = runner.arena().num_blocks() as usize;
    println!("\n## mixed steps against the twin's {name} (eager forward, greedy sampling)");
    println!("Prompt chunks start at position 0; decodes have {CONTEXT} tokens of context.");
    println!("| prompt chunks x tokens | decodes | ms | twin ms | twin / measured |");
    println!("| --- | --- | --- | --- | --- |");
    for (k, p) in [
        (1usize, 128usize),
        (4, 128),
        (16, 128),
        (1, 512),
        (4, 512),
        (1, 2048),
    ] {
        for d in [0usize, 32, 64] {
            let chunk_blocks = p.div_ceil(16);
            let dec_blocks = (CONTEXT as usize).div_ceil(16);
            if k * chunk_blocks + d * dec_blocks > arena {
                continue;
            }
            // Decodes take the first blocks, chunks the ones after: no two rows share a block.
            let dec = super::seqs(d, CONTEXT as usize, 0);
            let pre = super::seqs(k, p, (d * dec_blocks) as u32);
            let entries: Vec<BatchEntry<'_>> = pre
                .iter()
                .map(|q| (q, 0u32, p as u32))
                .chain(dec.iter().map(|q| (q, CONTEXT - 1, CONTEXT)))
                .enumerate()
                .map(|(i, (q, pos, end))| BatchEntry {
                    id: RequestId(i as u64),
                    tokens: &q.tokens,
                    prompt_len: q.tokens.len() as u32,
                    pos,
                    end,
                    blocks: &q.blocks,
                    sample: true,
                    sampling: &greedy,
                    mask: None,
                })
                .collect();
            let step = StepBatch { entries };
            let t = super::time(iters, dev, || {
                runner.step(&step).expect("mixed step");
            });
            let modelled = twin.step_time(step.entries.iter().map(|e| (e.pos, e.end)));
            println!(
                "| {k} x {p} | {d} | {:.2} | {:.2} | {:.2} |",
                t * 1e3,
                modelled * 1e3,
                modelled / t
            );
        }
    }
}
