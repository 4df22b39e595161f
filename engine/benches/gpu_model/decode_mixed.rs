//! Decode steps with mixed contexts, as served ShareGPT traffic has them (one step's sequences
//! hold 100-2,000 tokens of context): the eager forward against the decode buckets, launched
//! directly and replayed from graphs, and the graphs with the first design's splits (each
//! sequence's keys in the step's power-of-two split count, which served steps ran 6% slower
//! than eager ones: docs/BENCHMARKS.md). Uniform contexts (the decode table above) hide it.

use candle_core::Device;
use superinfer_engine::model::gpu_llama::DEFAULT_DECODE_BUCKETS;
use superinfer_engine::runner::gpu::GpuRunner;
use superinfer_engine::runner::{BatchEntry, ModelRunner, StepBatch};
use superinfer_engine::SamplingParams;
use superinfer_kernels::attention_plan::decode_split;
use superinfer_kernels::cuda::DecodeKernel;
use superinfer_policies::RequestId;

/// Tokens of context of the section's sequences (48 values from 104 to 1,998, median ~600,
/// in a fixed interleaved order so the first 32 are mixed too).
const CONTEXTS: [usize; 48] = [
    104, 799, 329, 1306, 540, 131, 836, 349, 1379, 564, 158, 875, 369, 1457, 589, 182, 917, 389,
    1541, 615, 205, 962, 409, 1631, 642, 226, 1010, 430, 1727, 670, 247, 1061, 451, 1830, 700, 268,
    1116, 472, 1940, 731, 289, 1175, 494, 1998, 764, 309, 1238, 517,
];

/// KV blocks of 16 tokens the section uses (from block 0).
pub fn blocks() -> usize {
    CONTEXTS.iter().map(|c| (c + 1).div_ceil(16)).sum()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Launch {
    Eager,
    Direct,
    Graph,
    /// Graph replay with each sequence's keys in the split count (before the fix).
    GraphEqualSplits,
}

/// Attention CTAs that hold keys per layer and KV head: with keys per split `part`, and with
/// each context in `splits` equal parts (multiples of 32 keys, as `cu/decode.cu`).
fn ctas(ctx: &[usize], part: u32, splits: u32) -> (u32, u32) {
    let own: u32 = ctx.iter().map(|&c| (c as u32 + 1).div_ceil(part)).sum();
    let equal: u32 = ctx
        .iter()
        .map(|&c| {
            let keys = c as u32 + 1;
            keys.div_ceil(keys.div_ceil(splits).next_multiple_of(32).max(32))
        })
        .sum();
    (own, equal)
}

pub fn run(runner: &mut GpuRunner, dev: &Device, iters: usize, kv_heads: u32) {
    let greedy = SamplingParams::default();
    let mut first = 0u32;
    let data: Vec<super::Seq> = CONTEXTS
        .iter()
        .map(|&c| {
            let s = super::seqs(1, c + 1, first).pop().expect("one sequence");
            first += (c + 1).div_ceil(16) as u32;
            s
        })
        .collect();
    println!("\n## decode steps with mixed contexts (ShareGPT-like, greedy sampling on the GPU)");
    println!("Contexts from a fixed list of 104-1,998 tokens; cuBLAS matmuls, one-pass attention.");
    println!("Graph (equal splits): each sequence's keys in the step's split count (the first");
    println!(
        "design); eager, direct and graph: the eager plan's keys per split for every sequence."
    );
    println!("| rows | longest / median context | keys per split (eager), splits (eager, graph) | attention CTAs with keys per KV head (eager parts / equal parts) | launch | ms/step | vs eager |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    runner.model_mut().set_gemv_max_rows(0);
    runner
        .model()
        .kernels()
        .set_decode_kernel(DecodeKernel::OnePass);
    for rows in [48usize, 32] {
        let s = &data[..rows];
        let ctx: Vec<usize> = CONTEXTS[..rows].to_vec();
        let mut sorted = ctx.clone();
        sorted.sort_unstable();
        let longest = *sorted.last().expect("rows") as u32 + 1;
        let (part, splits) = decode_split(rows as u32, kv_heads, longest);
        let graph_splits = splits.next_power_of_two();
        let (own, equal) = ctas(&ctx, part, graph_splits);
        let step = StepBatch {
            entries: s
                .iter()
                .enumerate()
                .map(|(i, q)| BatchEntry {
                    id: RequestId(i as u64),
                    tokens: &q.tokens,
                    prompt_len: q.tokens.len() as u32,
                    pos: q.tokens.len() as u32 - 1,
                    end: q.tokens.len() as u32,
                    blocks: &q.blocks,
                    sample: true,
                    sampling: &greedy,
                    mask: None,
                })
                .collect(),
        };
        let mut eager = None;
        for launch in [
            Launch::Eager,
            Launch::Direct,
            Launch::Graph,
            Launch::GraphEqualSplits,
        ] {
            let m = runner.model_mut();
            m.set_decode_equal_splits(launch == Launch::GraphEqualSplits);
            match launch {
                Launch::Eager => m.set_decode_buckets(&[], false),
                Launch::Direct => m.set_decode_buckets(&DEFAULT_DECODE_BUCKETS, false),
                _ => m.set_decode_buckets(&DEFAULT_DECODE_BUCKETS, true),
            }
            if launch != Launch::Eager {
                assert!(
                    runner.decode_logits(&step).expect("decode").is_some(),
                    "{rows} rows not taken by the decode buckets"
                );
            }
            let t = super::time(iters, dev, || {
                runner.step(&step).expect("decode step");
            });
            let base = *eager.get_or_insert(t);
            println!(
                "| {rows} | {longest} / {} | {part}, ({splits}, {graph_splits}) | {own} / {equal} | {launch:?} | {:.2} | {:+.1}% |",
                sorted[rows / 2] + 1,
                t * 1e3,
                100.0 * (t / base - 1.0)
            );
        }
    }
    runner.model_mut().set_decode_equal_splits(false);
}
