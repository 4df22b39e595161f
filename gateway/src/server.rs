//! The composition root: opens the tenant store, starts the engine, builds the router with its
//! layers, listens ([`crate::conn`]), and shuts down in order (drain in-flight requests up to a
//! deadline, answering new ones 503 → stop listening → stop the engine → flush the store).
//!
//! Layers, outermost first (the order matters):
//! 1. request-id sanitizing (a client's id that is too long or odd is dropped), then request id
//!    (`x-request-id`, set if absent, echoed back) ([`crate::layers`]);
//! 2. trace (one span per request, carrying the id; no per-request ERROR for 503s);
//! 3. OpenAI-shaped errors: any error answer below that is not JSON becomes OpenAI's shape;
//! 4. header limits (count, one `Authorization`), body timeout (408), body limit (413 at once
//!    for a `Content-Length` over it);
//! 5. auth (key → tenant) — before quota, which needs the tenant; on the generation routes
//!    then the inference extension's headers, only from a trusted proxy ([`crate::proxy`]),
//!    before quota so a refused header costs no quota;
//! 6. quota (rate, tokens/min, concurrency) — before validation, so a flood of bad requests
//!    from one tenant is throttled before it costs tokenization;
//! 7. validation (parse, byte bound, tokenize, limits, in the text pool) and 8. admission
//!    (engine queue) run in the handler, in that order ([`crate::openai`]).

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn_with_state, map_request, map_response_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use superinfer_tenants::{NewTenant, TenantStore};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::admin;
use crate::auth::AdminToken;
use crate::backend::{self, Backend};
use crate::config::{EdgeConfig, ServeConfig};
use crate::conn::Accept;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::openai;
use crate::quota::fleet::RedisStore;
use crate::quota::{LocalStore, QuotaStore};
use crate::registry::Registry;
use crate::state::{AppState, Shared};
use crate::text::TextPool;
use crate::{auth, layers, proxy, quota};

/// Name of the tenant created on the first start.
pub const DEFAULT_TENANT: &str = "default";

/// A server that is listening.
pub struct RunningServer {
    pub addr: SocketAddr,
    /// Where `/metrics` is served when `--metrics-listen` moved it.
    pub metrics_addr: Option<SocketAddr>,
    /// The default tenant's key, when this start created the tenant (first start only).
    pub default_api_key: Option<String>,
    pub state: Shared,
    stop: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl RunningServer {
    /// Begins a graceful shutdown and waits for it to finish.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        self.task.await.context("the server task")?
    }

    /// Waits until `signal` resolves, then shuts down gracefully.
    pub async fn run_until(
        self,
        signal: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        signal.await;
        tracing::info!("shutting down: no new connections; draining in-flight requests");
        self.shutdown().await
    }
}

pub use crate::conn::LIVENESS_PATH;
/// Readiness: 200 when serving, 503 while draining or with the engine stopped.
pub const READINESS_PATH: &str = "/readyz";
/// Prometheus text, on the API listener or on `--metrics-listen`.
pub const METRICS_PATH: &str = "/metrics";

