//! Host time of one whole `Engine::step` (poll copies, view, plan, apply, writeback, batch,
//! events) over 2,000 live decoding requests, with the simulated runner and copy engine on a
//! virtual clock, so only the engine's own work is timed. `wlvf-queued`: 100 more requests
//! wait for a seat, so every step builds the view and plans (a decode-only step skips both);
//! `-nocache`: the prefix cache off.
//! Goals (issue 11): under 300 µs
//! with 2,000-token contexts, and within 1.5x of the same step with 200-token contexts (the
//! per-step cost must not grow with context length).
//!
//! `cargo bench -p superinfer-engine --bench step` (criterion; results in docs/BENCHMARKS.md,
//! "Engine step").

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::time::Duration;
use superinfer_engine::clock::VirtualClock;
use superinfer_engine::profile::Profile;
use superinfer_engine::runner::sim::SimRunner;
use superinfer_engine::transfer::sim::SimTransfer;
use superinfer_engine::{Engine, EngineConfig, EngineRequest, ReqState, SamplingParams};
use superinfer_policies::{PolicyKind, RequestId, Slo, TenantId, WlvfConfig};

const LIVE: u64 = 2000;

type SimEngine = Engine<SimRunner, SimTransfer, VirtualClock>;

/// Request `i` (of tenant `i % 3`) with a prompt of `context` tokens.
fn request(i: u64, context: u32, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        id: RequestId(i),
        tenant: TenantId((i % 3) as u32),
        weight: 1.0,
        slo: Slo::default(),
        // Distinct prompts: each request's blocks are its own (the prefix cache still names
        // every block that fills, and that cost is measured).
        prompt: (0..context).map(|t| (i as u32) << 12 | t).collect(),
        max_tokens,
        ignore_eos: true,
        stop_token_ids: vec![],
        sampling: SamplingParams::default(),
        arrival: None,
        cache: None,
        follows: None,
    }
}

/// 2,000 requests of `context` prompt tokens, all prefilled and decoding, three tenants;
/// with `queued`, 100 more wait for a seat (every seat is taken), so every step plans.
fn warmed(policy: PolicyKind, context: u32, queued: bool, prefix_cache: bool) -> SimEngine {
    let profile = Profile::builtin("h200-llama-3-8b").expect("built-in profile");
    let transfer = SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes());
    let runner = SimRunner::new(profile, 16);
    // Nobody finishes during a run; tiers with room for 16,000 more tokens per request, so
    // the step measured is always the same kind of step (no shortage, no rotation).
    let max_tokens = 60_000;
    let blocks = LIVE as u32 * (context / 16 + 1000);
    let cfg = EngineConfig {
        hbm_blocks: blocks,
        dram_blocks: blocks,
        max_num_seqs: LIVE as u32,
        max_batched_tokens: 4096,
        prefix_cache,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(
        cfg,
        policy.build(&WlvfConfig::default()),
        runner,
        transfer,
        VirtualClock::new(),
    )
    .expect("engine");
    for i in 0..LIVE {
        e.submit(request(i, context, max_tokens)).expect("submit");
    }
    let decoding = |e: &SimEngine| {
        (0..LIVE).all(|i| {
            e.request(RequestId(i))
                .is_some_and(|r| r.state == ReqState::Running && !r.prefilling())
        })
    };
    while !decoding(&e) {
        e.step().expect("step");
        e.take_events();
    }
    if queued {
        for i in LIVE..LIVE + 100 {
            e.submit(request(i, context, max_tokens)).expect("submit");
        }
    }
    e
}

fn bench_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_step_2000");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    // `-nocache`: the same step with the prefix cache off, side by side (its cost is naming
    // each block that fills and turning synced blocks into entries).
    for (policy, queued, cache) in [
        (PolicyKind::Wlvf, false, true),
        (PolicyKind::Wlvf, false, false),
        (PolicyKind::Fcfs, false, true),
        (PolicyKind::Wlvf, true, true),
        (PolicyKind::Wlvf, true, false),
    ] {
        for context in [200u32, 2000] {
            // Built on first use: a filtered-out variant costs nothing (warming one up runs
            // ~1,000 planned steps of prefill).
            let mut engine: Option<SimEngine> = None;
            let name = format!(
                "{}{}{}",
                policy.as_str(),
                if queued { "-queued" } else { "" },
                if cache { "" } else { "-nocache" }
            );
            let mut events = Vec::new();
            group.bench_function(BenchmarkId::new(name, context), |b| {
                let e = engine.get_or_insert_with(|| warmed(policy, context, queued, cache));
                b.iter(|| {
                    let r = e.step().expect("step");
                    // As the engine thread does: the same buffer back every step.
                    e.swap_events(&mut events);
                    r
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
