//! The `long` section: the long-context regime (32k–128k tokens of KV per sequence), with the
//! engine's default settings (decode buckets and graphs, tensor-core decode attention, prompts
//! prefilled in chunks of the default `max_batched_tokens`).
//!
//! - decode steps at each `--long-contexts` × `--batches` case that fits the GPU's free memory
//!   (a context of c: c keys read, the new token at position c - 1),
//!   against the memory roofline (weights + KV read once), with the twin's step time
//!   (`--twin-profile`) beside each;
//! - decode attention alone, one layer, 20 launches back to back, at each case (a case too
//!   large for the whole model's KV still fits one layer's: the arena read as one-layer blocks);
//! - a prompt of each `--long-prefills` length prefilled in the engine's chunks, against the
//!   bf16 GEMM rate (`--gemm-tflops`), with the last chunk's attention alone beside it.
//!
//! A case that does not fit says so with the bytes it needs; it is not shrunk.

use candle_core::{DType, Device, Tensor};
use std::time::Instant;
use superinfer_engine::engine::EngineConfig;
use superinfer_engine::model::gpu_llama::GpuLlama;
use superinfer_engine::profile::Profile;
use superinfer_engine::runner::gpu::GpuRunner;
use superinfer_engine::runner::sim::SimRunner;
use superinfer_engine::runner::{BatchEntry, ModelRunner, StepBatch};
use superinfer_engine::SamplingParams;
use superinfer_kernels::attention_plan::{AttentionPlan, AttentionShape, SeqSpan};
use superinfer_policies::RequestId;

/// Bytes kept free beside the KV arena for activations, cuBLAS' workspace and the graphs.
const HEADROOM: f64 = 6.0 * (1u64 << 30) as f64;

pub struct LongArgs<'a> {
    pub contexts: &'a [usize],
    pub batches: &'a [usize],
    pub prefills: &'a [usize],
    pub iters: usize,
    pub hbm_tbs: f64,
    pub gemm_tflops: f64,
    pub twin_profile: &'a str,
}

/// Median seconds of `f` over `iters` runs after one warm-up (long runs: a few iterations).
fn time_few(iters: usize, dev: &Device, mut f: impl FnMut()) -> f64 {
    f();
    dev.synchronize().unwrap();
    let t: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            dev.synchronize().unwrap();
            s.elapsed().as_secs_f64()
        })
        .collect();
    super::median(t)
}

fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

