use super::*;
use crate::clock::RealClock;
use crate::engine::EngineConfig;
use crate::profile::Profile;
use crate::runner::sim::SimRunner;
use crate::runner::ModelRunner;
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
    // The refusal is known before any event is read: an HTTP server answers it with an error
    // instead of starting a stream.
    assert!(!s.blocking_accepted());
    let mut fine = h.submit(request(8, 5)).unwrap();
    assert!(fine.blocking_accepted());
    match s.blocking_next() {
        Some(StreamEvent::Finished {
            reason: FinishReason::Error,
            error: Some(msg),
            error_kind,
            ..
        }) => {
            assert!(msg.contains("empty"), "{msg}");
            assert_eq!(error_kind, Some(StreamErrorKind::Request));
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

/// The simulated runner, panicking in its first step after `fail` is set. Before it panics it
/// says it is in that step (`entered`) and waits for `go`, so a test can queue submits that
/// the failure finds in the inbox.
struct Panicky {
    inner: SimRunner,
    fail: Arc<AtomicBool>,
    entered: mpsc::SyncSender<()>,
    go: mpsc::Receiver<()>,
}

impl ModelRunner for Panicky {
    fn geometry(&self) -> crate::kv::BlockGeometry {
        self.inner.geometry()
    }

    fn eos_token_ids(&self) -> &[u32] {
        self.inner.eos_token_ids()
    }

    fn step(
        &mut self,
        batch: &crate::runner::StepBatch<'_>,
    ) -> Result<crate::runner::StepOutput, EngineError> {
        if self.fail.load(Ordering::Acquire) {
            let _ = self.entered.send(());
            let _ = self.go.recv();
            panic!("injected step panic");
        }
        self.inner.step(batch)
    }
}

/// A paced engine over [`Panicky`]: its trigger, the `entered` receiver and the `go` sender.
fn start_panicky() -> (
    EngineHandle,
    EngineThread,
    Arc<AtomicBool>,
    mpsc::Receiver<()>,
    mpsc::SyncSender<()>,
) {
    let profile = Profile::builtin("h200-llama-3-8b").unwrap();
    let cfg = EngineConfig {
        hbm_blocks: 256,
        dram_blocks: 512,
        ..EngineConfig::default()
    };
    let transfer = SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes());
    let fail = Arc::new(AtomicBool::new(false));
    let (entered_tx, entered) = mpsc::sync_channel(1);
    let (go, go_rx) = mpsc::sync_channel(1);
    let runner = Panicky {
        inner: SimRunner::new(profile, 16),
        fail: fail.clone(),
        entered: entered_tx,
        go: go_rx,
    };
    let policy = PolicyKind::Lvf.build(&WlvfConfig::default());
    let engine = Engine::new(cfg, policy, runner, transfer, RealClock::new()).unwrap();
    let pace = HandleConfig {
        pace: true,
        ..HandleConfig::default()
    };
    let (h, thread) = spawn(engine, pace).unwrap();
    (h, thread, fail, entered, go)
}

/// Reads `s` to its end, skipping tokens; panics if it closes without one.
fn end_of(s: &mut RequestStream) -> StreamEvent {
    loop {
        match s.blocking_next() {
            Some(StreamEvent::Token { .. }) => {}
            Some(end) => return end,
            None => panic!("request {:?}: the stream closed without an end", s.id),
        }
    }
}

/// Asserts that `end` is the typed end of a request the engine's failure cut short.
fn assert_engine_failed(end: &StreamEvent) {
    let StreamEvent::Finished {
        reason: FinishReason::Error,
        error: Some(msg),
        error_kind: Some(StreamErrorKind::EngineFailed),
        ..
    } = end
    else {
        panic!("not an engine-failure end: {end:?}");
    };
    assert!(msg.contains("injected step panic"), "{msg}");
}

#[test]
fn a_panicking_step_fails_the_engine_and_ends_every_request_with_a_typed_error() {
    let (h, thread, fail, entered, go) = start_panicky();
    assert_eq!(h.health(), EngineHealth::Running);
    // Paced at the profile's speed, 2,000 tokens are far from done when the panic comes.
    let mut running: Vec<RequestStream> = (0..2)
        .map(|i| h.submit(request(30 + i, 2000)).unwrap())
        .collect();
    for s in &mut running {
        assert!(matches!(s.blocking_next(), Some(StreamEvent::Token { .. })));
    }
    fail.store(true, Ordering::Release);
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the engine steps while requests run");
    // The loop is inside the failing step: this one waits in the inbox.
    let mut queued = h.submit(request(12, 5)).unwrap();
    go.send(()).unwrap();
    let start = Instant::now();
    while h.health() == EngineHealth::Running && start.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(2));
    }
    match h.health() {
        EngineHealth::Failed { message } => assert!(message.contains("injected"), "{message}"),
        other => panic!("not failed within 1 s: {other:?}"),
    }
    for s in running.iter_mut().chain([&mut queued]) {
        assert_engine_failed(&end_of(s));
        assert_eq!(s.blocking_next(), None, "the end is the last event");
    }
    assert!(!h.is_running());
    assert!(matches!(h.submit(request(5, 5)), Err(EngineError::Stopped)));
    assert_eq!(h.panics(), 1);
    thread.shutdown();
    assert!(matches!(h.health(), EngineHealth::Failed { .. }));
}

#[test]
fn a_shut_down_engine_is_stopped_not_failed() {
    let (h, thread) = start(false);
    assert_eq!(h.health(), EngineHealth::Running);
    thread.shutdown();
    assert_eq!((h.health(), h.panics()), (EngineHealth::Stopped, 0));
}

#[test]
fn a_panics_message_is_read_from_str_and_string_payloads() {
    let of = |f: fn()| panic_message(std::panic::catch_unwind(f).unwrap_err().as_ref());
    assert_eq!(of(|| panic!("plain")), "plain");
    assert_eq!(of(|| panic!("formatted {}", 7)), "formatted 7");
    assert_eq!(
        of(|| std::panic::panic_any(7_u32)),
        "a panic without a message"
    );
}
