//! The model runner contract: run one batch of prefill chunks and decode tokens over the
//! HBM tier, return the sampled tokens and how long the step took.
//!
//! Backends: [`sim`] (a cost model from a hardware+model profile), `cpu` (candle) and `cuda`.

mod cost;
#[cfg(feature = "model")]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod sim;

pub use cost::StepCost;

use crate::error::EngineError;
use crate::grammar::MaskRef;
use crate::kv::{BlockGeometry, LogicalBlock};
use crate::sampling::{SamplingParams, TokenLogprobs};
use superinfer_policies::RequestId;

/// One request's share of a step: run `tokens` (the sequence from position `pos`) and, when
/// `sample` is set, return the next token.
#[derive(Clone, Debug)]
pub struct BatchEntry<'a> {
    pub id: RequestId,
    /// The whole sequence so far (prompt + generated); the step runs `tokens[pos..end]`.
    pub tokens: &'a [u32],
    /// `tokens[..prompt_len]` is the prompt, the rest generated (for sampling penalties).
    pub prompt_len: u32,
    pub pos: u32,
    pub end: u32,
    /// The request's block table; every block covering `0..end` is resident in HBM.
    pub blocks: &'a [LogicalBlock],
    pub sample: bool,
    pub sampling: &'a SamplingParams,
    /// The row's token mask when its request has a grammar (computed while the step runs;
    /// the runner applies it before sampling).
    pub mask: Option<MaskRef<'a>>,
}

impl BatchEntry<'_> {
    /// Tokens this entry runs in the step.
    pub fn len(&self) -> u32 {
        self.end - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.pos
    }
}

/// A step's batch: decode tokens first, then prefill chunks.
#[derive(Clone, Debug, Default)]
pub struct StepBatch<'a> {
    pub entries: Vec<BatchEntry<'a>>,
}

/// What a step produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutput {
    /// One per batch entry, `Some` where it sampled.
    pub tokens: Vec<Option<u32>>,
    /// Seconds the step took (measured on real hardware, modelled in the simulation).
    pub elapsed: f64,
    /// Log-probabilities per batch entry, where its request asked for them; may be empty.
    pub logprobs: Vec<Option<TokenLogprobs>>,
    /// Prompt log-probabilities (`SamplingParams::prompt_logprobs`): `(entry, scores)`, the
    /// scores of tokens `pos + 1 ..` of that entry's chunk, those still in the prompt.
    pub prompt_logprobs: Vec<(usize, Vec<TokenLogprobs>)>,
}

/// Runs the model.
pub trait ModelRunner: Send {
    /// KV block geometry of the model (layers, KV heads, head dim, dtype, block size).
    fn geometry(&self) -> BlockGeometry;
    /// Token ids that end a request unless it ignores EOS.
    fn eos_token_ids(&self) -> &[u32];
    /// Runs one step.
    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput, EngineError>;
    /// Whether it reports prompt log-probabilities (`SamplingParams::prompt_logprobs`);
    /// the engine refuses such requests otherwise.
    fn prompt_logprobs(&self) -> bool {
        false
    }
    /// What a step costs, term by term, when the runner knows its hardware and model
    /// (`EngineConfig::step_tbt_share` keeps steps within the running TBT targets with it);
    /// `None`: not known, and steps are bounded by tokens only.
    fn step_cost(&self) -> Option<StepCost> {
        None
    }
}
