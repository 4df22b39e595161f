//! Step and kernel benchmarks of the GPU model path (feature `cuda`; needs a CUDA GPU):
//! a random-weight model at real size (default `llama-3-8b`, bf16) built in GPU memory.
//!
//! - decode steps at batch 1, 8, 32, 64 (each sequence with `--context` tokens of KV), against
//!   the memory roofline (weights + KV bytes read once at `--hbm-tbs` TB/s), and at 48 and 32
//!   rows of mixed contexts (104-1,998 tokens), eager against the decode buckets' graphs;
//! - a 2,048-token prefill (one sequence) against `--gemm-tflops` (the measured bf16 GEMM
//!   rate: 786 TFLOP/s on the H200);
//! - mixed steps (prompt chunks beside decodes) against the twin's step model (`mixed`);
//! - the served loop's host term: a GPU engine's decode steps against its runner's (`engine`);
//! - the attention kernels alone: decode at batch 64 (GB/s of KV read) and a 2,048-token
//!   causal prefill (TFLOP/s);
//! - `long` (alone, e.g. `--model llama-3.1-8b --sections long`): decode at 32k and 128k
//!   contexts and chunked prefills of 32k and 128k prompts (`gpu_model/long_context.rs`).
//!
//! Every figure is the median of `--iters` runs after warm-up, each ended by a device
//! synchronize (a step ends when its sampled ids reach the host).
//!
//! ```text
//! cargo bench -p superinfer-engine --features cuda --bench gpu_model -- \
//!     [--model llama-3-8b] [--context 512] [--iters 20] [--hbm-tbs 4.11] [--gemm-tflops 786]
//!     [--sections decode,prefill,matmul,mixed,engine,attention] [--batches 8,32] [--profile]
//!     [--long-contexts 32768,131072] [--long-prefills 32768,131072] [--twin-profile h100-…]
//! ```

#[path = "gpu_model/attention.rs"]
mod attention;
#[path = "gpu_model/decode_mixed.rs"]
mod decode_mixed;
#[path = "gpu_model/engine_loop.rs"]
mod engine_loop;
#[path = "gpu_model/long_context.rs"]
mod long_context;
#[path = "gpu_model/mixed.rs"]
mod mixed;

use candle_core::{DType, Device, Tensor};
use std::time::Instant;
use superinfer_engine::kv::{BlockState, HbmBlock, LogicalBlock};
use superinfer_engine::model::gpu_llama::{GpuLlama, Overlap, DEFAULT_DECODE_BUCKETS};
use superinfer_engine::model::tiny::RandomLlama;
use superinfer_engine::runner::gpu::GpuRunner;
use superinfer_engine::runner::{BatchEntry, ModelRunner, StepBatch};
use superinfer_engine::SamplingParams;
use superinfer_kernels::attention_plan::{AttentionShape, SeqSpan};
use superinfer_policies::RequestId;

struct Args {
    model: String,
    context: usize,
    iters: usize,
    hbm_tbs: f64,
    gemm_tflops: f64,
    /// Which sections run: any of decode, prefill, matmul, mixed, engine, attention
    /// (comma-separated).
    sections: String,
    /// Only the decode steps of these batch sizes (comma-separated; empty: all), and without
    /// the mixed-context steps.
    batches: Vec<usize>,
    /// After timing each decode step, one more inside cuProfilerStart/Stop: for
    /// `ncu --profile-from-start off` (scripts/gpu/model.sh profile), a kernel-by-kernel
    /// breakdown of exactly one step per configuration.
    profile: bool,
    /// The `long` section's decode contexts and prompt lengths, and the twin profile its
    /// figures are set beside.
    long_contexts: Vec<usize>,
    long_prefills: Vec<usize>,
    twin_profile: String,
}

fn list(v: &str, what: &str) -> Vec<usize> {
    v.split(',')
        .map(|b| b.trim().parse().unwrap_or_else(|_| panic!("{what} N,N,…")))
        .collect()
}