/// Opens everything and starts listening.
pub async fn start(cfg: ServeConfig) -> anyhow::Result<RunningServer> {
    if let Some(notice) = superinfer_engine::handle::fault_injection_notice() {
        tracing::warn!("{notice}");
    }
    let metrics = Metrics::new();
    let quota = quota_store(&cfg, &metrics).await?;
    let (registry, default_api_key, changes) = open_tenants(&cfg, metrics.clone(), quota).await?;
    let model = cfg.model.clone();
    let engine_opts = cfg.engine.clone();
    let Backend {
        handle,
        thread,
        text,
        model,
    } = tokio::task::spawn_blocking({
        let steps = metrics.step_metrics();
        move || backend::start(&model, &engine_opts, Some(steps))
    })
    .await
    .context("the engine start task")??;
    let (ledger, commit) =
        crate::usage::spawn_flusher(registry.store().clone(), cfg.ledger_sync, metrics.clone());
    let state = Arc::new(AppState {
        ledger: commit,
        engine: handle,
        registry: registry.clone(),
        metrics,
        text,
        model,
        admin_token: cfg.admin_token.as_deref().map(AdminToken::new),
        max_queue: cfg.engine.max_queue,
        max_body_bytes: cfg.max_body_bytes,
        body_timeout_s: cfg.edge.body_timeout.as_secs().max(1),
        max_headers: cfg.edge.max_headers,
        stream: cfg.edge.stream_limits(),
        text_pool: TextPool::new(cfg.edge.text_pool),
        draining: AtomicBool::new(false),
        proxy: Arc::new(cfg.proxy.clone()),
        started_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let watcher = registry.spawn_watcher(changes);
    #[cfg(unix)]
    let reloader = match &cfg.tenants_file {
        None => None,
        Some(c) => Some(
            crate::tenants_file::spawn_on_sighup(registry.clone(), c.clone())
                .context("cannot install the SIGHUP handler for the tenants file")?,
        ),
    };
    #[cfg(not(unix))]
    let reloader = None;
    let listener = TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let (metrics_listener, metrics_addr) = match cfg.metrics_listen {
        None => (None, None),
        Some(a) => {
            let l = TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen on {a} for /metrics"))?;
            let local = l.local_addr()?;
            (Some(l), Some(local))
        }
    };
    let app = router(state.clone(), &cfg.edge, cfg.metrics_listen.is_none());
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(serve(Serve {
        state: state.clone(),
        app,
        listener,
        metrics_listener,
        stopped,
        drain: cfg.drain_timeout,
        edge: cfg.edge.clone(),
        thread,
        watcher,
        reloader,
        ledger,
    }));
    tracing::info!(%addr, model = %state.model.id, "listening");
    Ok(RunningServer {
        addr,
        metrics_addr,
        default_api_key,
        state,
        stop,
        task,
    })
}

type Opened = (
    Arc<Registry>,
    Option<String>,
    superinfer_tenants::Subscriber,
);

/// This node's limiters, or the fleet's in Redis (pinged once, so the log and
/// `superinfer_quota_store_up` say at once whether it answers).
async fn quota_store(cfg: &ServeConfig, metrics: &Metrics) -> anyhow::Result<Arc<dyn QuotaStore>> {
    let Some(fleet) = &cfg.quota_store else {
        return Ok(Arc::new(LocalStore));
    };
    let store = RedisStore::new(fleet.clone(), metrics.clone())?;
    if store.ping().await {
        tracing::info!(failure = ?fleet.failure, "fleet quotas in Redis");
    }
    Ok(Arc::new(store))
}

/// Opens the store and applies `--tenants-file`; without one, on the first start creates the
/// default tenant and returns its key.
async fn open_tenants(
    cfg: &ServeConfig,
    metrics: Metrics,
    quota: Arc<dyn QuotaStore>,
) -> anyhow::Result<Opened> {
    let dir = cfg.data_dir.clone();
    let file = cfg.tenants_file.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Opened> {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
        let store = TenantStore::open(dir.join("tenants"))?;
        let mut key = None;
        if let Some(f) = &file {
            let report = crate::tenants_file::apply(&store, f)?;
            tracing::info!(path = %f.path.display(), %report, "tenants file applied");
        } else if store.list()?.is_empty() {
            let (_, k) = store.create(NewTenant::named(DEFAULT_TENANT))?;
            key = Some(k.into_string());
        }
        // Subscribe before the first snapshot, so no write falls between them.
        let changes = store.subscribe();
        let registry = Registry::new(store, metrics, quota)?;
        Ok((Arc::new(registry), key, changes))
    })
    .await
    .context("the tenant store task")?
}

pub fn router(state: Shared, edge: &EdgeConfig, with_metrics: bool) -> Router {
    let auth_state = auth::AuthState {
        registry: state.registry.clone(),
        metrics: state.metrics.clone(),
    };
    let proxy_state = proxy::ProxyState {
        config: state.proxy.clone(),
        metrics: state.metrics.clone(),
    };
    // Tokenizing is work on the node too: `/tokenize` and `/detokenize` are admitted by the
    // same quota layer (request rate, a concurrency seat while they run, token debt).
    let generate = Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/tokenize", post(openai::extra::tokenize))
        .route("/detokenize", post(openai::extra::detokenize))
        .layer(from_fn_with_state(state.metrics.clone(), quota::layer))
        .layer(from_fn_with_state(proxy_state, proxy::layer))
        .layer(from_fn_with_state(auth_state.clone(), auth::layer));
    let tenant_reads = Router::new()
        .route("/v1/models", get(openai::models))
        .route("/v1/tenant/stats", get(openai::tenant_stats))
        .route("/v1/models/{*id}", get(openai::extra::model))
        .layer(from_fn_with_state(auth_state, auth::layer));
    let mut open = Router::new()
        .route(LIVENESS_PATH, get(healthz))
        .route(READINESS_PATH, get(readyz))
        .route("/health", get(openai::extra::health))
        .route("/version", get(openai::extra::version));
    if with_metrics {
        open = open.route(METRICS_PATH, get(metrics_text));
    }
    // Layers, innermost first (each `.layer` wraps the ones before it).
    Router::new()
        .merge(generate)
        .merge(tenant_reads)
        .merge(open)
        .merge(admin::router(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // tower-http's limit answers a Content-Length over the limit at once, before reading.
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(state.max_body_bytes))
        .layer(RequestBodyTimeoutLayer::new(edge.body_timeout))
        .layer(from_fn_with_state(state.clone(), layers::header_limits))
        .layer(map_response_with_state(state.clone(), layers::openai_errors))
        // Expected 503s (shedding) are counted and summarized by `Metrics::shed`, not logged
        // one line per request: no failure logging here.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let id = req
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::debug_span!("request", method = %req.method(), path = %req.uri().path(), id)
                })
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeId::default()))
        .layer(map_request(layers::sanitize_request_id))
        .with_state(state)
}

