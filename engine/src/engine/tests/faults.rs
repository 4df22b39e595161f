//! Faults the engine survives: a model step that fails ends its batch's requests with an
//! error, returns their blocks and leaves everyone else served.

use super::*;
use crate::runner::{ModelRunner, StepBatch, StepOutput};

/// The simulated runner, failing its `fail_at`-th step (1-based) or, with `short`, returning
/// one result too few there.
struct Flaky {
    inner: SimRunner,
    steps: u64,
    fail_at: u64,
    short: bool,
}

impl ModelRunner for Flaky {
    fn geometry(&self) -> crate::kv::BlockGeometry {
        self.inner.geometry()
    }

    fn eos_token_ids(&self) -> &[u32] {
        self.inner.eos_token_ids()
    }

    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput, EngineError> {
        self.steps += 1;
        if self.steps != self.fail_at {
            return self.inner.step(batch);
        }
        if self.short {
            let mut out = self.inner.step(batch)?;
            out.tokens.pop();
            return Ok(out);
        }
        Err(EngineError::Runner("injected fault".into()))
    }
}

fn flaky_engine(fail_at: u64, short: bool) -> Engine<Flaky, SimTransfer, VirtualClock> {
    let profile = Profile::builtin("h200-llama-3-8b").unwrap();
    let transfer = SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes());
    let runner = Flaky {
        inner: SimRunner::new(profile, 16),
        steps: 0,
        fail_at,
        short,
    };
    let cfg = EngineConfig {
        hbm_blocks: 64,
        dram_blocks: 256,
        b_xfer: Some(16),
        max_batched_tokens: 256,
        max_num_seqs: 4,
        ..EngineConfig::default()
    };
    let policy = PolicyKind::Wlvf.build(&WlvfConfig::default());
    Engine::new(cfg, policy, runner, transfer, VirtualClock::new()).unwrap()
}

#[test]
fn a_failed_model_step_ends_only_its_batch_and_the_engine_serves_on() {
    for short in [false, true] {
        let mut e = flaky_engine(5, short);
        // Four fit the seats and run in step 5; two more wait for a seat.
        for i in 0..6 {
            e.submit(request(i, (i % 2) as u32, 40, 20)).unwrap();
        }
        let mut finished: HashMap<u64, (FinishReason, Option<String>)> = HashMap::new();
        for _ in 0..400 {
            e.step().unwrap();
            for ev in e.take_events() {
                if let EngineEvent::Finished { id, end, .. } = ev {
                    assert!(
                        finished.insert(id.0, (end.reason, end.error)).is_none(),
                        "twice"
                    );
                }
            }
            e.pool().check().unwrap();
            if e.is_empty() {
                break;
            }
        }
        assert_eq!(finished.len(), 6, "every request ended once: {finished:?}");
        let failed: Vec<u64> = finished
            .iter()
            .filter(|(_, (r, _))| *r == FinishReason::Error)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(failed.len(), 4, "the failed step's batch: {finished:?}");
        for id in &failed {
            let msg = finished[id].1.as_deref().unwrap_or("");
            let want = if short {
                "results for"
            } else {
                "injected fault"
            };
            assert!(msg.contains(want), "{msg}");
        }
        // The two that waited were served after the fault, to their length.
        for id in [4, 5] {
            assert_eq!(finished[&id].0, FinishReason::Length, "{finished:?}");
        }
        assert_eq!(e.stats().failed_steps, 1);
        assert_eq!(
            e.pool().hbm_available(),
            64,
            "blocks of the failed batch returned"
        );
    }
}

/// Runs `n` requests on a tight HBM tier (rotation every few steps), injecting `fault` into
/// every `every`-th copy batch up to `faults` of them; checks the pool after every step.
/// Returns the engine once every request finished, and each one's token count.
fn rotate_with_faults(
    fault: crate::transfer::CopyFault,
    every: u64,
    faults: u64,
) -> (TestEngine, HashMap<u64, (FinishReason, u32)>) {
    let mut e = engine_with(
        PolicyKind::Wlvf,
        EngineConfig {
            hbm_blocks: 40,
            dram_blocks: 400,
            b_xfer: Some(16),
            max_batched_tokens: 256,
            max_num_seqs: 64,
            copy_timeout_s: 1.0,
            ..EngineConfig::default()
        },
    );
    for i in 0..40 {
        e.submit(request(i, (i % 3) as u32, 60 + (i as u32 % 5) * 20, 40))
            .unwrap();
    }
    let (mut injected, mut batches_seen) = (0, 0);
    let mut done: HashMap<u64, (FinishReason, u32)> = HashMap::new();
    for _ in 0..20_000 {
        let before = e.stats();
        let r = e.step().unwrap();
        let after = e.stats();
        if after.bytes_h2d + after.bytes_d2h > before.bytes_h2d + before.bytes_d2h {
            batches_seen += 1;
            if batches_seen % every == 0 && injected < faults {
                e.transfer_mut().inject(fault);
                injected += 1;
            }
        }
        if let Some(t) = r.idle_until {
            e.clock_mut().skip_to(t);
        }
        for ev in e.take_events() {
            if let EngineEvent::Finished { id, end, .. } = ev {
                assert!(done
                    .insert(id.0, (end.reason, end.completion_tokens))
                    .is_none());
            }
        }
        e.pool().check().unwrap();
        if e.is_empty() {
            break;
        }
    }
    assert_eq!(injected, faults, "not enough copy batches to inject into");
    assert!(e.is_empty(), "a request is still live: {:?}", e.stats());
    (e, done)
}

#[test]
fn failed_copy_batches_recompute_their_requests_and_leak_nothing() {
    let (e, done) = rotate_with_faults(crate::transfer::CopyFault::Fail, 3, 8);
    assert_eq!(done.len(), 40, "every request ends once");
    assert!(
        done.values()
            .all(|&(r, n)| r == FinishReason::Length && n == 40),
        "{done:?}"
    );
    let s = e.stats();
    // A batch has a ticket per direction that has copies; each faults.
    assert!((8..=16).contains(&s.copy_faults), "{s:?}");
    assert!(s.recomputes > 0, "{s:?}");
    // Everything is free again (unreferenced cache entries count as free).
    assert_eq!((s.hbm_used, s.dram_used), (0, 0), "{s:?}");
}

#[test]
fn a_copy_batch_that_never_lands_times_out_and_only_its_slots_stay_quarantined() {
    let (mut e, done) = rotate_with_faults(crate::transfer::CopyFault::Hang, 4, 1);
    assert_eq!(done.len(), 40);
    assert!(done
        .values()
        .all(|&(r, n)| r == FinishReason::Length && n == 40));
    let s = e.stats();
    assert!((1..=2).contains(&s.copy_faults), "{s:?}");
    // The hung batch may still write its destinations and read its sources: those slots stay
    // out of use, nothing else does.
    let hung = e.transfer_mut().hung_blocks() as u32;
    assert!(hung > 0);
    assert!(
        s.hbm_used + s.dram_used <= 2 * hung && s.hbm_used + s.dram_used > 0,
        "{hung} blocks hung: {s:?}"
    );
}
