//! A ready engine on the CPU model path: load a Hugging Face model directory, size the two
//! KV tiers, and wire [`CpuRunner`], [`HostTransfer`] and the real clock into an [`Engine`]
//! that [`crate::spawn`] serves.
//!
//! ```no_run
//! use superinfer_engine::serve::{cpu_engine, EngineOptions};
//! use superinfer_engine::{spawn, HandleConfig};
//! # fn main() -> Result<(), superinfer_engine::EngineError> {
//! let dir = std::path::Path::new("/tmp/tiny");
//! superinfer_engine::model::tiny::write_tiny_model(dir, 0)?;
//! let (engine, codec) = cpu_engine(dir, &EngineOptions::default())?;
//! let (handle, thread) = spawn(engine, HandleConfig::default())?;
//! let prompt = codec.encode("In the beginning", true)?;
//! # let _ = (handle, thread, prompt);
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "cuda")]
pub mod gpu;
mod gpu_options;
pub mod host_memory;
mod warm_up;

pub use warm_up::{warm_up, WARM_UP_PROMPT};

pub use gpu_options::{GpuModel, GpuOptions};

use crate::clock::RealClock;
use crate::engine::{Engine, EngineConfig};
use crate::error::EngineError;
use crate::runner::cpu::{CpuRunner, CpuRunnerConfig};
use crate::runner::ModelRunner;
use crate::text::TextCodec;
use crate::transfer::host::HostTransfer;
use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};
use std::path::Path;
use superinfer_policies::{Policy, PolicyKind, WlvfConfig};

/// The engine type [`cpu_engine`] builds.
pub type CpuEngine = Engine<CpuRunner, HostTransfer, RealClock>;

/// Compute and KV-cache precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelDtype {
    /// Best on the CPU (f16/bf16 weights are converted on load).
    #[default]
    F32,
    F16,
    Bf16,
}

impl ModelDtype {
    pub fn dtype(self) -> DType {
        match self {
            ModelDtype::F32 => DType::F32,
            ModelDtype::F16 => DType::F16,
            ModelDtype::Bf16 => DType::BF16,
        }
    }
}

/// How to size and schedule an engine over a model (CPU or GPU): the engine's knobs and
/// their one set of defaults ([`EngineConfig`]), and what sizes the tiers. Each tier is given
/// in blocks or in bytes (blocks win when both are set; bytes are divided by the model's KV
/// block size); the tier sizes in `config` are replaced by them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineOptions {
    /// Batch budget, seats, rotation, prefix cache, deadlines, … as for every engine.
    pub config: EngineConfig,
    /// HBM-tier (on the CPU: the runner's arena) capacity in blocks.
    pub hbm_blocks: Option<u32>,
    /// HBM-tier capacity in bytes, when `hbm_blocks` is unset.
    pub hbm_bytes: u64,
    /// DRAM-tier capacity in blocks.
    pub dram_blocks: Option<u32>,
    /// DRAM-tier capacity in bytes, when `dram_blocks` is unset.
    pub dram_bytes: u64,
    pub policy: PolicyKind,
    /// Knobs of LVF / weighted LVF.
    pub wlvf: WlvfConfig,
    pub dtype: ModelDtype,
    /// Seed for requests without one; `None`: from the OS.
    pub seed: Option<u64>,
    /// Run one prefill and one decode through the runner before the engine starts
    /// ([`warm_up`]), so the first requests do not pay for first-use loading.
    pub warm_up: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            config: EngineConfig::default(),
            hbm_blocks: None,
            hbm_bytes: 256 << 20,
            dram_blocks: None,
            dram_bytes: 1 << 30,
            policy: PolicyKind::Wlvf,
            wlvf: WlvfConfig::default(),
            dtype: ModelDtype::F32,
            seed: None,
            warm_up: true,
        }
    }
}

impl EngineOptions {
    /// Tokens per KV block.
    pub fn block_size(&self) -> u32 {
        self.config.block_size
    }

    /// The engine's configuration for tiers of `hbm_blocks` and `dram_blocks`.
    pub(crate) fn engine_config(&self, hbm_blocks: u32, dram_blocks: u32) -> EngineConfig {
        EngineConfig {
            hbm_blocks,
            dram_blocks,
            ..self.config.clone()
        }
    }
}

