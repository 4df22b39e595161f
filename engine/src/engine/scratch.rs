//! What a step plans into and keeps between steps: the planned spans and the reusable
//! buffers of the batch.

use super::step_budget::Candidate;
use crate::runner::BatchEntry;
use superinfer_policies::{RequestId, Service, TenantId};

/// One planned entry: request, span to run, whether it samples.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) id: RequestId,
    pub(super) pos: u32,
    pub(super) end: u32,
    pub(super) sample: bool,
}

/// Buffers a step fills and empties, kept from step to step: a batch of 2,000 decodes is
/// ~200 KB of entries and spans, and allocating them afresh each step cost a tenth of its
/// host time (docs/BENCHMARKS.md, "Per-step cost").
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) spans: Vec<Span>,
    /// Always empty between steps: only its allocation is kept (see [`recycle`]).
    pub(super) entries: Vec<BatchEntry<'static>>,
    /// Batch indices of the prefill chunks, in request order.
    pub(super) prefills: Vec<usize>,
    /// Per tenant: the weight and the service of the step.
    pub(super) service: Vec<(TenantId, f64, Service)>,
    /// The step's sampled tokens, in request order, appended in a pass of their own.
    pub(super) appends: Vec<(RequestId, u32)>,
    /// The time budget's decode candidates, their choice and its sort order
    /// (`step_budget.rs`).
    pub(super) candidates: Vec<Candidate>,
    pub(super) run: Vec<bool>,
    pub(super) order: Vec<usize>,
    /// Decoding requests the time budget left out of this step.
    pub(super) skipped: Vec<RequestId>,
    /// Each span's share of the step's time, by batch index (`gpu_time.rs`).
    pub(super) shares: Vec<f64>,
}

/// An emptied vector's allocation for entries that borrow for another lifetime: collecting
/// in place (same layout) reuses it, and no element is ever mapped.
pub(super) fn recycle<'b>(mut v: Vec<BatchEntry<'_>>) -> Vec<BatchEntry<'b>> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied")).collect()
}
