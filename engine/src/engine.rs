//! The engine: a state machine driven by [`Engine::step`]. One step = poll finished copies →
//! ask the policy for a plan → apply it to the KV pool (rotations, restores, admissions,
//! eager writebacks) → issue the copies → run one batch → turn its output into events.
//! It never sleeps or spawns; the clock, runner and copy engine are parameters.

mod apply;
mod batch;
mod config;
mod copy_fault;
mod deadline;
mod expire;
mod gpu_time;
mod plan;
mod scratch;
mod shed;
mod step_budget;
mod step_trace;
mod xfer;

pub use config::{EngineConfig, DEFAULT_QUEUE_DEADLINE_TTFTS, DEFAULT_STEP_TBT_SHARE};
pub use xfer::measure_duplex_rate;

use crate::clock::Clock;
use crate::error::EngineError;
use crate::kv::{CacheScope, KvPool, PrefixHit};
use crate::request::{EngineRequest, ErrorCause, FinishReason, ReqState, Request};
use crate::runner::ModelRunner;
use crate::sampling::TokenLogprobs;
use crate::transfer::Transfer;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use superinfer_policies::{Policy, RequestId};

/// What the engine tells its caller, in order. Kept small (32 bytes, what is rare is boxed):
/// a step of 2,000 decodes writes 2,000 `Token`s, and at 88 bytes writing them was a sixth of
/// the step's host time (docs/BENCHMARKS.md, "Per-step cost of the engine").
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A token was produced at engine time `t`.
    Token {
        id: RequestId,
        token: u32,
        t: f64,
        /// What only some tokens carry: `Some` with every token of a request that asked for
        /// log-probabilities, and with a request's first token when its prompt was found in
        /// the prefix cache or scored; `None` otherwise (most tokens).
        extra: Option<Box<TokenExtra>>,
    },
    /// The request ended (exactly once per request) at engine time `t`.
    Finished {
        id: RequestId,
        t: f64,
        end: Box<RequestEnd>,
    },
}

// A plain token's event stays small (see `EngineEvent`).
const _: () = assert!(std::mem::size_of::<EngineEvent>() <= 32);

/// How a request ended ([`EngineEvent::Finished`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestEnd {
    pub reason: FinishReason,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Times it lost its place in HBM (rotations out and recomputes).
    pub preemptions: u32,
    /// With `FinishReason::Error`: what went wrong.
    pub error: Option<String>,
    /// With `FinishReason::Error`: whether it was the request's own fault or it was shed.
    pub error_cause: Option<ErrorCause>,
    /// Prompt tokens found in the prefix cache at its first admission.
    pub cached: PrefixHit,
    /// Seconds from its arrival to its first admission (to its end if it was never admitted).
    pub queued_s: f64,
    /// Seconds of the GPU's steps it took: each step's time split among its entries by the
    /// runner's cost model (`engine/gpu_time.rs`).
    pub gpu_s: f64,
    /// Seconds of host CPU its grammar's token masks took (charged to its tenant's
    /// fairness counter beside its GPU share).
    pub mask_s: f64,
}

/// The rare parts of a [`EngineEvent::Token`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenExtra {
    /// The token's log-probabilities (`SamplingParams::logprobs`).
    pub logprobs: Option<TokenLogprobs>,
    /// Prompt tokens found in the prefix cache at its first admission (as `Finished`'s), so a
    /// caller that stops the request early still knows them. Sent with the first token; a
    /// token without `extra` has the same as the request's earlier ones.
    pub cached: PrefixHit,
    /// With the first token of a request with `SamplingParams::prompt_logprobs`: the scores
    /// of prompt tokens `1..` (entry `i` is token `i + 1`'s); empty otherwise.
    pub prompt_logprobs: Vec<TokenLogprobs>,
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// A batch ran.
    pub ran: bool,
    /// Seconds the batch took.
    pub elapsed: f64,
    pub batch_size: usize,
    pub prefill_tokens: u32,
    pub decode_tokens: u32,
    /// Bytes of KV the batch's attention reads: every entry's keys and values up to its end,
    /// over all layers (each once; what a step's HBM traffic for attention is at least).
    pub kv_read_bytes: u64,
    /// Nothing could run: the engine time of the next copy completion (on a virtual clock),
    /// of the next copy timeout or of the next queue deadline, whichever is first.
    pub idle_until: Option<f64>,
}

