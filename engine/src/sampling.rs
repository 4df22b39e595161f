//! Per-request sampling parameters, and the sampler the model runners apply to a row of
//! logits. The simulated runner ignores them (its lengths come from `max_tokens`).
//!
//! Order, as vLLM: repetition penalty (prompt and output tokens) and frequency/presence
//! penalties (output tokens) → greedy when `temperature == 0` → temperature → top-k → min-p →
//! top-p → draw. Stop tokens, `max_tokens` and `ignore_eos` are the engine's.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// How the next token is chosen. `temperature == 0` is greedy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0: no top-k.
    pub top_k: u32,
    /// 1.0: no nucleus cut.
    pub top_p: f32,
    /// 0.0: no min-p cut.
    pub min_p: f32,
    /// Same seed, same prompt: same tokens, whatever else shares the batch. Without a seed
    /// the runner draws from its own generator.
    pub seed: Option<u64>,
    /// > 1 discourages every token already in the prompt or the output (1.0: off).
    pub repetition_penalty: f32,
    /// Subtracted from a logit once per occurrence of the token in the output.
    pub frequency_penalty: f32,
    /// Subtracted from a logit once if the token occurs in the output.
    pub presence_penalty: f32,
    /// `Some(n)`: report the sampled token's log-probability and the `n` most likely
    /// alternatives (the distribution after penalties, before temperature and cuts).
    pub logprobs: Option<u32>,
    /// `Some(n)`: also score every prompt token after the first, from the model's raw
    /// distribution at the position before it, with the `n` most likely alternatives
    /// (completions' `echo` with `logprobs`); such a request is never served from the
    /// prefix cache (cached tokens have no logits). Only runners that report
    /// [`crate::runner::ModelRunner::prompt_logprobs`] take it.
    pub prompt_logprobs: Option<u32>,
    /// Added to the logits of these tokens before anything else (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// No end-of-sequence token, and none of `min_tokens_stops`, until this many tokens have
    /// been generated (vLLM's `min_tokens`).
    pub min_tokens: u32,
    /// Stop tokens of the request (its `stop_token_ids`) held back by `min_tokens`, besides
    /// the model's end-of-sequence ids.
    pub min_tokens_stops: Vec<u32>,
    /// Structured outputs: only tokens this grammar allows next (its mask applied before
    /// everything else); the request stops when the grammar is complete. Not serialized: a
    /// compiled grammar belongs to one served model.
    #[serde(skip)]
    pub grammar: Option<crate::grammar::Grammar>,
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
            logprobs: None,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
            min_tokens: 0,
            min_tokens_stops: Vec::new(),
            grammar: None,
        }
    }
}

impl SamplingParams {
    /// Greedy: the most likely token, no randomness.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// Log-probabilities reported with a token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    /// Of the sampled token.
    pub logprob: f32,
    /// The most likely tokens with theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// A sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprobs: Option<TokenLogprobs>,
}

/// The generator for one draw of a seeded request: a function of the seed and of how many
/// tokens the sequence has, so a request draws the same numbers however it is batched,
/// preempted or recomputed.
pub fn seeded_rng(seed: u64, seq_len: usize) -> ChaCha8Rng {
    let mut z = seed ^ (seq_len as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64 finalizer
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ChaCha8Rng::seed_from_u64(z ^ (z >> 31))
}

/// Applies repetition, frequency and presence penalties in place. `history` is the prompt
/// followed by the output; the output starts at `prompt_len`.
pub fn apply_penalties(logits: &mut [f32], p: &SamplingParams, history: &[u32], prompt_len: usize) {
    if p.repetition_penalty != 1.0 && p.repetition_penalty > 0.0 {
        let mut seen = vec![false; logits.len()];
        for &t in history {
            let Some(s) = seen.get_mut(t as usize) else {
                continue;
            };
            if !*s {
                *s = true;
                let l = &mut logits[t as usize];
                *l = if *l > 0.0 {
                    *l / p.repetition_penalty
                } else {
                    *l * p.repetition_penalty
                };
            }
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in history.get(prompt_len..).unwrap_or(&[]) {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.frequency_penalty * n as f32 + p.presence_penalty;
            }
        }
    }
}

fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] || xs[best].is_nan() {
            best = i;
        }
    }
    best
}

