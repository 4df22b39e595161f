//! The engine on the GPU (feature `cuda`; the tests need a CUDA GPU and are `#[ignore]`d, run
//! by `scripts/gpu/model.sh` on the device machine): greedy outputs unchanged by rotation
//! through the CUDA copy engine, and by prefix-cache hits in HBM and from DRAM.
#![cfg(feature = "cuda")]

use std::collections::BTreeMap;
use std::path::Path;
use superinfer_engine::model::tiny::write_tiny_model;
use superinfer_engine::serve::gpu::{gpu_engine, GpuModel, GpuOptions};
use superinfer_engine::serve::{EngineOptions, ModelDtype};
use superinfer_engine::EngineConfig;
use superinfer_engine::{EngineEvent, EngineRequest};
use superinfer_policies::{PolicyKind, RequestId, Slo, TenantId, WlvfConfig};

fn prompt(id: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((id * 7919 + i * 104_729) % 1900 + 10) as u32)
        .collect()
}

fn request(id: u64, n: usize, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        slo: Slo {
            ttft_s: 1.0,
            tbt_s: 0.1,
        },
        ignore_eos: true,
        ..EngineRequest::new(
            RequestId(id),
            TenantId((id % 3) as u32),
            prompt(id, n),
            max_tokens,
        )
    }
}

fn run_engine(
    dir: &Path,
    hbm_blocks: u32,
    policy: PolicyKind,
    reqs: &[EngineRequest],
    prefix_cache: bool,
) -> (
    BTreeMap<RequestId, Vec<u32>>,
    superinfer_engine::EngineStats,
) {
    run_waves(dir, hbm_blocks, policy, &[reqs.to_vec()], prefix_cache)
}

/// Every request of `got` produced what it did in `want`.
fn same_outputs(
    want: &BTreeMap<RequestId, Vec<u32>>,
    got: &BTreeMap<RequestId, Vec<u32>>,
    what: &str,
) {
    let wrong: Vec<_> = got
        .iter()
        .filter(|(id, t)| want[id] != **t)
        .map(|(id, _)| *id)
        .collect();
    assert!(
        wrong.is_empty(),
        "{} outputs changed {what}: {wrong:?}",
        wrong.len()
    );
}

/// Submits each wave of requests once the previous one has finished; tokens per request.
fn run_waves(
    dir: &Path,
    hbm_blocks: u32,
    policy: PolicyKind,
    waves: &[Vec<EngineRequest>],
    prefix_cache: bool,
) -> (
    BTreeMap<RequestId, Vec<u32>>,
    superinfer_engine::EngineStats,
) {
    let opts = EngineOptions {
        config: EngineConfig {
            max_batched_tokens: 256,
            b_xfer: Some(16),
            prefix_cache,
            ..EngineConfig::default()
        },
        hbm_blocks: Some(hbm_blocks),
        dram_blocks: Some(4096),
        policy,
        dtype: ModelDtype::Bf16,
        seed: Some(1),
        ..EngineOptions::default()
    };
    let (mut e, _, _) = gpu_engine(
        &GpuModel::Dir(dir.to_path_buf()),
        &opts,
        &GpuOptions::default(),
        policy.build(&WlvfConfig::default()),
    )
    .unwrap();
    let mut out: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    for wave in waves {
        for r in wave {
            e.submit(r.clone()).unwrap();
        }
        let mut idle = 0u64;
        while !e.is_empty() {
            let r = e.step().expect("step");
            e.pool().check().expect("pool invariants");
            if r.ran {
                idle = 0;
            } else {
                idle += 1;
                assert!(idle < 10_000_000, "engine stuck: {:?}", e.stats());
                std::thread::yield_now();
            }
            for ev in e.take_events() {
                if let EngineEvent::Token { id, token, .. } = ev {
                    out.entry(id).or_default().push(token);
                }
            }
        }
        // Let the last writebacks land: their blocks become cache entries for the next wave.
        for _ in 0..50 {
            e.step().expect("step");
            std::thread::yield_now();
        }
    }
    (out, e.stats())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rotation_through_the_cuda_copy_engine_leaves_greedy_outputs_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 5).unwrap();
    let reqs: Vec<EngineRequest> = (0..120u64)
        .map(|i| request(i, 3 + (i as usize * 37) % 60, 2 + (i % 13) as u32))
        .collect();
    let (want, _) = run_engine(dir.path(), 2048, PolicyKind::Fcfs, &reqs, false);
    let (got, stats) = run_engine(dir.path(), 40, PolicyKind::Lvf, &reqs, false);
    println!("tight HBM (40 blocks): {stats:?}");
    assert!(stats.rotations_out > 0 && stats.restores > 0, "{stats:?}");
    assert!(stats.bytes_d2h > 0 && stats.bytes_h2d > 0, "{stats:?}");
    assert_eq!(got.len(), reqs.len());
    same_outputs(&want, &got, "under rotation");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn prefix_cache_hits_in_hbm_and_from_dram_leave_greedy_outputs_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 5).unwrap();
    // One tenant; every prompt starts with the same 48-token system prompt, and every third
    // one repeats an earlier prompt whole (a retry, or a conversation's next turn). Three
    // waves, each after the last finished: the first fills the cache, the second (other
    // prompts, 150 tokens each) pushes it out of HBM, the third repeats the first's prompts
    // and finds them in DRAM.
    let system = prompt(999, 48);
    let first: Vec<EngineRequest> = (0..30u64)
        .map(|i| {
            let mut r = request(i, 3 + (i as usize * 37) % 60, 2 + (i % 13) as u32);
            let own = if i % 3 == 2 {
                prompt(i - 2, r.prompt.len())
            } else {
                r.prompt
            };
            r.tenant = TenantId(0);
            r.prompt = system.iter().copied().chain(own).collect();
            r
        })
        .collect();
    let push: Vec<EngineRequest> = (100..110u64).map(|i| request(i, 150, 4)).collect();
    let again: Vec<EngineRequest> = first
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.id = RequestId(r.id.0 + 1000);
            r
        })
        .collect();
    let waves = [first, push, again];
    let (want, _) = run_waves(dir.path(), 2048, PolicyKind::Fcfs, &waves, false);
    // 40 HBM blocks: admissions queue behind each other, cached copies leave HBM and come
    // back from DRAM.
    let (got, stats) = run_waves(dir.path(), 40, PolicyKind::Wlvf, &waves, true);
    println!("prefix cache, tight HBM (40 blocks): {stats:?}");
    assert!(stats.prefix_hit_hbm_tokens > 0, "{stats:?}");
    assert!(stats.prefix_hit_dram_tokens > 0, "{stats:?}");
    assert_eq!(got.len(), 70);
    same_outputs(&want, &got, "with the prefix cache");
}
