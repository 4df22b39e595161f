//! The candle model runner: a Llama-family model ([`PagedLlama`]) over the HBM-tier
//! [`KvArena`], sampling on the host. Named for the CPU, where it is the default backend (the
//! "HBM" tier is then a host arena with the engine's HBM capacity), but written over candle's
//! [`Device`]: built with a CUDA device it runs the same code on the GPU.

mod cost;
#[cfg(test)]
mod tests;

use super::{ModelRunner, StepBatch, StepOutput};
use crate::error::EngineError;
use crate::kv::BlockGeometry;
use crate::model::kv_arena::candle_err;
use crate::model::{KvArena, ModelConfig, PagedLlama, SeqChunk};
use crate::sampling::{bias_and_hold_stops, logprobs_of, sample, TokenLogprobs};
use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::time::Instant;

/// How to build a [`CpuRunner`].
#[derive(Clone, Debug)]
pub struct CpuRunnerConfig {
    /// Tokens per KV block (the engine's `block_size`).
    pub block_size: u32,
    /// Blocks in the HBM-tier arena (the engine's `hbm_blocks`).
    pub hbm_blocks: u32,
    /// Compute and KV dtype; `None`: f32 (the fast and exact choice on the CPU). Weights in
    /// another dtype are converted on load.
    pub dtype: Option<DType>,
    pub device: Device,
    /// Seed of the generator for requests without a seed; `None`: from the OS.
    pub seed: Option<u64>,
}

impl Default for CpuRunnerConfig {
    fn default() -> Self {
        CpuRunnerConfig {
            block_size: 16,
            hbm_blocks: 1024,
            dtype: None,
            device: Device::Cpu,
            seed: None,
        }
    }
}

/// The candle [`ModelRunner`].
pub struct CpuRunner {
    model: PagedLlama,
    arena: KvArena,
    geometry: BlockGeometry,
    eos: Vec<u32>,
    rng: ChaCha8Rng,
    /// The step cost on this CPU, measured at load ([`cost`]); `None` on another device.
    cost: Option<super::StepCost>,
}

impl CpuRunner {
    /// Loads the model of a Hugging Face directory (`config.json` and safetensors weights) or
    /// of a GGUF file, and allocates the HBM-tier arena. End-of-sequence ids come from `config.json` and
    /// `generation_config.json`; [`CpuRunner::set_eos_token_ids`] overrides them.
    pub fn load(dir: &Path, cfg: &CpuRunnerConfig) -> Result<CpuRunner, EngineError> {
        let mc = ModelConfig::from_model_dir(dir)?;
        let dtype = cfg.dtype.unwrap_or(DType::F32);
        let model = PagedLlama::load(dir, &mc, dtype, &cfg.device)?;
        let geometry = mc.kv_geometry(cfg.block_size, dtype);
        let arena = KvArena::new(geometry, cfg.hbm_blocks, dtype, &cfg.device)?;
        let mut eos = mc.eos_token_ids.clone();
        let gen = if crate::model::gguf::is_gguf(dir) {
            None
        } else {
            crate::text::read_json(&dir.join("generation_config.json"))?
        };
        if let Some(v) = gen.as_ref().and_then(|g| g.get("eos_token_id")) {
            let ids: Vec<u32> = match v {
                serde_json::Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect(),
                x => x.as_u64().map(|x| x as u32).into_iter().collect(),
            };
            eos.extend(ids);
        }
        eos.sort_unstable();
        eos.dedup();
        let rng = match cfg.seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        let cost = cost::measured(&mc, dtype, &cfg.device);
        Ok(CpuRunner {
            model,
            arena,
            geometry,
            eos,
            rng,
            cost,
        })
    }

    /// Replaces the end-of-sequence ids (e.g. with [`crate::TextCodec::eos_token_ids`]).
    pub fn set_eos_token_ids(&mut self, ids: &[u32]) {
        self.eos = ids.to_vec();
    }

    /// The HBM-tier arena; clones share it (the host transfer backend copies from it).
    pub fn arena(&self) -> &KvArena {
        &self.arena
    }

