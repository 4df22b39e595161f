//! `POST /v1/completions` with a list of prompts and/or `n` > 1: one engine request per
//! choice, all submitted before the first token (`index` = prompt × `n` + choice; each choice
//! prefills its prompt itself unless the prefix cache already holds its blocks; usage sums the
//! choices' `cached_tokens`). The request's concurrency slot is shared by its choices and freed
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
    slot: crate::quota::Slot,
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
    let choices = prompts.len() * valid.n as usize;
    let usage = UsageTicket::new(
        state.registry.store().usage().clone(),
        ctx.tenant.id,
        choices,
    );
    let slot = Arc::new(Admitted { slot, usage });
    // Choice `p * n + j` is prompt `p`'s `j`-th; a seeded request's choices draw from seeds
    // `seed + j`, so they differ but repeat exactly.
    let choices = prompts
        .iter()
        .flat_map(|p| (0..valid.n).map(move |j| (p.clone(), j)));
    let mut gens = Vec::with_capacity(prompts.len() * valid.n as usize);
    for (prompt, j) in choices {
        let mut one = ValidRequest {
            prompt,
            more_prompts: Vec::new(),
            n: 1,
            ..valid.clone()
        };
        one.sampling.seed = valid.sampling.seed.map(|s| s.wrapping_add(u64::from(j)));
        // An error drops the generations made so far, which aborts their requests.
        let stream = admission::submit(state, &ctx.tenant, &one).inspect_err(|_| {
            state.metrics.rejected(&ctx.tenant.name, "overloaded");
            // Choices admitted so far are dropped; the request is one error in the ledger.
            slot.usage.fail();
        })?;
        let n = one.prompt.len() as u32;
        ctx.stats.admitted(u64::from(n));
        ctx.metrics.prompt_tokens.increment(u64::from(n));
        ctx.limits.charge_tokens(u64::from(n));
        gens.push(Generation::new(
            stream,
            state.text.decoder(),
            StopMatcher::new(&one.stop),
            ctx.clone(),
            started,
            n,
            slot.clone(),
        ));
    }
    let mut meta = ResponseMeta::new(
        Endpoint::Completions,
        &state.model.id,
        valid.include_usage,
        false,
    );
    meta.continuous_usage = valid.continuous_usage;
    if valid.stream {
        let out = Out {
            metrics: state.metrics.clone(),
            limits: state.stream,
            kill,
        };
        Ok(respond(gens, meta, out))
    } else {
        collect(gens, meta, &state.metrics).await
    }
}

/// One choice's whole text and finish reason, and its usage.
async fn collect_one(
    mut gen: Generation,
    metrics: &Metrics,
) -> Result<(String, &'static str, Usage)> {
    let mut text = String::new();
    while let Some(piece) = gen.next().await {
        match piece {
            Piece::Text(t) => text.push_str(&t),
            Piece::Done(o) => {
                if let Some(err) = o.error {
                    return Err(super::engine_failure(err, o.completion_tokens, metrics));
                }
                let usage = Usage::of(&o);
                return Ok((text, o.finish_reason, usage));
            }
        }
    }
    Err(GatewayError::Engine(
        "the answer ended without a finish".into(),
    ))
}

async fn collect(gens: Vec<Generation>, meta: ResponseMeta, metrics: &Metrics) -> Result<Response> {
    let outs =
        futures_util::future::join_all(gens.into_iter().map(|g| collect_one(g, metrics))).await;
    let mut choices = Vec::with_capacity(outs.len());
    let mut usage = Usage::new(0, 0, 0);
    for out in outs {
        let (text, finish, u) = out?;
        usage = usage.sum(u);
        choices.push((text, finish));
    }
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
    pieces: stream::SelectAll<BoxStream<'static, Item>>,
    open: usize,
    usage: Usage,
    tail: Vec<Bytes>,
}

fn respond(gens: Vec<Generation>, meta: ResponseMeta, out: Out) -> Response {
    let open = gens.len();
    let merged = stream::select_all(
        gens.into_iter()
            .enumerate()
            .map(|(i, g)| pieces(i as u32, g)),
    );
    let start = Merge {
        metrics: out.metrics.clone(),
        pieces: merged,
        open,
        usage: Usage::new(0, 0, 0),
        tail: Vec::new(),
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
                    let e = super::engine_failure(err, o.completion_tokens, &m.metrics);
                    event(&serde_json::to_vec(&e.body()).unwrap_or_default())
                } else {
                    m.usage = m.usage.sum(Usage::of(&o));
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
