//! Prompt log-probabilities (`SamplingParams::prompt_logprobs`, completions' `echo` with
//! `logprobs`) on the CPU model path, against an independent reading of the same model: each
//! prompt token's score equals the log-probability the model gives it when that prefix is
//! a prompt of its own (read from the full distribution of a one-token request). Chunked
//! prefill, other requests in the batch and the prefix cache change nothing; a runner without
//! them (the simulated one) refuses such a request.

use std::collections::BTreeMap;
use superinfer_engine::clock::VirtualClock;
use superinfer_engine::model::tiny::write_tiny_model;
use superinfer_engine::profile::Profile;
use superinfer_engine::runner::sim::SimRunner;
use superinfer_engine::serve::{cpu_engine, CpuEngine, EngineOptions};
use superinfer_engine::transfer::sim::SimTransfer;
use superinfer_engine::{
    Engine, EngineConfig, EngineError, EngineEvent, EngineRequest, SamplingParams, TokenLogprobs,
};
use superinfer_policies::{PolicyKind, RequestId, TenantId, WlvfConfig};

fn request(id: u64, prompt: Vec<u32>, sampling: SamplingParams) -> EngineRequest {
    EngineRequest {
        ignore_eos: true,
        sampling,
        ..EngineRequest::new(RequestId(id), TenantId(0), prompt, 1)
    }
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 104_729) % 1900 + 10) as u32)
        .collect()
}

/// Runs `e` dry; per request: its first token's log-probabilities and its prompt scores.
type Out = BTreeMap<RequestId, (Option<TokenLogprobs>, Vec<TokenLogprobs>, u32)>;

fn drain(e: &mut CpuEngine) -> Out {
    let mut out = Out::new();
    while !e.is_empty() {
        e.step().expect("step");
        e.pool().check().expect("pool invariants");
        for ev in e.take_events() {
            match ev {
                EngineEvent::Token { id, extra, .. } => {
                    let extra = extra.map(|x| *x).unwrap_or_default();
                    let o = out.entry(id).or_default();
                    o.0 = extra.logprobs;
                    o.1.extend(extra.prompt_logprobs);
                }
                EngineEvent::Finished { id, end, .. } => {
                    out.entry(id).or_default().2 = end.cached.tokens();
                }
            }
        }
    }
    out
}

fn opts(max_batched_tokens: u32) -> EngineOptions {
    EngineOptions {
        hbm_blocks: Some(128),
        dram_blocks: Some(256),
        config: EngineConfig {
            max_batched_tokens,
            ..EngineConfig::default()
        },
        seed: Some(1),
        ..EngineOptions::default()
    }
}

#[test]
fn prompt_scores_match_each_prefix_read_alone() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 5).unwrap();
    let p = prompt(40);
    let scoring = SamplingParams {
        prompt_logprobs: Some(3),
        ..SamplingParams::default()
    };
    // One chunk, then chunks of 16 tokens beside another request, then again with the
    // prompt's blocks cached: the same scores.
    let mut runs = Vec::new();
    for (budget, neighbour, warm) in [(256, false, false), (16, true, false), (16, true, true)] {
        let (mut e, _) = cpu_engine(dir.path(), &opts(budget)).unwrap();
        if warm {
            // The same prompt served first: its full blocks are cache entries now.
            e.submit(request(3, p.clone(), SamplingParams::default()))
                .unwrap();
            drain(&mut e);
            e.submit(request(4, p.clone(), SamplingParams::default()))
                .unwrap();
            assert!(drain(&mut e)[&RequestId(4)].2 > 0, "the prompt is cached");
        }
        e.submit(request(1, p.clone(), scoring.clone())).unwrap();
        if neighbour {
            e.submit(request(2, prompt(23), SamplingParams::default()))
                .unwrap();
        }
        let out = drain(&mut e);
        let (_, scores, cached) = out[&RequestId(1)].clone();
        assert_eq!(
            cached, 0,
            "a scoring request is never served from the cache"
        );
        assert_eq!(scores.len(), p.len() - 1);
        runs.push(scores);
        if neighbour {
            assert!(out[&RequestId(2)].1.is_empty(), "only asked-for scores");
        }
    }
    for r in &runs[1..] {
        for (a, b) in runs[0].iter().zip(r) {
            assert!((a.logprob - b.logprob).abs() < 1e-4, "{a:?} vs {b:?}");
            assert_eq!(a.top.len(), 3);
        }
    }
    // The reference: prefix p[..k] as a prompt of its own, the whole distribution of its
    // first token; p[k]'s entry in it is p[k]'s score.
    let (mut e, _) = cpu_engine(dir.path(), &opts(256)).unwrap();
    let full = SamplingParams {
        logprobs: Some(u32::MAX),
        ..SamplingParams::default()
    };
    for k in 1..p.len() {
        e.submit(request(100 + k as u64, p[..k].to_vec(), full.clone()))
            .unwrap();
    }
    let reference = drain(&mut e);
    for k in 1..p.len() {
        let dist = reference[&RequestId(100 + k as u64)]
            .0
            .clone()
            .expect("logprobs");
        let want = dist
            .top
            .iter()
            .find(|(t, _)| *t == p[k])
            .map(|&(_, lp)| lp)
            .expect("every token is in the whole distribution");
        let got = &runs[0][k - 1];
        assert!(
            (got.logprob - want).abs() < 1e-3,
            "token {k}: scored {} but alone {want}",
            got.logprob
        );
        assert!(got.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(got.logprob <= got.top[0].1 + 1e-6);
    }
}

#[test]
fn a_runner_without_prompt_scores_refuses_the_request() {
    let profile = Profile::builtin("h200-llama-3-8b").unwrap();
    let transfer = SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes());
    let mut e = Engine::new(
        EngineConfig::default(),
        PolicyKind::Fcfs.build(&WlvfConfig::default()),
        SimRunner::new(profile, 16),
        transfer,
        VirtualClock::new(),
    )
    .unwrap();
    let scoring = SamplingParams {
        prompt_logprobs: Some(0),
        ..SamplingParams::default()
    };
    let err = e.submit(request(1, prompt(8), scoring)).unwrap_err();
    assert!(matches!(err, EngineError::Unsupported { .. }), "{err}");
    assert!(e.is_empty());
}

#[test]
fn a_long_scored_prompt_runs_in_chunks_of_bounded_size() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 5).unwrap();
    let (mut e, _) = cpu_engine(dir.path(), &opts(2048)).unwrap();
    let scoring = SamplingParams {
        prompt_logprobs: Some(1),
        ..SamplingParams::default()
    };
    e.submit(request(1, prompt(700), scoring)).unwrap();
    let mut scores = Vec::new();
    let mut chunks = Vec::new();
    while !e.is_empty() {
        let r = e.step().expect("step");
        if r.prefill_tokens > 0 {
            chunks.push(r.prefill_tokens);
        }
        for ev in e.take_events() {
            if let EngineEvent::Token { extra: Some(x), .. } = ev {
                scores.extend(x.prompt_logprobs);
            }
        }
    }
    // 700 tokens under a budget of 2,048: in chunks of at most 256 all the same.
    assert_eq!(chunks, [256, 256, 188], "{chunks:?}");
    assert_eq!(scores.len(), 699);
}