/// Request ids `req-<salt><counter>`: unique per process, cheap.
#[derive(Clone)]
struct MakeId {
    salt: u32,
    next: Arc<AtomicU64>,
}

impl Default for MakeId {
    fn default() -> Self {
        MakeId {
            salt: rand::random(),
            next: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl MakeRequestId for MakeId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("req-{:08x}{n:08x}", self.salt);
        HeaderValue::from_str(&id).ok().map(RequestId::new)
    }
}

async fn healthz() -> Response {
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn readyz(State(state): State<Shared>) -> Response {
    let (code, status) = if state.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else if !state.engine.is_running() {
        (StatusCode::SERVICE_UNAVAILABLE, "engine stopped")
    } else {
        (StatusCode::OK, "ready")
    };
    (code, axum::Json(serde_json::json!({"status": status}))).into_response()
}

async fn metrics_text(State(state): State<Shared>) -> Response {
    state.metrics.engine_failures(state.engine.panics());
    let body = state.metrics.render(&state.engine.stats(), &state.model.id);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    GatewayError::NotFound {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    }
    .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    GatewayError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    }
    .into_response()
}

struct Serve {
    state: Shared,
    app: Router,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    stopped: watch::Receiver<bool>,
    drain: Duration,
    edge: EdgeConfig,
    thread: superinfer_engine::EngineThread,
    watcher: JoinHandle<()>,
    /// Re-applies `--tenants-file` on SIGHUP.
    reloader: Option<JoinHandle<()>>,
    /// Writes the usage ledger every second and for every answer (the last write is the
    /// store's flush at exit).
    ledger: JoinHandle<()>,
}

/// How long the streams still open after the drain deadline get to write their error event
/// and `[DONE]` (and wait for their ledger records) once the engine has stopped.
const STREAMS_END_GRACE: Duration = Duration::from_secs(3);

async fn serve(s: Serve) -> anyhow::Result<()> {
    let stop_signal = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let metrics_task = s.metrics_listener.map(|l| {
        let app = Router::new()
            .route(METRICS_PATH, get(metrics_text))
            .with_state(s.state.clone());
        let accept = Accept {
            listener: l,
            app,
            config: s.edge.clone(),
            metrics: s.state.metrics.clone(),
            drain: Duration::ZERO,
        };
        let stop = stop_signal(s.stopped.clone());
        tokio::spawn(async move { accept.run(stop).await.close(Duration::ZERO).await })
    });
    let state = s.state.clone();
    let mut rx = s.stopped.clone();
    let on_stop = async move {
        let _ = rx.wait_for(|v| *v).await;
        state.draining.store(true, Ordering::Release);
    };
    let accept = Accept {
        listener: s.listener,
        app: s.app,
        config: s.edge,
        metrics: s.state.metrics.clone(),
        drain: s.drain,
    };
    let remaining = accept.run(on_stop).await;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    s.watcher.abort();
    if let Some(r) = &s.reloader {
        r.abort();
    }
    let thread = s.thread;
    // Stopping the engine ends the streams still open with an error event and `[DONE]`; they
    // get a moment to write it before their connections are closed. The ledger's writer runs
    // until then: those streams' records are settled as they end, and their last bytes wait
    // for their records to be on disk.
    tokio::task::spawn_blocking(move || thread.shutdown())
        .await
        .context("the engine's shutdown")?;
    remaining.close(STREAMS_END_GRACE).await;
    s.ledger.abort();
    let store = s.state.registry.store().clone();
    tokio::task::spawn_blocking(move || store.flush())
        .await
        .context("the store's last flush")??;
    tracing::info!("stopped");
    Ok(())
}
