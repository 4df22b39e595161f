//! The OpenAI-compatible endpoints: `POST /v1/completions`, `POST /v1/chat/completions`
//! (streamed as server-sent events, or one JSON body), `GET /v1/models`, and the tenant's own
//! `GET /v1/tenant/stats`; vLLM's extra endpoints are in [`extra`]. The auth and quota layers have run before these handlers; each
//! handler then validates, admits and streams, in that order.

mod errors;
pub mod extra;
mod response;
mod several;
mod sse;

pub use crate::config::StreamLimits;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;
use std::time::Instant;

use crate::admission;
use crate::conn::ConnKill;
use crate::error::{GatewayError, Result};
use crate::generate::{Admitted, Generation, Piece, StopMatcher};
use crate::metrics::Metrics;
use crate::quota::Slot;
use crate::registry::TenantCtx;
use crate::state::Shared;
use crate::stats::stats_body;
use crate::usage::UsageTicket;
use crate::validate::{self, Endpoint};
pub use errors::{engine_failure, refusal_error};
use response::{ResponseMeta, Usage};

pub async fn completions(
    State(state): State<Shared>,
    Extension(ctx): Extension<Arc<TenantCtx>>,
    Extension(slot): Extension<Slot>,
    kill: Option<Extension<ConnKill>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let kill = kill.map(|Extension(k)| k);
    generate(state, ctx, slot, kill, Endpoint::Completions, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn chat_completions(
    State(state): State<Shared>,
    Extension(ctx): Extension<Arc<TenantCtx>>,
    Extension(slot): Extension<Slot>,
    kill: Option<Extension<ConnKill>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let kill = kill.map(|Extension(k)| k);
    generate(state, ctx, slot, kill, Endpoint::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn generate(
    state: Shared,
    ctx: Arc<TenantCtx>,
    slot: Slot,
    kill: Option<ConnKill>,
    endpoint: Endpoint,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let started = Instant::now();
    let refuse = |reason: &'static str, e: GatewayError| {
        state.metrics.rejected(&ctx.tenant.name, reason);
        e
    };
    let bytes = body.map_err(|e| {
        refuse(
            "invalid",
            GatewayError::from_body(&e, state.max_body_bytes, state.body_timeout_s),
        )
    })?;
    let (tenant, model, text) = (ctx.tenant.clone(), state.model.clone(), state.text.clone());
    // Parsing, tokenization and templating are CPU work: off the reactor, in the bounded pool.
    let size = bytes.len();
    let valid = state
        .text_pool
        .run_sized(ctx.tenant.id.0, size, move || {
            let t = Instant::now();
            let valid = validate::parse(&bytes)
                .and_then(|b| validate::validate(endpoint, b, &tenant, &model, &text));
            (valid, t.elapsed().as_secs_f64())
        })
        .await
        .map(|(valid, seconds)| {
            // The tenant's CPU, whether the request is then billed or refused.
            ctx.metrics.host_seconds[0].record(seconds);
            valid
        })
        .map_err(|e| {
            if e.status() == StatusCode::SERVICE_UNAVAILABLE {
                state.metrics.shed("text_pool");
            }
            refuse("text_pool", e)
        })?
        .map_err(|e| refuse("invalid", e))?;
    let seats = admission::fan_out(ctx.limits.as_ref(), &valid)
        .await
        .map_err(|e| {
            let reason = if e.status() == StatusCode::TOO_MANY_REQUESTS {
                "concurrency"
            } else {
                "invalid"
            };
            refuse(reason, e)
        })?;
    let usage = UsageTicket::new(
        state.registry.store().usage().clone(),
        ctx.tenant.id,
        admission::sequences(&valid) as usize,
        admission::reserve(&ctx.limits, &valid),
        valid.stream,
    );
    // Every byte after the request is billed waits for its record to be on disk.
    let receipt = usage.receipt();
    let billed = |resp| crate::usage::gate(resp, receipt, state.ledger.clone());
    if !valid.more_prompts.is_empty() || valid.best_of > 1 {
        let resp = several::generate(&state, ctx, (slot, seats, usage), valid, started, kill);
        return Ok(billed(resp.await?).await);
    }
    // A refusal drops `usage`, which refunds the reservation.
    let stream = admission::submit(&state, &ctx.tenant, &valid).map_err(|e| {
        if e.status() == StatusCode::SERVICE_UNAVAILABLE {
            ctx.shed(started.elapsed().as_secs_f64());
        }
        refuse("overloaded", e)
    })?;
    usage.accepted();
    let prompt_tokens = valid.prompt.len() as u32;
    ctx.admitted(true, prompt_tokens);
    let slot = slot
        .take()
        .ok_or_else(|| GatewayError::Internal("the concurrency slot was taken twice".into()))?;
    let slot = Arc::new(Admitted { slot, seats, usage });
    let mut gen = Generation::new(
        stream,
        state.text.decoder(),
        StopMatcher::new(&valid.stop),
        ctx.clone(),
        started,
        prompt_tokens,
        slot,
    );
    // A refusal by the engine (queue full, would miss its SLO, …) is an HTTP error, also for
    // a stream: nothing has been sent yet.
    if let Some(end) = gen.refusal().await {
        return Err(refuse("overloaded", refusal_error(end, &state.metrics)));
    }
    let mut meta = ResponseMeta::new(
        endpoint,
        &state.model.id,
        valid.include_usage,
        valid.logprobs.is_some(),
    );
    meta.continuous_usage = valid.continuous_usage;
    meta.echo = valid.echo;
    let mut gen = if valid.sampling.prompt_logprobs.is_some() {
        // `echo` with `logprobs` (never streamed): the prompt's tokens lead the logprobs.
        meta.echo_first = Some(state.text.decoder().token_text(valid.prompt[0]));
        gen.scoring_prompt(&valid.prompt)
    } else {
        gen
    };
    if let Some(t) = valid.tools.as_ref().filter(|t| t.parses()) {
        let stream = crate::tools::ToolStream::new(valid.tool_format, t.tools.clone());
        meta.tools = Some(std::cell::RefCell::new(stream));
    }
    if valid.stream {
        // The headers wait for the first piece: a request shed at its queue deadline or
        // failed before its first token gets its HTTP error, as when not streamed.
        if let Some(end) = gen.before_first_piece().await {
            return Err(refusal_error(end, &state.metrics));
        }
        let out = sse::Out {
            metrics: state.metrics.clone(),
            limits: state.stream,
            kill,
        };
        Ok(billed(sse::respond(gen, meta, out)).await)
    } else {
        Ok(billed(collect(gen, meta, &state.metrics).await?).await)
    }
}

/// A non-streamed answer: the whole text in one JSON body.
async fn collect(mut gen: Generation, meta: ResponseMeta, metrics: &Metrics) -> Result<Response> {
    let mut text = meta.echo.clone().unwrap_or_default();
    let mut logprobs = Vec::new();
    while let Some(piece) = gen.next().await {
        let prompt = gen.take_prompt_logprobs();
        if !prompt.is_empty() {
            logprobs.splice(0..0, prompt);
        }
        logprobs.extend(gen.take_logprobs());
        match piece {
            Piece::Text(t) => text.push_str(&t),
            Piece::Done(o) => {
                if let Some(err) = o.error {
                    return Err(engine_failure(err, o.completion_tokens, metrics));
                }
                let usage = Usage::of(&o);
                return Ok(meta.full_body(&text, o.finish_reason, usage, &logprobs));
            }
        }
    }
    Err(GatewayError::Engine(
        "the answer ended without a finish".into(),
    ))
}

/// `GET /v1/models`: the one served model.
pub async fn models(State(state): State<Shared>) -> Response {
    Json(serde_json::json!({
        "object": "list",
        "data": [extra::model_card(&state)],
    }))
    .into_response()
}

/// `GET /v1/tenant/stats`: the calling tenant's own statistics. There is no parameter that
/// names a tenant: the key decides whose statistics these are.
pub async fn tenant_stats(Extension(ctx): Extension<Arc<TenantCtx>>) -> Response {
    Json(stats_body(&ctx.tenant, ctx.limits.as_ref(), &ctx.stats)).into_response()
}
