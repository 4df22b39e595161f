//! The admin API under `/admin/v1/tenants`, behind its own token (`--admin-token` or
//! `SUPERINFER_ADMIN_TOKEN`; without one the admin API answers 403). Tenants are named in
//! paths by id (all digits) or by name (never all digits). Every write returns once it is durable, and the request path sees
//! it before the response is sent (the directory is rebuilt right after the write).
//!
//! | method | path | does |
//! |---|---|---|
//! | GET | /admin/v1/tenants | list |
//! | POST | /admin/v1/tenants | create; the only time the key is shown (201) |
//! | GET | /admin/v1/tenants/{tenant} | get |
//! | PATCH | /admin/v1/tenants/{tenant} | change some fields |
//! | DELETE | /admin/v1/tenants/{tenant} | delete (its key stops working) |
//! | POST | /admin/v1/tenants/{tenant}/rotate-key | new key; the old one stops working |
//! | GET | /admin/v1/tenants/{tenant}/stats | the tenant's live statistics |

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::json;
use superinfer_tenants::{KeyHash, NewTenant, Tenant, TenantPatch, TenantRef, TenantStore};

use crate::auth::bearer;
use crate::error::{GatewayError, Result};
use crate::state::Shared;

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

pub fn router(state: Shared) -> Router<Shared> {
    Router::new()
        .route("/admin/v1/tenants", get(list).post(create))
        .route(
            "/admin/v1/tenants/{tenant}",
            get(get_one).patch(patch).delete(delete),
        )
        .route("/admin/v1/tenants/{tenant}/rotate-key", post(rotate_key))
        .route("/admin/v1/tenants/{tenant}/stats", get(stats))
        .layer(axum::middleware::from_fn_with_state(state, admin_auth))
}

async fn admin_auth(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let Some(token) = &state.admin_token else {
        return GatewayError::AdminDisabled.into_response();
    };
    match bearer(req.headers()) {
        Some(t) if token.matches(t) => next.run(req).await,
        _ => GatewayError::AdminUnauthorized.into_response(),
    }
}

/// Runs a blocking store call off the async executor.
async fn blocking<T: Send + 'static>(
    state: &Shared,
    f: impl FnOnce(&TenantStore) -> Result<T> + Send + 'static,
) -> Result<T> {
    let store = state.registry.store().clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| GatewayError::Internal(format!("store task: {e}")))?
}

/// A tenant named in a path: all digits is an id, anything else a name (names cannot be all
/// digits, so a path never means two tenants).
fn resolve(store: &TenantStore, key: &str) -> Result<Tenant> {
    let r = TenantRef::parse(key);
    store
        .resolve(&r)?
        .ok_or_else(|| GatewayError::TenantNotFound(r.to_string()))
}

fn parse<T: DeserializeOwned>(
    state: &Shared,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<T> {
    let bytes = body.map_err(|e| GatewayError::from_body(&e, state))?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        GatewayError::InvalidRequest {
            message: format!("`{path}`: {}", e.into_inner()),
            param: (path != ".").then_some(path),
        }
    })
}

async fn list(State(state): State<Shared>) -> Result<Response> {
    let tenants = blocking(&state, |s| Ok(s.list()?)).await?;
    Ok(Json(json!({"object": "list", "data": tenants})).into_response())
}

async fn create(
    State(state): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let new: NewTenant = parse(&state, body)?;
    let (tenant, key) = blocking(&state, move |s| Ok(s.create(new)?)).await?;
    state.registry.refresh().await?;
    tracing::info!(tenant = %tenant.name, id = tenant.id.0, "tenant created");
    let body = json!({"tenant": tenant, "api_key": key.expose()});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn get_one(State(state): State<Shared>, Path(key): Path<String>) -> Result<Response> {
    let tenant = blocking(&state, move |s| resolve(s, &key)).await?;
    Ok(Json(tenant).into_response())
}

async fn patch(
    State(state): State<Shared>,
    Path(key): Path<String>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let p: TenantPatch = parse(&state, body)?;
    let tenant = blocking(&state, move |s| {
        let t = resolve(s, &key)?;
        Ok(s.patch(t.id, p)?)
    })
    .await?;
    state.registry.refresh().await?;
    tracing::info!(tenant = %tenant.name, id = tenant.id.0, "tenant patched");
    Ok(Json(tenant).into_response())
}

async fn delete(State(state): State<Shared>, Path(key): Path<String>) -> Result<Response> {
    let tenant = blocking(&state, move |s| {
        let t = resolve(s, &key)?;
        Ok(s.delete(t.id)?)
    })
    .await?;
    state.registry.refresh().await?;
    tracing::info!(tenant = %tenant.name, id = tenant.id.0, "tenant deleted");
    Ok(Json(json!({"deleted": true, "tenant": tenant})).into_response())
}

async fn rotate_key(State(state): State<Shared>, Path(key): Path<String>) -> Result<Response> {
    let (tenant, key) = blocking(&state, move |s| {
        let t = resolve(s, &key)?;
        let k = s.rotate_key(t.id)?;
        Ok((t, k))
    })
    .await?;
    state.registry.refresh().await?;
    tracing::info!(tenant = %tenant.name, id = tenant.id.0, "tenant key rotated");
    Ok(Json(json!({"tenant": tenant, "api_key": key.expose()})).into_response())
}

async fn stats(State(state): State<Shared>, Path(key): Path<String>) -> Result<Response> {
    let tenant = blocking(&state, move |s| resolve(s, &key)).await?;
    let ctx = state
        .registry
        .get(tenant.id)
        .ok_or_else(|| GatewayError::TenantNotFound(format!("named `{}`", tenant.name)))?;
    Ok(Json(crate::openai::stats_body(&ctx)).into_response())
}
