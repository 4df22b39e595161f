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
                if let EngineEvent::Finished {
                    id, reason, error, ..
                } = ev
                {
                    assert!(finished.insert(id.0, (reason, error)).is_none(), "twice");
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
