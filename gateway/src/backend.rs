//! The engine behind the gateway: which model, which runner, which engine knobs; started on
//! its own thread ([`superinfer_engine::spawn`]).
//!
//! Sources:
//! - the embedded tiny model (the default): a random-weight Llama written into
//!   `<data dir>/model` on the first start, run by the CPU runner; its text is meaningless but
//!   real (real tokenizer, chat template, sampling);
//! - `--model-dir DIR` (alias `--model`): a Hugging Face model directory, or a GGUF file
//!   (weights dequantized on load, tokenizer and chat template from its metadata), on the
//!   CPU runner;
//! - `--sim-profile NAME`: the simulated runner on the real clock at a built-in hardware +
//!   model profile's speed (e.g. `h200-llama-3-8b`), or at zero cost per step (`zero`, for
//!   benchmarking the gateway itself). Its tokens are rendered by the word stand-in of
//!   [`crate::text`].

use anyhow::Context;
use std::path::{Path, PathBuf};
use superinfer_engine::clock::RealClock;
use superinfer_engine::profile::{HardwareProfile, Profile};
pub use superinfer_engine::serve::GpuOptions;
use superinfer_engine::sim::sim_engine_on;
use superinfer_engine::{
    spawn, EngineConfig, EngineHandle, EngineThread, HandleConfig, StepMetrics,
};
use superinfer_policies::{PolicyKind, WlvfConfig};

use crate::text::Text;
use crate::wire::ModelInfo;

/// The default simulated profile.
pub const DEFAULT_SIM_PROFILE: &str = "h200-llama-3-8b";
/// The profile name whose steps cost nothing.
pub const ZERO_PROFILE: &str = "zero";

/// The id `GET /v1/models` shows for the embedded model.
pub const TINY_MODEL_ID: &str = "superinfer-tiny";
/// Seed of the embedded tiny model's weights: every installation serves the same model
/// (`superinfer model tiny` uses it too).
pub const TINY_MODEL_SEED: u64 = 0;

/// Where the model comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSource {
    /// The embedded tiny model, written into this directory on first use.
    Tiny(PathBuf),
    /// A Hugging Face model directory (config.json, tokenizer.json, safetensors), or a GGUF
    /// file.
    Dir(PathBuf),
    /// The simulated runner at a built-in profile, or `zero`.
    Sim(String),
    /// A model on a CUDA GPU: a directory or `random:NAME` (needs a build with `cuda`).
    Gpu { model: String, gpu: GpuOptions },
}

/// The GPU tiers from the command line's `gpu_memory_utilization`, `hbm_kv_gb` and
/// `dram_kv_gb` (absent: the engine's defaults), checked by the engine's own validation.
pub fn gpu_options(
    utilization: Option<f64>,
    hbm_kv_gb: Option<f64>,
    dram_kv_gb: Option<f64>,
) -> anyhow::Result<GpuOptions> {
    let d = GpuOptions::default();
    let o = GpuOptions {
        gpu_memory_utilization: utilization.unwrap_or(d.gpu_memory_utilization),
        hbm_kv_gb,
        dram_kv_gb: dram_kv_gb.unwrap_or(d.dram_kv_gb),
        ..d
    };
    o.validate()?;
    Ok(o)
}

