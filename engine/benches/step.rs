//! Host time of one whole `Engine::step` (poll copies, view, plan, apply, writeback, batch,
//! events) over 2,000 live decoding requests, with the simulated runner and copy engine on a
//! virtual clock, so only the engine's own work is timed. `wlvf-queued`: 100 more requests
//! wait for a seat, so every step builds the view and plans (a decode-only step skips both);
//! `-nocache`: the prefix cache off.
//! Goals (issue 11): under 300 µs with 2,000-token contexts, and within 1.5x of the same step
//! with 200-token contexts (the per-step cost must not grow with context length).
//!
//! Contexts stay what the name says: every step appends a token to each request, so after
//! `context / 4` timed steps the generation is aborted and 2,000 new requests with fresh
//! prompts are admitted and prefilled (untimed) before timing goes on. The pool and the
//! prefix cache live on across generations, as in a server that has run a while (the
//! aborted requests' blocks stay as cache entries and are evicted as new ones need room),
//! and the tiers have room for every live request's growth, so every timed step is the same
//! kind of step (no shortage, no rotation).
//!
//! `cargo bench -p superinfer-engine --bench step` (criterion; results in docs/BENCHMARKS.md,
//! "Per-step cost of the engine").

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::time::{Duration, Instant};
use superinfer_engine::clock::VirtualClock;
use superinfer_engine::profile::Profile;
use superinfer_engine::runner::sim::SimRunner;
use superinfer_engine::transfer::sim::SimTransfer;
use superinfer_engine::{
    Engine, EngineConfig, EngineEvent, EngineRequest, ReqState, SamplingParams,
};
use superinfer_policies::{PolicyKind, RequestId, Slo, TenantId, WlvfConfig};

// The allocator the `superinfer` binary runs the engine with (the system allocator here made
// the step ~1.4x slower, docs/BENCHMARKS.md "Per-step cost of the engine").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const LIVE: u64 = 2000;
const QUEUED: u64 = 100;

type SimEngine = Engine<SimRunner, SimTransfer, VirtualClock>;

/// Request `i` (of tenant `i % 3`) with a prompt of `context` tokens, distinct from every
/// other request's from its first token (so its blocks are its own; the prefix cache still
/// names every block that fills, and that cost is measured).
fn request(i: u64, context: u32) -> EngineRequest {
    EngineRequest {
        id: RequestId(i),
        tenant: TenantId((i % 3) as u32),
        weight: 1.0,
        slo: Slo::default(),
        prompt: (0..context)
            .map(|t| if t == 0 { i as u32 } else { t })
            .collect(),
        // Nobody finishes while timed: a generation is aborted long before.
        max_tokens: 60_000,
        ignore_eos: true,
        stop_token_ids: vec![],
        sampling: SamplingParams::default(),
        arrival: None,
        cache: None,
        follows: None,
        queue_deadline_s: None,
    }
}

/// An engine with 2,000 requests of about `context` tokens decoding (and, with `queued`,
/// 100 more waiting for a seat), renewed every `context / 4` steps.
struct Fixture {
    engine: SimEngine,
    context: u32,
    queued: bool,
    /// Ids of the live generation start here.
    first: u64,
    next: u64,
    /// Timed steps left before the generation is renewed.
    left: u32,
    events: Vec<EngineEvent>,
}

impl Fixture {
    fn new(policy: PolicyKind, context: u32, queued: bool, prefix_cache: bool) -> Fixture {
        let profile = Profile::builtin("h200-llama-3-8b").expect("built-in profile");
        let transfer = SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes());
        let runner = SimRunner::new(profile, 16);
        // Room for every live request at its longest, and as much again for cache entries
        // of earlier generations.
        let blocks = 2 * (LIVE + QUEUED) as u32 * (Self::window(context) + context).div_ceil(16);
        let cfg = EngineConfig {
            hbm_blocks: blocks,
            dram_blocks: 2 * blocks,
            max_num_seqs: LIVE as u32,
            // 32 prompt tokens a request a step: a generation's prompts are prefilled in
            // context / 32 steps, so the first requests admitted decode about 3% of their
            // context before timing starts (with 4,096 tokens a step, prefill took ~1,000
            // steps at 2,000 tokens and the first requests reached twice the context). A
            // decode-only step uses 2,000 of the budget whatever it is.
            max_batched_tokens: LIVE as u32 * 32,
            prefix_cache,
            ..EngineConfig::default()
        };
        let engine = Engine::new(
            cfg,
            policy.build(&WlvfConfig::default()),
            runner,
            transfer,
            VirtualClock::new(),
        )
        .expect("engine");
        let mut f = Fixture {
            engine,
            context,
            queued,
            first: 0,
            next: 0,
            left: 0,
            events: Vec::new(),
        };
        f.renew();
        f
    }

    /// Timed steps per generation: contexts grow by at most a quarter while timed.
    fn window(context: u32) -> u32 {
        context / 4
    }

    /// Aborts the live generation and admits a new one, stepping (untimed) until all of it
    /// decodes. Never inlined, so that a profile can tell its (untimed) steps from the timed.
    #[inline(never)]
    fn renew(&mut self) {
        for i in self.first..self.next {
            self.engine.abort(RequestId(i));
        }
        self.first = self.next;
        for _ in 0..LIVE {
            let r = request(self.next, self.context);
            self.engine.submit(r).expect("submit");
            self.next += 1;
        }
        let (first, last) = (self.first, self.next);
        let decoding = |e: &SimEngine| {
            (first..last).all(|i| {
                e.request(RequestId(i))
                    .is_some_and(|r| r.state == ReqState::Running && !r.prefilling())
            })
        };
        while !decoding(&self.engine) {
            self.engine.step().expect("step");
            self.engine.swap_events(&mut self.events);
        }
        // Contexts are what the name says when timing starts (prefill in a few dozen steps).
        let longest = (first..last)
            .filter_map(|i| self.engine.request(RequestId(i)))
            .map(|r| r.tokens.len() as u32)
            .max()
            .unwrap_or(0);
        assert!(
            longest <= self.context + self.context / 16 + 1,
            "a request decoded {longest} tokens into a {}-token generation before timing",
            self.context
        );
        if self.queued {
            for _ in 0..QUEUED {
                let r = request(self.next, self.context);
                self.engine.submit(r).expect("submit");
                self.next += 1;
            }
        }
        self.left = Self::window(self.context);
    }

    /// `iters` timed steps (renewing the generation, untimed, whenever its window is used).
    fn time(&mut self, iters: u64) -> Duration {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            if self.left == 0 {
                self.renew();
            }
            self.left -= 1;
            let t = Instant::now();
            let r = self.engine.step().expect("step");
            // As the engine thread does: the same buffer back every step.
            self.engine.swap_events(&mut self.events);
            total += t.elapsed();
            assert!(r.ran && r.prefill_tokens == 0, "a timed step only decodes");
        }
        total
    }
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
            // Built on first use: a filtered-out variant costs nothing.
            let mut fixture: Option<Fixture> = None;
            let name = format!(
                "{}{}{}",
                policy.as_str(),
                if queued { "-queued" } else { "" },
                if cache { "" } else { "-nocache" }
            );
            group.bench_function(BenchmarkId::new(name, context), |b| {
                let f = fixture.get_or_insert_with(|| Fixture::new(policy, context, queued, cache));
                b.iter_custom(|iters| f.time(iters))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
