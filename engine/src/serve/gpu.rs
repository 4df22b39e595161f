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
use std::path::Path;
use superinfer_policies::Policy;

pub use super::gpu_options::{GpuModel, GpuOptions};

/// The engine type [`gpu_engine`] builds.
pub type GpuEngine = Engine<GpuRunner, CudaTransfer, RealClock>;

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
    let block_bytes = config.kv_geometry(opts.block_size(), dtype).block_bytes();
    let hbm_blocks = match (opts.hbm_blocks, gpu.hbm_kv_blocks(block_bytes)) {
        (Some(n), _) => n,
        (None, Some(n)) => n,
        (None, None) => {
            let (free, total) = model
                .gpu()
                .mem_info()
                .map_err(|e| EngineError::Runner(format!("reading GPU memory: {e}")))?;
            gpu.utilization_blocks(free as u64, total as u64, block_bytes)
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
        .unwrap_or_else(|| gpu.dram_kv_blocks(block_bytes));
    // The copy engine pins an arena of at least one block; a tier of none (HBM-only KV) is
    // the engine's: it never rotates, and its prefix cache keeps blocks in HBM.
    let arena_blocks = dram_blocks.max(1);
    let mut runner = GpuRunner::new(model, opts.block_size(), hbm_blocks, opts.seed)?;
    if !gpu.cuda_graphs {
        runner.model_mut().set_decode_buckets(&[], false);
    }
    if let Some(c) = &codec {
        let eos = super::merged_eos(c.eos_token_ids(), runner.eos_token_ids());
        runner.set_eos_token_ids(&eos);
    }
    if opts.warm_up {
        super::warm_up(&mut runner, hbm_blocks, opts.block_size())?;
    }
    // The pinned DRAM tier is host memory: refuse it up front rather than fail in the driver.
    super::host_memory::check(
        u64::from(arena_blocks) * block_bytes,
        super::host_memory::available_bytes(),
        "pinned DRAM KV tier",
        "--dram-kv-gb",
    )?;
    let transfer = runner.transfer(arena_blocks).map_err(|e| {
        EngineError::Config(format!(
            "{e} (allocating the pinned DRAM KV tier of {:.1} GB: lower --dram-kv-gb)",
            (u64::from(arena_blocks) * block_bytes) as f64 / 1e9
        ))
    })?;
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
