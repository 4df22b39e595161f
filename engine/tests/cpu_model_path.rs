//! The CPU model path end to end, on the tiny model written into a temp dir and loaded by the
//! real loading code: rotation to DRAM and back, recompute preemption, batch composition and
//! heavy rotation under a small HBM tier all leave greedy outputs unchanged.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use superinfer_engine::model::tiny::write_tiny_model;
use superinfer_engine::serve::{cpu_engine, cpu_engine_with_policy, CpuEngine, EngineOptions};
use superinfer_engine::EngineConfig;
use superinfer_engine::{EngineEvent, EngineRequest};
use superinfer_policies::{
    Capacity, Phase, Plan, Policy, PolicyKind, ReqView, RequestId, Service, Slo, TenantId,
};

fn model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    write_tiny_model(dir.path(), 5).expect("tiny model");
    dir
}

fn opts(hbm_blocks: u32, dram_blocks: u32) -> EngineOptions {
    EngineOptions {
        hbm_blocks: Some(hbm_blocks),
        dram_blocks: Some(dram_blocks),
        config: EngineConfig {
            max_batched_tokens: 256,
            // Every request must complete, however slow the machine: no queue deadline.
            queue_deadline_ttfts: None,
            ..EngineConfig::default()
        },
        seed: Some(1),
        ..EngineOptions::default()
    }
}

fn request(id: u64, prompt: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        weight: 1.0 + (id % 3) as f64,
        slo: Slo {
            ttft_s: 0.05,
            tbt_s: 0.01,
        },
        ignore_eos: true,
        ..EngineRequest::new(RequestId(id), TenantId((id % 3) as u32), prompt, max_tokens)
    }
}

/// A prompt of `n` tokens, different for each `id`.
fn prompt(id: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((id * 7919 + i * 104_729) % 1900 + 10) as u32)
        .collect()
}

/// Steps `e` until it is empty, checking the pool after every step; tokens per request.
fn drain(e: &mut CpuEngine) -> BTreeMap<RequestId, Vec<u32>> {
    let mut out: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    let mut finished = 0;
    let mut idle = 0;
    while !e.is_empty() {
        let r = e.step().expect("step");
        e.pool().check().expect("pool invariants");
        if r.ran {
            idle = 0;
        } else {
            idle += 1;
            assert!(idle < 100_000, "engine stuck: {:?}", e.stats());
            std::thread::yield_now();
        }
        for ev in e.take_events() {
            match ev {
                EngineEvent::Token { id, token, .. } => out.entry(id).or_default().push(token),
                EngineEvent::Finished { .. } => finished += 1,
            }
        }
    }
    assert_eq!(finished, out.len());
    assert!(e.pool().illegal_transitions().is_empty());
    out
}

fn alone(dir: &Path, req: EngineRequest) -> Vec<u32> {
    let (mut e, _) = cpu_engine(dir, &opts(64, 256)).unwrap();
    let id = req.id;
    e.submit(req).unwrap();
    drain(&mut e).remove(&id).unwrap()
}

#[test]
fn warming_up_before_serving_leaves_every_output_unchanged() {
    // An 8-block HBM tier: the warm-up's 97 tokens of garbage KV fill 7 blocks, which the
    // requests then reuse; any of it read by a request would change its logits. Half of the
    // requests sample at temperature 0.8 with seeds of their own (draws keyed by position,
    // so they do not depend on how steps are batched).
    let dir = model();
    let run = |warm_up: bool| {
        let o = EngineOptions {
            warm_up,
            ..opts(8, 64)
        };
        let (mut e, _) = cpu_engine(dir.path(), &o).unwrap();
        for id in 0..6 {
            let mut r = request(id, prompt(id, 20 + 7 * id as usize), 12);
            if id % 2 == 1 {
                r.sampling.temperature = 0.8;
                r.sampling.seed = Some(id);
            }
            e.submit(r).unwrap();
        }
        drain(&mut e)
    };
    let (warm, cold) = (run(true), run(false));
    assert_eq!(warm.len(), 6);
    assert_eq!(warm, cold);
}

