//! Policies by name, as the command line and config files spell them.

use crate::baselines::{Edf, Fcfs, SwappedFirst, WaitingFirst};
use crate::lvf::Lvf;
use crate::types::Policy;
use crate::vlt::VltConfig;
use crate::wlvf::{Wlvf, WlvfConfig};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The policies SuperInfer ships.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    Fcfs,
    Wf,
    Sf,
    Edf,
    Lvf,
    Wlvf,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Fcfs,
        PolicyKind::Wf,
        PolicyKind::Sf,
        PolicyKind::Edf,
        PolicyKind::Lvf,
        PolicyKind::Wlvf,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Fcfs => "fcfs",
            PolicyKind::Wf => "wf",
            PolicyKind::Sf => "sf",
            PolicyKind::Edf => "edf",
            PolicyKind::Lvf => "lvf",
            PolicyKind::Wlvf => "wlvf",
        }
    }

    /// Builds the policy. `cfg.vlt` applies to LVF and weighted LVF; the caps and the fairness
    /// band to weighted LVF only.
    pub fn build(self, cfg: &WlvfConfig) -> Box<dyn Policy> {
        match self {
            PolicyKind::Fcfs => Box::new(Fcfs),
            PolicyKind::Wf => Box::new(WaitingFirst),
            PolicyKind::Sf => Box::new(SwappedFirst),
            PolicyKind::Edf => Box::new(Edf),
            PolicyKind::Lvf => Box::new(Lvf { vlt: cfg.vlt }),
            PolicyKind::Wlvf => Box::new(Wlvf::new(*cfg)),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown policy '{}': expected one of fcfs, wf, sf, edf, lvf, wlvf",
            self.0
        )
    }
}

impl std::error::Error for UnknownPolicy {}

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// Default VLT knobs, re-exported for callers that build a config from flags.
pub fn default_vlt() -> VltConfig {
    VltConfig::default()
}