/// End-of-sequence ids of the tokenizer's files and of the model's config, sorted, once each.
pub(crate) fn merged_eos(codec: &[u32], model: &[u32]) -> Vec<u32> {
    let mut eos = [codec, model].concat();
    eos.sort_unstable();
    eos.dedup();
    eos
}

/// Fixes the number of CPU threads candle uses (`RAYON_NUM_THREADS`; `None`: the available
/// parallelism) unless the environment already sets it. Without it candle asks the OS for the
/// number of physical cores (reading `/proc/cpuinfo`) on every parallel operation, which
/// costs more than a small model's decode step (measured: 2.5 ms → 0.4 ms per tiny-model
/// decode step). Call it at the start of `main`, before any other thread exists: it changes
/// the process environment.
pub fn pin_cpu_threads(threads: Option<usize>) {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return;
    }
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    std::env::set_var("RAYON_NUM_THREADS", n.max(1).to_string());
}

/// Builds a CPU engine for the model in `model_dir` with the policy of `opts`, and the
/// model's [`TextCodec`] (tokenizer, chat template, EOS ids). Hand the engine to
/// [`crate::spawn`] to serve it.
pub fn cpu_engine(
    model_dir: &Path,
    opts: &EngineOptions,
) -> Result<(CpuEngine, TextCodec), EngineError> {
    cpu_engine_with_policy(model_dir, opts, opts.policy.build(&opts.wlvf))
}

/// [`cpu_engine`] with a policy of the caller's (`opts.policy` is ignored).
pub fn cpu_engine_with_policy(
    model_dir: &Path,
    opts: &EngineOptions,
    policy: Box<dyn Policy>,
) -> Result<(CpuEngine, TextCodec), EngineError> {
    let codec = TextCodec::from_model_dir(model_dir)?;
    let cfg = crate::model::ModelConfig::from_model_dir(model_dir)?;
    let dtype = opts.dtype.dtype();
    let block_bytes = cfg.kv_geometry(opts.block_size(), dtype).block_bytes();
    let blocks = |n: Option<u32>, bytes: u64, what: &str| -> Result<u32, EngineError> {
        let n = n.unwrap_or_else(|| (bytes / block_bytes.max(1)).min(u64::from(u32::MAX)) as u32);
        if n == 0 && what == "HBM" {
            return Err(EngineError::Config(format!(
                "the {what} tier holds no block ({bytes} bytes, {block_bytes} bytes per block)"
            )));
        }
        Ok(n)
    };
    let hbm_blocks = blocks(opts.hbm_blocks, opts.hbm_bytes, "HBM")?;
    let dram_blocks = blocks(opts.dram_blocks, opts.dram_bytes, "DRAM")?;
    // Both tiers live in host memory on the CPU path.
    let avail = host_memory::available_bytes();
    let tier = |n: u32| u64::from(n) * block_bytes;
    host_memory::check(tier(hbm_blocks), avail, "HBM KV tier", "--hbm-blocks")?;
    host_memory::check(
        tier(hbm_blocks) + tier(dram_blocks),
        avail,
        "HBM and DRAM KV tiers together",
        "--dram-blocks (or --hbm-blocks)",
    )?;
    let mut runner = CpuRunner::load(
        model_dir,
        &CpuRunnerConfig {
            block_size: opts.block_size(),
            hbm_blocks,
            dtype: Some(dtype),
            device: Device::Cpu,
            seed: opts.seed,
        },
    )?;
    runner.set_eos_token_ids(&merged_eos(codec.eos_token_ids(), runner.eos_token_ids()));
    if opts.warm_up {
        warm_up(&mut runner, hbm_blocks, opts.block_size())?;
    }
    let transfer = HostTransfer::new(runner.arena().clone(), dram_blocks)?;
    let engine_cfg = opts.engine_config(hbm_blocks, dram_blocks);
    let engine = Engine::new(engine_cfg, policy, runner, transfer, RealClock::new())?;
    Ok((engine, codec))
}
