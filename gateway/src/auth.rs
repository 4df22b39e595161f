//! The auth layer: the bearer key → the tenant's live context, attached to the request as an
//! extension. Missing or unknown key → 401; disabled tenant → 403. Uses only the in-memory
//! directory (no disk access per request).
//!
//! Also the admin API's credential, [`AdminToken`], which `crate::admin` checks.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use superinfer_tenants::{Auth, KeyHash};

use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::registry::Registry;

/// The admin token, kept as a hash and compared in constant time.
#[derive(Clone)]
pub struct AdminToken(KeyHash);

impl AdminToken {
    pub fn new(token: &str) -> AdminToken {
        AdminToken(KeyHash::of(token))
    }

    pub fn matches(&self, presented: &str) -> bool {
        // KeyHash equality is constant-time.
        self.0 == KeyHash::of(presented)
    }
}

/// The auth layer's own state: the tenant directory, and the metrics that count refusals.
#[derive(Clone)]
pub struct AuthState {
    pub registry: Arc<Registry>,
    pub metrics: Metrics,
}

/// The value of `Authorization: Bearer <token>`, if present.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

pub async fn layer(State(state): State<AuthState>, mut req: Request, next: Next) -> Response {
    let Some(key) = bearer(req.headers()) else {
        return GatewayError::MissingKey.into_response();
    };
    match state.registry.authenticate(key) {
        Auth::Granted(ctx) => {
            req.extensions_mut().insert(ctx);
            next.run(req).await
        }
        Auth::Disabled(ctx) => {
            state.metrics.rejected(&ctx.tenant.name, "disabled");
            GatewayError::TenantDisabled {
                name: ctx.tenant.name.clone(),
            }
            .into_response()
        }
        Auth::Denied => GatewayError::InvalidKey.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_scheme_is_case_insensitive_and_trimmed() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  sk-si-x "),
        );
        assert_eq!(bearer(&h), Some("sk-si-x"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
    }
}
