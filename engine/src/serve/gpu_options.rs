//! What a GPU engine is asked for: which model (`random:NAME` or a directory) and how large
//! its tiers are. Plain data, validated and tested without a GPU; `gpu.rs` (feature `cuda`)
//! builds the engine from it.

use crate::error::EngineError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// Replay decode-only steps of at most 128 rows from CUDA graphs (else every step runs
    /// through the eager forward pass).
    pub cuda_graphs: bool,
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
            cuda_graphs: true,
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

    /// HBM KV blocks of `block_bytes` when `hbm_kv_gb` sets the tier directly.
    pub fn hbm_kv_blocks(&self, block_bytes: u64) -> Option<u32> {
        self.hbm_kv_gb.map(|gb| blocks_in(gb, block_bytes))
    }

    /// HBM KV blocks that `gpu_memory_utilization` leaves on a GPU with `free` of `total`
    /// bytes free once the weights are loaded, after `activation_gb`.
    pub fn utilization_blocks(&self, free: u64, total: u64, block_bytes: u64) -> u32 {
        let keep = (1.0 - self.gpu_memory_utilization) * total as f64 + self.activation_gb * 1e9;
        blocks_in((free as f64 - keep).max(0.0) / 1e9, block_bytes)
    }

    /// DRAM KV blocks of `block_bytes` in `dram_kv_gb`.
    pub fn dram_kv_blocks(&self, block_bytes: u64) -> u32 {
        blocks_in(self.dram_kv_gb, block_bytes)
    }
}

/// Whole blocks of `block_bytes` in `gb` GB (10^9 bytes).
fn blocks_in(gb: f64, block_bytes: u64) -> u32 {
    crate::kv::whole_blocks(gb * 1e9, block_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_names_and_directories_parse() {
        assert_eq!(
            GpuModel::parse("random:llama-3-8b"),
            GpuModel::Random("llama-3-8b".into())
        );
        assert_eq!(
            GpuModel::parse("/models/x"),
            GpuModel::Dir(PathBuf::from("/models/x"))
        );
    }

    #[test]
    fn options_that_cannot_work_are_refused_by_name() {
        assert!(GpuOptions::default().validate().is_ok());
        let cases = [
            (
                GpuOptions {
                    gpu_memory_utilization: 0.0,
                    ..GpuOptions::default()
                },
                "gpu_memory_utilization",
            ),
            (
                GpuOptions {
                    hbm_kv_gb: Some(0.0),
                    ..GpuOptions::default()
                },
                "hbm_kv_gb",
            ),
            (
                GpuOptions {
                    dram_kv_gb: f64::INFINITY,
                    ..GpuOptions::default()
                },
                "dram_kv_gb",
            ),
        ];
        for (o, field) in cases {
            let e = o.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn gigabytes_become_whole_blocks() {
        let o = GpuOptions {
            hbm_kv_gb: Some(4.0),
            dram_kv_gb: 48.0,
            ..GpuOptions::default()
        };
        // 4 GB of 2 MiB blocks (Llama-3-8B, 16 tokens): floor(4e9 / 2097152) = 1907.
        assert_eq!(o.hbm_kv_blocks(2 << 20), Some(1907));
        assert_eq!(o.dram_kv_blocks(2 << 20), 22_888);
        assert_eq!(GpuOptions::default().hbm_kv_blocks(2 << 20), None);
        // 143 GB card, 120 GB free after the weights, 0.9 utilization, 4 GB for activations:
        // 120 - 14.3 - 4 = 101.7 GB of KV.
        let u = GpuOptions::default().utilization_blocks(120_000_000_000, 143_000_000_000, 1 << 20);
        assert_eq!(u, (101.7e9 / (1u64 << 20) as f64) as u32);
        assert_eq!(
            GpuOptions::default().utilization_blocks(1, 143_000_000_000, 1 << 20),
            0
        );
    }
}
