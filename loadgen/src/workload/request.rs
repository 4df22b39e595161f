//! One request as a workload plans it, and the trace blocks a replayed row's prompt is made of.

use super::conversation::{self, Turn};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One request to send: who, when, how long, and what it says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// 0.. in order of `arrival_s`.
    pub id: u64,
    /// Index into the tenants slice.
    pub tenant: usize,
    /// When it is sent. For a follow-up turn this is only a lower bound (the conversation's
    /// start plus the think times so far): the target sends it `turn.think_s` after the
    /// previous turn finished.
    pub arrival_s: f64,
    /// The whole prompt as planned: system prompt + history (earlier messages and answers of
    /// their requested lengths) + the new message.
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Tokens of the tenant's system prompt at the start of the prompt.
    pub system_tokens: u32,
    /// Tokens of the new user message (the end of the prompt).
    pub message_tokens: u32,
    /// Seed of the new message's content.
    pub content_seed: u64,
    /// Place in a multi-turn conversation; `None`: a single request.
    pub turn: Option<Turn>,
    /// A replayed trace row's prompt blocks; `None`: the content comes from the seeds.
    #[serde(skip)]
    pub blocks: Option<TraceBlocks>,
}

/// A prompt made of a trace's blocks: hash id k is `block_tokens` fixed token ids, the same
/// wherever k appears; the prompt is the blocks in order, cut at `prompt_tokens` (and filled
/// with the row's own tokens where the ids cover less).
#[derive(Clone, Debug, PartialEq)]
pub struct TraceBlocks {
    pub hash_ids: Arc<[u64]>,
    pub block_tokens: u32,
}

impl TraceBlocks {
    /// The prompt's token ids; `seed` fills what the blocks do not cover.
    pub fn prompt_ids(&self, seed: u64, prompt_tokens: u32) -> Vec<u32> {
        let mut ids = Vec::with_capacity(prompt_tokens as usize);
        for &h in self.hash_ids.iter() {
            if ids.len() >= prompt_tokens as usize {
                break;
            }
            ids.extend(conversation::token_ids(block_seed(h), self.block_tokens));
        }
        ids.truncate(prompt_tokens as usize);
        let rest = prompt_tokens - ids.len() as u32;
        ids.extend(conversation::token_ids(seed, rest));
        ids
    }
}

fn block_seed(hash_id: u64) -> u64 {
    conversation::text_seed(&format!("trace block {hash_id}"))
}
