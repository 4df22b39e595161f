//! Execution half of a step: build the batch under the token budget (decode tokens first,
//! then prefill chunks in admission order), run it, and turn its output into tokens, finishes
//! and service accounting.

use super::plan::{plan_batch, BudgetScratch};
use super::scratch::{recycle, Scratch, Span};
use super::{Engine, EngineConfig, EngineEvent, StepReport};
use crate::clock::Clock;
use crate::error::EngineError;
use crate::grammar::{MaskBoard, MaskRef};
use crate::kv::KvPool;
use crate::request::{ErrorCause, FinishReason, Request};
use crate::runner::{BatchEntry, ModelRunner, StepBatch, StepOutput};
use crate::sampling::TokenLogprobs;
use crate::transfer::Transfer;
use llguidance::Matcher;
use std::collections::{BTreeMap, BTreeSet};
use superinfer_policies::{RequestId, Service, TenantId};

impl<R: ModelRunner, T: Transfer, C: Clock> Engine<R, T, C> {
    /// Runs one batch, if anything can run.
    pub(super) fn run_batch(&mut self) -> Result<StepReport, EngineError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let report = self.run_planned(&mut scratch);
        self.scratch = scratch;
        report
    }

    fn run_planned(&mut self, scratch: &mut Scratch) -> Result<StepReport, EngineError> {
        let spans = &mut scratch.spans;
        spans.clear();
        let mut entries = recycle(std::mem::take(&mut scratch.entries));
        scratch.skipped.clear();
        let share = self.cfg.step_tbt_share.map(|s| self.calibration.share(s));
        let limit = self.cost.zip(share);
        let mut b = BudgetScratch {
            candidates: &mut scratch.candidates,
            run: &mut scratch.run,
            order: &mut scratch.order,
            skipped: &mut scratch.skipped,
        };
        let decodes = plan_batch(
            &self.requests,
            &self.pool,
            (&self.cfg, limit, self.policy.as_ref(), self.clock.now()),
            &mut b,
            spans,
            &mut entries,
        );

        if spans.is_empty() {
            return Ok(StepReport {
                idle_until: [
                    self.transfer.next_completion(),
                    self.copy_deadline(),
                    self.deadlines.next(),
                ]
                .into_iter()
                .flatten()
                .reduce(f64::min),
                ..Default::default()
            });
        }
        let (out, entries, mask_failed, mask_s) =
            step_with_masks(&mut self.runner, &mut self.constraints, entries);
        scratch.entries = recycle(entries);
        for id in scratch.skipped.iter() {
            if let Some(r) = self.requests.get_mut(id) {
                r.decode_skips += 1;
            }
        }
        // A failed matcher is not fed again (after a panic its state is unknown).
        for (id, _) in &mask_failed {
            self.constraints.remove(id);
        }
        let mut mask_failed: BTreeMap<RequestId, String> = mask_failed.into_iter().collect();
        self.transfer.step_issued();
        let out = match out {
            Ok(out) if out.tokens.len() == spans.len() => out,
            Ok(out) => {
                let e = format!(
                    "the model step returned {} results for {} entries",
                    out.tokens.len(),
                    spans.len()
                );
                return Ok(self.fail_batch(spans, e));
            }
            Err(e) => return Ok(self.fail_batch(spans, format!("the model step failed: {e}"))),
        };
        self.clock.advance(out.elapsed);
        let t = self.clock.now();
        let mut report = StepReport {
            ran: true,
            elapsed: out.elapsed,
            batch_size: spans.len(),
            kv_read_bytes: spans.iter().map(|s| u64::from(s.end)).sum::<u64>()
                * self.runner.geometry().bytes_per_token(),
            ..Default::default()
        };
        // Each entry's result, in request order: decode spans already are (the batch takes
        // them in that order), prefill chunks are merged in. One in-order walk of the
        // requests then reaches each of them without a lookup of its own.
        let StepOutput {
            tokens,
            mut logprobs,
            prompt_logprobs,
            ..
        } = out;
        let mut scores: BTreeMap<usize, Vec<TokenLogprobs>> = prompt_logprobs.into_iter().collect();
        let prefills = &mut scratch.prefills;
        prefills.clear();
        prefills.extend(decodes..spans.len());
        prefills.sort_unstable_by_key(|&k| spans[k].id);
        let mut order = MergeById {
            spans,
            decode: 0..decodes,
            prefill: prefills.iter().copied().peekable(),
        }
        .peekable();
        let predicted = super::gpu_time::step_shares(
            self.cost.as_ref(),
            spans,
            decodes,
            out.elapsed,
            &mut scratch.shares,
        );
        let mut record = if self.trace.is_on() {
            super::step_trace::StepRecord::of_batch(t - out.elapsed, spans, decodes)
        } else {
            super::step_trace::StepRecord::default()
        };
        record.elapsed_s = out.elapsed;
        record.predicted_s = predicted;
        self.last_step = Some(record);
        let shares = &scratch.shares;
        let service = &mut scratch.service;
        service.clear();
        let appends = &mut scratch.appends;
        appends.clear();
        let mut ends = Vec::new();
        let mut ctx = Advance {
            appends,
            cfg: &self.cfg,
            pool: &mut self.pool,
            events: &mut self.events,
            writeback_due: &mut self.writeback_due,
            constraints: &mut self.constraints,
            mask_failed: &mut mask_failed,
            // Borrowed beside the requests (disjoint fields): no copy per step.
            eos: self.runner.eos_token_ids(),
            t,
        };
        for (id, req) in self.requests.iter_mut() {
            let Some(k) = order.next_if(|&k| spans[k].id == *id) else {
                continue;
            };
            let span = spans[k];
            if let Some(s) = scores.remove(&k) {
                keep_prompt_scores(req, span, s);
            }
            let lp = logprobs.get_mut(k).and_then(Option::take);
            req.gpu_s += shares[k];
            let mask_s = mask_s.get(id).copied().unwrap_or(0.0);
            req.mask_s += mask_s;
            let (c, end) = ctx.advance(req, span, (tokens[k], lp));
            if c.decode_step {
                req.decode_skips = 0;
                report.decode_tokens += 1;
            } else {
                report.prefill_tokens += span.end - span.pos;
            }
            // A few tenants a step: a short search, from the last one found.
            let at = match service.iter().rposition(|e| e.0 == c.tenant) {
                Some(at) => at,
                None => {
                    service.push((c.tenant, c.weight, Service::default()));
                    service.len() - 1
                }
            };
            let s = &mut service[at].2;
            s.prefill += c.service.prefill;
            s.decode += c.service.decode;
            if let Some(cost) = &self.cost {
                s.kv_read += cost.kv_equivalent(span.pos, span.end);
                s.host += cost.seconds_equivalent(mask_s);
            }
            if let Some(end) = end {
                ends.push((*id, end));
            } else if req.next_token_needs_block(self.cfg.block_size) {
                self.grow_due.push(*id);
            }
        }
        debug_assert!(order.next().is_none(), "batch ids are live");
        append_tokens(&mut self.requests, &scratch.appends);
        for (id, (reason, error)) in ends {
            let error = error.map(|e| (ErrorCause::Request, e));
            self.finish_with(id, reason, t, error);
        }
        service.sort_unstable_by_key(|e| e.0);
        for &(tenant, weight, s) in service.iter() {
            self.policy.on_service(tenant, weight, s);
        }
        Ok(report)
    }

    /// A step that failed: the requests of its batch end with an error (their blocks go back
    /// to the pool); the others keep their places and the engine goes on serving.
    fn fail_batch(&mut self, spans: &[Span], error: String) -> StepReport {
        let t = self.clock.now();
        self.counters.failed_steps += 1;
        for span in spans {
            let error = Some((ErrorCause::Request, error.clone()));
            self.finish_with(span.id, FinishReason::Error, t, error);
        }
        StepReport {
            batch_size: spans.len(),
            ..Default::default()
        }
    }
}