fn args() -> Args {
    let mut a = Args {
        model: "llama-3-8b".into(),
        context: 512,
        iters: 20,
        hbm_tbs: 4.11,
        gemm_tflops: 786.0,
        sections: "decode,prefill,matmul,mixed,engine,attention".into(),
        batches: Vec::new(),
        profile: false,
        long_contexts: vec![32_768, 131_072],
        long_prefills: vec![32_768, 131_072],
        twin_profile: "h200-llama-3.1-8b".into(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--model" => a.model = v,
            "--context" => a.context = v.parse().expect("--context N"),
            "--iters" => a.iters = v.parse().expect("--iters N"),
            "--hbm-tbs" => a.hbm_tbs = v.parse().expect("--hbm-tbs X"),
            "--gemm-tflops" => a.gemm_tflops = v.parse().expect("--gemm-tflops X"),
            "--sections" => a.sections = v,
            "--batches" => a.batches = list(&v, "--batches"),
            "--long-contexts" => a.long_contexts = list(&v, "--long-contexts"),
            "--long-prefills" => a.long_prefills = list(&v, "--long-prefills"),
            "--twin-profile" => a.twin_profile = v,
            "--profile" => {
                a.profile = true;
                i += 1;
                continue;
            }
            // cargo bench passes --bench; nothing else is expected.
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median seconds of `f` over `iters` runs after 3 warm-ups.
fn time(iters: usize, dev: &Device, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    dev.synchronize().unwrap();
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let s = Instant::now();
        f();
        dev.synchronize().unwrap();
        t.push(s.elapsed().as_secs_f64());
    }
    median(t)
}

/// Median seconds per call of `f` issued `n` times back to back (one synchronize per `n`), over
/// `iters` rounds: a kernel's own time, without the host's launch-and-wait round trip.
fn time_each(iters: usize, n: usize, dev: &Device, mut f: impl FnMut()) -> f64 {
    time(iters, dev, || {
        for _ in 0..n {
            f();
        }
    }) / n as f64
}

/// `f` once between cuProfilerStart and cuProfilerStop (a profiler started with
/// `--profile-from-start off` sees only this).
fn profiled(dev: &Device, f: impl FnOnce()) {
    use candle_core::cuda_backend::cudarc::driver::sys;
    dev.synchronize().unwrap();
    // SAFETY: no arguments; the context is current on this thread (candle's device).
    unsafe { sys::cuProfilerStart() }
        .result()
        .expect("cuProfilerStart");
    f();
    dev.synchronize().unwrap();
    // SAFETY: as above.
    unsafe { sys::cuProfilerStop() }
        .result()
        .expect("cuProfilerStop");
}

struct Seq {
    tokens: Vec<u32>,
    blocks: Vec<LogicalBlock>,
}

fn seqs(n: usize, len: usize, first_block: u32) -> Vec<Seq> {
    let per = len.div_ceil(16) as u32;
    (0..n as u32)
        .map(|i| Seq {
            tokens: (0..len as u32).map(|t| (t * 31 + i) % 30_000 + 5).collect(),
            blocks: (0..per)
                .map(|k| LogicalBlock {
                    hbm: Some(HbmBlock(first_block + i * per + k)),
                    dram: None,
                    state: BlockState::Dirty,
                    inflight: None,
                    entry: None,
                })
                .collect(),
        })
        .collect()
}

fn batch<'a>(s: &'a [Seq], pos: usize, p: &'a SamplingParams) -> StepBatch<'a> {
    StepBatch {
        entries: s
            .iter()
            .enumerate()
            .map(|(i, q)| BatchEntry {
                id: RequestId(i as u64),
                tokens: &q.tokens,
                prompt_len: q.tokens.len() as u32,
                pos: pos as u32,
                end: q.tokens.len() as u32,
                blocks: &q.blocks,
                sample: true,
                sampling: p,
                mask: None,
            })
            .collect(),
    }
}

/// Each sequence's HBM block table.
fn hbm_tables(s: &[Seq]) -> Vec<Vec<u32>> {
    s.iter()
        .map(|q| q.blocks.iter().map(|b| b.hbm.unwrap().0).collect())
        .collect()
}

/// One decode span per table: sequence `i` is query row `i`, at the last of its `keys` keys.
fn decode_spans(tables: &[Vec<u32>], keys: usize) -> Vec<SeqSpan<'_>> {
    tables
        .iter()
        .enumerate()
        .map(|(i, t)| SeqSpan {
            q_offset: i as u32,
            pos: keys as u32 - 1,
            end: keys as u32,
            blocks: t,
        })
        .collect()
}

/// How a decode step is launched.
#[derive(Clone, Copy, Debug)]
enum Launch {
    Eager,
    Direct,
    Graph,
    /// Graph, with each norm of a one-row step fused into the GEMV after it and silu_mul
    /// fused into the gate/up GEMV.
    GraphFused,
    /// Graph, every kernel launched with programmatic dependent launch (no prefetch).
    GraphPdl,
    /// GraphPdl, with the GEMVs' L2 prefetch of their first weight rows.
    GraphPdlPrefetch,
    /// GraphPdlPrefetch and both fusions.
    GraphPdlFused,
}

impl Launch {
    fn fused(self) -> bool {
        matches!(self, Launch::GraphFused | Launch::GraphPdlFused)
    }

    fn overlap(self) -> Overlap {
        match self {
            Launch::GraphPdl => Overlap::PDL,
            Launch::GraphPdlPrefetch | Launch::GraphPdlFused => Overlap::PDL_PREFETCH,
            _ => Overlap::default(),
        }
    }
}

fn main() {
    let a = args();
    let dev = Device::new_cuda(0).expect("a CUDA GPU");
    let (spec, vocab) = RandomLlama::named(&a.model).expect("model name");
    let t0 = Instant::now();
    let model = GpuLlama::random(&spec, vocab, DType::BF16, &dev, 0).expect("random model");
    dev.synchronize().unwrap();
    let weights = model.weight_bytes() as f64;
    println!(
        "model random:{} bf16: {:.2} GB of weights, built in GPU memory in {:.1} s",
        a.model,
        weights / 1e9,
        t0.elapsed().as_secs_f64()
    );
    if a.sections == "long" {
        let batches = if a.batches.is_empty() {
            vec![1, 8]
        } else {
            a.batches.clone()
        };
        let long = long_context::LongArgs {
            contexts: &a.long_contexts,
            batches: &batches,
            prefills: &a.long_prefills,
            iters: a.iters,
            hbm_tbs: a.hbm_tbs,
            gemm_tflops: a.gemm_tflops,
            twin_profile: &a.twin_profile,
        };
        long_context::run(model, &dev, &long);
        return;
    }
    let cfg = model.config().clone();
    let kv_per_token = (2 * cfg.num_layers * cfg.kv_width() * 2) as f64;
    let shape = AttentionShape {
        num_heads: cfg.num_heads as u32,
        kv_heads: cfg.num_kv_heads as u32,
        head_dim: cfg.head_dim as u32,
        num_layers: cfg.num_layers as u32,
        block_size: 16,
        window: 0,
    };
    let max_batch = 64usize;
    let ctx = a.context;
    let blocks_needed = (max_batch * (ctx + 1).div_ceil(16))
        .max(2048usize.div_ceil(16) + 1)
        .max(decode_mixed::blocks());
    let mut runner = GpuRunner::new(model, 16, blocks_needed as u32 + 8, Some(0)).unwrap();
    let greedy = SamplingParams::default();

    println!("\n## decode steps (context {ctx} tokens per sequence, greedy sampling on the GPU)");
    println!(
        "Host issue: the time to enqueue a step (no wait); below the step time, the GPU never"
    );
    println!("waits for the host between steps (within a step it may, between short kernels).");
    println!(
        "Launch: eager (the forward pass, a plan per step), direct (the decode buckets' fixed"
    );
    println!(
        "buffers, launched one by one), graph (the same launches replayed from a CUDA graph)."
    );
    println!("| batch | matmuls, decode attention, launch | ms/step | roofline ms (weights + KV at {} TB/s) | x roofline | tokens/s | host issue ms |", a.hbm_tbs);
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    use superinfer_kernels::cuda::DecodeKernel::{OnePass, TensorCore, ThreePhase};
    use Launch::{Direct, Eager, Graph, GraphFused, GraphPdl, GraphPdlFused, GraphPdlPrefetch};
    let steps = [
        (1usize, 0usize, OnePass, Eager),
        (1, 1, OnePass, Eager),
        (1, 1, OnePass, Direct),
        (1, 1, OnePass, Graph),
        (1, 1, ThreePhase, Eager),
        (1, 1, TensorCore, Graph),
        (1, 1, TensorCore, GraphFused),
        (1, 1, TensorCore, GraphPdl),
        (1, 1, TensorCore, GraphPdlPrefetch),
        (1, 1, TensorCore, GraphPdlFused),
        (2, 2, OnePass, Eager),
        (2, 2, OnePass, Graph),
        (2, 0, TensorCore, Graph),
        (2, 2, TensorCore, Graph),
        (2, 2, TensorCore, GraphPdl),
        (4, 0, TensorCore, Graph),
        (4, 4, TensorCore, Graph),
        (4, 4, TensorCore, GraphPdl),
        (8, 0, OnePass, Eager),
        (8, 0, OnePass, Direct),
        (8, 0, OnePass, Graph),
        (8, 8, OnePass, Graph),
        (8, 0, ThreePhase, Eager),
        (8, 0, TensorCore, Graph),
        (8, 8, TensorCore, Graph),
        (8, 8, TensorCore, GraphPdl),
        (32, 0, OnePass, Eager),
        (32, 0, OnePass, Graph),
        (32, 0, TensorCore, Graph),
        (64, 0, OnePass, Eager),
        (64, 0, OnePass, Direct),
        (64, 0, OnePass, Graph),
        (64, 0, ThreePhase, Eager),
        (64, 0, TensorCore, Eager),
        (64, 0, TensorCore, Graph),
    ];
    let chosen = |b: &usize| a.batches.is_empty() || a.batches.contains(b);
    let decode = steps
        .into_iter()
        .filter(|(b, ..)| a.sections.contains("decode") && chosen(b));
    for (b, gemv, kernel, launch) in decode {
        runner.model_mut().set_gemv_max_rows(gemv);
        runner.model().kernels().set_decode_kernel(kernel);
        match launch {
            Eager => runner.model_mut().set_decode_buckets(&[], false),
            Direct => runner
                .model_mut()
                .set_decode_buckets(&DEFAULT_DECODE_BUCKETS, false),
            _ => runner
                .model_mut()
                .set_decode_buckets(&DEFAULT_DECODE_BUCKETS, true),
        }
        runner.model_mut().set_decode_fused_norm(launch.fused());
        runner.model_mut().set_decode_fused_silu(launch.fused());
        runner.model_mut().set_decode_overlap(launch.overlap());
        let how = format!(
            "{}, {kernel:?}, {launch:?}",
            if gemv > 0 { "GEMV kernel" } else { "cuBLAS" },
        );
        let s = seqs(b, ctx + 1, 0);
        let step = batch(&s, ctx, &greedy);
        let t = time(a.iters, &dev, || {
            runner.step(&step).expect("decode step");
        });
        if a.profile {
            profiled(&dev, || {
                runner.step(&step).expect("decode step");
            });
        }
        let roof = (weights + b as f64 * (ctx + 1) as f64 * kv_per_token) / (a.hbm_tbs * 1e12);
        // Host issue: the eager forward's enqueue, or a decode step's whole host side
        // (uploads, launches or one graph launch; the wait for the sampled ids excluded
        // by asking for logits).
        let mut issue = Vec::new();
        for _ in 0..a.iters {
            dev.synchronize().unwrap();
            let s = Instant::now();
            let logits = match launch {
                Eager => runner.logits(&step).expect("forward"),
                _ => match runner.decode_logits(&step).expect("decode") {
                    Some(l) => l,
                    None => panic!("batch {b} not taken by the decode buckets"),
                },
            };
            issue.push(s.elapsed().as_secs_f64());
            drop(logits);
        }
        dev.synchronize().unwrap();
        println!(
            "| {b} | {how} | {:.2} | {:.2} | {:.2} | {:.0} | {:.2} |",
            t * 1e3,
            roof * 1e3,
            t / roof,
            b as f64 / t,
            median(issue) * 1e3
        );
    }
    if a.sections.contains("decode") && a.batches.is_empty() {
        decode_mixed::run(&mut runner, &dev, a.iters, shape.kv_heads);
    }

    runner
        .model_mut()
        .set_gemv_max_rows(superinfer_engine::model::gpu_llama::DEFAULT_GEMV_MAX_ROWS);
    runner
        .model_mut()
        .set_decode_buckets(&DEFAULT_DECODE_BUCKETS, true);
    runner
        .model()
        .kernels()
        .set_decode_kernel(Default::default());
    // The defaults again (as the server runs).
    runner.model_mut().set_decode_fused_norm(false);
    runner.model_mut().set_decode_fused_silu(false);
    runner.model_mut().set_decode_overlap(Overlap::PDL);

    println!("\n## prefill (one sequence, one chunk)");
    println!(
        "| tokens | ms | TFLOP/s (matmuls + causal attention) | % of {} TFLOP/s |",
        a.gemm_tflops
    );
    println!("| --- | --- | --- | --- |");
    let params = (weights / 2.0) - (cfg.vocab_size * cfg.hidden_size) as f64;
    for n in [512usize, 2048]
        .into_iter()
        .filter(|_| a.sections.contains("prefill"))
    {
        let s = seqs(1, n, 0);
        let step = batch(&s, 0, &greedy);
        let t = time(a.iters, &dev, || {
            runner.step(&step).expect("prefill step");
        });
        // Matmuls: 2 flops per weight per token (the lm head only for the sampled row);
        // attention: QK^T and PV over the causal half.
        let lm = (cfg.vocab_size * cfg.hidden_size) as f64;
        let attn = 2.0 * 2.0 * (n * n) as f64 / 2.0
            * (cfg.num_heads * cfg.head_dim * cfg.num_layers) as f64;
        let flops = 2.0 * params * n as f64 + 2.0 * lm + attn;
        println!(
            "| {n} | {:.1} | {:.0} | {:.0}% |",
            t * 1e3,
            flops / t / 1e12,
            100.0 * flops / t / 1e12 / a.gemm_tflops
        );
    }

    println!("\n## one matmul at batch 1: GEMV kernel vs cuBLAS (candle matmul), bf16");
    println!("Launch + wait per figure, and (back to back) 20 launches, one wait, per launch.");
    println!("| weight (n x k) | GEMV us | GEMV GB/s | cuBLAS us | cuBLAS GB/s | GEMV back to back us | GB/s |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    {
        let k = runner.model().kernels();
        let h = cfg.hidden_size;
        let shapes = [
            (cfg.q_width() + 2 * cfg.kv_width(), h),
            (h, cfg.q_width()),
            (2 * cfg.intermediate_size, h),
            (h, cfg.intermediate_size),
            (cfg.vocab_size, h),
        ];
        for (n, kk) in shapes.into_iter().filter(|_| a.sections.contains("matmul")) {
            let w = Tensor::randn(0f32, 1.0, (n, kk), &dev)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let x = Tensor::randn(0f32, 1.0, (1, kk), &dev)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let bytes = (n * kk * 2) as f64;
            let tg = time(a.iters * 5, &dev, || {
                k.gemv(&x, &w).unwrap();
            });
            let wt = w.t().unwrap();
            let tc = time(a.iters * 5, &dev, || {
                x.matmul(&wt).unwrap();
            });
            let tb = time_each(a.iters, 20, &dev, || {
                k.gemv(&x, &w).unwrap();
            });
            println!(
                "| {n} x {kk} | {:.1} | {:.0} | {:.1} | {:.0} | {:.1} | {:.0} |",
                tg * 1e6,
                bytes / tg / 1e9,
                tc * 1e6,
                bytes / tc / 1e9,
                tb * 1e6,
                bytes / tb / 1e9
            );
        }
    }

    if a.sections.contains("mixed") {
        mixed::run(&mut runner, &dev, &a.model, a.iters);
    }
    if !a.sections.contains("attention") {
        engine_section(runner, &a);
        return;
    }
    attention::run(&runner, &dev, &a, &shape, max_batch);
    engine_section(runner, &a);
}

/// The `engine` section, last: it builds engines with models of their own, so the bench's
/// runner and its model are freed first (two copies of a 32B model do not fit one H200).
fn engine_section(runner: GpuRunner, a: &Args) {
    drop(runner);
    if a.sections.contains("engine") {
        engine_loop::run(&a.model, a.context, a.iters);
    }
}
