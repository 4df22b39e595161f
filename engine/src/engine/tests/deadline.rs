//! Queue deadlines (`engine/src/engine/deadline.rs`): a request still waiting for its first
//! admission at its deadline is shed with its cause; none is admitted after it; a request
//! with a token, or one with a later deadline of its own, is never shed.

use super::*;

fn one_at_a_time(deadline_ttfts: Option<f64>) -> TestEngine {
    // 16 blocks of HBM: one request of 100 + 100 tokens (13 blocks) runs at a time.
    engine_with(
        PolicyKind::Fcfs,
        EngineConfig {
            hbm_blocks: 16,
            dram_blocks: 64,
            b_xfer: Some(16),
            max_batched_tokens: 256,
            max_num_seqs: 64,
            queue_deadline_ttfts: deadline_ttfts,
            ..EngineConfig::default()
        },
    )
}

fn with_ttft(mut r: EngineRequest, ttft_s: f64) -> EngineRequest {
    r.slo = Slo { ttft_s, tbt_s: 0.1 };
    r
}

#[test]
fn a_request_still_queued_at_its_deadline_is_shed_and_none_starts_after_it() {
    // TTFT target 0.5 s, deadline 3 × 0.5 = 1.5 s; each request takes ~1.5 s of decode, so a
    // queue of 8 cannot all start in time.
    let mut e = one_at_a_time(Some(3.0));
    for i in 0..8 {
        e.submit(with_ttft(request(i, 0, 100, 100), 0.5)).unwrap();
    }
    // Request 8 names its own, longer deadline: it is served whatever the queue.
    let mut own = with_ttft(request(8, 0, 100, 100), 0.5);
    own.queue_deadline_s = Some(1000.0);
    e.submit(own).unwrap();
    let mut first = HashMap::new();
    let mut shed = Vec::new();
    let mut finished = 0;
    for _ in 0..200_000 {
        if e.is_empty() {
            break;
        }
        e.clock_mut().advance(0.005);
        e.step().unwrap();
        for ev in e.take_events() {
            match ev {
                EngineEvent::Token { id, t, .. } => {
                    first.entry(id).or_insert(t);
                }
                EngineEvent::Finished { id, t, end } => {
                    finished += 1;
                    if end.error_cause == Some(ErrorCause::QueueDeadline) {
                        assert_eq!(end.reason, FinishReason::Error);
                        assert_eq!(end.completion_tokens, 0);
                        assert!(!first.contains_key(&id), "{id:?} had a token and was shed");
                        assert!(t >= 1.5 - 1e-9, "{id:?} shed at {t}, before its deadline");
                        assert!(
                            end.error
                                .as_deref()
                                .is_some_and(|m| m.contains("queue deadline")),
                            "{:?}",
                            end.error
                        );
                        shed.push(id);
                    }
                }
            }
        }
    }
    assert_eq!(finished, 9, "every request ended");
    assert!(
        shed.len() >= 3,
        "the queue outlived its deadlines: {shed:?}"
    );
    assert!(!shed.contains(&RequestId(8)), "its own deadline is later");
    assert!(first.contains_key(&RequestId(0)), "the first one ran");
    assert_eq!(e.stats().shed_deadline, shed.len() as u64);
    for (id, t) in &first {
        if *id != RequestId(8) {
            assert!(*t <= 1.5 + 0.01, "{id:?} started at {t}, past its deadline");
        }
    }
}

#[test]
fn without_a_deadline_nothing_is_shed_and_bad_deadlines_are_refused() {
    let mut e = one_at_a_time(None);
    for i in 0..4 {
        e.submit(with_ttft(request(i, 0, 100, 100), 0.1)).unwrap();
    }
    let events = drain(&mut e, 100_000);
    let ends = events
        .iter()
        .filter(|ev| matches!(ev, EngineEvent::Finished { end, .. } if end.reason == FinishReason::Length))
        .count();
    assert_eq!(ends, 4);
    assert_eq!(e.stats().shed_deadline, 0);

    let mut bad = request(10, 0, 10, 10);
    bad.queue_deadline_s = Some(0.0);
    assert!(matches!(e.submit(bad), Err(EngineError::BadRequest { .. })));
    assert!(e.request(RequestId(10)).is_none(), "nothing kept");
    for k in [-1.0, f64::NAN, f64::INFINITY] {
        let cfg = EngineConfig {
            queue_deadline_ttfts: Some(k),
            ..EngineConfig::default()
        };
        let profile = Profile::builtin("h200-llama-3-8b").unwrap();
        let transfer = SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes());
        let made = Engine::new(
            cfg,
            PolicyKind::Fcfs.build(&WlvfConfig::default()),
            SimRunner::new(profile, 16),
            transfer,
            VirtualClock::new(),
        );
        assert!(matches!(made, Err(EngineError::Config(_))), "{k}");
    }
    assert_eq!(EngineConfig::queue_deadline_setting(Some(0.0)), Ok(None));
    assert_eq!(
        EngineConfig::queue_deadline_setting(None),
        Ok(Some(DEFAULT_QUEUE_DEADLINE_TTFTS))
    );
    assert!(EngineConfig::queue_deadline_setting(Some(-2.0)).is_err());
}