pub fn run(model: GpuLlama, dev: &Device, a: &LongArgs<'_>) {
    let cfg = model.config().clone();
    let weights = model.weight_bytes() as f64;
    let kv_per_token = (2 * cfg.num_layers * cfg.kv_width() * 2) as f64;
    let block = 16usize;
    let block_bytes = kv_per_token * block as f64;
    let (free, total) = model.gpu().mem_info().expect("cuMemGetInfo");
    let room = free as f64 - HEADROOM;
    println!(
        "\n## long context (max position {}): {:.1} GiB free of {:.1} GiB after the weights, \
         {:.0} KiB of KV a token",
        cfg.max_position_embeddings,
        gib(free as f64),
        gib(total as f64),
        kv_per_token / 1024.0
    );
    // Blocks of `n` sequences of `tokens` each (each its own blocks).
    let blocks_of = |n: usize, tokens: usize| n * tokens.div_ceil(block);
    let fits = |n: usize, tokens: usize| blocks_of(n, tokens) as f64 * block_bytes <= room;
    let decode_cases: Vec<(usize, usize)> = a
        .contexts
        .iter()
        .flat_map(|&c| a.batches.iter().map(move |&b| (c, b)))
        .collect();
    let chunk = EngineConfig::default().max_batched_tokens as usize;
    let blocks = decode_cases
        .iter()
        .map(|&(c, b)| (b, c))
        .chain(a.prefills.iter().map(|&n| (1, n)))
        .filter(|&(b, t)| fits(b, t))
        .map(|(b, t)| blocks_of(b, t))
        .max()
        .unwrap_or(0)
        // One layer's blocks of the largest case (the attention-alone rows) must fit too.
        .max(
            decode_cases
                .iter()
                .map(|&(c, b)| blocks_of(b, c).div_ceil(cfg.num_layers))
                .max()
                .unwrap_or(0),
        );
    println!(
        "KV arena: {blocks} blocks of {block} tokens ({:.1} GiB)",
        gib(blocks as f64 * block_bytes)
    );
    let twin = Profile::builtin(a.twin_profile)
        .map(|p| SimRunner::new(p, block as u32))
        .map_err(|e| println!("(no twin column: {e})"))
        .ok();
    let mut runner = GpuRunner::new(model, block as u32, blocks as u32, Some(0)).unwrap();
    let greedy = SamplingParams::default();
    let shape = AttentionShape {
        num_heads: cfg.num_heads as u32,
        kv_heads: cfg.num_kv_heads as u32,
        head_dim: cfg.head_dim as u32,
        num_layers: cfg.num_layers as u32,
        block_size: block as u32,
        window: 0,
    };
    let one_layer = AttentionShape {
        num_layers: 1,
        ..shape
    };

    println!(
        "\n### decode steps (greedy sampling on the GPU; roofline: weights + KV at {} TB/s)",
        a.hbm_tbs
    );
    println!("| context | batch | launch | ms/step | roofline ms | x roofline | tokens/s | twin ms ({}) | twin / measured |", a.twin_profile);
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for &(ctx, b) in &decode_cases {
        let kv = b as f64 * ctx as f64 * kv_per_token;
        let roof = (weights + kv) / (a.hbm_tbs * 1e12);
        if !fits(b, ctx) {
            println!(
                "| {ctx} | {b} | does not fit: {:.1} GiB of KV, {:.1} GiB free for it | — | {:.2} | — | — | — | — |",
                gib(kv),
                gib(room),
                roof * 1e3
            );
            continue;
        }
        // `ctx` keys read: the new token's at position ctx - 1 (the last the model has).
        let s = super::seqs(b, ctx, 0);
        let step = super::batch(&s, ctx - 1, &greedy);
        let launch = match runner.decode_logits(&step).expect("decode") {
            Some(_) => "graph",
            None => "eager",
        };
        let t = time_few(a.iters, dev, || {
            runner.step(&step).expect("decode step");
        });
        let (twin_ms, ratio) = match &twin {
            Some(tw) => {
                let m = tw.step_time(step.entries.iter().map(|e| (e.pos, e.end)));
                (format!("{:.2}", m * 1e3), format!("{:.2}", m / t))
            }
            None => ("—".into(), "—".into()),
        };
        println!(
            "| {ctx} | {b} | {launch} | {:.2} | {:.2} | {:.2} | {:.0} | {twin_ms} | {ratio} |",
            t * 1e3,
            roof * 1e3,
            t / roof,
            b as f64 / t
        );
    }

    println!("\n### decode attention alone (one layer, 20 launches back to back, one synchronize)");
    println!(
        "| context | batch | arena | splits × keys | us | GB/s of KV | % of {} TB/s |",
        a.hbm_tbs
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let arena = runner.arena().rows().clone();
    let qw = cfg.q_width();
    for &(ctx, b) in &decode_cases {
        let k = runner.model().kernels();
        let keys = ctx;
        // The whole model's layout when its KV fits, else one layer's blocks (64 KiB apart
        // instead of a whole block's stride).
        let (sh, layout) = if fits(b, keys) {
            (&shape, "block-first")
        } else {
            (&one_layer, "one-layer")
        };
        let tables = super::hbm_tables(&super::seqs(b, keys, 0));
        let spans = super::decode_spans(&tables, keys);
        let meta = k
            .upload(AttentionPlan::new(sh, &spans).unwrap(), sh)
            .unwrap();
        let q = Tensor::randn(0f32, 1.0, (b, qw), dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let t = super::time_each(a.iters, 20, dev, || {
            k.attention(&q, &arena, &meta, sh, 0).unwrap();
        });

        let bytes = b as f64 * keys as f64 * kv_per_token / cfg.num_layers as f64;
        println!(
            "| {ctx} | {b} | {layout} | {} × {} | {:.1} | {:.0} | {:.0}% |",
            meta.plan.decode_splits,
            meta.plan.decode_part,
            t * 1e6,
            bytes / t / 1e9,
            100.0 * bytes / t / (a.hbm_tbs * 1e12)
        );
    }

    println!(
        "\n### prefill of one prompt in the engine's chunks of {chunk} tokens (against {} TFLOP/s)",
        a.gemm_tflops
    );
    println!("FLOPs: 2 per weight per token (the lm head once per chunk) + causal attention (QK^T and PV).");
    println!("| tokens | chunks | ms | TFLOP/s | % of GEMM rate | last chunk's attention alone, ms (TFLOP/s) | twin ms | twin / measured |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let params = (weights / 2.0) - (cfg.vocab_size * cfg.hidden_size) as f64;
    let lm = (cfg.vocab_size * cfg.hidden_size) as f64;
    let attn_layer = (cfg.num_heads * cfg.head_dim) as f64;
    for &n in a.prefills {
        if !fits(1, n) {
            println!(
                "| {n} | — | does not fit: {:.1} GiB of KV, {:.1} GiB free for it | | | | | |",
                gib(n as f64 * kv_per_token),
                gib(room)
            );
            continue;
        }
        let s = super::seqs(1, n, 0);
        let q = &s[0];
        let spans: Vec<(u32, u32)> = (0..n)
            .step_by(chunk)
            .map(|p| (p as u32, (p + chunk).min(n) as u32))
            .collect();
        let steps: Vec<StepBatch<'_>> = spans
            .iter()
            .map(|&(pos, end)| StepBatch {
                entries: vec![BatchEntry {
                    id: RequestId(0),
                    tokens: &q.tokens,
                    prompt_len: n as u32,
                    pos,
                    end,
                    blocks: &q.blocks,
                    sample: end as usize == n,
                    sampling: &greedy,
                    mask: None,
                }],
            })
            .collect();
        let iters = if n > 65_536 { 1 } else { a.iters.min(3) };
        let t = time_few(iters, dev, || {
            for st in &steps {
                runner.step(st).expect("prefill chunk");
            }
        });
        let attn = 2.0 * 2.0 * (n * n) as f64 / 2.0 * attn_layer * cfg.num_layers as f64;
        let flops = 2.0 * params * n as f64 + 2.0 * lm * spans.len() as f64 + attn;
        // The last chunk's attention, one layer, times the layers.
        let k = runner.model().kernels();
        let &(pos, end) = spans.last().unwrap();
        let table: Vec<u32> = q.blocks.iter().map(|x| x.hbm.unwrap().0).collect();
        let span = [SeqSpan {
            q_offset: 0,
            pos,
            end,
            blocks: &table,
        }];
        let meta = k
            .upload(AttentionPlan::new(&shape, &span).unwrap(), &shape)
            .unwrap();
        let qc = Tensor::randn(0f32, 1.0, ((end - pos) as usize, qw), dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let ta = super::time(a.iters.min(5), dev, || {
            k.attention(&qc, &arena, &meta, &shape, 0).unwrap();
        }) * cfg.num_layers as f64;
        let c = (end - pos) as f64;
        let attn_chunk =
            2.0 * 2.0 * c * (pos as f64 + c / 2.0) * attn_layer * cfg.num_layers as f64;
        let (twin_ms, ratio) = match &twin {
            Some(tw) => {
                let m: f64 = steps
                    .iter()
                    .map(|st| tw.step_time(st.entries.iter().map(|e| (e.pos, e.end))))
                    .sum();
                (format!("{:.0}", m * 1e3), format!("{:.2}", m / t))
            }
            None => ("—".into(), "—".into()),
        };
        println!(
            "| {n} | {} | {:.0} | {:.0} | {:.0}% | {:.1} ({:.0}) | {twin_ms} | {ratio} |",
            spans.len(),
            t * 1e3,
            flops / t / 1e12,
            100.0 * flops / t / 1e12 / a.gemm_tflops,
            ta * 1e3,
            attn_chunk / ta / 1e12
        );
    }
}
