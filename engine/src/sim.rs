//! The simulated engine (the twin): the real [`Engine`] over a [`SimRunner`], a
//! [`SimTransfer`] and a [`VirtualClock`], sized from a hardware + model profile.

use crate::clock::{Clock, VirtualClock};
use crate::engine::{Engine, EngineConfig};
use crate::error::EngineError;
use crate::profile::Profile;
use crate::runner::sim::SimRunner;
use crate::transfer::sim::SimTransfer;
use serde::{Deserialize, Serialize};
use superinfer_policies::Policy;

/// The twin's engine type.
pub type SimEngine = Engine<SimRunner, SimTransfer, VirtualClock>;

/// How to size the simulated node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimSettings {
    /// Built-in profile name, e.g. `gh200-qwen2.5-32b`.
    pub profile: String,
    /// Share of HBM the engine may use (weights + KV + reserve), as vLLM's setting.
    pub gpu_memory_utilization: f64,
    /// DRAM tier size in GiB (the paper used 400).
    pub dram_gib: f64,
    /// Rotation budget in blocks per iteration (paper: 2400); `None`: automatic, from the
    /// profile's link rate and the iteration time.
    pub b_xfer: Option<u32>,
    pub max_batched_tokens: u32,
    pub block_size: u32,
}

impl Default for SimSettings {
    fn default() -> Self {
        SimSettings {
            profile: "gh200-qwen2.5-32b".into(),
            gpu_memory_utilization: 0.9,
            dram_gib: 400.0,
            b_xfer: None,
            max_batched_tokens: 16384,
            block_size: 16,
        }
    }
}

/// Builds the twin for `settings` with `policy`.
pub fn sim_engine(
    settings: &SimSettings,
    policy: Box<dyn Policy>,
) -> Result<SimEngine, EngineError> {
    let profile = Profile::builtin(&settings.profile)?;
    let (hbm_blocks, dram_blocks) = profile.kv_blocks(
        settings.block_size,
        settings.gpu_memory_utilization,
        settings.dram_gib,
    )?;
    let cfg = EngineConfig {
        block_size: settings.block_size,
        max_batched_tokens: settings.max_batched_tokens,
        b_xfer: settings.b_xfer,
        hbm_blocks,
        dram_blocks,
        ..EngineConfig::default()
    };
    sim_engine_with(profile, cfg, policy)
}

/// The twin of `profile` with an engine configuration of the caller's (tiers already sized,
/// e.g. from a server's flags).
pub fn sim_engine_with(
    profile: Profile,
    cfg: EngineConfig,
    policy: Box<dyn Policy>,
) -> Result<SimEngine, EngineError> {
    sim_engine_on(profile, cfg, policy, VirtualClock::new())
}

/// [`sim_engine_with`] on a clock of the caller's: a [`crate::clock::RealClock`] serves the
/// simulated runner in real time (the gateway's `--sim-profile`).
pub fn sim_engine_on<C: Clock>(
    profile: Profile,
    cfg: EngineConfig,
    policy: Box<dyn Policy>,
    clock: C,
) -> Result<Engine<SimRunner, SimTransfer, C>, EngineError> {
    let transfer = SimTransfer::new(
        &profile.hw,
        profile.model.geometry(cfg.block_size).block_bytes(),
    );
    let runner = SimRunner::new(profile, cfg.block_size);
    Engine::new(cfg, policy, runner, transfer, clock)
}
