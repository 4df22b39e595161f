//! Hardware + model profiles for the simulated backends. Profiles are data files under
//! `engine/profiles/` (each field with its source) embedded in the binary; a profile name is
//! `HARDWARE-MODEL`, e.g. `gh200-qwen2.5-32b`.

use crate::error::EngineError;
use crate::kv::BlockGeometry;
use serde::Deserialize;

/// A GPU node: memory, bandwidths, compute rate and overheads.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    pub name: String,
    pub hbm_gb: f64,
    pub hbm_bw_gbps: f64,
    pub hbm_bw_efficiency: f64,
    pub matmul_tflops: f64,
    pub prefill_efficiency: f64,
    /// Fraction of `matmul_tflops` a prompt chunk's causal attention (QK^T and PV) reaches in
    /// the runner's prefill-attention kernel; `prefill_efficiency` when absent.
    #[serde(default)]
    pub prefill_attention_efficiency: Option<f64>,
    /// Query rows (of one head) the prefill-attention kernel keeps in flight at that rate:
    /// SMs × resident CTAs × `prefill_attention_tile`. A chunk's query tiles run in waves of
    /// that many rows over all heads, each wave as long as its tiles' walk over the keys, so
    /// a chunk costs its (query, key) pairs rounded up to whole waves
    /// ([`crate::runner::cost::attention_pairs`]). 0 (absent): no waves, pairs only.
    #[serde(default)]
    pub prefill_attention_rows_in_flight: u32,
    /// Query rows of one head a CTA of the prefill-attention kernel takes (its tile).
    #[serde(default)]
    pub prefill_attention_tile: u32,
    /// A step with a prompt chunk of at least this many tokens runs the wide kernel
    /// (`kernels/src/cu/prefill_wide.cu`, at `prefill_attention_wide_efficiency`, its many
    /// waves costed as pairs); 0 (absent): one kernel.
    #[serde(default)]
    pub prefill_attention_wide_min_tokens: u32,
    /// Fraction of `matmul_tflops` the wide kernel's attention reaches.
    #[serde(default)]
    pub prefill_attention_wide_efficiency: Option<f64>,
    pub h2d_gbps: f64,
    pub d2h_gbps: f64,
    pub duplex_each_gbps: f64,
    pub per_copy_latency_s: f64,
    /// Seconds every step pays beyond the roofline model (the served loop's host term and
    /// what the runner loses to launches and small kernels).
    pub step_overhead_s: f64,
    /// Seconds each sequence of a step adds to it beyond the roofline model; 0 when absent.
    #[serde(default)]
    pub step_overhead_per_seq_s: f64,
    /// Decode-only steps of at most this many sequences are replayed from CUDA graphs and pay
    /// the two `graph_*` overheads instead of the two above; 0 (absent): no graphs.
    #[serde(default)]
    pub graph_max_seqs: u32,
    #[serde(default)]
    pub graph_step_overhead_s: f64,
    #[serde(default)]
    pub graph_step_overhead_per_seq_s: f64,
    /// The layer count of the model the four overheads above were measured with: a model
    /// with another count pays them scaled by its layers over this (launches, small kernels
    /// and attention's latency are per layer). 0 (absent): the same for every model.
    #[serde(default)]
    pub overhead_layers: u32,
    pub activation_reserve_gb: f64,
    /// Fraction of the effective HBM bandwidth that decode attention reaches when it reads the
    /// KV cache (the runner's attention kernel, not the hardware); 1.0 when absent.
    #[serde(default = "one")]
    pub kv_read_efficiency: f64,
    /// Whether a step's KV reads overlap its matmuls (one fused pass: time = max of compute
    /// and memory) or follow them (separate attention kernels: the KV time adds); true when
    /// absent.
    #[serde(default = "yes")]
    pub kv_overlaps_compute: bool,
}

impl HardwareProfile {
    /// The FLOP rate of a prompt chunk's attention (`prefill_attention_efficiency`).
    pub fn attention_flops_per_s(&self) -> f64 {
        self.matmul_tflops
            * 1e12
            * self
                .prefill_attention_efficiency
                .unwrap_or(self.prefill_efficiency)
    }