/// Batch indices in request order: the decode spans (already in that order) merged with the
/// prefill chunks (sorted apart).
struct MergeById<'s, P: Iterator<Item = usize>> {
    spans: &'s [Span],
    decode: std::ops::Range<usize>,
    prefill: std::iter::Peekable<P>,
}

impl<P: Iterator<Item = usize>> Iterator for MergeById<'_, P> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let d = self.decode.clone().next();
        match (d, self.prefill.peek()) {
            (Some(d), Some(&p)) if self.spans[p].id < self.spans[d].id => self.prefill.next(),
            (Some(_), _) => self.decode.next(),
            (None, _) => self.prefill.next(),
        }
    }
}

/// Keeps the scores of prompt tokens `span.pos + 1 ..` that `req` has not had yet (a
/// recompute scores its prompt again); they go out with its first token.
fn keep_prompt_scores(req: &mut Request, span: Span, scores: Vec<TokenLogprobs>) {
    if req.generated > 0 {
        return; // sent with its first token already
    }
    // `req.prompt_logprobs[k]` is token `k + 1`'s; `scores[k]` is token `pos + 1 + k`'s.
    let have = req.prompt_logprobs.len();
    let from = span.pos as usize;
    if from <= have {
        req.prompt_logprobs
            .extend(scores.into_iter().skip(have - from));
    }
}