/// Runs `target` alone until it has received `at` tokens of service, then rotates it out
/// (or drops its KV); the other requests are admitted only then, so they take over the HBM
/// slots it left. `hold` plans later the target is restored (or admitted again).
struct Scripted {
    target: RequestId,
    at: u64,
    hold: u32,
    recompute: bool,
    served: u64,
    out_for: u32,
    done: bool,
}

impl Policy for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn plan(&mut self, _now: f64, view: &[ReqView], _cap: Capacity) -> Plan {
        let mut plan = Plan::default();
        if !self.done {
            if let Some(t) = view.iter().find(|v| v.id == self.target) {
                match t.phase {
                    Phase::Waiting => plan.admit.push(t.id),
                    Phase::Running if !t.prefilling && self.served >= self.at => {
                        self.done = true;
                        if self.recompute {
                            plan.recompute.push(t.id);
                        } else {
                            plan.rotate_out.push(t.id);
                        }
                    }
                    _ => {}
                }
            }
            return plan;
        }
        for v in view {
            if v.id != self.target {
                if v.phase == Phase::Waiting {
                    plan.admit.push(v.id);
                }
                continue;
            }
            if matches!(v.phase, Phase::Waiting | Phase::Rotary) {
                self.out_for += 1;
                if self.out_for > self.hold {
                    if v.phase == Phase::Waiting {
                        plan.admit.push(v.id);
                    } else {
                        plan.restore.push(v.id);
                    }
                }
            }
        }
        plan
    }

    fn on_service(&mut self, tenant: TenantId, _weight: f64, service: Service) {
        if tenant == TenantId((self.target.0 % 3) as u32) {
            self.served += service.prefill + service.decode;
        }
    }
}

fn preempted_run(
    dir: &Path,
    recompute: bool,
) -> (Vec<u32>, Vec<u32>, superinfer_engine::EngineStats) {
    let policy = Scripted {
        target: RequestId(1),
        at: 40 + 6,
        hold: 6,
        recompute,
        served: 0,
        out_for: 0,
        done: false,
    };
    // 6 HBM blocks: the target's 4 blocks, then the other request needs the slots it frees.
    let (mut e, _) = cpu_engine_with_policy(dir, &opts(6, 64), Box::new(policy)).unwrap();
    e.submit(request(1, prompt(1, 40), 24)).unwrap();
    e.submit(request(2, prompt(2, 50), 8)).unwrap();
    let mut out = drain(&mut e);
    let stats = e.stats();
    (
        out.remove(&RequestId(1)).unwrap(),
        out.remove(&RequestId(2)).unwrap(),
        stats,
    )
}

#[test]
fn rotation_and_recompute_leave_greedy_outputs_unchanged() {
    let dir = model();
    let want1 = alone(dir.path(), request(1, prompt(1, 40), 24));
    let want2 = alone(dir.path(), request(2, prompt(2, 50), 8));
    assert_eq!(want1.len(), 24);

    let (got1, got2, stats) = preempted_run(dir.path(), false);
    assert_eq!(stats.rotations_out, 1, "{stats:?}");
    assert_eq!(stats.restores, 1, "{stats:?}");
    assert!(stats.bytes_d2h > 0 && stats.bytes_h2d > 0, "{stats:?}");
    assert_eq!(got1, want1, "rotated out to DRAM and restored");
    assert_eq!(got2, want2);

    let (got1, got2, stats) = preempted_run(dir.path(), true);
    assert_eq!(stats.recomputes, 1, "{stats:?}");
    assert_eq!(got1, want1, "preempted by recompute");
    assert_eq!(got2, want2);
}

#[test]
fn outputs_do_not_depend_on_batch_composition() {
    let dir = model();
    let reqs: Vec<EngineRequest> = (0..8)
        .map(|i| request(i, prompt(i, 5 + 9 * i as usize), 12))
        .collect();
    let (mut e, _) = cpu_engine(dir.path(), &opts(64, 256)).unwrap();
    for r in &reqs {
        e.submit(r.clone()).unwrap();
    }
    let batched = drain(&mut e);
    for r in reqs {
        let id = r.id;
        assert_eq!(batched[&id], alone(dir.path(), r), "request {id:?}");
    }
}