    /// The wide prefill-attention kernel's threshold (chunk tokens) and rate, if it has one.
    pub fn wide_attention(&self) -> Option<(f64, f64)> {
        let eff = self.prefill_attention_wide_efficiency?;
        (self.prefill_attention_wide_min_tokens > 0).then(|| {
            (
                f64::from(self.prefill_attention_wide_min_tokens),
                self.matmul_tflops * 1e12 * eff,
            )
        })
    }

    /// Queries of one wave of the prefill-attention kernel over `num_heads` heads, and its
    /// tile (both 0 when the profile does not say).
    pub fn attention_waves(&self, num_heads: u32) -> (f64, f64) {
        if self.prefill_attention_tile == 0 {
            return (0.0, 0.0);
        }
        (
            f64::from(self.prefill_attention_rows_in_flight) / f64::from(num_heads.max(1)),
            f64::from(self.prefill_attention_tile),
        )
    }
}

fn yes() -> bool {
    true
}

fn one() -> f64 {
    1.0
}

/// A transformer's shape.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelProfile {
    pub name: String,
    pub params: f64,
    pub num_layers: u32,
    pub hidden_size: u32,
    pub num_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype_bytes: u32,
}

impl ModelProfile {
    pub fn weight_bytes(&self) -> f64 {
        self.params * f64::from(self.dtype_bytes)
    }

    pub fn geometry(&self, block_size: u32) -> BlockGeometry {
        BlockGeometry {
            num_layers: self.num_layers,
            block_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            dtype_bytes: self.dtype_bytes,
        }
    }
}

/// A hardware profile with a model on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub hw: HardwareProfile,
    pub model: ModelProfile,
}

const HARDWARE: &[(&str, &str)] = &[
    ("gh200", include_str!("../profiles/hardware/gh200.toml")),
    ("h200", include_str!("../profiles/hardware/h200.toml")),
    ("h100", include_str!("../profiles/hardware/h100.toml")),
];

const MODELS: &[(&str, &str)] = &[
    (
        "qwen2.5-32b",
        include_str!("../profiles/models/qwen2.5-32b.toml"),
    ),
    (
        "llama-3-8b",
        include_str!("../profiles/models/llama-3-8b.toml"),
    ),
    (
        "llama-3.1-8b",
        include_str!("../profiles/models/llama-3.1-8b.toml"),
    ),
];

/// The built-in hardware profile of a GPU by its driver name (`NVIDIA H100 80GB HBM3`,
/// `NVIDIA H200`, `NVIDIA GH200 480GB`, ...); `None` for a GPU without one. (Every built-in
/// file parses: `every_builtin_profile_loads`.)
pub fn hardware_for_gpu(device_name: &str) -> Option<HardwareProfile> {
    let upper = device_name.to_ascii_uppercase();
    // GH200 before H200: the one name contains the other.
    let key = ["gh200", "h200", "h100"]
        .into_iter()
        .find(|k| upper.contains(&k.to_ascii_uppercase()))?;
    let (_, text) = HARDWARE.iter().find(|(h, _)| *h == key)?;
    parse(key, text).ok()
}

/// Names of every built-in profile.
pub fn builtin_names() -> Vec<String> {
    HARDWARE
        .iter()
        .flat_map(|(h, _)| MODELS.iter().map(move |(m, _)| format!("{h}-{m}")))
        .collect()
}

fn parse<T: serde::de::DeserializeOwned>(name: &str, text: &str) -> Result<T, EngineError> {
    toml::from_str(text).map_err(|e| EngineError::Profile {
        name: name.into(),
        msg: e.to_string(),
    })
}

impl Profile {
    /// A built-in profile by name (`gh200-qwen2.5-32b`, `h200-llama-3-8b`, ...).
    pub fn builtin(name: &str) -> Result<Profile, EngineError> {
        let unknown = || EngineError::Profile {
            name: name.into(),
            msg: format!("unknown profile; built-in: {}", builtin_names().join(", ")),
        };
        let (hw_name, model_name) = name.split_once('-').ok_or_else(unknown)?;
        let hw = HARDWARE
            .iter()
            .find(|(h, _)| *h == hw_name)
            .ok_or_else(unknown)?;
        let model = MODELS
            .iter()
            .find(|(m, _)| *m == model_name)
            .ok_or_else(unknown)?;
        Profile::from_toml(name, hw.1, model.1)
    }

