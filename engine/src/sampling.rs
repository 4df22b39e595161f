//! Per-request sampling parameters. The runner applies them; the simulated runner ignores
//! them (its lengths come from `max_tokens`).

use serde::{Deserialize, Serialize};

/// How the next token is chosen. `temperature == 0` is greedy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0: no top-k.
    pub top_k: u32,
    /// 1.0: no nucleus cut.
    pub top_p: f32,
    /// 0.0: no min-p cut.
    pub min_p: f32,
    pub seed: Option<u64>,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
        }
    }
}
