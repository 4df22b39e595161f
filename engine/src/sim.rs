//! The simulated engine (the twin): the real [`Engine`] over a [`SimRunner`], a
//! [`SimTransfer`] and a [`VirtualClock`], at a hardware + model profile's speed.

use crate::clock::{Clock, VirtualClock};
use crate::engine::{Engine, EngineConfig};
use crate::error::EngineError;
use crate::profile::Profile;
use crate::runner::sim::SimRunner;
use crate::transfer::sim::SimTransfer;
use superinfer_policies::Policy;

/// The twin's engine type.
pub type SimEngine = Engine<SimRunner, SimTransfer, VirtualClock>;

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
