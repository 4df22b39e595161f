//! The CUDA side of the crate (feature `cuda`): device, memory tiers, copies, the duplex copy
//! engine and run-time compiled kernels. cudarc is used only through candle's re-export, so
//! the model (candle) and the copy engine share one context and one cudarc build.

pub mod copy;
mod decode_graph;
mod device;
mod duplex;
mod kernels;
mod memory;
mod model;
pub mod nvrtc;
mod source;

pub use candle_core::cuda_backend::cudarc;
pub use copy::{Copier, CopyMode};
pub use decode_graph::{DecodeGraphs, DecodeOut, DecodeSeq, LayerWeights, LlamaDims, LlamaWeights};
pub use device::Gpu;
pub use duplex::{Direction, DuplexConfig, DuplexEngine};
pub use kernels::{Blocks, Kernels};
pub use memory::{Arena, DeviceArena, PinnedArena};
pub use model::{
    sample_params, DecodeKernel, DecodeLaunch, GpuSample, ModelKernels, Overlap, OverlapGuard,
    RopeLaunch, StepGraph, StepMeta, GEMV_MAX_ROWS,
};

use crate::error::Error;
use cudarc::driver::DriverError;

/// Wraps a driver error with the operation that failed.
pub(crate) fn driver(op: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        detail: format!("{e:?}"),
    }
}