/// The engine behind the gateway as the command line sets it: the engine's knobs with their
/// one set of defaults ([`EngineConfig`], shared with the twin and the benches), the policy,
/// and what only the gateway knows (its queue, the context it admits, the tool-call format).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOptions {
    pub policy: PolicyKind,
    /// Knobs of (weighted) LVF: VLT weights and the starvation caps.
    pub wlvf: WlvfConfig,
    /// Batch budget, seats, rotation, prefix cache, deadlines, step budget and trace. Its
    /// tier sizes are replaced by `hbm_blocks` / `dram_blocks`, or sized from the model and
    /// the device, and its queue by twice `max_queue`.
    pub config: EngineConfig,
    pub hbm_blocks: Option<u32>,
    pub dram_blocks: Option<u32>,
    /// Requests waiting for admission beyond this are refused (503).
    pub max_queue: usize,
    /// Longest prompt + output of one request; `None`: the model's context. Capped by the
    /// model's context and by what the HBM KV tier holds.
    pub max_model_len: Option<u32>,
    /// How the model writes tool calls (`--tool-call-parser`); `None`: by its chat template.
    pub tool_call_parser: Option<crate::tools::ToolFormat>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            policy: PolicyKind::Wlvf,
            wlvf: WlvfConfig::default(),
            config: EngineConfig::default(),
            hbm_blocks: None,
            dram_blocks: None,
            max_queue: 1024,
            max_model_len: None,
            tool_call_parser: None,
        }
    }
}

impl EngineOptions {
    /// The engine's configuration for tiers of `hbm_blocks` and `dram_blocks`.
    fn engine_config(&self, hbm_blocks: u32, dram_blocks: u32) -> EngineConfig {
        EngineConfig {
            hbm_blocks,
            dram_blocks,
            // The gateway refuses at its own limit first (503); this is the engine's backstop.
            max_queue: self.max_queue.saturating_mul(2).max(1),
            ..self.config.clone()
        }
    }
}

/// A running engine and what the gateway needs to talk to it.
pub struct Backend {
    pub handle: EngineHandle,
    pub thread: EngineThread,
    pub text: Text,
    pub model: ModelInfo,
}

/// Loads the model and starts its engine thread, which records its per-step histograms into
/// `steps` (when given).
pub fn start(
    source: &ModelSource,
    opts: &EngineOptions,
    steps: Option<StepMetrics>,
) -> anyhow::Result<Backend> {
    match source {
        ModelSource::Sim(profile) => start_sim(profile, opts, steps),
        ModelSource::Gpu { model, gpu } => start_gpu(model, gpu, opts, steps),
        ModelSource::Dir(dir) => start_cpu(dir, model_id(dir), opts, steps),
        ModelSource::Tiny(dir) => {
            if !dir.join("config.json").exists() {
                write_tiny(dir)?;
            }
            start_cpu(dir, TINY_MODEL_ID.into(), opts, steps)
        }
    }
}

