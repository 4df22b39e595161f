//! A tenant's id, the one type every other module of the crate names (errors included), so it
//! depends on nothing.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A tenant's id: allocated from a persistent counter, never reused, the same number as the
/// engine's `superinfer_policies::TenantId(u32)` so the gateway can map it directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantId(pub u32);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
