//! The GPU model runner (feature `cuda`): [`GpuLlama`] over an HBM-tier [`KvArena`] in device
//! memory, which the CUDA copy engine shares (see [`GpuRunner::transfer`]). Greedy and
//! temperature sampling run on the GPU, so only token ids cross to the host; requests with
//! top-k/top-p/min-p cuts, penalties or logprobs are sampled on the host from their own row.

use super::cost::StepCost;
use super::{BatchEntry, ModelRunner, StepBatch, StepOutput};
use crate::error::EngineError;
use crate::kv::BlockGeometry;
use crate::model::gpu_llama::{DecodeOut, GpuLlama};
use crate::model::kv_arena::candle_err;
use crate::model::KvArena;
use crate::profile::{hardware_for_gpu, ModelProfile, Profile};
use crate::sampling::{bias_and_hold_stops, sample, SamplingParams, TokenLogprobs};
use crate::transfer::cuda::{CudaTransfer, CudaTransferConfig};
use candle_core::{DType, Tensor};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;
use superinfer_kernels::cuda::GpuSample;

/// The CUDA [`ModelRunner`].
pub struct GpuRunner {
    model: GpuLlama,
    arena: KvArena,
    geometry: BlockGeometry,
    eos: Vec<u32>,
    rng: ChaCha8Rng,
    cost: Option<StepCost>,
}

/// The step cost of `model` on this GPU, from the GPU's built-in hardware profile and the
/// model's own shape; `None` (steps bounded by tokens only) for a GPU without a profile.
fn step_cost_of(model: &GpuLlama, geometry: BlockGeometry) -> Option<StepCost> {
    let gpu = model.gpu().name().unwrap_or_default();
    let Some(hw) = hardware_for_gpu(&gpu) else {
        tracing::info!(
            gpu,
            "no hardware profile for this GPU; steps are bounded by tokens only"
        );
        return None;
    };
    let c = model.config();
    let dtype_bytes = geometry.dtype_bytes;
    let shape = ModelProfile {
        name: "served".into(),
        params: model.weight_bytes() as f64 / f64::from(dtype_bytes),
        num_layers: c.num_layers as u32,
        hidden_size: c.hidden_size as u32,
        num_heads: c.num_heads as u32,
        kv_heads: c.num_kv_heads as u32,
        head_dim: c.head_dim as u32,
        dtype_bytes,
    };
    tracing::info!(
        gpu,
        profile = hw.name,
        "step costs from the GPU's hardware profile"
    );
    Some(StepCost::of_profile(
        &Profile { hw, model: shape },
        geometry,
    ))
}

/// Whether a request's sampling runs on the GPU (greedy or plain temperature).
pub fn samples_on_gpu(p: &SamplingParams) -> bool {
    p.top_k == 0
        && p.top_p >= 1.0
        && p.min_p <= 0.0
        && p.repetition_penalty == 1.0
        && p.frequency_penalty == 0.0
        && p.presence_penalty == 0.0
        && p.logprobs.is_none()
        && p.logit_bias.is_empty()
        && p.min_tokens == 0
}

impl GpuRunner {
    /// Allocates an HBM arena of `hbm_blocks` blocks of `block_size` tokens for `model`.
    pub fn new(
        model: GpuLlama,
        block_size: u32,
        hbm_blocks: u32,
        seed: Option<u64>,
    ) -> Result<GpuRunner, EngineError> {
        let c = model.config();
        let geometry = c.kv_geometry(block_size, model.dtype());
        let arena = KvArena::new(geometry, hbm_blocks, model.dtype(), model.device())?;
        let mut eos = c.eos_token_ids.clone();
        eos.sort_unstable();
        eos.dedup();
        let rng = match seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        let cost = step_cost_of(&model, geometry);
        Ok(GpuRunner {
            model,
            arena,
            geometry,
            eos,
            rng,
            cost,
        })
    }

    /// The CUDA copy engine over this runner's HBM arena and a pinned DRAM tier of
    /// `dram_blocks` blocks: the two share one HBM tier, as the KV pool assumes.
    pub fn transfer(&self, dram_blocks: u32) -> Result<CudaTransfer, EngineError> {
        CudaTransfer::with_arena(
            self.model.gpu(),
            CudaTransferConfig {
                geometry: self.geometry,
                hbm_blocks: self.arena.num_blocks(),
                dram_blocks,
                pinned_chunk_bytes: 1 << 30,
            },
            self.arena.rows(),
        )
        .map_err(|e| EngineError::Runner(format!("the CUDA copy engine: {e}")))
    }

    pub fn set_eos_token_ids(&mut self, ids: &[u32]) {
        self.eos = ids.to_vec();
    }

    pub fn arena(&self) -> &KvArena {
        &self.arena
    }