/// Counters and gauges for metrics and tests.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineStats {
    pub waiting: usize,
    pub running: usize,
    pub rotary: usize,
    pub evicting: usize,
    pub restoring: usize,
    /// Blocks in use (cached blocks nobody uses count as free).
    pub hbm_used: u32,
    pub hbm_capacity: u32,
    pub dram_used: u32,
    pub dram_capacity: u32,
    pub admitted: u64,
    pub rotations_out: u64,
    pub restores: u64,
    pub recomputes: u64,
    pub finished: u64,
    /// Model steps that failed (their batch's requests ended with an error).
    pub failed_steps: u64,
    /// Copy tickets (one direction of one batch) that failed or timed out; the requests they
    /// touched were recomputed.
    pub copy_faults: u64,
    /// Requests refused at submit because they would wait past their TTFT SLO.
    pub shed: u64,
    /// Requests shed while waiting, at their queue deadline.
    pub shed_deadline: u64,
    pub steps: u64,
    pub bytes_h2d: u64,
    pub bytes_d2h: u64,
    /// The rotation budget of the latest plan, blocks per direction.
    pub b_xfer: u32,
    /// The link's rate the automatic budget uses: blocks per second per direction with both
    /// directions busy (measured at start, or the twin's profile); 0 with a fixed budget.
    pub link_blocks_per_s: f64,
    /// Measured over predicted step time, as the step time budget learned it (1 until the
    /// runner's steps run slower than its cost model; `step_budget::Calibration`).
    pub step_cost_scale: f64,
    /// Prefix-cache blocks with a copy in HBM / in DRAM (an entry may have both).
    pub prefix_hbm_blocks: u32,
    pub prefix_dram_blocks: u32,
    /// Prompt tokens looked up in the prefix cache at first admissions, and those found, by
    /// tier.
    pub prefix_query_tokens: u64,
    pub prefix_hit_hbm_tokens: u64,
    pub prefix_hit_dram_tokens: u64,
    /// Tokens per KV block (the configured block size).
    pub block_size: u32,
}

/// Live requests per state, kept as they move (so no step counts them by scanning).
#[derive(Clone, Debug, Default)]
struct Census([usize; 5]);

impl Census {
    fn slot(s: ReqState) -> usize {
        match s {
            ReqState::Waiting => 0,
            ReqState::Running => 1,
            ReqState::Rotary => 2,
            ReqState::Evicting => 3,
            ReqState::Restoring => 4,
        }
    }

    fn count(&self, s: ReqState) -> usize {
        self.0[Census::slot(s)]
    }

    fn add(&mut self, s: ReqState) {
        self.0[Census::slot(s)] += 1;
    }

    fn remove(&mut self, s: ReqState) {
        self.0[Census::slot(s)] -= 1;
    }
}

/// The engine over a runner `R`, a copy engine `T` and a clock `C`.
pub struct Engine<R, T, C> {
    cfg: EngineConfig,
    policy: Box<dyn Policy>,
    runner: R,
    transfer: T,
    clock: C,
    pool: KvPool,
    requests: BTreeMap<RequestId, Request>,
    /// Requests with copies in flight (Evicting or Restoring).
    transit: BTreeSet<RequestId>,
    /// Tickets submitted and not yet landed, with their submit time (for the copy timeout).
    outstanding: BTreeMap<crate::transfer::Ticket, f64>,
    /// Engine time of the latest poll of the copy engine: the copy timeout is judged at it.
    last_poll: Option<f64>,
    events: Vec<EngineEvent>,
    counters: EngineStats,
    census: Census,
    late: shed::LateGuard,
    deadlines: deadline::Deadlines,
    /// The runner's step cost, when it knows it (the step time budget uses it).
    cost: Option<crate::runner::StepCost>,
    /// How much slower than `cost` predicts the runner's steps run.
    calibration: step_budget::Calibration,
    /// Start of the previous step, if the engine still had live requests after it (so the
    /// time since is iteration time, not idle time).
    busy_since: Option<f64>,
    /// The latest batch's record, completed with its iteration time when the next step
    /// starts (the calibration's measurement, and the step trace's line).
    last_step: Option<step_trace::StepRecord>,
    trace: step_trace::StepTrace,
    xfer: xfer::XferBudget,
    /// Requests that may have full blocks not yet written back (a block filled since their
    /// last complete writeback), oldest first: eager writeback visits only these.
    writeback_due: BTreeSet<RequestId>,
    /// Running requests that may need a block for their next token (their blocks were
    /// exactly full when they last ran or were restored): growth looks only at these.
    grow_due: Vec<RequestId>,
    /// The matcher of each live request with a grammar (structured outputs): a field of its
    /// own, so that a step's masks are computed on a worker while the runner runs.
    constraints: BTreeMap<RequestId, llguidance::Matcher>,
    /// The step's buffers, kept from step to step.
    scratch: scratch::Scratch,
}