/// Writes the embedded model into a sibling folder and renames it into place, so a crash
/// while writing never leaves a half-written model that a later start would try to load.
fn write_tiny(dir: &Path) -> anyhow::Result<()> {
    let partial = dir.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial)
            .with_context(|| format!("cannot remove {}", partial.display()))?;
    }
    std::fs::create_dir_all(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    superinfer_engine::model::tiny::write_tiny_model(&partial, TINY_MODEL_SEED)
        .with_context(|| format!("writing the embedded model into {}", partial.display()))?;
    if dir.exists() {
        // No config.json: an incomplete copy from an older layout.
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    std::fs::rename(&partial, dir)
        .with_context(|| format!("cannot move the model into {}", dir.display()))?;
    tracing::info!(dir = %dir.display(), "wrote the embedded tiny model");
    Ok(())
}

/// A model's id: its folder name, or a GGUF file's name without `.gguf`.
fn model_id(dir: &Path) -> String {
    let path = dir.canonicalize().ok();
    let path = path.as_deref().unwrap_or(dir);
    let name = if path.is_file() && path.extension().is_some_and(|e| e == "gguf") {
        path.file_stem()
    } else {
        path.file_name()
    };
    name.map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
}

/// The engine's options for a model runner (CPU or GPU) from the command line's.
fn engine_options(opts: &EngineOptions) -> superinfer_engine::serve::EngineOptions {
    superinfer_engine::serve::EngineOptions {
        // The model runners size the tiers themselves (from `hbm_blocks` / `dram_blocks` or
        // the memory sizes).
        config: opts.engine_config(0, 0),
        hbm_blocks: opts.hbm_blocks,
        dram_blocks: opts.dram_blocks,
        policy: opts.policy,
        wlvf: opts.wlvf,
        ..superinfer_engine::serve::EngineOptions::default()
    }
}

fn start_cpu(
    dir: &Path,
    id: String,
    opts: &EngineOptions,
    steps: Option<StepMetrics>,
) -> anyhow::Result<Backend> {
    use superinfer_engine::serve;
    let cpu = engine_options(opts);
    let (engine, codec) = serve::cpu_engine(dir, &cpu)
        .with_context(|| format!("loading the model in {}", dir.display()))?;
    let config = superinfer_engine::model::ModelConfig::from_model_dir(dir)?;
    let model = ModelInfo {
        id,
        max_model_len: context_len(&config),
        prompt_logprobs: true,
    };
    serve_engine(engine, (opts, steps), false, Text::model(codec), model)
}

/// The model's context length as a token count.
fn context_len(config: &superinfer_engine::model::ModelConfig) -> u32 {
    u32::try_from(config.max_position_embeddings).unwrap_or(u32::MAX)
}

/// Starts `engine` on its thread (real-time pacing of simulated steps when `pace`) and
/// describes it; `model.max_model_len` (the model's context) is capped by the command line's
/// limit and by what the HBM tier holds.
fn serve_engine<R, T, C>(
    engine: superinfer_engine::Engine<R, T, C>,
    (opts, steps): (&EngineOptions, Option<StepMetrics>),
    pace: bool,
    text: Text,
    model: ModelInfo,
) -> anyhow::Result<Backend>
where
    R: superinfer_engine::runner::ModelRunner + 'static,
    T: superinfer_engine::transfer::Transfer + 'static,
    C: superinfer_engine::clock::Clock + 'static,
{
    let text = text.with_tool_format(opts.tool_call_parser);
    let kv_tokens = engine
        .config()
        .hbm_blocks
        .saturating_mul(engine.config().block_size);
    tracing::info!(
        hbm_blocks = engine.config().hbm_blocks,
        dram_blocks = engine.config().dram_blocks,
        block_size = engine.config().block_size,
        hbm_kv_tokens = kv_tokens,
        "KV tiers"
    );
    match engine.config().b_xfer {
        Some(blocks) => tracing::info!(blocks, "rotation budget B_xfer fixed"),
        None => tracing::info!(
            link_blocks_per_s = engine.stats().link_blocks_per_s,
            share = engine.config().b_xfer_link_share,
            "rotation budget B_xfer automatic: link rate x mean iteration time, at least the largest live request"
        ),
    }
    let handle_cfg = HandleConfig {
        inbox_capacity: opts.max_queue.max(1),
        pace,
        step_metrics: steps,
        ..HandleConfig::default()
    };
    let (handle, thread) = spawn(engine, handle_cfg)?;
    Ok(Backend {
        handle,
        thread,
        text,
        model: ModelInfo {
            max_model_len: opts
                .max_model_len
                .unwrap_or(u32::MAX)
                .min(kv_tokens)
                .min(model.max_model_len),
            ..model
        },
    })
}

#[cfg(not(feature = "cuda"))]
fn start_gpu(
    _model: &str,
    _gpu: &GpuOptions,
    _opts: &EngineOptions,
    _steps: Option<StepMetrics>,
) -> anyhow::Result<Backend> {
    anyhow::bail!(
        "this superinfer was built without CUDA; build it with \
         `cargo build --release -p superinfer-gateway --features cuda`"
    )
}

#[cfg(feature = "cuda")]
fn start_gpu(
    model: &str,
    gpu: &GpuOptions,
    opts: &EngineOptions,
    steps: Option<StepMetrics>,
) -> anyhow::Result<Backend> {
    use superinfer_engine::serve::gpu::{gpu_engine, GpuModel};
    use superinfer_engine::serve::{self, ModelDtype};
    let eo = serve::EngineOptions {
        dtype: ModelDtype::Bf16,
        ..engine_options(opts)
    };
    let source = GpuModel::parse(model);
    let policy = opts.policy.build(&opts.wlvf);
    let (engine, codec, config) = gpu_engine(&source, &eo, gpu, policy)
        .with_context(|| format!("loading {model} on the GPU"))?;
    // Its KV tiers are logged with every backend's ("KV tiers", `serve_engine`).
    tracing::info!(model, "model on the GPU");
    let id = match &source {
        GpuModel::Random(_) => model.to_owned(),
        GpuModel::Dir(dir) => model_id(dir),
    };
    let info = ModelInfo {
        id,
        max_model_len: context_len(&config),
        prompt_logprobs: false,
    };
    // A random model has no tokenizer: the word stand-in, inside its vocabulary.
    let vocab = u32::try_from(config.vocab_size).unwrap_or(u32::MAX);
    let text = codec.map_or_else(|| Text::words_for_vocab(vocab), Text::model);
    serve_engine(engine, (opts, steps), false, text, info)
}

/// A profile whose steps and copies take no modelled time.
pub fn zero_profile() -> anyhow::Result<Profile> {
    let base = Profile::builtin(DEFAULT_SIM_PROFILE)?;
    let fast = 1e12;
    Ok(Profile {
        hw: HardwareProfile {
            name: ZERO_PROFILE.into(),
            hbm_bw_gbps: fast,
            hbm_bw_efficiency: 1.0,
            matmul_tflops: fast,
            prefill_efficiency: 1.0,
            prefill_attention_efficiency: None,
            h2d_gbps: fast,
            d2h_gbps: fast,
            duplex_each_gbps: fast,
            per_copy_latency_s: 0.0,
            step_overhead_s: 0.0,
            step_overhead_per_seq_s: 0.0,
            graph_max_seqs: 0,
            graph_step_overhead_s: 0.0,
            graph_step_overhead_per_seq_s: 0.0,
            overhead_layers: 0,
            kv_read_efficiency: 1.0,
            kv_overlaps_compute: true,
            ..base.hw
        },
        model: base.model,
    })
}

fn start_sim(
    name: &str,
    opts: &EngineOptions,
    steps: Option<StepMetrics>,
) -> anyhow::Result<Backend> {
    let zero = name == ZERO_PROFILE;
    let profile = if zero {
        zero_profile()?
    } else {
        Profile::builtin(name)?
    };
    let (hbm, dram) = profile
        .kv_blocks(opts.config.block_size, 0.9, 400.0)
        .with_context(|| format!("sizing the KV tiers of profile {name}"))?;
    let cfg = opts.engine_config(
        opts.hbm_blocks.unwrap_or(hbm),
        opts.dram_blocks.unwrap_or(dram),
    );
    let policy = opts.policy.build(&opts.wlvf);
    let engine = sim_engine_on(profile, cfg, policy, RealClock::new())?;
    let model = ModelInfo {
        id: format!("sim-{name}"),
        max_model_len: u32::MAX,
        prompt_logprobs: false,
    };
    serve_engine(engine, (opts, steps), !zero, Text::words(), model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_build_without_cuda_refuses_the_gpu_with_the_build_command() {
        let source = ModelSource::Gpu {
            model: "random:llama-3-8b".into(),
            gpu: gpu_options(None, Some(4.0), None).unwrap(),
        };
        let e = start(&source, &EngineOptions::default(), None)
            .err()
            .expect("no CUDA in this build")
            .to_string();
        assert!(e.contains("--features cuda"), "{e}");
    }

    #[test]
    fn gpu_settings_refuse_values_that_cannot_work() {
        assert!(gpu_options(Some(0.0), None, None).is_err());
        assert!(gpu_options(None, Some(-1.0), None).is_err());
        assert!(gpu_options(None, None, Some(f64::NAN)).is_err());
        let ok = gpu_options(None, None, None).unwrap();
        assert_eq!((ok.gpu_memory_utilization, ok.dram_kv_gb), (0.9, 32.0));
    }
}
