//! The admin API under `/admin/v1/` (tenants, and the usage ledger), behind its own token (`--admin-token` or
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
//! | DELETE | /admin/v1/tenants/{tenant}/prefix-cache[?shared=true] | drop its prefix cache |
//! | GET | /admin/v1/usage[?tenant=&from=&to=&format=json\|csv] | the usage ledger ([`crate::usage`]) |

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete as delete_route, get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::json;
use superinfer_engine::kv::CacheScope;
use superinfer_engine::EngineError;
use superinfer_policies::TenantId as EngineTenantId;
use superinfer_tenants::{NewTenant, Tenant, TenantPatch, TenantRef, TenantStore};

use crate::auth::bearer;
use crate::error::{GatewayError, Result};
use crate::state::Shared;
use crate::stats::stats_body;

pub fn router(state: Shared) -> Router<Shared> {
    Router::new()
        .route("/admin/v1/tenants", get(list).post(create))
        .route(
            "/admin/v1/tenants/{tenant}",
            get(get_one).patch(patch).delete(delete),
        )
        .route("/admin/v1/tenants/{tenant}/rotate-key", post(rotate_key))
        .route("/admin/v1/usage", get(crate::usage::export))
        .route("/admin/v1/tenants/{tenant}/stats", get(stats))
        .route(
            "/admin/v1/tenants/{tenant}/prefix-cache",
            delete_route(drop_prefix_cache),
        )
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
    let bytes =
        body.map_err(|e| GatewayError::from_body(&e, state.max_body_bytes, state.body_timeout_s))?;
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
    Ok(Json(stats_body(&ctx.tenant, ctx.limits.as_ref(), &ctx.stats)).into_response())
}

/// `DELETE /admin/v1/tenants/{tenant}/prefix-cache`: drops the tenant's own prefix-cache
/// namespace (every salt). A tenant in a shared namespace shares it with other tenants, so that
/// one is dropped only with `?shared=true`; the answer says which were dropped. Blocks that live
/// requests still use are freed when those end, but no request hits them again.
async fn drop_prefix_cache(
    State(state): State<Shared>,
    Path(key): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response> {
    let shared = shared_flag(query.as_deref())?;
    let tenant = blocking(&state, move |s| resolve(s, &key)).await?;
    let own = CacheScope::tenant_base(EngineTenantId(tenant.id.0));
    let n = drop_base(&state, own.clone()).await?;
    let mut total = u64::from(n);
    let mut namespaces = vec![json!({"namespace": own, "dropped_blocks": n})];
    let shared_ns = tenant.cache_namespace.clone();
    let note = match (&shared_ns, shared) {
        (Some(name), true) => {
            let base = CacheScope::shared_base(name);
            let n = drop_base(&state, base.clone()).await?;
            total += u64::from(n);
            namespaces.push(json!({"namespace": base, "dropped_blocks": n}));
            None
        }
        (Some(name), false) => Some(format!(
            "the shared namespace `{name}` was not dropped (other tenants may use it); add \
             ?shared=true to drop it too"
        )),
        (None, true) => Some("the tenant has no shared namespace".to_string()),
        (None, false) => None,
    };
    tracing::info!(tenant = %tenant.name, id = tenant.id.0, blocks = total, "prefix cache dropped");
    Ok(Json(json!({
        "object": "prefix_cache.dropped",
        "tenant": {"id": tenant.id, "name": tenant.name},
        "dropped_blocks": total,
        "namespaces": namespaces,
        "cache_namespace": shared_ns,
        "note": note,
    }))
    .into_response())
}

/// The query of the drop call: nothing, or `shared=true|false`.
fn shared_flag(query: Option<&str>) -> Result<bool> {
    let mut shared = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        shared = match pair.split_once('=') {
            Some(("shared", "true")) => true,
            Some(("shared", "false")) => false,
            Some(("shared", v)) => {
                return Err(GatewayError::invalid(
                    "shared",
                    format!("`shared` must be true or false, got {v:?}"),
                ))
            }
            _ => {
                let name = pair.split('=').next().unwrap_or(pair);
                return Err(GatewayError::invalid(
                    name,
                    format!("unknown query parameter `{name}`; the only one is `shared`"),
                ));
            }
        };
    }
    Ok(shared)
}

async fn drop_base(state: &Shared, base: String) -> Result<u32> {
    state
        .engine
        .drop_prefix_cache(base)
        .await
        .map_err(|e| match e {
            EngineError::Stopped => GatewayError::ShuttingDown,
            EngineError::QueueFull(_) => GatewayError::Overloaded {
                message: "the engine inbox is full; retry after the Retry-After seconds".into(),
                retry_after_s: 1,
            },
            other => GatewayError::Engine(other.to_string()),
        })
}