fn log_softmax(xs: &[f32]) -> Vec<f32> {
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = xs.iter().map(|&x| f64::from((x - max).exp())).sum();
    let log_z = max + sum.ln() as f32;
    xs.iter().map(|&x| x - log_z).collect()
}

pub(crate) fn logprobs_of(logits: &[f32], token: usize, n: u32) -> TokenLogprobs {
    let lp = log_softmax(logits);
    let mut ids: Vec<usize> = (0..lp.len()).collect();
    let n = (n as usize).min(ids.len());
    if n > 0 && n < ids.len() {
        ids.select_nth_unstable_by(n - 1, |&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    }
    ids.truncate(n);
    ids.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    TokenLogprobs {
        logprob: lp[token],
        top: ids.into_iter().map(|i| (i as u32, lp[i])).collect(),
    }
}

/// Before sampling the token after `history` (output from `prompt_len`): `logit_bias`, and
/// while fewer than `min_tokens` tokens have been generated, `eos` and `min_tokens_stops`
/// made impossible. Runners call it on every row they sample on the host, then [`sample`].
pub fn bias_and_hold_stops(
    logits: &mut [f32],
    p: &SamplingParams,
    eos: &[u32],
    history: &[u32],
    prompt_len: usize,
) {
    for &(t, b) in &p.logit_bias {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += b;
        }
    }
    if history.len().saturating_sub(prompt_len) < p.min_tokens as usize {
        for &t in eos.iter().chain(&p.min_tokens_stops) {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Chooses the next token from one row of logits (modified in place). `history` is the
/// sequence so far (prompt then output, output from `prompt_len`); `rng` is used unless the
/// request is greedy or seeded.
pub fn sample(
    logits: &mut [f32],
    p: &SamplingParams,
    history: &[u32],
    prompt_len: usize,
    rng: &mut dyn RngCore,
) -> Sampled {
    for l in logits.iter_mut() {
        if l.is_nan() {
            *l = f32::NEG_INFINITY;
        }
    }
    apply_penalties(logits, p, history, prompt_len);
    let token = if p.is_greedy() || logits.len() < 2 {
        argmax(logits)
    } else {
        match p.seed {
            Some(s) => draw(logits, p, &mut seeded_rng(s, history.len())),
            None => draw(logits, p, rng),
        }
    };
    Sampled {
        token: token as u32,
        logprobs: p.logprobs.map(|n| logprobs_of(logits, token, n)),
    }
}

/// Temperature, top-k, min-p, top-p, then one draw.
fn draw(logits: &[f32], p: &SamplingParams, rng: &mut dyn RngCore) -> usize {
    let inv_t = 1.0 / p.temperature;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut cand: Vec<(usize, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i, ((l - max) * inv_t).exp()))
        .filter(|&(_, w)| w > 0.0)
        .collect();
    if cand.is_empty() {
        return argmax(logits);
    }
    let desc = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let k = p.top_k as usize;
    if k > 0 && k < cand.len() {
        cand.select_nth_unstable_by(k - 1, desc);
        cand.truncate(k);
    }
    if p.min_p > 0.0 || p.top_p < 1.0 {
        cand.sort_by(desc);
        if p.min_p > 0.0 {
            // Weights are relative to the most likely token (weight 1 before truncation).
            let floor = p.min_p * cand[0].1;
            cand.retain(|&(_, w)| w >= floor);
        }
        if p.top_p < 1.0 {
            let total: f32 = cand.iter().map(|c| c.1).sum();
            let mut acc = 0.0;
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                acc += c.1 / total;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
    }
    let total: f32 = cand.iter().map(|c| c.1).sum();
    let mut u = rng.random::<f32>() * total;
    for &(i, w) in &cand {
        if u < w {
            return i;
        }
        u -= w;
    }
    cand[cand.len() - 1].0
}

#[cfg(test)]
mod tests;
