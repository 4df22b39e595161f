//! The metrics the Gateway API Inference Extension's endpoint picker reads from a model
//! server, under vLLM's names (its model-server protocol), labelled `model_name` as vLLM's
//! are. Only what we can fill truthfully:
//! - `vllm:num_requests_waiting`: requests not in the running batch — waiting for admission,
//!   and rotated out to DRAM (or moving between the tiers), as vLLM V1 counts its preempted
//!   requests as waiting;
//! - `vllm:num_requests_running`: the running batch;
//! - `vllm:kv_cache_usage_perc`: used share (0..1) of the HBM tier, the one the batch runs
//!   from (prefix-cache blocks nobody uses count as free, as in vLLM);
//! - `vllm:cache_config_info{block_size, num_gpu_blocks, num_cpu_blocks}` = 1: the KV block
//!   size in tokens and the blocks of the HBM and DRAM tiers.
//!
//! Not exported: `vllm:lora_requests_info` (we serve no LoRA adapters; an empty series would
//! announce LoRA serving to the picker's affinity scorer). Our own signals stay under our
//! names in `metrics.rs` (DRAM tier usage, the rotation backlog, per-tenant attainment).

use superinfer_engine::EngineStats;

pub const WAITING: &str = "vllm:num_requests_waiting";
pub const RUNNING: &str = "vllm:num_requests_running";
pub const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
pub const CACHE_CONFIG: &str = "vllm:cache_config_info";

/// Their help texts, for `describe`.
pub const HELP: &[(&str, &str)] = &[
    (
        WAITING,
        "Requests not in the running batch: waiting for admission, or rotated out to DRAM.",
    ),
    (RUNNING, "Requests in the running batch."),
    (
        KV_USAGE,
        "Used share of the HBM KV tier; 1 means 100 percent used.",
    ),
    (
        CACHE_CONFIG,
        "KV cache configuration: block size in tokens, HBM (gpu) and DRAM (cpu) tier blocks.",
    ),
];

/// Sets the gauges from `engine` (inside the server's recorder).
pub fn record(engine: &EngineStats, model: &str) {
    let m = model.to_string();
    let not_running = engine.waiting + engine.rotary + engine.evicting + engine.restoring;
    metrics::gauge!(WAITING, "model_name" => m.clone()).set(not_running as f64);
    metrics::gauge!(RUNNING, "model_name" => m.clone()).set(engine.running as f64);
    let usage = if engine.hbm_capacity == 0 {
        0.0
    } else {
        f64::from(engine.hbm_used) / f64::from(engine.hbm_capacity)
    };
    metrics::gauge!(KV_USAGE, "model_name" => m.clone()).set(usage);
    metrics::gauge!(
        CACHE_CONFIG,
        "model_name" => m,
        "block_size" => engine.block_size.to_string(),
        "num_gpu_blocks" => engine.hbm_capacity.to_string(),
        "num_cpu_blocks" => engine.dram_capacity.to_string()
    )
    .set(1.0);
}
