//! The simulated target: the real engine (scheduler, KV pool, accounting) on a virtual clock
//! with a simulated GPU from a hardware + model profile. Runs a 120 s workload in well under a
//! second of wall time.

use super::{Target, TargetStats};
use crate::record::RequestRecord;
use crate::workload::{RequestSpec, TenantSpec};
use anyhow::Context;
use superinfer_engine::kv::whole_blocks;
use superinfer_engine::profile::Profile;
use superinfer_engine::sim::{sim_engine_with, SimEngine};
use superinfer_engine::EngineConfig;
use superinfer_policies::{PolicyKind, WlvfConfig};

mod serve;

pub use serve::RunLog;

/// Bytes in a GB, the unit of [`SimTargetConfig::hbm_kv_gb`] and [`SimTargetConfig::dram_gb`].
const GB: f64 = 1e9;
/// Bytes in a GiB, the unit of [`SimTargetConfig::dram_gib`].
const GIB: f64 = (1u64 << 30) as f64;

/// How the simulated node is built for every run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimTargetConfig {
    /// Built-in profile name, e.g. `gh200-qwen2.5-32b`.
    pub profile: String,
    /// The engine's knobs, with the defaults `superinfer serve` has ([`EngineConfig`]); its
    /// tier sizes are replaced by the ones sized below from the profile.
    pub engine: EngineConfig,
    /// DRAM tier size in GiB (2^30 bytes); ignored when `dram_gb` is set.
    pub dram_gib: f64,
    /// DRAM tier size in GB (10^9 bytes); overrides `dram_gib`.
    pub dram_gb: Option<f64>,
    /// Share of HBM for weights + KV + activation reserve; ignored when `hbm_kv_gb` is set.
    pub gpu_memory_utilization: f64,
    /// HBM KV tier size in GB (10^9 bytes); overrides the size that follows from the HBM
    /// size, the weights and `gpu_memory_utilization`.
    pub hbm_kv_gb: Option<f64>,
    /// VLT knobs and weighted-LVF caps (used by the policies that have them).
    pub policy: WlvfConfig,
    /// After the last arrival, keep serving for at most this long; requests not served by
    /// then count as misses.
    pub drain_s: f64,
}

impl Default for SimTargetConfig {
    fn default() -> Self {
        SimTargetConfig {
            profile: "gh200-qwen2.5-32b".into(),
            engine: EngineConfig::default(),
            dram_gib: 400.0,
            dram_gb: None,
            gpu_memory_utilization: 0.9,
            hbm_kv_gb: None,
            policy: WlvfConfig::default(),
            drain_s: 60.0,
        }
    }
}

/// Serves workloads with the twin.
#[derive(Clone, Debug)]
pub struct SimTarget {
    cfg: SimTargetConfig,
    profile: Profile,
    engine: EngineConfig,
    /// Keep every prompt sent in the last run (for tests of the content).
    keep_prompts: bool,
    last: Option<serve::RunLog>,
}

impl SimTarget {
    /// Checks the profile and sizes now, so a bad flag fails before any run.
    pub fn new(cfg: SimTargetConfig) -> anyhow::Result<SimTarget> {
        let profile = Profile::builtin(&cfg.profile)?;
        cfg.policy
            .vlt
            .validate()
            .map_err(|e| anyhow::anyhow!("{e} (--alpha, --beta-b, --beta-f)"))?;
        let e = &cfg.engine;
        if e.max_batched_tokens == 0 || e.max_num_seqs == 0 || e.block_size == 0 {
            anyhow::bail!(
                "max_batched_tokens ({}), max_num_seqs ({}) and block_size ({}) must be positive",
                e.max_batched_tokens,
                e.max_num_seqs,
                e.block_size
            );
        }
        let (hbm_blocks, dram_blocks) = kv_blocks(&profile, &cfg)
            .with_context(|| format!("sizing the KV tiers of {}", cfg.profile))?;
        let engine = EngineConfig {
            hbm_blocks,
            dram_blocks,
            ..cfg.engine.clone()
        };
        Ok(SimTarget {
            cfg,
            profile,
            engine,
            keep_prompts: false,
            last: None,
        })
    }

    pub fn config(&self) -> &SimTargetConfig {
        &self.cfg
    }

    /// The engine settings every run uses (tier sizes in blocks, budgets).
    pub fn engine_config(&self) -> &EngineConfig {
        &self.engine
    }

    /// The longest sequence the node can ever hold: its HBM KV tier, in tokens.
    pub fn context_tokens(&self) -> u32 {
        self.engine
            .hbm_blocks
            .saturating_mul(self.engine.block_size)
    }

