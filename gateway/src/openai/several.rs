//! `POST /v1/completions` with a list of prompts, `n` > 1 and/or `best_of` > 1 (not
//! streamed: the `n` best of `best_of` candidates by mean token log-probability), and `POST
//! /v1/chat/completions` with `n` > 1: one engine request per choice, all submitted before the
//! first token (`index` = prompt × `n` + choice). A prompt is prefilled once: its later
//! choices follow the first (`EngineRequest::follows`), so the engine admits them once the
//! prompt's full blocks are cached and they compute only the partial last block (with the
//! prefix cache off, each choice prefills the prompt itself); usage counts each prompt's tokens
//! and cached tokens once, as OpenAI does, and every choice's completion tokens (the ledger
//! the same). The request's concurrency slot is shared by its choices and freed
//! when the last ends. Not streamed: one body with every choice and the usage of all. Streamed: the
//! choices' chunks interleaved as they come, each choice's finish chunk, then (with
//! `include_usage`) one usage chunk and `[DONE]`. A failure of one choice ends the response
//! with an error (the others are aborted).

use axum::response::Response;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use std::sync::Arc;
use std::time::Instant;

use super::response::{event, ChunkKind, ResponseMeta, Usage, DONE};
use super::sse::Out;
use crate::admission;
use crate::conn::ConnKill;
use crate::error::{GatewayError, Result};
use crate::generate::{Admitted, Generation, Piece, StopMatcher};
use crate::metrics::Metrics;
use crate::registry::TenantCtx;
use crate::state::Shared;
use crate::usage::UsageTicket;
use crate::validate::{Endpoint, ValidRequest};

pub async fn generate(
    state: &Shared,
    ctx: Arc<TenantCtx>,
    (slot, seats, usage): (
        crate::quota::Slot,
        Option<crate::quota::InFlight>,
        UsageTicket,
    ),
    valid: ValidRequest,
    started: Instant,
    kill: Option<ConnKill>,
) -> Result<Response> {
    let slot = slot
        .take()
        .ok_or_else(|| GatewayError::Internal("the concurrency slot was taken twice".into()))?;
    let prompts: Vec<Vec<u32>> = std::iter::once(valid.prompt.clone())
        .chain(valid.more_prompts.iter().cloned())
        .collect();
    // `best_of` candidates per prompt (`n` unless `best_of` is larger).
    let per_prompt = valid.best_of;
    let slot = Arc::new(Admitted { slot, seats, usage });
    // Choice `p * n + j` is prompt `p`'s `j`-th; a seeded request's choices draw from seeds
    // `seed + j`, so they differ but repeat exactly.
    let choices = prompts
        .iter()
        .flat_map(|p| (0..per_prompt).map(move |j| (p.clone(), j)));
    let mut gens = Vec::with_capacity(prompts.len() * per_prompt as usize);
    // The engine request of the current prompt's first choice, which the others follow.
    let mut leader = None;
    for (prompt, j) in choices {
        let mut one = ValidRequest {
            prompt,
            more_prompts: Vec::new(),
            n: 1,
            ..valid.clone()
        };
        one.sampling.seed = valid.sampling.seed.map(|s| s.wrapping_add(u64::from(j)));
        if per_prompt > valid.n {
            // Candidates are ranked by their tokens' log-probabilities.
            one.sampling.logprobs = Some(0);
        }
        // An error drops the generations made so far, which aborts their requests.
        let follows = if j == 0 { None } else { leader };
        let stream =
            admission::submit_following(state, &ctx.tenant, &one, follows).inspect_err(|e| {
                state.metrics.rejected(&ctx.tenant.name, "overloaded");
                if e.status() == axum::http::StatusCode::SERVICE_UNAVAILABLE {
                    ctx.shed(started.elapsed().as_secs_f64());
                }
                // Choices admitted so far are dropped; the request is one error in the ledger.
                slot.usage.fail();
            })?;
        slot.usage.accepted();
        if j == 0 {
            leader = Some(stream.id);
        }
        // The request's first sequence; each prompt's tokens counted once, with its first
        // choice (as `usage.prompt_tokens`).
        let n = one.prompt.len() as u32;
        ctx.admitted(gens.is_empty(), if j == 0 { n } else { 0 });
        gens.push(
            Generation::new(
                stream,
                state.text.decoder(),
                StopMatcher::new(&one.stop),
                ctx.clone(),
                started,
                n,
                slot.clone(),
            )
            .sharing_prompt(j != 0),
        );
    }
    // Every choice is submitted; a refusal of any is the request's HTTP error (the others are
    // dropped with `gens`, which aborts them).
    for g in &mut gens {
        if let Some(end) = g.refusal().await {
            state.metrics.rejected(&ctx.tenant.name, "overloaded");
            slot.usage.fail();
            return Err(super::errors::refusal_error(end, &state.metrics));
        }
    }
    let mut meta = ResponseMeta::new(valid.endpoint, &state.model.id, valid.include_usage, false);
    meta.continuous_usage = valid.continuous_usage;
    if valid.stream {
        let out = Out {
            metrics: state.metrics.clone(),
            limits: state.stream,
            kill,
        };
        Ok(respond(gens, meta, per_prompt, out))
    } else {
        let pick = (per_prompt > valid.n).then_some((per_prompt, valid.n));
        collect(gens, meta, (per_prompt, pick), &state.metrics).await
    }
}

