//! A tenant's terms: its latency promise ([`Slo`]) and what it may use ([`Quotas`]).

use serde::{Deserialize, Serialize};

/// A latency promise in milliseconds: time to first token and time between tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Slo {
    pub ttft_ms: u32,
    pub tbt_ms: u32,
    /// Milliseconds a request may wait for its first admission before it is shed with 503;
    /// `None`: the node's `queue_deadline_ttfts` times `ttft_ms` (10 by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_deadline_ms: Option<u32>,
}

impl Default for Slo {
    /// The paper's SLOs: TTFT 5 s, TBT 100 ms (the same as the engine's default).
    fn default() -> Self {
        Slo {
            ttft_ms: 5_000,
            tbt_ms: 100,
            queue_deadline_ms: None,
        }
    }
}

impl Slo {
    /// Time to first token in seconds, as the engine takes it.
    pub fn ttft_s(&self) -> f64 {
        f64::from(self.ttft_ms) / 1e3
    }

    /// Time between tokens in seconds, as the engine takes it.
    pub fn tbt_s(&self) -> f64 {
        f64::from(self.tbt_ms) / 1e3
    }

    /// The tenant's own queue deadline in seconds, as the engine takes it (`None`: the node's).
    pub fn queue_deadline_s(&self) -> Option<f64> {
        self.queue_deadline_ms.map(|ms| f64::from(ms) / 1e3)
    }
}

/// What a tenant may use. The gateway enforces these; the store only keeps them sane.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Quotas {
    /// Sustained request rate (token bucket refill), requests per second.
    pub requests_per_s: f64,
    /// Token bucket depth: requests that may arrive at once.
    pub burst: u32,
    /// Prompt plus output tokens per minute.
    pub tokens_per_min: u64,
    /// Requests in flight at once.
    pub max_concurrent: u32,
    /// Longest prompt accepted, in tokens.
    pub max_prompt_tokens: u32,
    /// Largest `max_tokens` accepted (and the cap when a request leaves it out).
    pub max_output_tokens: u32,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            requests_per_s: 50.0,
            burst: 100,
            tokens_per_min: 1_000_000,
            max_concurrent: 64,
            max_prompt_tokens: 8_192,
            max_output_tokens: 2_048,
        }
    }
}
