//! What the engine thread and every handle and stream share: statistics, pending aborts, the
//! health flags and the id counter.

use crate::engine::EngineStats;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use superinfer_policies::RequestId;

pub(super) struct Shared {
    pub(super) stats: Mutex<EngineStats>,
    pub(super) aborts: Mutex<Vec<RequestId>>,
    pub(super) running: AtomicBool,
    /// The panic's message once the loop failed; written before `running` turns false.
    pub(super) failure: Mutex<Option<String>>,
    /// Panics caught in the serving loop.
    pub(super) panics: AtomicU64,
    pub(super) next_id: AtomicU64,
    pub(super) max_tokens_total: u32,
}
