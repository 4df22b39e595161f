//! What the engine thread and every handle and stream share: statistics, pending aborts, the
//! health flags and the id counter.

use crate::engine::EngineStats;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use superinfer_policies::RequestId;
use tokio::sync::oneshot;

pub(super) struct Shared {
    pub(super) stats: Mutex<EngineStats>,
    /// Requests whose streams were dropped or aborted, each with where its end's trace goes
    /// (a stream aborted by [`super::RequestStream::abort`]).
    pub(super) aborts: Mutex<Vec<(RequestId, Option<oneshot::Sender<EndTrace>>)>>,
    pub(super) running: AtomicBool,
    /// The panic's message once the loop failed; written before `running` turns false.
    pub(super) failure: Mutex<Option<String>>,
    /// Panics caught in the serving loop.
    pub(super) panics: AtomicU64,
    pub(super) next_id: AtomicU64,
    pub(super) max_tokens_total: u32,
}

/// A request's life inside the engine, with its end ([`super::StreamEvent::Finished`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EndTrace {
    /// Seconds from its arrival at the engine to its first admission (to its end if it was
    /// never admitted).
    pub queued_s: f64,
    /// Times it lost its place in HBM (rotations out and recomputes).
    pub preemptions: u32,
    /// Seconds of the GPU's steps that were its share (`RequestEnd::gpu_s`).
    pub gpu_s: f64,
    /// Seconds of host CPU its grammar's token masks took (`RequestEnd::mask_s`).
    pub mask_s: f64,
}