    /// A profile from the texts of a hardware and a model file.
    pub fn from_toml(name: &str, hw: &str, model: &str) -> Result<Profile, EngineError> {
        let p = Profile {
            hw: parse(name, hw)?,
            model: parse(name, model)?,
        };
        p.validate(name)?;
        Ok(p)
    }

    fn validate(&self, name: &str) -> Result<(), EngineError> {
        let h = &self.hw;
        let positive = [
            ("hbm_gb", h.hbm_gb),
            ("hbm_bw_gbps", h.hbm_bw_gbps),
            ("hbm_bw_efficiency", h.hbm_bw_efficiency),
            ("matmul_tflops", h.matmul_tflops),
            ("prefill_efficiency", h.prefill_efficiency),
            ("kv_read_efficiency", h.kv_read_efficiency),
            (
                "prefill_attention_efficiency",
                h.prefill_attention_efficiency
                    .unwrap_or(h.prefill_efficiency),
            ),
            ("h2d_gbps", h.h2d_gbps),
            ("d2h_gbps", h.d2h_gbps),
            ("duplex_each_gbps", h.duplex_each_gbps),
            ("params", self.model.params),
        ];
        for (field, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(EngineError::Profile {
                    name: name.into(),
                    msg: format!("{field} must be positive, got {v}"),
                });
            }
        }
        Ok(())
    }

    /// KV capacity in blocks, as vLLM sizes it: HBM × utilization − weights − activation
    /// reserve for the HBM tier; the DRAM tier is a setting in GiB.
    pub fn kv_blocks(
        &self,
        block_size: u32,
        gpu_memory_utilization: f64,
        dram_gib: f64,
    ) -> Result<(u32, u32), EngineError> {
        let block_bytes = self.model.geometry(block_size).block_bytes();
        let block = block_bytes as f64;
        let budget = self.hw.hbm_gb * 1e9 * gpu_memory_utilization
            - self.model.weight_bytes()
            - self.hw.activation_reserve_gb * 1e9;
        if budget < block {
            return Err(EngineError::Profile {
                name: format!("{}-{}", self.hw.name, self.model.name),
                msg: format!(
                    "no HBM left for KV: {:.1} GB × {gpu_memory_utilization} − {:.1} GB weights",
                    self.hw.hbm_gb,
                    self.model.weight_bytes() / 1e9
                ),
            });
        }
        Ok((
            crate::kv::whole_blocks(budget, block_bytes),
            crate::kv::whole_blocks(dram_gib * (1u64 << 30) as f64, block_bytes),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_finds_its_hardware_profile_by_driver_name() {
        let name = |n: &str| hardware_for_gpu(n).map(|h| h.name);
        assert_eq!(name("NVIDIA H100 80GB HBM3").as_deref(), Some("h100"));
        assert_eq!(name("NVIDIA H200").as_deref(), Some("h200"));
        assert_eq!(name("NVIDIA GH200 480GB").as_deref(), Some("gh200"));
        assert_eq!(name("NVIDIA A100-SXM4-80GB"), None);
    }

    #[test]
    fn every_builtin_profile_loads() {
        for name in builtin_names() {
            let p = Profile::builtin(&name).unwrap();
            let (hbm, dram) = p.kv_blocks(16, 0.9, 400.0).unwrap();
            // The tightest: Qwen2.5-32B on an H100, ~64 GB of weights in 80 GB, 715 blocks.
            assert!(hbm >= 512 && dram > hbm, "{name}: {hbm} {dram}");
        }
    }

    #[test]
    fn qwen_block_is_4_mib_and_capacity_follows_memory() {
        let p = Profile::builtin("gh200-qwen2.5-32b").unwrap();
        assert_eq!(p.model.geometry(16).block_bytes(), 4 << 20);
        let (hbm, dram) = p.kv_blocks(16, 0.9, 400.0).unwrap();
        // 144 GB × 0.9 − 65 GB − 4 GB = 60.6 GB of 4 MiB blocks; 400 GiB of DRAM.
        assert_eq!(hbm, 14448);
        assert_eq!(dram, 102_400);
    }

    #[test]
    fn unknown_profile_names_the_builtins() {
        let e = Profile::builtin("tpu-llama").unwrap_err().to_string();
        assert!(e.contains("gh200-qwen2.5-32b"), "{e}");
    }
}