    pub fn model(&self) -> &PagedLlama {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut PagedLlama {
        &mut self.model
    }

    /// Runs `batch` and returns its logits rows without sampling (for tests and tools): one
    /// per sampling entry, or one per token of an entry that scores its prompt.
    pub fn logits(&mut self, batch: &StepBatch<'_>) -> Result<Tensor, EngineError> {
        let tables = hbm_tables(batch)?;
        self.model.forward(&seq_chunks(batch, &tables), &self.arena)
    }
}

/// The model's view of `batch`: each entry's chunk over its HBM block table (`tables`, from
/// [`hbm_tables`]).
pub(crate) fn seq_chunks<'a>(
    batch: &'a StepBatch<'_>,
    tables: &'a [Vec<u32>],
) -> Vec<SeqChunk<'a>> {
    batch
        .entries
        .iter()
        .zip(tables)
        .map(|(e, t)| SeqChunk {
            tokens: e.tokens,
            pos: e.pos as usize,
            end: e.end as usize,
            blocks: t,
            sample: e.sample,
            all_rows: scores_prompt(e),
        })
        .collect()
}

/// Whether `e`'s chunk scores prompt tokens: its request asks for prompt log-probabilities
/// and the chunk predicts at least one prompt token (position `p` predicts token `p + 1`).
fn scores_prompt(e: &super::BatchEntry<'_>) -> bool {
    e.sampling.prompt_logprobs.is_some() && e.pos + 1 < e.prompt_len
}

/// Every entry's block table as HBM block ids; an error names a request with a block that is
/// not in HBM.
pub(crate) fn hbm_tables(batch: &StepBatch<'_>) -> Result<Vec<Vec<u32>>, EngineError> {
    batch
        .entries
        .iter()
        .map(|e| {
            e.blocks
                .iter()
                .map(|b| b.hbm.map(|h| h.0))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    EngineError::Runner(format!(
                        "request {:?}: a block of its table is not in HBM",
                        e.id
                    ))
                })
        })
        .collect()
}

impl ModelRunner for CpuRunner {
    fn geometry(&self) -> BlockGeometry {
        self.geometry
    }

    fn step_cost(&self) -> Option<super::StepCost> {
        self.cost
    }

    fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    fn prompt_logprobs(&self) -> bool {
        true
    }

    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput, EngineError> {
        let start = Instant::now();
        let logits = self.logits(batch)?;
        let mut rows = logits
            .to_vec2::<f32>()
            .map_err(|e| candle_err("reading logits", e))?
            .into_iter();
        let n = batch.entries.len();
        let mut tokens = Vec::with_capacity(n);
        let mut logprobs: Vec<Option<TokenLogprobs>> = Vec::with_capacity(n);
        let mut prompt_logprobs = Vec::new();
        for (i, e) in batch.entries.iter().enumerate() {
            if scores_prompt(e) {
                // One row per token of the chunk; the last is the sampling row (if it samples).
                let scored = (e.len() - u32::from(e.sample)) as usize;
                let top = e.sampling.prompt_logprobs.unwrap_or(0);
                let mut scores = Vec::new();
                for (k, row) in rows.by_ref().take(scored).enumerate() {
                    let next = e.pos as usize + k + 1;
                    if next < e.prompt_len as usize {
                        scores.push(logprobs_of(&row, e.tokens[next] as usize, top));
                    }
                }
                prompt_logprobs.push((i, scores));
            }
            if !e.sample {
                tokens.push(None);
                logprobs.push(None);
                continue;
            }
            let mut row = rows
                .next()
                .ok_or_else(|| EngineError::Runner("fewer logits rows than samples".into()))?;
            let history = &e.tokens[..e.end as usize];
            let prompt_len = e.prompt_len as usize;
            if let Some(mask) = &e.mask {
                mask.apply(&mut row);
            }
            bias_and_hold_stops(&mut row, e.sampling, &self.eos, history, prompt_len);
            let s = sample(
                &mut row,
                e.sampling,
                history,
                e.prompt_len as usize,
                &mut self.rng,
            );
            tokens.push(Some(s.token));
            logprobs.push(s.logprobs);
        }
        Ok(StepOutput {
            tokens,
            elapsed: start.elapsed().as_secs_f64(),
            logprobs,
            prompt_logprobs,
        })
    }
}