/// Appends each sampled token to its request's tokens, in a pass over the requests of its
/// own. Each append is a store into a vector of its own, on a page of its own: in the walk
/// that applies the results, every one waited for its page's translation before the walk
/// went on (a quarter of a 2,000-request decode step's host time, docs/BENCHMARKS.md
/// "Per-step cost"); in a loop that does nothing else, the stores overlap.
fn append_tokens(requests: &mut BTreeMap<RequestId, Request>, appends: &[(RequestId, u32)]) {
    let Some(&(first, _)) = appends.first() else {
        return;
    };
    let mut next = appends.iter().peekable();
    for (id, req) in requests.range_mut(first..) {
        let Some(&&(want, tok)) = next.peek() else {
            break;
        };
        if *id == want {
            req.tokens.push(tok);
            next.next();
        }
    }
    debug_assert!(
        next.peek().is_none(),
        "appended tokens are of live requests"
    );
}

/// What applying a step's results needs of the engine besides the request itself (disjoint
/// fields, so the walk over the requests can hold each one mutably).
struct Advance<'a> {
    /// Sampled tokens to append after the walk ([`append_tokens`]).
    appends: &'a mut Vec<(RequestId, u32)>,
    cfg: &'a EngineConfig,
    pool: &'a mut KvPool,
    events: &'a mut Vec<EngineEvent>,
    writeback_due: &'a mut BTreeSet<RequestId>,
    constraints: &'a mut BTreeMap<RequestId, Matcher>,
    /// Requests whose grammar mask failed this step, with why: they end with that error.
    mask_failed: &'a mut BTreeMap<RequestId, String>,
    eos: &'a [u32],
    /// Engine time at the end of the step.
    t: f64,
}

impl Advance<'_> {
    /// Applies one entry's result to `req`; returns what the step did for it, and how the
    /// request ends if it does (the caller finishes it after the walk).
    fn advance(
        &mut self,
        req: &mut Request,
        span: Span,
        out: (Option<u32>, Option<TokenLogprobs>),
    ) -> (Charge, Option<(FinishReason, Option<String>)>) {
        let (token, logprobs) = out;
        let (t, eos) = (self.t, self.eos);
        let bs = self.cfg.block_size;
        for i in span.pos / bs..span.end.div_ceil(bs) {
            self.pool.wrote(span.id, i as usize);
        }
        let progress = self.cfg.progress_tokens;
        let charge = Charge::of(req, span);
        req.kv_len = span.end;
        if span.end / bs > span.pos / bs {
            // A block filled: it is due for eager writeback, and (with the prefix cache) it
            // is named, so that once synced it becomes a cache entry.
            self.writeback_due.insert(span.id);
            if self.cfg.prefix_cache {
                let kv = span.end as usize;
                req.extend_chain(kv, bs);
                self.pool
                    .sealed(span.id, (span.end / bs) as usize, &req.hashes);
            }
        }
        let mut finished = None;
        let mut grammar_error = None;
        if let (true, Some(tok)) = (span.sample, token) {
            if let Some(e) = self.mask_failed.remove(&span.id) {
                // Sampled without its mask: not emitted.
                return (charge, Some((FinishReason::Error, Some(e))));
            }
            self.appends.push((span.id, tok));
            req.generated += 1;
            req.run_tokens += 1;
            if req.run_tokens >= progress {
                req.consecutive_rotations = 0;
            }
            req.t_first.get_or_insert(t);
            req.t_last = Some(t);
            let first = req.generated == 1;
            let rare = logprobs.is_some()
                || (first && (req.cached.tokens() > 0 || !req.prompt_logprobs.is_empty()));
            let extra = rare.then(|| {
                Box::new(super::TokenExtra {
                    logprobs,
                    cached: req.cached,
                    prompt_logprobs: if first {
                        std::mem::take(&mut req.prompt_logprobs)
                    } else {
                        Vec::new()
                    },
                })
            });
            self.events.push(EngineEvent::Token {
                id: span.id,
                token: tok,
                t,
                extra,
            });
            // A grammar that is complete ends the request (ignore_eos or not).
            let grammar_done = match self.constraints.get_mut(&span.id) {
                None => false,
                Some(m) => match m.consume_token(tok) {
                    Ok(()) => m.is_stopped(),
                    Err(e) => {
                        grammar_error = Some(format!("structured output: {e}"));
                        false
                    }
                },
            };
            let stop = (!req.ignore_eos && eos.contains(&tok))
                || (req.has_stop_ids && req.spec.stop_token_ids.contains(&tok))
                || grammar_done;
            if grammar_error.is_some() {
                finished = Some(FinishReason::Error);
            } else if stop {
                finished = Some(FinishReason::Stop);
            } else if req.generated >= req.max_tokens {
                finished = Some(FinishReason::Length);
            }
        }
        (charge, finished.map(|reason| (reason, grammar_error)))
    }
}

