//! What a target reports about each request it was sent.

use serde::{Deserialize, Serialize};

/// The observed life of one request. Times are seconds on the run's clock (0 = start).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: u64,
    /// Index into the run's tenants.
    pub tenant: usize,
    pub arrival_s: f64,
    /// `None`: never served by the end of the run.
    pub first_token_s: Option<f64>,
    /// Time of every output token, the first included, in order.
    pub token_times_s: Vec<f64>,
    /// `None`: still running, paused or waiting at the end of the run.
    pub finish_s: Option<f64>,
    pub prompt_tokens: u32,
    /// Output tokens requested (the target length).
    pub output_tokens: u32,
    /// Output tokens actually produced.
    pub generated_tokens: u32,
    /// Times the request lost its place on the GPU (rotated out or recomputed).
    pub preemptions: u32,
    /// Prompt tokens the server found in its prefix cache; `None`: not known (not finished,
    /// or the server did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
    /// Of `cached_tokens`, those found only in host DRAM (copied in); `None`: not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_dram_tokens: Option<u32>,
    /// The conversation and the turn within it, for multi-turn workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// The target refused the request with this HTTP status, when it was submitted or later
    /// but before its first token (the twin: 400 for a request the node can never hold, 503
    /// for a full queue, a shed at submission or one past its queue deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<u16>,
    /// Seconds of the node's steps that were this request's share, split by the runner's cost
    /// model (the twin reports it; `None`: the target did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_s: Option<f64>,
    /// Seconds from its arrival at the node's engine to its first admission (the twin reports
    /// it; `None`: the target did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_s: Option<f64>,
}

impl RequestRecord {
    /// A record for a request that was never served.
    pub fn unserved(spec: &crate::workload::RequestSpec) -> RequestRecord {
        RequestRecord {
            id: spec.id,
            tenant: spec.tenant,
            arrival_s: spec.arrival_s,
            first_token_s: None,
            token_times_s: Vec::new(),
            finish_s: None,
            prompt_tokens: spec.prompt_tokens,
            output_tokens: spec.output_tokens,
            generated_tokens: 0,
            preemptions: 0,
            cached_tokens: None,
            cached_dram_tokens: None,
            conversation: spec.turn.map(|t| t.conversation),
            turn: spec.turn.map(|t| t.index),
            refused: None,
            gpu_s: None,
            queued_s: None,
        }
    }

    /// Gaps between consecutive tokens, in seconds.
    pub fn gaps(&self) -> impl Iterator<Item = f64> + '_ {
        self.token_times_s.windows(2).map(|w| w[1] - w[0])
    }
}
