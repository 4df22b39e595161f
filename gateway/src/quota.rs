//! The quota layer (after auth, before validation): the tenant's requests/s with burst, its
//! tokens-per-minute bucket and its concurrency limit ([`crate::limits`]). Over any of them →
//! 429 with `Retry-After`. The concurrency slot it takes travels with the request as a
//! [`Slot`] and is freed when the response (streamed or not) is complete.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::GatewayError;
use crate::limits::{InFlight, Refusal};
use crate::registry::TenantCtx;
use crate::state::Shared;

/// The concurrency slot of one request, taken out by the handler.
#[derive(Clone, Debug)]
pub struct Slot(Arc<Mutex<Option<InFlight>>>);

impl Slot {
    pub fn take(&self) -> Option<InFlight> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

pub async fn layer(State(state): State<Shared>, mut req: Request, next: Next) -> Response {
    let Some(ctx) = req.extensions().get::<Arc<TenantCtx>>().cloned() else {
        // The auth layer runs first; without it there is no tenant to charge.
        return GatewayError::Internal("quota layer without auth".into()).into_response();
    };
    match ctx.limits.admit() {
        Ok(slot) => {
            req.extensions_mut()
                .insert(Slot(Arc::new(Mutex::new(Some(slot)))));
            next.run(req).await
        }
        Err(refusal) => {
            let reason = match refusal {
                Refusal::Rate { .. } => "rate",
                Refusal::Tokens { .. } => "tokens",
                Refusal::Concurrency { .. } => "concurrency",
            };
            state.metrics.rejected(&ctx.tenant.name, reason);
            let (message, retry_after_s) = refusal.message();
            GatewayError::RateLimited {
                message,
                retry_after_s,
            }
            .into_response()
        }
    }
}
