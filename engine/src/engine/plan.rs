//! What one step runs: the decodes and prompt chunks within the token budget and, with a cost
//! model, the time budget (`step_budget.rs`).

use super::scratch::Span;
use super::step_budget::{choose_decodes, Candidate, StepLimit, MIN_CHUNK_TOKENS};
use super::EngineConfig;
use crate::kv::pool::LogicalBlock;
use crate::kv::KvPool;
use crate::request::{ReqState, Request};
use crate::runner::{BatchEntry, StepCost};
use std::collections::BTreeMap;
use superinfer_policies::{Policy, RequestId};

/// Prompt tokens a request that scores its prompt (`SamplingParams::prompt_logprobs`) runs per
/// step at most: each costs a full row of logits on the host (vocabulary × 4 bytes, ~200 KB
/// for a 49k vocabulary), so a long prompt is scored in chunks of bounded memory.
pub const PROMPT_SCORE_CHUNK: u32 = 256;

/// The share of its TTFT target a short prompt waits before its chunk may outgrow the step's
/// time limit. Measured in the twin (docs/BENCHMARKS.md, "The promise with the defaults"):
/// 0.5 let weighted LVF's TBT fall 0.9–1.7 points under FCFS's at the SLO experiment's knee
/// on the 32B shape; 0.9 gave back most of LVF's TTFT lead under memory pressure (81.9%
/// against 97.3% at 0.8, 32B GH200 shape at 19 RPS).
pub const TTFT_PRESSURE: f64 = 0.8;

/// The most prefill tokens `r` may run in one step (no bound unless it scores its prompt).
fn score_cap(r: &Request) -> u32 {
    if r.spec.sampling.prompt_logprobs.is_some() {
        PROMPT_SCORE_CHUNK
    } else {
        u32::MAX
    }
}

