//! Faults on the CPU model path (issue 16): host-transfer batches that fail are recomputed, and
//! every request's greedy output is the same as in a run without faults (no request is lost,
//! none hangs, the pool is checked after every step and ends empty); a DRAM tier larger than
//! the host's available memory is a start-up error naming its setting.

use std::collections::BTreeMap;
use superinfer_engine::model::tiny::write_tiny_model;
use superinfer_engine::serve::{cpu_engine, CpuEngine, EngineOptions};
use superinfer_engine::transfer::CopyFault;
use superinfer_engine::EngineConfig;
use superinfer_engine::{EngineEvent, EngineRequest};
use superinfer_policies::{RequestId, TenantId};

fn engine(dir: &std::path::Path) -> CpuEngine {
    let opts = EngineOptions {
        config: EngineConfig {
            max_batched_tokens: 128,
            ..EngineConfig::default()
        },
        // Tight: 12 requests of ~5 blocks each rotate through 24 blocks.
        hbm_blocks: Some(24),
        dram_blocks: Some(512),
        seed: Some(1),
        ..EngineOptions::default()
    };
    cpu_engine(dir, &opts).expect("engine").0
}

fn request(id: u64) -> EngineRequest {
    let prompt = (0..(50 + id * 3)).map(|i| ((id * 7919 + i * 104_729) % 1900 + 10) as u32);
    EngineRequest {
        ignore_eos: true,
        ..EngineRequest::new(
            RequestId(id),
            TenantId((id % 3) as u32),
            prompt.collect(),
            24,
        )
    }
}

/// Runs 12 requests at once; with `fail_every`, every such copy batch fails (at most
/// `max_faults` of them). Returns each request's tokens and the faults injected.
fn run(
    e: &mut CpuEngine,
    fail_every: Option<u64>,
    max_faults: u64,
) -> (BTreeMap<u64, Vec<u32>>, u64) {
    for id in 0..12 {
        e.submit(request(id)).expect("submit");
    }
    let (mut batches, mut injected) = (0u64, 0u64);
    let mut tokens: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut finished = 0;
    for _ in 0..200_000 {
        let before = e.stats();
        let r = e.step().expect("step");
        let after = e.stats();
        if after.bytes_h2d + after.bytes_d2h > before.bytes_h2d + before.bytes_d2h {
            batches += 1;
            if fail_every.is_some_and(|n| batches % n == 0) && injected < max_faults {
                e.transfer_mut().inject(CopyFault::Fail);
                injected += 1;
            }
        }
        e.pool().check().expect("pool invariants");
        if !r.ran {
            std::thread::yield_now();
        }
        for ev in e.take_events() {
            match ev {
                EngineEvent::Token { id, token, .. } => tokens.entry(id.0).or_default().push(token),
                EngineEvent::Finished { .. } => finished += 1,
            }
        }
        if finished == 12 {
            break;
        }
    }
    assert_eq!(finished, 12, "every request ends: {:?}", e.stats());
    (tokens, injected)
}

#[test]
fn failed_host_copies_are_recomputed_and_outputs_do_not_change() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_tiny_model(dir.path(), 5).expect("tiny model");
    let mut clean = engine(dir.path());
    let (want, _) = run(&mut clean, None, 0);
    assert!(
        clean.stats().rotations_out > 0,
        "the tier must be tight enough to rotate"
    );
    let mut faulty = engine(dir.path());
    let (got, injected) = run(&mut faulty, Some(2), 6);
    let s = faulty.stats();
    assert!(
        injected > 0 && s.copy_faults > 0 && s.recomputes > 0,
        "{s:?}"
    );
    assert_eq!(got, want, "greedy outputs changed under copy faults");
    assert_eq!((s.hbm_used, s.dram_used), (0, 0), "blocks leaked: {s:?}");
}

#[test]
fn a_dram_tier_beyond_the_host_memory_is_a_start_up_error_naming_the_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_tiny_model(dir.path(), 5).expect("tiny model");
    let opts = EngineOptions {
        hbm_blocks: Some(24),
        dram_blocks: Some(u32::MAX),
        ..EngineOptions::default()
    };
    let Err(e) = cpu_engine(dir.path(), &opts) else {
        panic!("a DRAM tier of u32::MAX blocks was accepted");
    };
    let e = e.to_string();
    assert!(
        e.contains("--dram-blocks") && e.contains("GB of host memory"),
        "{e}"
    );
}
