//! The copy timeout against model steps longer than it (a CPU model on long prompts): copies
//! that land during such a step, or are reported only at the poll after it, are no faults;
//! a batch that never lands still is one.

use super::*;
use crate::runner::{ModelRunner, StepBatch, StepOutput};
use crate::transfer::{CopyBatch, CopyFault, Ticket, Tickets, Transfer};

/// Every step's reported time: over the default 10-s copy timeout.
const STEP_S: f64 = 15.0;

/// The simulated runner, every step taking [`STEP_S`].
struct SlowSteps(SimRunner);

impl ModelRunner for SlowSteps {
    fn geometry(&self) -> crate::kv::BlockGeometry {
        self.0.geometry()
    }

    fn eos_token_ids(&self) -> &[u32] {
        self.0.eos_token_ids()
    }

    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput, EngineError> {
        let mut out = self.0.step(batch)?;
        out.elapsed = STEP_S;
        Ok(out)
    }
}

/// The simulated copy engine; with `lag`, each ticket is reported one poll after it landed,
/// as a copy worker starved of CPU by the step finishes just after the engine looked.
struct Lagging {
    inner: SimTransfer,
    lag: bool,
    /// Tickets landed by the previous poll, reported at the next.
    held: Vec<Ticket>,
    /// Tickets reported a poll late so far.
    late_reports: u64,
    last_poll: f64,
}

impl Transfer for Lagging {
    fn submit(&mut self, now: f64, batch: CopyBatch) -> Tickets {
        self.inner.submit(now, batch)
    }

    fn poll(&mut self, now: f64) -> Vec<Ticket> {
        self.last_poll = now;
        let landed = self.inner.poll(now);
        if !self.lag {
            return landed;
        }
        self.late_reports += self.held.len() as u64;
        std::mem::replace(&mut self.held, landed)
    }

    fn take_failed(&mut self) -> Vec<(Ticket, String)> {
        self.inner.take_failed()
    }

    fn next_completion(&self) -> Option<f64> {
        let held = (!self.held.is_empty()).then_some(self.last_poll);
        [held, self.inner.next_completion()]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }

    fn bytes_moved(&self) -> (u64, u64) {
        self.inner.bytes_moved()
    }

    fn block_bytes(&self) -> u64 {
        self.inner.block_bytes()
    }

    fn modelled_rate(&self) -> Option<f64> {
        self.inner.modelled_rate()
    }
}

type SlowEngine = Engine<SlowSteps, Lagging, VirtualClock>;

/// A tight HBM tier (rotation every few steps) at the default copy timeout.
fn slow_engine(lag: bool) -> SlowEngine {
    let profile = Profile::builtin("h200-llama-3-8b").unwrap();
    let transfer = Lagging {
        inner: SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes()),
        lag,
        held: Vec::new(),
        late_reports: 0,
        last_poll: 0.0,
    };
    let cfg = EngineConfig {
        hbm_blocks: 40,
        dram_blocks: 400,
        b_xfer: Some(16),
        max_batched_tokens: 256,
        max_num_seqs: 64,
        // Steps of minutes: every queued request would pass its queue deadline; this test is
        // about copies, and wants each request served to its end.
        queue_deadline_ttfts: None,
        ..EngineConfig::default()
    };
    assert!(STEP_S > cfg.copy_timeout_s);
    let policy = PolicyKind::Wlvf.build(&WlvfConfig::default());
    let runner = SlowSteps(SimRunner::new(profile, 16));
    Engine::new(cfg, policy, runner, transfer, VirtualClock::new()).unwrap()
}

/// Serves 24 requests to the end, making the first copy batch hang when `hang`; returns the
/// engine and each request's end and token count.
fn serve_slowly(lag: bool, hang: bool) -> (SlowEngine, HashMap<u64, (FinishReason, u32)>) {
    let mut e = slow_engine(lag);
    if hang {
        e.transfer_mut().inner.inject(CopyFault::Hang);
    }
    for i in 0..24 {
        e.submit(request(i, (i % 3) as u32, 60 + (i as u32 % 5) * 20, 40))
            .unwrap();
    }
    let mut done = HashMap::new();
    for _ in 0..20_000 {
        let r = e.step().unwrap();
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
    assert!(e.is_empty(), "a request is still live: {:?}", e.stats());
    (e, done)
}

/// All 24 requests ended once, each at its full 40 tokens.
fn assert_every_request_ends_once(lag: bool, done: &HashMap<u64, (FinishReason, u32)>) {
    assert_eq!(done.len(), 24, "lag {lag}: every request ends once");
    assert!(
        done.values()
            .all(|&(r, n)| r == FinishReason::Length && n == 40),
        "lag {lag}: {done:?}"
    );
}

#[test]
fn copies_issued_before_a_step_longer_than_the_timeout_are_not_faults() {
    for lag in [false, true] {
        let (e, done) = serve_slowly(lag, false);
        assert_every_request_ends_once(lag, &done);
        let s = e.stats();
        assert!(s.rotations_out > 0 && s.bytes_d2h > 0, "lag {lag}: {s:?}");
        if lag {
            assert!(e.transfer.late_reports > 0, "no copy was reported late");
        }
        assert_eq!((s.copy_faults, s.recomputes), (0, 0), "lag {lag}: {s:?}");
    }
}

#[test]
fn a_copy_that_never_lands_is_a_fault_even_when_every_step_is_longer_than_the_timeout() {
    for lag in [false, true] {
        let (e, done) = serve_slowly(lag, true);
        assert_every_request_ends_once(lag, &done);
        let s = e.stats();
        assert!((1..=2).contains(&s.copy_faults), "lag {lag}: {s:?}");
    }
}
