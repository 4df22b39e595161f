//! A ready engine on a CUDA GPU (feature `cuda`): the model ([`GpuLlama`]: a Hugging Face
//! directory, or `random:NAME` built in GPU memory), its HBM KV arena shared with the CUDA
//! copy engine, and a pinned DRAM tier; the HBM tier is sized like vLLM's
//! (`gpu_memory_utilization`) or directly in GB, to create memory pressure on purpose.

use super::EngineOptions;
use crate::clock::RealClock;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::model::gpu_llama::GpuLlama;
use crate::model::tiny::RandomLlama;
use crate::model::ModelConfig;
use crate::runner::gpu::GpuRunner;
use crate::runner::ModelRunner;
use crate::text::TextCodec;
use crate::transfer::cuda::CudaTransfer;
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use superinfer_policies::Policy;

/// The engine type [`gpu_engine`] builds.
pub type GpuEngine = Engine<GpuRunner, CudaTransfer, RealClock>;

/// Which model to put on the GPU.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuModel {
    /// A Hugging Face directory (config.json, tokenizer.json, safetensors).
    Dir(PathBuf),
    /// `random:NAME`: a built-in shape with random weights made on the GPU (no tokenizer:
    /// outputs are meaningless token ids).
    Random(String),
}

impl GpuModel {
    /// `random:NAME`, else a directory path.
    pub fn parse(s: &str) -> GpuModel {
        match s.strip_prefix("random:") {
            Some(name) => GpuModel::Random(name.to_owned()),
            None => GpuModel::Dir(PathBuf::from(s)),
        }
    }
}

/// GPU memory and tier sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuOptions {
    /// CUDA device ordinal.
    pub device: usize,
    /// Fraction of the GPU's memory the engine may use (weights + KV + activations), as
    /// vLLM's; the HBM KV tier gets what remains after the weights and `activation_gb`.
    pub gpu_memory_utilization: f64,
    /// HBM KV tier in GB (1e9 bytes); overrides the utilization-based size.
    pub hbm_kv_gb: Option<f64>,
    /// DRAM KV tier (pinned host memory) in GB.
    pub dram_kv_gb: f64,
    /// Reserved for activations and cuBLAS workspaces, GB.
    pub activation_gb: f64,
    /// Seed of `random:` weights.
    pub weight_seed: u64,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            device: 0,
            gpu_memory_utilization: 0.9,
            hbm_kv_gb: None,
            dram_kv_gb: 32.0,
            activation_gb: 4.0,
            weight_seed: 0,
        }
    }
}

impl GpuOptions {
    /// Refuses values that cannot work, with the field's name.
    pub fn validate(&self) -> Result<(), EngineError> {
        let u = self.gpu_memory_utilization;
        if !(u > 0.0 && u <= 1.0) {
            return Err(EngineError::Config(format!(
                "gpu_memory_utilization must be in (0, 1], got {u}"
            )));
        }
        for (name, v) in [
            ("hbm_kv_gb", self.hbm_kv_gb.unwrap_or(1.0)),
            ("dram_kv_gb", self.dram_kv_gb),
            ("activation_gb", self.activation_gb),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(EngineError::Config(format!(
                    "{name} must be a number of GB >= 0, got {v}"
                )));
            }
        }
        if self.hbm_kv_gb == Some(0.0) {
            return Err(EngineError::Config("hbm_kv_gb must be above 0".into()));
        }
        Ok(())
    }
}

/// Blocks of `block_bytes` in `gb` GB.
fn blocks_in(gb: f64, block_bytes: u64) -> u32 {
    (gb * 1e9 / block_bytes as f64).min(f64::from(u32::MAX)) as u32
}

/// Loads `model` onto the GPU and builds its engine with `policy` (dtype from `opts.dtype`;
/// f32 is refused on the GPU). Returns the model's codec when it has a tokenizer (`None` for
/// `random:` models) and its config.
pub fn gpu_engine(
    model: &GpuModel,
    opts: &EngineOptions,
    gpu: &GpuOptions,
    policy: Box<dyn Policy>,
) -> Result<(GpuEngine, Option<TextCodec>, ModelConfig), EngineError> {
    gpu.validate()?;
    let device = Device::new_cuda(gpu.device)
        .map_err(|e| EngineError::Config(format!("CUDA device {}: {e}", gpu.device)))?;
    let dtype = opts.dtype.dtype();
    let (model, codec) = match model {
        GpuModel::Dir(dir) => load_dir(dir, dtype, &device)?,
        GpuModel::Random(name) => {
            let (spec, vocab) = RandomLlama::named(name)?;
            let m = GpuLlama::random(&spec, vocab, dtype, &device, gpu.weight_seed)?;
            (m, None)
        }
    };
    let config = model.config().clone();
    let block_bytes = opts.block_size as u64
        * 2
        * config.num_layers as u64
        * config.kv_width() as u64
        * dtype.size_in_bytes() as u64;
    let hbm_blocks = match (opts.hbm_blocks, gpu.hbm_kv_gb) {
        (Some(n), _) => n,
        (None, Some(gb)) => blocks_in(gb, block_bytes),
        (None, None) => {
            let (free, total) = model
                .gpu()
                .mem_info()
                .map_err(|e| EngineError::Runner(format!("reading GPU memory: {e}")))?;
            let keep = (1.0 - gpu.gpu_memory_utilization) * total as f64 + gpu.activation_gb * 1e9;
            blocks_in((free as f64 - keep).max(0.0) / 1e9, block_bytes)
        }
    };
    if hbm_blocks == 0 {
        return Err(EngineError::Config(format!(
            "the HBM KV tier holds no block of {block_bytes} bytes (raise hbm_kv_gb or \
             gpu_memory_utilization)"
        )));
    }
    let dram_blocks = opts
        .dram_blocks
        .unwrap_or_else(|| blocks_in(gpu.dram_kv_gb, block_bytes))
        .max(1);
    let mut runner = GpuRunner::new(model, opts.block_size, hbm_blocks, opts.seed)?;
    if let Some(c) = &codec {
        let eos = super::merged_eos(c.eos_token_ids(), runner.eos_token_ids());
        runner.set_eos_token_ids(&eos);
    }
    let transfer = runner.transfer(dram_blocks)?;
    let engine_cfg = opts.engine_config(hbm_blocks, dram_blocks);
    let engine = Engine::new(engine_cfg, policy, runner, transfer, RealClock::new())?;
    Ok((engine, codec, config))
}

fn load_dir(
    dir: &Path,
    dtype: candle_core::DType,
    device: &Device,
) -> Result<(GpuLlama, Option<TextCodec>), EngineError> {
    let codec = TextCodec::from_model_dir(dir)?;
    let cfg = ModelConfig::from_model_dir(dir)?;
    let model = GpuLlama::load(dir, &cfg, dtype, device)?;
    Ok((model, Some(codec)))
}