impl<R: ModelRunner, T: Transfer, C: Clock> Engine<R, T, C> {
    pub fn new(
        cfg: EngineConfig,
        policy: Box<dyn Policy>,
        runner: R,
        transfer: T,
        clock: C,
    ) -> Result<Self, EngineError> {
        if cfg.block_size == 0 || cfg.max_batched_tokens == 0 || cfg.hbm_blocks == 0 {
            return Err(EngineError::Config(
                "block_size, max_batched_tokens and hbm_blocks must be positive".into(),
            ));
        }
        if runner.geometry().block_size != cfg.block_size {
            return Err(EngineError::Config(format!(
                "runner block size {} differs from engine block size {}",
                runner.geometry().block_size,
                cfg.block_size
            )));
        }
        if let Some(f) = cfg.step_tbt_share.filter(|f| !(f.is_finite() && *f > 0.0)) {
            return Err(EngineError::Config(format!(
                "step_tbt_share must be positive, got {f}"
            )));
        }
        if let Some(k) = cfg
            .queue_deadline_ttfts
            .filter(|k| !(k.is_finite() && *k > 0.0))
        {
            return Err(EngineError::Config(format!(
                "queue_deadline_ttfts must be positive, got {k}"
            )));
        }
        let share = cfg.b_xfer_link_share;
        if !(share.is_finite() && share > 0.0) {
            return Err(EngineError::Config(format!(
                "b_xfer_link_share must be positive, got {share}"
            )));
        }
        let mut transfer = transfer;
        let rate = match cfg.b_xfer {
            Some(_) => 0.0,
            // No DRAM tier to rotate into (HBM-only KV): no link to budget.
            None if cfg.dram_blocks < 2 => 0.0,
            None => measure_duplex_rate(&mut transfer, cfg.hbm_blocks, cfg.dram_blocks).map_err(
                |e| {
                    EngineError::Config(format!(
                        "automatic B_xfer: {e} (set a fixed budget with --b-xfer)"
                    ))
                },
            )?,
        };
        let xfer = xfer::XferBudget::new(cfg.b_xfer, share, rate);
        let cost = runner.step_cost();
        let trace = step_trace::StepTrace::open(cfg.step_trace.as_deref())?;
        let pool = KvPool::new(cfg.hbm_blocks, cfg.dram_blocks)
            .with_prefix_cache(cfg.prefix_cache, cfg.prefix_cache_dram);
        Ok(Engine {
            cfg,
            policy,
            runner,
            transfer,
            clock,
            pool,
            requests: BTreeMap::new(),
            transit: BTreeSet::new(),
            outstanding: BTreeMap::new(),
            last_poll: None,
            events: Vec::new(),
            counters: EngineStats::default(),
            census: Census::default(),
            late: shed::LateGuard::default(),
            deadlines: deadline::Deadlines::default(),
            cost,
            calibration: step_budget::Calibration::default(),
            busy_since: None,
            last_step: None,
            trace,
            xfer,
            writeback_due: BTreeSet::new(),
            grow_due: Vec::new(),
            constraints: BTreeMap::new(),
            scratch: scratch::Scratch::default(),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    pub fn clock_mut(&mut self) -> &mut C {
        &mut self.clock
    }

    /// The copy engine (fault drills and tests inject faults through it).
    pub fn transfer_mut(&mut self) -> &mut T {
        &mut self.transfer
    }

    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Live requests (not finished).
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// A live request, for inspection.
    pub fn request(&self, id: RequestId) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// Hands the events produced since the last call to `buf` (emptied first) and keeps
    /// `buf`'s allocation for the next ones: a serving loop that passes the same buffer back
    /// every step allocates nothing and writes events into memory still in cache (a step of
    /// 2,000 decodes makes ~190 KB of them).
    pub fn swap_events(&mut self, buf: &mut Vec<EngineEvent>) {
        buf.clear();
        std::mem::swap(&mut self.events, buf);
    }

    /// Takes the events produced since the last call.
    pub fn take_events(&mut self) -> Vec<EngineEvent> {
        // The next batch of events is about as large as this one: allocate once for it.
        let next = Vec::with_capacity(self.events.len());
        std::mem::replace(&mut self.events, next)
    }

    /// Accepts a request. Refuses (and keeps nothing of) an empty prompt, one that could never
    /// fit in HBM, a duplicate id, bad weights, or a full queue.
    pub fn submit(&mut self, spec: EngineRequest) -> Result<(), EngineError> {
        let id = spec.id;
        if spec.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt(id));
        }
        let ok_num = |x: f64| x.is_finite() && x > 0.0;
        if !ok_num(spec.weight)
            || !ok_num(spec.slo.ttft_s)
            || !ok_num(spec.slo.tbt_s)
            || !spec.queue_deadline_s.is_none_or(ok_num)
        {
            return Err(EngineError::BadRequest {
                id,
                weight: spec.weight,
            });
        }
        let tokens = spec.prompt.len() as u32 + spec.max_tokens.max(1);
        let blocks = tokens.div_ceil(self.cfg.block_size);
        if blocks > self.cfg.hbm_blocks {
            let capacity = self.cfg.hbm_blocks;
            return Err(EngineError::TooLong {
                id,
                tokens,
                blocks,
                capacity,
            });
        }
        if self.requests.contains_key(&id) {
            return Err(EngineError::Duplicate(id));
        }
        if spec.sampling.prompt_logprobs.is_some() && !self.runner.prompt_logprobs() {
            return Err(EngineError::Unsupported {
                id,
                what: "prompt log-probabilities (`echo` with `logprobs`)",
            });
        }
        let waiting = self.census.count(ReqState::Waiting);
        if waiting >= self.cfg.max_queue {
            return Err(EngineError::QueueFull(waiting));
        }
        if let Some(f) = self.cfg.shed_late {
            if let Some(ratio) = self.late.refuse(spec.tenant, f) {
                self.counters.shed += 1;
                return Err(EngineError::WouldMissSlo {
                    id,
                    wait_s: ratio * spec.slo.ttft_s,
                });
            }
        }
        let deadline = deadline::Deadlines::of(
            &spec,
            spec.arrival.unwrap_or(self.clock.now()),
            self.cfg.queue_deadline_ttfts,
        );
        let mut req = Request::new(spec, self.clock.now());
        if let Some(t) = deadline {
            self.deadlines.push(t, id);
        }
        if self.cfg.prefix_cache {
            let scope = req
                .spec
                .cache
                .clone()
                .unwrap_or_else(|| CacheScope::tenant(req.tenant));
            req.cache_base = CacheScope::base_key(&scope.base);
            req.start_chain(scope.root(), self.cfg.block_size);
        }
        self.policy.on_arrival(req.tenant, req.weight);
        self.late.queued(req.tenant);
        self.census.add(req.state);
        if let Some(g) = &req.spec.sampling.grammar {
            self.constraints.insert(id, g.matcher());
        }
        self.requests.insert(id, req);
        Ok(())
    }

    /// Moves a live request to state `to` (a checked transition), keeping the census.
    fn move_req(&mut self, id: RequestId, to: ReqState) {
        let req = self
            .requests
            .get_mut(&id)
            .expect("caller checked it is live");
        let (from, tenant) = (req.state, req.tenant);
        self.census.remove(from);
        req.set_state(to);
        self.census.add(to);
        match (from == ReqState::Waiting, to == ReqState::Waiting) {
            (true, false) => self.late.dequeued(tenant),
            (false, true) => self.late.queued(tenant),
            _ => {}
        }
    }

    /// Ends a request now: its blocks are released (slots with a copy in flight are held back
    /// until it lands) and it finishes with `Abort`. Unknown ids are ignored.
    pub fn abort(&mut self, id: RequestId) {
        let t = self.clock.now();
        self.finish(id, FinishReason::Abort, t);
    }

    fn finish(&mut self, id: RequestId, reason: FinishReason, t: f64) {
        self.finish_with(id, reason, t, None);
    }

    /// Ends a request with `reason` (and, for errors, why and what went wrong).
    fn finish_with(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        t: f64,
        error: Option<(ErrorCause, String)>,
    ) {
        let Some(req) = self.requests.remove(&id) else {
            return;
        };
        self.census.remove(req.state);
        if req.state == ReqState::Waiting {
            self.late.dequeued(req.tenant);
        }
        self.policy.on_departure(req.tenant);
        self.pool.free(id);
        self.transit.remove(&id);
        self.writeback_due.remove(&id);
        self.constraints.remove(&id);
        self.counters.finished += 1;
        self.events.push(EngineEvent::Finished {
            id,
            t,
            end: Box::new(RequestEnd {
                reason,
                prompt_tokens: req.prompt_len,
                completion_tokens: req.generated,
                preemptions: req.rotations + req.recomputes,
                error_cause: error.as_ref().map(|e| e.0),
                error: error.map(|e| e.1),
                cached: req.cached,
                queued_s: req.t_admit.unwrap_or(t) - req.t_arr,
                gpu_s: req.gpu_s,
                mask_s: req.mask_s,
            }),
        });
    }

    /// Drops the prefix cache of the namespace named `base` (a tenant's own,
    /// [`CacheScope::tenant_base`], or a shared one; every salt of it): no request hits it
    /// again; blocks in use stay until their requests let go. Returns the blocks dropped.
    pub fn drop_prefix_cache(&mut self, base: &str) -> u32 {
        self.pool.drop_namespace(CacheScope::base_key(base))
    }

    /// Gauges and counters now.
    pub fn stats(&self) -> EngineStats {
        let mut s = self.counters.clone();
        s.waiting = self.census.count(ReqState::Waiting);
        s.running = self.census.count(ReqState::Running);
        s.rotary = self.census.count(ReqState::Rotary);
        s.evicting = self.census.count(ReqState::Evicting);
        s.restoring = self.census.count(ReqState::Restoring);
        s.hbm_capacity = self.pool.hbm_capacity();
        s.dram_capacity = self.pool.dram_capacity();
        // Cached blocks nobody uses are dropped on demand: they count as free here, as they
        // do for the scheduler (`prefix_*_blocks` count them).
        s.hbm_used = s.hbm_capacity - self.pool.hbm_available();
        s.dram_used = s.dram_capacity - self.pool.dram_available();
        (s.bytes_h2d, s.bytes_d2h) = self.transfer.bytes_moved();
        (s.prefix_hbm_blocks, s.prefix_dram_blocks) = self.pool.prefix_blocks();
        s.b_xfer = self.xfer.last();
        s.link_blocks_per_s = self.xfer.rate();
        s.step_cost_scale = self.calibration.scale();
        s.block_size = self.cfg.block_size;
        s
    }

    /// One iteration. See the module docs for the order of work.
    pub fn step(&mut self) -> Result<StepReport, EngineError> {
        let now = self.clock.now();
        let iteration = self.busy_since.map(|t| now - t);
        if let Some(i) = iteration {
            // One iteration: the batch, the copies it waited for, the host work around them.
            self.policy.on_step(i);
            self.xfer.observe(i);
        }
        if let Some(mut last) = self.last_step.take() {
            // What a decoding client sees between two tokens is the whole iteration, so the
            // budget learns from it rather than from the runner's time alone.
            last.iteration_s = iteration;
            if let (Some(p), Some(i)) = (last.predicted_s, iteration) {
                self.calibration.observe(p, i);
            }
            self.trace.write(&last);
        }
        self.ingest_copies(now);
        self.shed_past_deadline(now);
        let mut copies = crate::transfer::CopyBatch::default();
        let grown = self.schedule(now, &mut copies);
        self.grow_and_write_back(grown, &mut copies);
        if !copies.is_empty() {
            let tickets = self.transfer.submit(now, copies);
            for t in tickets.h2d.into_iter().chain(tickets.d2h) {
                self.outstanding.insert(t, now);
            }
            self.pool.commit(tickets);
        }
        self.counters.steps += 1;
        let report = self.run_batch();
        self.busy_since = (!self.requests.is_empty()).then_some(now);
        report
    }
}

#[cfg(test)]
mod tests;
