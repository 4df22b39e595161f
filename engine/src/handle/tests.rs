use super::*;
use crate::clock::RealClock;
use crate::engine::EngineConfig;
use crate::profile::Profile;
use crate::runner::sim::SimRunner;
use crate::transfer::sim::SimTransfer;
use std::time::Instant;
use superinfer_policies::{PolicyKind, TenantId, WlvfConfig};

fn start(pace: bool) -> (EngineHandle, EngineThread) {
    let profile = Profile::builtin("h200-llama-3-8b").unwrap();
    let cfg = EngineConfig {
        hbm_blocks: 256,
        dram_blocks: 512,
        ..EngineConfig::default()
    };
    let transfer = SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes());
    let runner = SimRunner::new(profile, 16);
    let policy = PolicyKind::Lvf.build(&WlvfConfig::default());
    let engine = Engine::new(cfg, policy, runner, transfer, RealClock::new()).unwrap();
    spawn(
        engine,
        HandleConfig {
            pace,
            ..HandleConfig::default()
        },
    )
    .unwrap()
}

fn request(prompt: usize, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        ignore_eos: true,
        ..EngineRequest::new(RequestId(0), TenantId(0), vec![1; prompt], max_tokens)
    }
}

fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn streams_deliver_every_token_then_one_finish() {
    let (h, thread) = start(false);
    let mut streams: Vec<RequestStream> = (0..3)
        .map(|i| h.submit(request(20 + i, 7)).unwrap())
        .collect();
    for s in &mut streams {
        let mut tokens = 0;
        let mut last_t = 0.0;
        loop {
            match s.blocking_next() {
                Some(StreamEvent::Token { t, .. }) => {
                    assert!(t >= last_t, "engine timestamps move forward");
                    last_t = t;
                    tokens += 1;
                }
                Some(StreamEvent::Finished {
                    reason,
                    completion_tokens,
                    ..
                }) => {
                    assert_eq!(reason, FinishReason::Length);
                    assert_eq!(completion_tokens, 7);
                    break;
                }
                None => panic!("stream ended without Finished"),
            }
        }
        assert_eq!(tokens, 7);
        assert_eq!(s.blocking_next(), None);
    }
    thread.shutdown();
    assert!(!h.is_running());
    assert!(matches!(h.submit(request(5, 5)), Err(EngineError::Stopped)));
}

#[test]
fn dropping_a_stream_aborts_the_request_and_frees_its_blocks() {
    // Paced: the request takes ~2000 × 6 ms, so it is surely still running when dropped.
    let (h, _thread) = start(true);
    let mut s = h.submit(request(100, 2000)).unwrap();
    assert!(matches!(s.blocking_next(), Some(StreamEvent::Token { .. })));
    assert!(h.stats().hbm_used > 0 || wait_for(|| h.stats().hbm_used > 0));
    drop(s);
    assert!(
        wait_for(|| {
            let st = h.stats();
            st.running + st.waiting == 0 && st.hbm_used == 0 && st.finished == 1
        }),
        "{:?}",
        h.stats()
    );
}

#[test]
fn a_request_the_engine_refuses_ends_with_an_error() {
    let (h, _thread) = start(false);
    let mut s = h.submit(request(0, 5)).unwrap();
    match s.blocking_next() {
        Some(StreamEvent::Finished {
            reason: FinishReason::Error,
            error: Some(msg),
            ..
        }) => {
            assert!(msg.contains("empty"), "{msg}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_token_of_a_stream_carries_the_prompts_cached_tokens() {
    // The engine sends a request's cached prefix with its first token only (the event's
    // rare part); the stream repeats it on every token, as callers that stop early read it.
    let (h, thread) = start(false);
    let prompt = |id| EngineRequest {
        id: RequestId(id),
        ..request(64, 6)
    };
    let mut first = h.submit(prompt(10)).unwrap();
    while !matches!(first.blocking_next(), Some(StreamEvent::Finished { .. })) {}
    let mut second = h.submit(prompt(11)).unwrap();
    let mut seen = Vec::new();
    let finished = loop {
        match second.blocking_next() {
            Some(StreamEvent::Token { cached, .. }) => seen.push(cached),
            Some(StreamEvent::Finished { cached, .. }) => break cached,
            None => panic!("the stream ended without a finish"),
        }
    };
    assert!(
        finished.tokens() >= 48,
        "the shared prompt was a hit: {finished:?}"
    );
    assert_eq!(seen.len(), 6);
    assert!(
        seen.iter().all(|c| *c == finished),
        "{seen:?} vs {finished:?}"
    );
    thread.shutdown();
    drop(h);
}
