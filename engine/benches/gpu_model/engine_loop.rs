//! The served loop's host term (issue 14 item 4): the engine thread's own time per decode
//! step, outside the model runner. A GPU engine built as `superinfer serve` builds it (weighted
//! LVF, the CUDA copy engine, a pinned DRAM tier) runs `batch` requests of `context` prompt
//! tokens until all of them decode, then `iters` decode steps are timed: the step
//! (`Engine::step`: plan, apply, batch, the runner, results) plus taking its events (what
//! the serving thread does next), against the runner's own time (`StepReport::elapsed`:
//! tables, uploads, launches or a graph replay, the wait for the sampled ids). Their
//! difference is what the twin's step model must add per step to follow the served loop.

use std::time::Instant;
use superinfer_engine::serve::gpu::{gpu_engine, GpuModel, GpuOptions};
use superinfer_engine::serve::{EngineOptions, ModelDtype};
use superinfer_engine::EngineConfig;
use superinfer_engine::EngineRequest;
use superinfer_policies::{PolicyKind, RequestId, Slo, TenantId, WlvfConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(model: &str, context: usize, iters: usize) {
    println!("\n## the served loop's host term (engine thread, decode steps, weighted LVF)");
    println!(
        "Medians over {iters} decode steps after every request's prefill; prompts of {context} tokens."
    );
    println!("| CUDA graphs | batch | served step ms (step + events) | runner ms | host term ms | host term per row us |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for graphs in [true, false] {
        for batch in [1usize, 8, 32, 64, 128] {
            let per_req = (context + iters + 64).div_ceil(16);
            let opts = EngineOptions {
                config: EngineConfig {
                    max_batched_tokens: 2048,
                    max_num_seqs: 256,
                    prefix_cache: false,
                    ..EngineConfig::default()
                },
                hbm_blocks: Some((batch * per_req + 64) as u32),
                dram_blocks: Some(64),
                policy: PolicyKind::Wlvf,
                dtype: ModelDtype::Bf16,
                seed: Some(1),
                ..EngineOptions::default()
            };
            let gpu = GpuOptions {
                cuda_graphs: graphs,
                ..GpuOptions::default()
            };
            let policy = PolicyKind::Wlvf.build(&WlvfConfig::default());
            let (mut e, _, _) =
                gpu_engine(&GpuModel::Random(model.into()), &opts, &gpu, policy).expect("engine");
            for i in 0..batch as u64 {
                let prompt = (0..context as u64)
                    .map(|t| ((i * 7919 + t * 104_729) % 30_000 + 5) as u32)
                    .collect();
                let r = EngineRequest {
                    slo: Slo {
                        ttft_s: 600.0,
                        tbt_s: 10.0,
                    },
                    ignore_eos: true,
                    ..EngineRequest::new(
                        RequestId(i),
                        TenantId((i % 3) as u32),
                        prompt,
                        (iters + 64) as u32,
                    )
                };
                e.submit(r).expect("submit");
            }
            let mut guard = 0;
            loop {
                let r = e.step().expect("step");
                drop(e.take_events());
                if r.ran && r.prefill_tokens == 0 && r.decode_tokens as usize == batch {
                    break;
                }
                guard += 1;
                assert!(guard < 100_000, "batch {batch} never decoded all at once");
            }
            let (mut wall, mut runner) = (Vec::new(), Vec::new());
            for _ in 0..iters {
                let t = Instant::now();
                let r = e.step().expect("step");
                drop(e.take_events());
                wall.push(t.elapsed().as_secs_f64());
                runner.push(r.elapsed);
                assert_eq!(
                    r.decode_tokens as usize, batch,
                    "a decode step of every request"
                );
            }
            let host: Vec<f64> = wall.iter().zip(&runner).map(|(w, r)| w - r).collect();
            let h = median(host);
            println!(
                "| {} | {batch} | {:.3} | {:.3} | {:.3} | {:.1} |",
                if graphs { "on" } else { "off" },
                median(wall) * 1e3,
                median(runner) * 1e3,
                h * 1e3,
                h / batch as f64 * 1e6
            );
        }
    }
}
