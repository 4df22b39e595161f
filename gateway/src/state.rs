//! What every handler shares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use superinfer_engine::EngineHandle;

use crate::admin::AdminToken;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::text::Text;
use crate::validate::ModelInfo;

/// The server's shared state; handlers get it as `State<Arc<AppState>>`.
pub struct AppState {
    pub engine: EngineHandle,
    pub registry: Arc<Registry>,
    pub metrics: Metrics,
    pub text: Text,
    pub model: ModelInfo,
    /// `None`: the admin API is disabled.
    pub admin_token: Option<AdminToken>,
    /// Requests waiting in the engine beyond this are refused with 503.
    pub max_queue: usize,
    /// Largest accepted request body, bytes.
    pub max_body_bytes: usize,
    /// Set when shutdown began: new requests get 503, `/readyz` fails.
    pub draining: AtomicBool,
    /// Unix seconds when the server started (the model's `created`).
    pub started_unix_s: u64,
}

impl AppState {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

pub type Shared = Arc<AppState>;