/// One choice's whole text and finish reason, its usage, and the mean log-probability of its
/// tokens (0 unless they were reported).
async fn collect_one(
    mut gen: Generation,
    metrics: &Metrics,
) -> Result<(String, &'static str, Usage, f64)> {
    let mut text = String::new();
    let (mut sum, mut count) = (0f64, 0u32);
    while let Some(piece) = gen.next().await {
        for lp in gen.take_logprobs() {
            sum += f64::from(lp.logprob);
            count += 1;
        }
        match piece {
            Piece::Text(t) => text.push_str(&t),
            Piece::Done(o) => {
                if let Some(err) = o.error {
                    return Err(super::errors::engine_failure(
                        err,
                        o.completion_tokens,
                        metrics,
                    ));
                }
                let usage = Usage::of(&o);
                let mean = if count > 0 {
                    sum / f64::from(count)
                } else {
                    0.0
                };
                return Ok((text, o.finish_reason, usage, mean));
            }
        }
    }
    Err(GatewayError::Engine(
        "the answer ended without a finish".into(),
    ))
}

/// Every choice in order (`per_prompt` of each prompt); with `pick = (best_of, n)`, of each
/// prompt's `best_of` candidates the `n` with the highest mean token log-probability, best
/// first (usage counts every candidate's tokens, and each prompt's once).
async fn collect(
    gens: Vec<Generation>,
    meta: ResponseMeta,
    (per_prompt, pick): (u32, Option<(u32, u32)>),
    metrics: &Metrics,
) -> Result<Response> {
    let outs =
        futures_util::future::join_all(gens.into_iter().map(|g| collect_one(g, metrics))).await;
    let mut candidates = Vec::with_capacity(outs.len());
    let mut usage = Usage::new(0, 0, 0);
    for (k, out) in outs.into_iter().enumerate() {
        let (text, finish, u, mean) = out?;
        usage = usage.sum(if k % per_prompt as usize == 0 {
            u
        } else {
            u.without_prompt()
        });
        candidates.push((text, finish, mean));
    }
    let choices: Vec<(String, &str)> = match pick {
        None => candidates.into_iter().map(|(t, f, _)| (t, f)).collect(),
        Some((best_of, n)) => candidates
            .chunks_mut(best_of as usize)
            .flat_map(|group| {
                group.sort_by(|a, b| b.2.total_cmp(&a.2));
                group[..n as usize]
                    .iter()
                    .map(|(t, f, _)| (t.clone(), *f))
                    .collect::<Vec<_>>()
            })
            .collect(),
    };
    Ok(meta.full_body_many(&choices, usage))
}

/// What one choice's stream yields: its index, the piece, its live usage.
type Item = (u32, Piece, Usage);

fn pieces(index: u32, gen: Generation) -> BoxStream<'static, Item> {
    stream::unfold(gen, move |mut g| async move {
        let piece = g.next().await?;
        let live = Usage::live(&g);
        Some(((index, piece, live), g))
    })
    .boxed()
}

struct Merge {
    metrics: Metrics,
    /// Choices of each prompt (the first of each counts the prompt's tokens).
    per_prompt: u32,
    pieces: stream::SelectAll<BoxStream<'static, Item>>,
    open: usize,
    usage: Usage,
    tail: Vec<Bytes>,
}

fn respond(gens: Vec<Generation>, meta: ResponseMeta, per_prompt: u32, out: Out) -> Response {
    let open = gens.len();
    let merged = stream::select_all(
        gens.into_iter()
            .enumerate()
            .map(|(i, g)| pieces(i as u32, g)),
    );
    // A chat stream opens each choice with its role chunk.
    let tail = match meta.endpoint {
        Endpoint::Chat => (0..open as u32)
            .rev()
            .map(|i| meta.chunk_for(i, ChunkKind::Open, None))
            .collect(),
        Endpoint::Completions => Vec::new(),
    };
    let start = Merge {
        metrics: out.metrics.clone(),
        per_prompt,
        pieces: merged,
        open,
        usage: Usage::new(0, 0, 0),
        tail,
    };
    let events = stream::unfold((start, meta), |(mut m, meta)| async move {
        if let Some(b) = m.tail.pop() {
            return Some((b, (m, meta)));
        }
        if m.open == 0 {
            return None;
        }
        let (i, piece, live) = m.pieces.next().await?;
        let live = meta.continuous_usage.then_some(live);
        let b = match piece {
            Piece::Text(t) => meta.chunk_for(i, ChunkKind::Text(&t, &[]), live),
            Piece::Done(o) => {
                m.open -= 1;
                if let Some(err) = o.error {
                    // One choice failed: the error, then the end; the others are dropped.
                    m.open = 0;
                    m.tail = vec![Bytes::from_static(DONE)];
                    let e = super::errors::engine_failure(err, o.completion_tokens, &m.metrics);
                    event(&serde_json::to_vec(&e.body()).unwrap_or_default())
                } else {
                    let first = i % m.per_prompt == 0;
                    m.usage = m.usage.sum(Usage::of_choice(&o, first));
                    if m.open == 0 {
                        m.tail.push(Bytes::from_static(DONE));
                        if meta.include_usage {
                            m.tail.push(meta.chunk(ChunkKind::Usage(m.usage)));
                        }
                    }
                    meta.chunk_for(i, ChunkKind::Finish(o.finish_reason), live)
                }
            }
        };
        Some((b, (m, meta)))
    });
    super::sse::respond_with(events, out)
}
