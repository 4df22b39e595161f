//! One run of the twin: requests submitted at their times, follow-up turns of a conversation
//! released by the finish of the turn before (closed loop per conversation), every event
//! recorded.
//!
//! Prompts are token ids ([`crate::workload::conversation`]): the tenant's system prompt, then
//! for a follow-up exactly the previous prompt and the tokens the engine generated for it,
//! then the new message. So the engine's prefix cache hits wherever a real server's would.

use super::super::TargetStats;
use crate::record::RequestRecord;
use crate::workload::conversation::{first_prompt_ids, next_prompt_ids};
use crate::workload::{RequestSpec, TenantSpec};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use superinfer_engine::clock::Clock;
use superinfer_engine::sim::SimEngine;
use superinfer_engine::{
    EngineError, EngineEvent, EngineRequest, ErrorCause, FinishReason, RequestEnd,
};
use superinfer_policies::{RequestId, Slo, TenantId};

/// What a run sent and generated, beyond the records.
#[derive(Clone, Debug, Default)]
pub struct RunLog {
    /// Prompt of every request sent, by id (only when prompts were kept).
    pub prompts: HashMap<u64, Vec<u32>>,
    /// Tokens each request generated, by id (only when prompts were kept).
    pub answers: HashMap<u64, Vec<u32>>,
    pub stats: TargetStats,
}

/// The inputs of one run.
pub(super) struct Run<'a> {
    pub tenants: &'a [TenantSpec],
    pub requests: &'a [RequestSpec],
    pub duration_s: f64,
    pub end_s: f64,
    pub keep_prompts: bool,
}

/// A request due at a time: (time bits, index into the requests). Times are non-negative, so
/// their bit patterns order as the numbers do.
type Due = Reverse<(u64, usize)>;

/// The state of a run in flight.
struct Live<'a> {
    run: &'a Run<'a>,
    /// Index of a follow-up turn by the id of the turn before it.
    next_turn: HashMap<u64, usize>,
    index: HashMap<u64, usize>,
    due: BinaryHeap<Due>,
    records: HashMap<u64, RequestRecord>,
    /// Prompts and answers of requests whose conversation goes on (all, with keep_prompts).
    prompts: HashMap<u64, Vec<u32>>,
    answers: HashMap<u64, Vec<u32>>,
    log: RunLog,
}

impl Run<'_> {
    /// Serves the run on `engine`; returns the records of the requests sent.
    pub fn serve(&self, mut engine: SimEngine) -> anyhow::Result<(Vec<RequestRecord>, RunLog)> {
        let mut live = Live::new(self);
        let mut events = Vec::new();
        loop {
            let now = engine.clock().now();
            while let Some(i) = live.pop_due(now) {
                live.submit(&mut engine, i);
            }
            if now >= self.end_s {
                break;
            }
            let upcoming = live.next_due();
            if engine.is_empty() {
                match upcoming {
                    Some(t) => engine.clock_mut().skip_to(t),
                    None => break,
                }
                continue;
            }
            let report = engine.step()?;
            live.log.stats.prefill_tokens_computed += u64::from(report.prefill_tokens);
            engine.swap_events(&mut events);
            live.record(events.drain(..));
            if !report.ran {
                // Nothing could run: wait for the next copy or arrival, or let a little time
                // pass so time-based priorities move.
                let wake = [report.idle_until, live.next_due()]
                    .into_iter()
                    .flatten()
                    .reduce(f64::min);
                let t = wake.unwrap_or(now + 1e-3).min(self.end_s).max(now + 1e-6);
                engine.clock_mut().skip_to(t);
            }
        }
        Ok(live.finish(&engine))
    }
}

/// The HTTP status a server answers for an engine's refusal at submission.
fn refusal_status(e: &EngineError) -> u16 {
    match e {
        EngineError::QueueFull(_) | EngineError::WouldMissSlo { .. } => 503,
        _ => 400,
    }
}

