//! A freshly loaded runner's first steps, run before it serves: on a GPU they load what is
//! loaded on first use (candle's PTX modules, JIT-compiled by the driver; cuBLAS handles and
//! workspaces), which took the first requests of a fresh H200 server 2.6 s (docs/BENCHMARKS.md).
//! One prefill chunk and one decode step, greedy, over the first HBM blocks.

use crate::error::EngineError;
use crate::kv::{BlockState, HbmBlock, LogicalBlock};
use crate::runner::{BatchEntry, ModelRunner, StepBatch};
use crate::sampling::SamplingParams;
use superinfer_policies::RequestId;

/// Tokens of the warm-up prompt (one prefill tile of the GPU attention kernel and then some),
/// fewer when the HBM tier is smaller.
pub const WARM_UP_PROMPT: u32 = 96;

/// Runs one prefill of up to [`WARM_UP_PROMPT`] tokens and one decode step after it through
/// `runner`, writing KV into HBM blocks `0..`; returns the tokens it ran (0 when the tier has
/// no room for two tokens). Call it before the engine owns the tier: the blocks' contents are
/// garbage afterwards, which is harmless because every request writes a KV slot before any
/// step reads it. The runners keep no per-request state, so nothing else remains.
pub fn warm_up<R: ModelRunner + ?Sized>(
    runner: &mut R,
    hbm_blocks: u32,
    block_size: u32,
) -> Result<u32, EngineError> {
    let room = hbm_blocks.saturating_mul(block_size);
    if room < 2 {
        return Ok(0);
    }
    let prompt = WARM_UP_PROMPT.min(room - 1);
    let blocks: Vec<LogicalBlock> = (0..(prompt + 1).div_ceil(block_size))
        .map(|b| LogicalBlock {
            hbm: Some(HbmBlock(b)),
            dram: None,
            state: BlockState::Dirty,
            inflight: None,
            entry: None,
        })
        .collect();
    // Greedy with a seed of its own: the runner's generator (for requests without a seed)
    // is not advanced, so a server started with a seed draws the same sequence as before.
    let sampling = SamplingParams {
        seed: Some(0),
        ..SamplingParams::default()
    };
    let mut tokens = vec![0u32; prompt as usize + 1];
    let out = runner.step(&one(
        &tokens[..prompt as usize],
        prompt,
        0,
        &blocks,
        &sampling,
    ))?;
    tokens[prompt as usize] = out
        .tokens
        .first()
        .copied()
        .flatten()
        .ok_or_else(|| EngineError::Runner("the warm-up prefill sampled no token".into()))?;
    runner.step(&one(&tokens, prompt, prompt, &blocks, &sampling))?;
    Ok(prompt + 1)
}

/// A batch of one warm-up entry running `tokens[pos..]`.
fn one<'a>(
    tokens: &'a [u32],
    prompt_len: u32,
    pos: u32,
    blocks: &'a [LogicalBlock],
    sampling: &'a SamplingParams,
) -> StepBatch<'a> {
    StepBatch {
        entries: vec![BatchEntry {
            id: RequestId(u64::MAX),
            tokens,
            prompt_len,
            pos,
            end: tokens.len() as u32,
            blocks,
            sample: true,
            sampling,
            mask: None,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;
    use crate::runner::sim::SimRunner;

    fn runner() -> SimRunner {
        SimRunner::new(Profile::builtin("h200-llama-3-8b").unwrap(), 16)
    }

    #[test]
    fn the_prompt_fits_the_tier_and_an_empty_tier_is_skipped() {
        assert_eq!(warm_up(&mut runner(), 64, 16).unwrap(), WARM_UP_PROMPT + 1);
        // One block: a 15-token prompt and its one decoded token fill it.
        assert_eq!(warm_up(&mut runner(), 1, 16).unwrap(), 16);
        assert_eq!(warm_up(&mut runner(), 0, 16).unwrap(), 0);
        assert_eq!(warm_up(&mut runner(), 1, 1).unwrap(), 0);
    }
}
