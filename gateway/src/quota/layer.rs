//! The quota layer (after auth, before validation): charges the request to its tenant's
//! limiter, and answers 429 (or 503 with the quota store down) when it is over a quota.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::{Arc, Mutex};

use super::Slot;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::registry::TenantCtx;

/// The quota layer; its state is the metrics that count refusals.
pub async fn layer(State(metrics): State<Metrics>, mut req: Request, next: Next) -> Response {
    let Some(ctx) = req.extensions().get::<Arc<TenantCtx>>().cloned() else {
        // The auth layer runs first; without it there is no tenant to charge.
        return GatewayError::Internal("quota layer without auth".into()).into_response();
    };
    match ctx.limits.admit().await {
        Ok(slot) => {
            req.extensions_mut()
                .insert(Slot(Arc::new(Mutex::new(Some(slot)))));
            next.run(req).await
        }
        Err(refusal) => {
            metrics.rejected(&ctx.tenant.name, refusal.reason());
            refusal.into_error().into_response()
        }
    }
}