/// The batch under the token budget into `spans` and `entries` (both empty): decode tokens
/// first (in request order), then prefill chunks in admission order; one lookup of each
/// request's block table. With a time limit (`limit`: the cost model and the share of the
/// tightest decoding TBT target, `step_budget.rs`), the decodes that do not fit skip the step
/// (their ids in `b.skipped`) and prompt chunks get the time left. Returns how many of them
/// decode (the first ones).
pub(super) fn plan_batch<'a>(
    requests: &'a BTreeMap<RequestId, Request>,
    pool: &'a KvPool,
    (cfg, limit, policy, now): (&EngineConfig, Option<(StepCost, f64)>, &dyn Policy, f64),
    b: &mut BudgetScratch<'_>,
    spans: &mut Vec<Span>,
    entries: &mut Vec<BatchEntry<'a>>,
) -> usize {
    let bs = cfg.block_size;
    let mut budget = cfg.max_batched_tokens;
    let mut prefills = Vec::new();
    let mut decodes = 0;
    let mut push = |r: &'a Request, blocks: &'a [LogicalBlock], span: Span| {
        spans.push(span);
        entries.push(BatchEntry {
            id: span.id,
            tokens: &r.tokens,
            prompt_len: r.prompt_len,
            pos: span.pos,
            end: span.end,
            blocks,
            sample: span.sample,
            sampling: &r.spec.sampling,
            mask: None,
        });
    };
    // Decoding requests with room for their next token, in request order.
    let mut wanting: Vec<(&'a Request, &'a [LogicalBlock])> = Vec::new();
    let mut tightest = f64::INFINITY;
    let long = cfg.long_prefill();
    for r in requests.values().filter(|r| r.state == ReqState::Running) {
        if r.prefilling() {
            prefills.push((r.t_run.unwrap_or(r.t_arr), r));
            continue;
        }
        let blocks = pool.table(r.id);
        if blocks.len() as u32 * bs > r.kv_len {
            if limit.is_some() {
                tightest = tightest.min(r.spec.slo.tbt_s);
            }
            wanting.push((r, blocks));
        }
    }
    // The step's time limit, in every step with a request decoding and a cost model: a share
    // of the tightest TBT target among the decodes (a batch of looser targets takes longer
    // steps). Without it, a flood of prompts fills the token budget with chunks and every
    // decode beside them waits for the whole step (docs/SCHEDULING.md, "The step rule").
    let limit = limit
        .filter(|_| !wanting.is_empty())
        .map(|(cost, share)| StepLimit {
            cost,
            seconds: share * tightest,
            target_s: tightest,
        });
    let mut left_s = f64::INFINITY;
    if let Some(l) = &limit {
        b.candidates.clear();
        b.candidates.extend(wanting.iter().map(|(r, _)| Candidate {
            kv_len: r.kv_len,
            skips: r.decode_skips,
        }));
        left_s = l.seconds - choose_decodes(b.candidates, l, b.run, b.order);
    }
    for (i, &(r, blocks)) in wanting.iter().enumerate() {
        if limit.is_some() && !b.run[i] {
            b.skipped.push(r.id);
            continue;
        }
        if budget == 0 {
            continue;
        }
        let span = Span {
            id: r.id,
            pos: r.kv_len,
            end: r.kv_len + 1,
            sample: true,
        };
        push(r, blocks, span);
        budget -= 1;
        decodes += 1;
    }
    prefills.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.spec.id.cmp(&b.1.spec.id)));
    if limit.is_some() {
        // With a time limit, short prompts (their whole prompt, not what is left of it) first,
        // each class in the policy's order: a chunk deep in a long prompt, even its last few
        // thousand tokens, can take a whole step's time, and the short ones behind it would
        // get none. Except a long prompt of a tenant behind every short prompt's tenant (a
        // lower chunk band of the policy): else a tenant whose work is long prompts gets only
        // the time a backlogged tenant's short ones leave. Among long prompts the policy's
        // order stays (ordering them by band would share the time between their prefills and
        // delay every first token).
        let short_band = prefills
            .iter()
            .filter(|p| p.1.prompt_len <= long)
            .map(|p| policy.chunk_band(p.1.tenant))
            .min();
        prefills.sort_by_key(|p| match (p.1.prompt_len > long, short_band) {
            (false, _) => 1,
            (true, Some(b)) if policy.chunk_band(p.1.tenant) < b => 0,
            (true, _) => 2,
        });
    }
    // In admission order, each prefill gets its rest, a long one at most `long` tokens; what
    // is left then goes to the long ones, in the same order (work-conserving). With a time
    // limit, each chunk also fits the time left (the first at least MIN_CHUNK_TOKENS), and
    // the short prompts go first.
    let mut grants: Vec<(&Request, u32)> = Vec::with_capacity(prefills.len());
    // A short prompt that has waited past `TTFT_PRESSURE` of its TTFT target, of a tenant in
    // the policy's lowest chunk band (not ahead of its share), takes its chunk whatever the
    // time: past that point its first token is worth a late step to the decodes beside it
    // (the trade LVF makes by rotation), and a flooding tenant ahead of its share never gets
    // to. A long prompt never does: its chunks deep in a context would hold every decode for
    // seconds (the Mooncake replay's TBT fell from 95-97% to 87-94% when they did).
    let pressed = |r: &Request| {
        r.prompt_len <= long
            && now - r.t_arr > TTFT_PRESSURE * r.spec.slo.ttft_s
            && policy.chunk_band(r.tenant) == 0
    };
    let mut in_time = |r: &Request, already: u32, want: u32, first: bool, pressed: bool| -> u32 {
        let Some(l) = &limit else { return want };
        // The chunk's cost so far (its fixed part counts once it has tokens).
        let spent = |n: u32| {
            if n == 0 {
                0.0
            } else {
                l.cost.chunk_s(r.kv_len, n)
            }
        };
        let fit = l
            .cost
            .chunk_tokens_within(r.kv_len, left_s + spent(already))
            .saturating_sub(already);
        let take = if pressed {
            want
        } else if first && already == 0 {
            // A chunk of fewer queries than one wave of the attention kernel costs as much
            // attention as the wave (`runner::cost::attention_pairs`): a forced chunk takes
            // up to the wave, as far as the step still ends within the TBT target itself
            // (the share's headroom; a wave's GEMMs alone are ~30 ms on the H100).
            let headroom = l
                .cost
                .chunk_tokens_within(r.kv_len, left_s + l.target_s - l.seconds);
            let least = MIN_CHUNK_TOKENS.max(l.cost.wave_tokens().min(headroom));
            want.min(fit.max(least))
        } else {
            want.min(fit)
        };
        left_s -= spent(already + take) - spent(already);
        take
    };
    for (k, (_, r)) in prefills.into_iter().enumerate() {
        let want = r.remaining().min(long).min(budget).min(score_cap(r));
        // A short prompt under pressure gets its rest here (`long` bounds it): the second
        // pass has nothing to add to it.
        let take = in_time(r, 0, want, k == 0, pressed(r));
        budget -= take;
        grants.push((r, take));
    }
    for (r, take) in grants.iter_mut() {
        let want = (r.remaining() - *take)
            .min(budget)
            .min(score_cap(r) - *take);
        let more = if want == 0 {
            0
        } else {
            in_time(r, *take, want, false, false)
        };
        budget -= more;
        *take += more;
    }
    for (r, take) in grants {
        if take == 0 {
            continue;
        }
        let end = r.kv_len + take;
        let span = Span {
            id: r.id,
            pos: r.kv_len,
            end,
            sample: end == r.tokens.len() as u32,
        };
        push(r, pool.table(r.id), span);
    }
    decodes
}

/// The time budget's scratch, borrowed from the step's [`Scratch`].
pub(super) struct BudgetScratch<'s> {
    pub(super) candidates: &'s mut Vec<Candidate>,
    pub(super) run: &'s mut Vec<bool>,
    pub(super) order: &'s mut Vec<usize>,
    pub(super) skipped: &'s mut Vec<RequestId>,
}