impl<'a> Live<'a> {
    fn new(run: &'a Run<'a>) -> Live<'a> {
        let mut next_turn = HashMap::new();
        let mut due = BinaryHeap::new();
        for (i, r) in run.requests.iter().enumerate() {
            match r.turn.and_then(|t| t.after) {
                Some(prev) => {
                    next_turn.insert(prev, i);
                }
                None => due.push(Reverse((r.arrival_s.max(0.0).to_bits(), i))),
            }
        }
        let index = run
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id, i))
            .collect();
        Live {
            run,
            next_turn,
            index,
            due,
            records: HashMap::new(),
            prompts: HashMap::new(),
            answers: HashMap::new(),
            log: RunLog::default(),
        }
    }

    fn next_due(&self) -> Option<f64> {
        self.due.peek().map(|Reverse((t, _))| f64::from_bits(*t))
    }

    fn pop_due(&mut self, now: f64) -> Option<(f64, usize)> {
        let t = self.next_due()?;
        if t > now {
            return None;
        }
        let Reverse((_, i)) = self.due.pop()?;
        Some((t, i))
    }

    /// Builds the request's prompt and submits it at time `t`.
    fn submit(&mut self, engine: &mut SimEngine, (t, i): (f64, usize)) {
        let spec = &self.run.requests[i];
        let tenant = &self.run.tenants[spec.tenant];
        let prompt = match spec.turn.and_then(|turn| turn.after) {
            Some(prev) => {
                let before = self.prompts.get(&prev).map(Vec::as_slice).unwrap_or(&[]);
                let answer = self.answers.get(&prev).map(Vec::as_slice).unwrap_or(&[]);
                let p = next_prompt_ids(before, answer, spec.content_seed, spec.message_tokens);
                if !self.run.keep_prompts {
                    self.prompts.remove(&prev);
                    self.answers.remove(&prev);
                }
                p
            }
            None => match &spec.blocks {
                Some(b) => b.prompt_ids(spec.content_seed, spec.prompt_tokens),
                None => first_prompt_ids(
                    tenant.system_seed(),
                    spec.system_tokens,
                    spec.content_seed,
                    spec.message_tokens,
                ),
            },
        };
        let mut rec = RequestRecord::unserved(spec);
        rec.arrival_s = t;
        rec.prompt_tokens = prompt.len() as u32;
        self.records.insert(spec.id, rec);
        let request = EngineRequest {
            weight: tenant.weight,
            slo: Slo {
                ttft_s: tenant.ttft_slo_s,
                tbt_s: tenant.tbt_slo_s,
            },
            ignore_eos: true,
            arrival: Some(t),
            ..EngineRequest::new(
                RequestId(spec.id),
                TenantId(spec.tenant as u32),
                prompt.clone(),
                spec.output_tokens,
            )
        };
        if self.run.keep_prompts || self.next_turn.contains_key(&spec.id) {
            self.prompts.insert(spec.id, prompt);
            self.answers.insert(spec.id, Vec::new());
        }
        // A refused request stays unserved (a miss) with the status a server would answer;
        // its conversation ends there.
        if let Err(e) = engine.submit(request) {
            if let Some(r) = self.records.get_mut(&spec.id) {
                r.refused = Some(refusal_status(&e));
            }
        }
    }

    fn record(&mut self, events: impl Iterator<Item = EngineEvent>) {
        for ev in events {
            match ev {
                EngineEvent::Token { id, token, t, .. } => {
                    if let Some(a) = self.answers.get_mut(&id.0) {
                        a.push(token);
                    }
                    let Some(r) = self.records.get_mut(&id.0) else {
                        continue;
                    };
                    r.first_token_s.get_or_insert(t);
                    r.token_times_s.push(t);
                    r.generated_tokens += 1;
                }
                EngineEvent::Finished { id, t, end } => {
                    let RequestEnd {
                        preemptions,
                        reason,
                        cached,
                        error_cause,
                        gpu_s,
                        queued_s,
                        ..
                    } = *end;
                    if let Some(r) = self.records.get_mut(&id.0) {
                        // Shed past its queue deadline: the 503 a server answers before the
                        // first byte.
                        if error_cause == Some(ErrorCause::QueueDeadline) {
                            r.refused = Some(503);
                        }
                        r.finish_s = Some(t);
                        r.preemptions = preemptions;
                        r.gpu_s = Some(gpu_s);
                        r.queued_s = Some(queued_s);
                        r.cached_tokens = Some(cached.tokens());
                        r.cached_dram_tokens = Some(cached.dram);
                    }
                    let completed = matches!(reason, FinishReason::Stop | FinishReason::Length);
                    self.release_next(id.0, t, completed);
                }
            }
        }
    }

    /// The turn after `id` is due its think time after `t`, if the conversation goes on and
    /// that is inside the arrival window.
    fn release_next(&mut self, id: u64, t: f64, completed: bool) {
        let Some(&next) = self.next_turn.get(&id) else {
            return;
        };
        let think_s = self.run.requests[next]
            .turn
            .map_or(0.0, |turn| turn.think_s);
        let at = t + think_s;
        if completed && at < self.run.duration_s {
            self.due.push(Reverse((at.to_bits(), next)));
        } else if !self.run.keep_prompts {
            self.prompts.remove(&id);
            self.answers.remove(&id);
        }
    }

    /// The records of the requests sent, in id order; live requests keep their partial
    /// record, with their preemptions.
    fn finish(mut self, engine: &SimEngine) -> (Vec<RequestRecord>, RunLog) {
        let mut records: Vec<RequestRecord> = self.records.into_values().collect();
        records.sort_by_key(|r| self.index[&r.id]);
        for r in &mut records {
            if let Some(req) = engine.request(RequestId(r.id)) {
                r.preemptions = req.rotations + req.recomputes;
                r.gpu_s = Some(req.gpu_s);
                r.queued_s = req.t_admit.map(|t| t - req.t_arr);
            }
        }
        if self.run.keep_prompts {
            self.log.prompts = self.prompts;
            self.log.answers = self.answers;
        }
        (records, self.log)
    }
}
