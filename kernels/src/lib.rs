//! SuperInfer kernels: everything of the project that touches the GPU directly, and the only
//! crate with `unsafe` (each block says why it is sound in a `// SAFETY:` note).
//!
//! Without features this crate is plain Rust and builds anywhere: the copy planner (merging
//! adjacent blocks, block-first and layer-first layouts), the in-flight hazard tracker, the
//! test-data patterns, the kernel-cache keys and the benchmark tables. With feature `cuda` it
//! adds, through candle's CUDA backend and its re-export of cudarc (so the model and the copy
//! engine share one context and one cudarc build):
//! - [`cuda::Gpu`]: the device context, its compute stream, copy streams and events;
//! - [`cuda::DeviceArena`] (the HBM tier) and [`cuda::PinnedArena`] (the DRAM tier, pinned
//!   host memory allocated in large chunks);
//! - [`cuda::copy`]: one direction's copies issued per segment or as one batched call
//!   (`cuMemcpyBatchAsync`);
//! - [`cuda::DuplexEngine`]: H2D and D2H on two dedicated streams, writeback gated on the step
//!   that produced the blocks, completion by events, never a device synchronize;
//! - [`cuda::Kernels`]: CUDA C compiled at run time by NVRTC, cached on disk by source hash and
//!   architecture (block fill/verify, gather/scatter copy, a memory-bound load kernel).
//!
//! It does not decide what to copy (the engine's KV pool does) nor run models.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod attention_plan;
pub mod compile_cache;
pub mod error;
pub mod inflight;
pub mod pattern;
pub mod plan;
pub mod report;

#[cfg(feature = "cuda")]
pub mod cuda;

pub use error::{Error, Result};
pub use inflight::{Conflict, InFlight, Tier};
pub use plan::{BlockCopy, BlockShape, Layout, MergeLimits, Segment};
