//! What the pointer-level launches of the model kernels take (`raw.rs`): the launch
//! descriptions, the GEMV's output forms, a launch grid, and a captured step graph.

use super::super::cudarc::driver::{CudaGraph, LaunchConfig};
use super::super::driver;
use crate::error::Result;

/// The decode attention of one layer over a plan's decode sequences.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLaunch {
    pub q: u64,
    pub kv: u64,
    pub out: u64,
    /// Split workspace (accumulators, then max/sum pairs); 0 when `splits` is 1.
    pub ws_acc: u64,
    pub ws_ml: u64,
    /// `[q_row, context_len, table_start, part]` per sequence (`part` read only when the
    /// launch's `part` is 0).
    pub seqs: u64,
    pub tables: u64,
    pub decodes: u32,
    pub splits: u32,
    /// Keys per split; 0: each sequence's entry says (at least its keys over `splits`; an
    /// entry of 0: its keys in `splits` equal parts).
    pub part: u32,
}

/// Bias, rotary and the K/V write of one layer (see `cu/rope_kv.cu`).
#[derive(Clone, Copy, Debug)]
pub struct RopeLaunch {
    pub qkv: u64,
    /// 0: no bias.
    pub bias: u64,
    pub q: u64,
    pub kv: u64,
    pub cos: u64,
    pub sin: u64,
    pub positions: u64,
    pub slots: u64,
    pub tokens: u32,
}

/// The widest row `launch_gemv_norm` takes (its floats in 48 KB of shared memory, less the
/// reduction's scratch).
pub const GEMV_NORM_MAX_K: u32 = 12_256;

/// What a GEMV writes for output column `c` of `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvOut {
    /// `x · w[c]`: `w` is `(n, k)`.
    Plain,
    /// `silu(x · w[c]) * (x · w[n + c])`: `w` is the fused gate/up projection `(2n, k)`, and
    /// the result is bitwise `silu_mul` over the plain GEMV's `2n` columns.
    SiluMul,
}

impl GemvOut {
    /// The kernel name's infix.
    pub(super) fn infix(self) -> &'static str {
        match self {
            GemvOut::Plain => "",
            GemvOut::SiluMul => "_silu",
        }
    }
}

/// A launch of `dims` CTAs of `threads` threads, no dynamic shared memory.
pub(super) fn grid(dims: (u32, u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: dims,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches captured once and replayed on the compute stream with one call.
pub struct StepGraph(pub(super) CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as no two threads use one at
// the same time. A StepGraph is only launched through `&self` by its owner, `DecodeGraphs`,
// whose every use takes `&mut self` (the model keeps it behind a mutex): uses are serialized.
// It is not Sync, so no two threads can hold `&StepGraph` at once.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Replays the captured launches (they read and write the addresses they captured).
    pub fn launch(&self) -> Result<()> {
        self.0.launch().map_err(driver("cuGraphLaunch"))
    }
}