    /// Bytes of one KV block of the profile's model.
    pub fn block_bytes(&self) -> u64 {
        self.profile
            .model
            .geometry(self.engine.block_size)
            .block_bytes()
    }

    /// Keep the prompts of the next runs (see [`SimTarget::last_prompts`]).
    pub fn keep_prompts(&mut self, keep: bool) {
        self.keep_prompts = keep;
    }

    /// The prompt of every request the last run sent, by request id (empty unless
    /// [`SimTarget::keep_prompts`] was set), and the tokens each one generated.
    pub fn last_prompts(&self) -> Option<&serve::RunLog> {
        self.last.as_ref()
    }

    fn build(&self, policy: PolicyKind) -> anyhow::Result<SimEngine> {
        Ok(sim_engine_with(
            self.profile.clone(),
            self.engine.clone(),
            policy.build(&self.cfg.policy),
        )?)
    }
}

/// The HBM and DRAM tier sizes in blocks. The HBM tier is `hbm_kv_gb` when set (it must hold a
/// block, and fit in HBM next to the weights and the activation reserve), otherwise what
/// vLLM's rule leaves: HBM × `gpu_memory_utilization` − weights − activation reserve. The
/// DRAM tier is `dram_gb` GB when set, otherwise `dram_gib` GiB.
pub fn kv_blocks(profile: &Profile, cfg: &SimTargetConfig) -> anyhow::Result<(u32, u32)> {
    let block_size = cfg.engine.block_size;
    let block_bytes = profile.model.geometry(block_size).block_bytes();
    let block = block_bytes as f64;
    let blocks = |bytes: f64| whole_blocks(bytes, block_bytes);
    let hbm = match cfg.hbm_kv_gb {
        None => {
            profile
                .kv_blocks(block_size, cfg.gpu_memory_utilization, cfg.dram_gib)?
                .0
        }
        Some(gb) => {
            if !(gb.is_finite() && gb > 0.0) {
                anyhow::bail!(
                    "the HBM KV tier (--hbm-kv-gb) must be positive and finite, got {gb}"
                );
            }
            let weights = profile.model.weight_bytes() / GB;
            let reserve = profile.hw.activation_reserve_gb;
            if gb + weights + reserve > profile.hw.hbm_gb {
                anyhow::bail!(
                    "an HBM KV tier of {gb} GB (--hbm-kv-gb) does not fit: with {weights:.2} GB \
                     of weights and {reserve} GB of activation reserve it exceeds the {} GB of \
                     HBM (at most {:.2} GB of KV)",
                    profile.hw.hbm_gb,
                    profile.hw.hbm_gb - weights - reserve
                );
            }
            let n = blocks(gb * GB);
            if n == 0 {
                anyhow::bail!(
                    "an HBM KV tier of {gb} GB (--hbm-kv-gb) holds no KV block: one block \
                     ({block_size} tokens) of this model is {:.3} GB",
                    block / GB
                );
            }
            n
        }
    };
    let dram = match cfg.dram_gb {
        Some(gb) if !(gb.is_finite() && gb >= 0.0) => {
            anyhow::bail!("the DRAM tier (--dram-gb) must be >= 0 and finite, got {gb}")
        }
        Some(gb) => blocks(gb * GB),
        None => blocks(cfg.dram_gib.max(0.0) * GIB),
    };
    Ok((hbm, dram))
}

impl Target for SimTarget {
    fn cache_blocks(&self) -> Option<(u32, u64)> {
        let e = &self.engine;
        // The two-tier cache is inclusive: every entry keeps a DRAM slot and some also an
        // HBM copy (engine/src/kv/pool), so the DRAM tier bounds how many entries it holds;
        // without a DRAM tier the cache is HBM-only.
        let blocks = match (e.prefix_cache, e.prefix_cache_dram && e.dram_blocks > 0) {
            (false, _) => 0,
            (true, false) => u64::from(e.hbm_blocks),
            (true, true) => u64::from(e.dram_blocks),
        };
        Some((e.block_size, blocks))
    }

    fn run(
        &mut self,
        policy: PolicyKind,
        tenants: &[TenantSpec],
        requests: &[RequestSpec],
        duration_s: f64,
    ) -> anyhow::Result<Vec<RequestRecord>> {
        let engine = self.build(policy)?;
        let run = serve::Run {
            tenants,
            requests,
            duration_s,
            end_s: duration_s + self.cfg.drain_s.max(0.0),
            keep_prompts: self.keep_prompts,
        };
        let (records, log) = run.serve(engine)?;
        self.last = Some(log);
        Ok(records)
    }

    fn last_stats(&self) -> Option<TargetStats> {
        self.last.as_ref().map(|l| l.stats)
    }
}

#[cfg(test)]
mod tests;