    pub fn model(&self) -> &GpuLlama {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut GpuLlama {
        &mut self.model
    }

    /// The logits of `batch`'s sampling entries `(n, vocab)` in the model's dtype.
    pub fn logits(&mut self, batch: &StepBatch<'_>) -> Result<Tensor, EngineError> {
        let tables = super::cpu::hbm_tables(batch)?;
        self.model
            .forward(&super::cpu::seq_chunks(batch, &tables), &self.arena)
    }

    /// The logits of a decode-only `batch` through the decode buckets, not waited for
    /// (`None`: the buckets do not take it; benchmarks time the host side with this).
    pub fn decode_logits(&mut self, batch: &StepBatch<'_>) -> Result<Option<Tensor>, EngineError> {
        let tables = super::cpu::hbm_tables(batch)?;
        let chunks = super::cpu::seq_chunks(batch, &tables);
        Ok(match self.model.decode(&chunks, &self.arena, None)? {
            Some(DecodeOut::Logits(l)) => Some(l),
            _ => None,
        })
    }

    fn gpu_draw(&mut self, e: &BatchEntry<'_>) -> GpuSample {
        GpuSample {
            temperature: e.sampling.temperature,
            seed: e.sampling.seed.unwrap_or_else(|| self.rng.next_u64()),
            counter: e.end,
        }
    }
}

impl ModelRunner for GpuRunner {
    fn geometry(&self) -> BlockGeometry {
        self.geometry
    }

    fn step_cost(&self) -> Option<StepCost> {
        self.cost
    }

    fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput, EngineError> {
        let start = Instant::now();
        self.model
            .gpu()
            .bind()
            .map_err(|e| EngineError::Runner(format!("binding the CUDA context: {e}")))?;
        let sampling: Vec<&BatchEntry<'_>> = batch.entries.iter().filter(|e| e.sample).collect();
        let (mut gpu_rows, mut gpu_draws, mut host_rows) = (Vec::new(), Vec::new(), Vec::new());
        for (row, e) in sampling.iter().enumerate() {
            if samples_on_gpu(e.sampling) && e.mask.is_none() {
                gpu_rows.push(row as u32);
                gpu_draws.push(self.gpu_draw(e));
            } else {
                host_rows.push(row as u32);
            }
        }
        // A decode-only step goes through the decode buckets (CUDA graphs), sampling included
        // when every row samples on the GPU; any other step through the eager forward.
        let tables = super::cpu::hbm_tables(batch)?;
        let chunks = super::cpu::seq_chunks(batch, &tables);
        let all_gpu = host_rows.is_empty();
        let decoded = self
            .model
            .decode(&chunks, &self.arena, all_gpu.then_some(&gpu_draws[..]))?;
        let logits = match decoded {
            Some(DecodeOut::Ids(ids)) => {
                return Ok(self.output(batch, ids.into_iter().map(Some).collect(), start));
            }
            Some(DecodeOut::Logits(l)) => l,
            None => self.model.forward(&chunks, &self.arena)?,
        };
        let dev = self.model.device().clone();
        let pick = |rows: &[u32]| -> Result<Tensor, EngineError> {
            if rows.len() == sampling.len() {
                return Ok(logits.clone());
            }
            let idx = Tensor::from_slice(rows, rows.len(), &dev)
                .map_err(|e| candle_err("sample rows", e))?;
            logits
                .index_select(&idx, 0)
                .map_err(|e| candle_err("sample rows", e))
        };
        let mut sampled = vec![None; sampling.len()];
        let mut logprobs: Vec<Option<TokenLogprobs>> = vec![None; sampling.len()];
        if !gpu_rows.is_empty() {
            let ids = self
                .model
                .kernels()
                .sample(&pick(&gpu_rows)?, &gpu_draws)
                .map_err(|e| EngineError::Runner(format!("GPU sampling: {e}")))?;
            for (r, id) in gpu_rows.iter().zip(ids) {
                sampled[*r as usize] = Some(id);
            }
        }
        if !host_rows.is_empty() {
            let rows = pick(&host_rows)?
                .to_dtype(DType::F32)
                .and_then(|t| t.to_vec2::<f32>())
                .map_err(|e| candle_err("reading logits", e))?;
            for (r, mut row) in host_rows.iter().zip(rows) {
                let e = sampling[*r as usize];
                let history = &e.tokens[..e.end as usize];
                let prompt_len = e.prompt_len as usize;
                if let Some(mask) = &e.mask {
                    mask.apply(&mut row);
                }
                bias_and_hold_stops(&mut row, e.sampling, &self.eos, history, prompt_len);
                let s = sample(
                    &mut row,
                    e.sampling,
                    &e.tokens[..e.end as usize],
                    e.prompt_len as usize,
                    &mut self.rng,
                );
                sampled[*r as usize] = Some(s.token);
                logprobs[*r as usize] = s.logprobs;
            }
        }
        let mut out = self.output(batch, sampled, start);
        let mut lps = logprobs.into_iter();
        for (e, lp) in batch.entries.iter().zip(out.logprobs.iter_mut()) {
            if e.sample {
                *lp = lps.next().flatten();
            }
        }
        Ok(out)
    }
}

impl GpuRunner {
    /// The step's output from the sampled ids of its sampling entries, in order.
    fn output(
        &self,
        batch: &StepBatch<'_>,
        sampled: Vec<Option<u32>>,
        start: Instant,
    ) -> StepOutput {
        let mut sampled = sampled.into_iter();
        let tokens = batch
            .entries
            .iter()
            .map(|e| {
                if e.sample {
                    sampled.next().flatten()
                } else {
                    None
                }
            })
            .collect();
        StepOutput {
            tokens,
            elapsed: start.elapsed().as_secs_f64(),
            logprobs: vec![None; batch.entries.len()],
            prompt_logprobs: Vec::new(),
        }
    }
}
