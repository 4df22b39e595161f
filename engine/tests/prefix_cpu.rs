//! The prefix cache on the CPU model path (issue 12, item 4): the runner prefills from the
//! first uncached position and attends over shared blocks, and greedy and seeded outputs are
//! identical with the cache on and off, also when the hit came from DRAM.

use std::collections::BTreeMap;
use std::path::Path;
use superinfer_engine::model::tiny::write_tiny_model;
use superinfer_engine::serve::{cpu_engine, CpuEngine, EngineOptions};
use superinfer_engine::EngineConfig;
use superinfer_engine::{EngineEvent, EngineRequest, PrefixHit, SamplingParams};
use superinfer_policies::{RequestId, TenantId};

fn model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    write_tiny_model(dir.path(), 5).expect("tiny model");
    dir
}

fn engine(dir: &Path, hbm_blocks: u32, prefix_cache: bool) -> CpuEngine {
    let opts = EngineOptions {
        config: EngineConfig {
            max_batched_tokens: 256,
            prefix_cache,
            ..EngineConfig::default()
        },
        hbm_blocks: Some(hbm_blocks),
        dram_blocks: Some(512),
        seed: Some(1),
        ..EngineOptions::default()
    };
    cpu_engine(dir, &opts).expect("engine").0
}

/// A request of tenant 0; `seeded`: sampled at temperature 0.8 with its own seed, else greedy.
fn request(id: u64, prompt: Vec<u32>, seeded: bool) -> EngineRequest {
    let sampling = if seeded {
        SamplingParams {
            temperature: 0.8,
            seed: Some(id),
            ..SamplingParams::default()
        }
    } else {
        SamplingParams::default()
    };
    EngineRequest {
        ignore_eos: true,
        sampling,
        ..EngineRequest::new(RequestId(id), TenantId(0), prompt, 12)
    }
}

/// A shared 48-token system prompt, then a message of its own.
fn prompt(id: u64) -> Vec<u32> {
    let system = (0..48u64).map(|i| (i * 37 % 1900 + 10) as u32);
    let own = (0..(20 + id % 7)).map(|i| ((id * 7919 + i * 104_729) % 1900 + 10) as u32);
    system.chain(own).collect()
}

/// Runs `req` to its end on `e` (checking the pool after every step): its tokens and the
/// prefix it found cached.
fn run(e: &mut CpuEngine, req: EngineRequest) -> (Vec<u32>, PrefixHit) {
    let id = req.id;
    e.submit(req).expect("submit");
    let mut tokens = Vec::new();
    for _ in 0..100_000 {
        let r = e.step().expect("step");
        e.pool().check().expect("pool invariants");
        if !r.ran {
            std::thread::yield_now();
        }
        for ev in e.take_events() {
            match ev {
                EngineEvent::Token { id: i, token, .. } if i == id => tokens.push(token),
                EngineEvent::Finished { id: i, end, .. } if i == id => return (tokens, end.cached),
                _ => {}
            }
        }
    }
    panic!("{id:?} did not finish: {:?}", e.stats());
}

/// Lets eager writebacks land, so that finished requests' blocks are cache entries.
fn settle(e: &mut CpuEngine) {
    for _ in 0..50 {
        e.step().expect("step");
        std::thread::yield_now();
    }
}

/// Every request alone on an engine without the cache: the reference outputs.
fn reference(dir: &Path, reqs: &[EngineRequest]) -> BTreeMap<RequestId, Vec<u32>> {
    reqs.iter()
        .map(|r| {
            let mut e = engine(dir, 64, false);
            (r.id, run(&mut e, r.clone()).0)
        })
        .collect()
}

#[test]
fn hits_in_hbm_leave_greedy_and_seeded_outputs_unchanged() {
    let dir = model();
    // Three conversations' first turns, then a second turn that re-sends the first one's
    // prompt and answer before a new message.
    let reqs: Vec<EngineRequest> = (1..=3)
        .flat_map(|id| {
            [
                request(id, prompt(id), false),
                request(id + 10, prompt(id), true),
            ]
        })
        .collect();
    let want = reference(dir.path(), &reqs);
    let mut e = engine(dir.path(), 64, true);
    let mut hits = 0;
    for r in &reqs {
        let (got, cached) = run(&mut e, r.clone());
        assert_eq!(got, want[&r.id], "{:?} with the cache", r.id);
        hits += cached.tokens();
        settle(&mut e);
    }
    assert!(hits >= 5 * 48, "the system prompt was found cached: {hits}");
    let mut turn2 = prompt(1);
    turn2.extend(&want[&RequestId(1)]);
    turn2.extend([11, 12, 13, 14, 15]);
    let second = request(4, turn2, false);
    let want2 = reference(dir.path(), std::slice::from_ref(&second));
    let (got, cached) = run(&mut e, second);
    assert_eq!(got, want2[&RequestId(4)], "second turn with the cache");
    // The first turn's whole prompt and most of its answer were cached.
    assert!(cached.hbm >= 64, "{cached:?}");
}

#[test]
fn a_hit_copied_in_from_dram_leaves_outputs_unchanged() {
    let dir = model();
    let first = request(1, prompt(1), false);
    let again = request(2, prompt(1), true);
    let want = reference(dir.path(), &[first.clone(), again.clone()]);
    // 12 HBM blocks: the other prompts push the first one's cached blocks out of HBM (their
    // DRAM copies stay), so the second request's hit is copied in through the copy engine.
    let mut e = engine(dir.path(), 12, true);
    assert_eq!(run(&mut e, first).0, want[&RequestId(1)]);
    settle(&mut e);
    for id in 20..24 {
        let other: Vec<u32> = (0..150)
            .map(|i| ((id * 31 + i * 17) % 1900 + 10) as u32)
            .collect();
        run(&mut e, request(id, other, false));
        settle(&mut e);
    }
    let h2d = e.stats().bytes_h2d;
    let (got, cached) = run(&mut e, again);
    assert_eq!(got, want[&RequestId(2)], "hit from DRAM");
    assert_eq!(cached, PrefixHit { hbm: 0, dram: 64 });
    assert!(e.stats().bytes_h2d > h2d, "{:?}", e.stats());
}
