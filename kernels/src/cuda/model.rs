//! The model kernels (`cu/*.cu`, CUDA C compiled at run time by NVRTC and cached) launched on
//! candle tensors: the engine's CUDA model keeps its weights and activations as candle tensors
//! (cuBLAS matmuls through candle) and calls these for what candle lacks: paged attention over
//! the block-first arena (prefill on tensor cores, split-context decode), the fused
//! bias/rotary/KV-slot write, the fused residual add + RMSNorm, SiLU·up, and sampling.
//!
//! Every kernel runs on the tensors' device stream (the model's compute stream). Outputs are
//! fresh tensors; the arena and the residual stream are written in place through their device
//! pointers, which is sound because the engine owns both and never reads them concurrently
//! (the KV pool never hands a block with a copy in flight to a step).
//!
//! `state.rs`: [`ModelKernels`] (compiled modules, stream, cuBLAS) and its tensor-level
//! launches; `raw.rs`: the pointer-level launches a CUDA graph captures, described by
//! `spec.rs`; `launch.rs`: the launch path (`cuLaunchKernelEx`) with the overlap of
//! `overlap.rs`; `decode_kernel.rs`: which decode attention kernel runs. Only this root
//! re-exports; the files use each other, never the root, so their imports form no cycle.

mod decode_kernel;
mod launch;
mod overlap;
mod raw;
mod spec;
mod state;

pub use decode_kernel::DecodeKernel;
pub use launch::OverlapGuard;
pub use overlap::Overlap;
pub use spec::{DecodeLaunch, GemvOut, RopeLaunch, StepGraph, GEMV_NORM_MAX_K};
pub use state::{sample_params, GpuSample, ModelKernels, StepMeta, GEMV_MAX_ROWS};
