//! What every handler shares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use superinfer_engine::EngineHandle;

use crate::auth::AdminToken;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::text::{Text, TextPool};
use crate::wire::ModelInfo;

/// The server's shared state; handlers get it as `State<Arc<AppState>>`.
pub struct AppState {
    pub engine: EngineHandle,
    pub registry: Arc<Registry>,
    pub metrics: Metrics,
    pub text: Text,
    /// Where parsing, tokenization and chat templating run (never on the reactor).
    pub text_pool: TextPool,
    pub model: ModelInfo,
    /// `None`: the admin API is disabled.
    pub admin_token: Option<AdminToken>,
    /// Requests waiting in the engine beyond this are refused with 503.
    pub max_queue: usize,
    /// Largest accepted request body, bytes.
    pub max_body_bytes: usize,
    /// Seconds a request body may take to arrive.
    pub body_timeout_s: u64,
    /// Header fields in one request, at most.
    pub max_headers: usize,
    /// Slow readers: how much of a stream waits for its client, and for how long.
    pub stream: crate::config::StreamLimits,
    /// Set when shutdown began: new requests get 503, `/readyz` fails.
    pub draining: AtomicBool,
    /// Who may send the inference extension's headers (`crate::proxy`).
    pub proxy: Arc<crate::proxy::ProxyConfig>,
    /// Unix seconds when the server started (the model's `created`).
    pub started_unix_s: u64,
    /// The usage ledger's writer: answers wait on it for their record ([`crate::usage::gate`]).
    pub ledger: Arc<crate::usage::LedgerCommit>,
}

impl AppState {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

pub type Shared = Arc<AppState>;