/// Runs the batch; when some of its sampling rows have a grammar, their masks are computed
/// on a worker thread while the runner runs the model (`grammar::mask`). Also returns the
/// requests whose mask failed (their token was sampled without it: the engine ends them
/// with the error instead of emitting it).
fn step_with_masks<'e, R: ModelRunner>(
    runner: &mut R,
    constraints: &mut BTreeMap<RequestId, Matcher>,
    entries: Vec<BatchEntry<'e>>,
) -> StepWithMasks<'e> {
    let mut rows: Vec<Option<&mut Matcher>> = Vec::new();
    if !constraints.is_empty() {
        let mut by_id: BTreeMap<RequestId, &mut Matcher> =
            constraints.iter_mut().map(|(id, m)| (*id, m)).collect();
        rows = entries
            .iter()
            .map(|e| e.sample.then(|| by_id.remove(&e.id)).flatten())
            .collect();
    }
    if rows.iter().all(Option::is_none) {
        let batch = StepBatch { entries };
        return (
            runner.step(&batch),
            batch.entries,
            Vec::new(),
            BTreeMap::new(),
        );
    }
    let (board, tx) = MaskBoard::new();
    let mut constrained = Vec::new();
    let entries = entries
        .into_iter()
        .zip(&rows)
        .enumerate()
        .map(|(row, (mut e, m))| {
            if m.is_some() {
                e.mask = Some(MaskRef { board: &board, row });
                constrained.push((row, e.id));
            }
            e
        })
        .collect();
    let out = std::thread::scope(|s| {
        s.spawn(move || MaskBoard::compute(rows, tx));
        runner.step(&StepBatch { entries })
    });
    let mask_s = constrained
        .iter()
        .map(|&(row, id)| (id, board.seconds(row)))
        .collect();
    let failed = board
        .failures(constrained)
        .into_iter()
        .map(|(id, e)| (id, format!("structured output: {e}")))
        .collect();
    // The entries borrow the mask board, which goes here: nothing of them is kept.
    (out, Vec::new(), failed, mask_s)
}

/// A step's output, its entries to recycle, the requests whose grammar mask failed and the
/// seconds each constrained request's mask took.
type StepWithMasks<'e> = (
    Result<StepOutput, EngineError>,
    Vec<BatchEntry<'e>>,
    Vec<(RequestId, String)>,
    BTreeMap<RequestId, f64>,
);

/// What one batch entry did: a decode step or prefill, and the service its tenant is charged.
struct Charge {
    decode_step: bool,
    tenant: TenantId,
    weight: f64,
    service: Service,
}

impl Charge {
    /// A one-token span of a request past its prompt is a decode step; anything else (prompt
    /// chunks, a recomputed request's tokens) is prefill. The tenant is charged only for
    /// tokens it was never charged for: recomputing is the scheduler's choice, not its work.
    fn of(req: &mut Request, span: Span) -> Charge {
        let decode_step = span.sample && span.end - span.pos == 1 && span.pos >= req.prompt_len;
        let fresh = span.end.saturating_sub(req.charged_kv.max(span.pos));
        req.charged_kv = req.charged_kv.max(span.end);
        let service = if decode_step {
            Service {
                decode: u64::from(fresh),
                ..Service::default()
            }
        } else {
            Service {
                prefill: u64::from(fresh),
                ..Service::default()
            }
        };
        Charge {
            decode_step,
            tenant: req.tenant,
            weight: req.weight,
            service,
        }
    }
}
