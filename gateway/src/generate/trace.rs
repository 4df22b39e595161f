//! One request's trace: a `request` span (tenant, engine id) with an event at its first token
//! and one at its end (finish reason, tokens, time queued in the engine, time to the first
//! token, preemptions, why it went unserved), at DEBUG under the target
//! `superinfer::request`, so `RUST_LOG=superinfer::request=debug` follows every request
//! through the node without a line per request at the default level.

use superinfer_engine::EndTrace;
use tracing::Span;

pub const TARGET: &str = "superinfer::request";

/// The span of one choice of one request and what its end event reports.
#[derive(Clone)]
pub struct RequestTrace {
    span: Span,
    /// The engine's account of its life, with its end.
    pub engine: EndTrace,
}

impl RequestTrace {
    pub fn new(tenant: &str, id: u64) -> RequestTrace {
        RequestTrace {
            span: tracing::debug_span!(target: TARGET, "request", tenant, id),
            engine: EndTrace::default(),
        }
    }

    /// Its first token came `ttft_s` after arrival, `cached` prompt tokens found cached.
    pub fn first_token(&self, ttft_s: f64, cached: u32) {
        tracing::debug!(target: TARGET, parent: &self.span, ttft_s, cached, "first token");
    }

    /// It ended with `reason` (and `unserved` when it never had a first token).
    pub fn end(&self, reason: &str, tokens: (u32, u32), e2e_s: f64, unserved: Option<&str>) {
        tracing::debug!(
            target: TARGET,
            parent: &self.span,
            finish_reason = reason,
            prompt_tokens = tokens.0,
            completion_tokens = tokens.1,
            queued_s = self.engine.queued_s,
            preemptions = self.engine.preemptions,
            gpu_s = self.engine.gpu_s,
            e2e_s,
            unserved,
            "finished"
        );
    }
}