#[test]
fn two_hundred_requests_under_rotation_complete_with_correct_outputs() {
    let dir = model();
    let reqs: Vec<EngineRequest> = (0..200u64)
        .map(|i| {
            let n = 3 + (i as usize * 37) % 45;
            request(i, prompt(i, n), 2 + (i % 11) as u32)
        })
        .collect();
    // Reference: everything fits, FCFS.
    let roomy = EngineOptions {
        policy: PolicyKind::Fcfs,
        ..opts(1024, 64)
    };
    let (mut e, _) = cpu_engine(dir.path(), &roomy).unwrap();
    for r in &reqs {
        e.submit(r.clone()).unwrap();
    }
    let want = drain(&mut e);
    // 40 blocks of HBM for 200 requests of 1 to 4 blocks each: constant rotation.
    let tight = EngineOptions {
        config: EngineConfig {
            b_xfer: Some(16),
            ..opts(40, 2048).config
        },
        ..opts(40, 2048)
    };
    let (mut e, _) = cpu_engine(dir.path(), &tight).unwrap();
    for r in &reqs {
        e.submit(r.clone()).unwrap();
    }
    let got = drain(&mut e);
    let stats = e.stats();
    assert!(stats.rotations_out > 0, "no rotation happened: {stats:?}");
    assert!(stats.restores > 0, "{stats:?}");
    assert_eq!(got.len(), 200);
    let mut wrong = HashMap::new();
    for (id, toks) in &got {
        if want[id] != *toks {
            wrong.insert(*id, (toks.clone(), want[id].clone()));
        }
    }
    assert!(wrong.is_empty(), "{} wrong outputs: {wrong:?}", wrong.len());
    assert_eq!(stats.hbm_used, 0);
    // Spot checks against runs alone.
    for i in [0u64, 77, 199] {
        let r = reqs[i as usize].clone();
        assert_eq!(got[&RequestId(i)], alone(dir.path(), r), "request {i}");
    }
}

#[test]
fn served_on_its_thread_streams_the_same_tokens_and_frees_aborted_requests() {
    use superinfer_engine::{spawn, HandleConfig, StreamEvent};
    let dir = model();
    let want = alone(dir.path(), request(3, prompt(3, 30), 10));
    let (engine, codec) = cpu_engine(dir.path(), &opts(64, 256)).unwrap();
    let (handle, thread) = spawn(engine, HandleConfig::default()).unwrap();
    // A client that goes away after its first token: its blocks are freed.
    let mut quitter = handle.submit(request(0, prompt(4, 40), 200)).unwrap();
    assert!(matches!(
        quitter.blocking_next(),
        Some(StreamEvent::Token { .. })
    ));
    drop(quitter);
    let mut s = handle.submit(request(0, prompt(3, 30), 10)).unwrap();
    let mut got = Vec::new();
    let mut text = codec.incremental_decoder();
    let mut streamed = String::new();
    loop {
        match s.blocking_next() {
            Some(StreamEvent::Token { token, .. }) => {
                got.push(token);
                streamed.push_str(&text.push(token));
            }
            Some(StreamEvent::Finished {
                completion_tokens, ..
            }) => {
                assert_eq!(completion_tokens, 10);
                break;
            }
            None => panic!("stream ended without Finished"),
        }
    }
    assert_eq!(got, want);
    streamed.push_str(&text.finish());
    assert_eq!(
        streamed,
        codec.decode(&got),
        "meaningless but well-formed text"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while handle.stats().hbm_used != 0 || handle.stats().running != 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", handle.stats());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    thread.shutdown();
}

/// HBM-only KV (no DRAM tier) at the default, automatic rotation budget: there is no link to
/// measure and nothing to rotate into, so the engine starts and serves; requests beyond what
/// HBM holds wait for room instead of rotating out.
#[test]
fn an_engine_without_a_dram_tier_starts_with_the_automatic_budget_and_serves() {
    let dir = model();
    for dram_blocks in [0, 1] {
        let (mut e, _) = cpu_engine(dir.path(), &opts(16, dram_blocks))
            .unwrap_or_else(|err| panic!("{dram_blocks} DRAM blocks: {err}"));
        for id in 0..4 {
            e.submit(request(id, prompt(id, 40), 8)).unwrap();
        }
        let out = drain(&mut e);
        assert_eq!(out.len(), 4, "{dram_blocks} DRAM blocks");
    }
}
