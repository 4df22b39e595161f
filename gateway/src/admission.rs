//! Admission (the last step before the engine): refuse with 503 + `Retry-After` when the
//! engine's queue is full or its inbox cannot take the request, or the server is draining;
//! otherwise submit the validated request with the tenant's SLO and weight.

use superinfer_engine::kv::CacheScope;
use superinfer_engine::{EngineError, EngineRequest, RequestStream};
use superinfer_policies::{RequestId, Slo, TenantId};
use superinfer_tenants::Tenant;

use crate::error::{GatewayError, Result};
use crate::quota::{InFlight, Limiter, Refusal};
use crate::state::AppState;
use crate::validate::ValidRequest;

/// The engine requests (sequences) a validated request runs: each prompt × `best_of`.
pub fn sequences(v: &ValidRequest) -> u32 {
    (1 + v.more_prompts.len() as u32).saturating_mul(v.best_of.max(1))
}

/// The prompt tokens a request's sequences prefill together (each prompt × `best_of`).
pub fn fan_out_prompt_tokens(v: &ValidRequest) -> u64 {
    let prompts: u64 = std::iter::once(&v.prompt)
        .chain(&v.more_prompts)
        .map(|p| p.len() as u64)
        .sum();
    prompts * u64::from(v.best_of.max(1))
}

/// Counts a request's fan-out where it costs, before the engine sees it: every sequence
/// beyond the first (which the quota layer admitted) takes a concurrency seat ([`reserve`]
/// then charges every sequence's tokens). A request with more sequences than the
/// tenant may ever run at once is a 400 naming the field; one whose seats are not free now, a
/// 429. The seats travel with the request and are freed when its last choice ends.
pub async fn fan_out(limits: &dyn Limiter, v: &ValidRequest) -> Result<Option<InFlight>> {
    let seqs = sequences(v);
    let limit = limits.quotas().max_concurrent;
    if seqs > limit {
        let field = if v.best_of > v.n {
            "best_of"
        } else if v.n > 1 {
            "n"
        } else {
            "prompt"
        };
        return Err(GatewayError::invalid(
            field,
            format!(
                "this request runs {seqs} sequences (prompts × n or best_of); this tenant runs \
                 at most {limit} at once (max_concurrent): send fewer"
            ),
        ));
    }
    let seats = match seqs {
        0 | 1 => None,
        _ => Some(
            limits
                .admit_seats(seqs - 1)
                .await
                .map_err(Refusal::into_error)?,
        ),
    };
    Ok(seats)
}

/// The tokens a request may use at most: every sequence's prompt and `max_tokens`.
pub fn reservation(v: &ValidRequest) -> u64 {
    fan_out_prompt_tokens(v) + u64::from(v.max_tokens) * u64::from(sequences(v))
}

/// Charges a request's [`reservation`] to its tenant's tokens per minute before the engine
/// sees it; `usage::UsageTicket` settles it to what the client received when it ends
/// (refunding all of it if the engine never accepted the request).
pub fn reserve(
    limits: &std::sync::Arc<dyn Limiter>,
    v: &ValidRequest,
) -> (std::sync::Arc<dyn Limiter>, u64) {
    let tokens = reservation(v);
    limits.charge_tokens(tokens);
    (limits.clone(), tokens)
}

/// The prefix-cache namespace of a tenant's request: its shared namespace when the tenant
/// has one (`cache_namespace`), else its own; salted with the request's `cache_salt`.
pub fn cache_scope(tenant: &Tenant, salt: Option<&str>) -> CacheScope {
    let base = match &tenant.cache_namespace {
        Some(name) => CacheScope::shared(name),
        None => CacheScope::tenant(TenantId(tenant.id.0)),
    };
    base.salted(salt.map(str::to_owned))
}

/// The engine request for a tenant's validated request: identity, weight, SLO and cache
/// namespace come from the tenant record only (the body can only salt the namespace).
pub fn engine_request(tenant: &Tenant, v: &ValidRequest) -> EngineRequest {
    EngineRequest {
        weight: tenant.weight,
        slo: Slo {
            ttft_s: tenant.slo.ttft_s(),
            tbt_s: tenant.slo.tbt_s(),
        },
        queue_deadline_s: tenant.slo.queue_deadline_s(),
        ignore_eos: v.ignore_eos,
        stop_token_ids: v.stop_token_ids.clone(),
        sampling: v.sampling.clone(),
        cache: Some(cache_scope(tenant, v.cache_salt.as_deref())),
        ..EngineRequest::new(
            RequestId(0),
            TenantId(tenant.id.0),
            v.prompt.clone(),
            v.max_tokens,
        )
    }
}

/// Submits, or refuses; every refusal for load is counted as shed (`Metrics::shed`).
pub fn submit(state: &AppState, tenant: &Tenant, v: &ValidRequest) -> Result<RequestStream> {
    submit_following(state, tenant, v, None)
}

/// [`submit`] for a choice that follows `follows`, an engine request with the same prompt
/// (`EngineRequest::follows`: it finds that prompt cached instead of computing it again).
pub fn submit_following(
    state: &AppState,
    tenant: &Tenant,
    v: &ValidRequest,
    follows: Option<RequestId>,
) -> Result<RequestStream> {
    let shed = |reason: &'static str, e: GatewayError| {
        state.metrics.shed(reason);
        e
    };
    if state.is_draining() {
        return Err(shed("draining", GatewayError::ShuttingDown));
    }
    let waiting = state.engine.stats().waiting;
    if waiting >= state.max_queue {
        return Err(shed(
            "queue_full",
            overloaded(format!(
                "the engine queue is full ({waiting} requests waiting); retry after the \
                 Retry-After seconds"
            )),
        ));
    }
    state
        .engine
        .submit(EngineRequest {
            follows,
            ..engine_request(tenant, v)
        })
        .map_err(|e| match e {
            EngineError::QueueFull(_) => shed(
                "inbox_full",
                overloaded("the engine inbox is full; retry after the Retry-After seconds".into()),
            ),
            EngineError::Stopped => shed("draining", GatewayError::ShuttingDown),
            other => GatewayError::Engine(other.to_string()),
        })
}

fn overloaded(message: String) -> GatewayError {
    GatewayError::Overloaded {
        message,
        retry_after_s: 1,
    }
}
