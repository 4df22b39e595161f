//! The cuBLAS handle the decode steps' matmuls run through, and its workspace.
//!
//! By default the model shares candle's handle (cuBLAS's own workspace). With
//! `SUPERINFER_CUBLAS_WORKSPACE_MB=N` it gets a handle of its own on the compute stream with an
//! N MiB workspace that the model owns (NVIDIA recommends 32 MiB on Hopper; PyTorch sets that):
//! split-K and stream-K algorithms need room for partial sums, and a workspace set by the
//! caller is the one cuBLAS uses inside a CUDA graph capture. `N = 0` gives the own handle
//! without a workspace (cuBLAS's default), to separate the two in a measurement.

use std::sync::Arc;

use super::super::cudarc::cublas::{sys as blas_sys, CudaBlas};
use super::super::cudarc::driver::{CudaSlice, DevicePtr};
use super::super::Gpu;
use crate::error::{Error, Result};

/// Largest workspace `SUPERINFER_CUBLAS_WORKSPACE_MB` may ask for (MiB).
const MAX_WORKSPACE_MB: usize = 1024;

/// A cuBLAS handle bound to the compute stream, with the workspace it was given (kept alive
/// for as long as the handle: fields drop in order, the handle first).
pub(super) struct Blas {
    handle: Arc<CudaBlas>,
    _workspace: Option<CudaSlice<u8>>,
}

impl Blas {
    /// candle's handle, or one of the model's own as `SUPERINFER_CUBLAS_WORKSPACE_MB` says.
    pub(super) fn new(gpu: &Gpu) -> Result<Self> {
        let Some(mb) = workspace_mb_from_env()? else {
            return Ok(Self {
                handle: gpu.candle().cublas_handle(),
                _workspace: None,
            });
        };
        let stream = gpu.compute_stream().clone();
        let handle = CudaBlas::new(stream.clone()).map_err(|e| Error::Cuda {
            op: "cublasCreate",
            detail: e.to_string(),
        })?;
        let workspace = if mb == 0 {
            None
        } else {
            let bytes = mb << 20;
            let ws = stream.alloc_zeros::<u8>(bytes).map_err(|e| Error::Cuda {
                op: "cuBLAS workspace",
                detail: e.to_string(),
            })?;
            let (ptr, guard) = ws.device_ptr(&stream);
            // SAFETY: `ws` holds `bytes` bytes on the handle's device and lives as long as
            // the handle (both in `Self`, the handle dropped first).
            let status =
                unsafe { blas_sys::cublasSetWorkspace_v2(*handle.handle(), ptr as _, bytes) };
            if status != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(Error::Cuda {
                    op: "cublasSetWorkspace",
                    detail: format!("{status:?}"),
                });
            }
            drop(guard);
            Some(ws)
        };
        Ok(Self {
            handle: Arc::new(handle),
            _workspace: workspace,
        })
    }

    pub(super) fn handle(&self) -> &CudaBlas {
        &self.handle
    }
}

/// `SUPERINFER_CUBLAS_WORKSPACE_MB`: unset → `None` (candle's handle), else its MiB.
fn workspace_mb_from_env() -> Result<Option<usize>> {
    match std::env::var("SUPERINFER_CUBLAS_WORKSPACE_MB") {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(mb) if mb <= MAX_WORKSPACE_MB => Ok(Some(mb)),
            _ => Err(Error::Invalid(format!(
                "SUPERINFER_CUBLAS_WORKSPACE_MB={v:?}: expected MiB from 0 to {MAX_WORKSPACE_MB}"
            ))),
        },
        Err(e) => Err(Error::Invalid(format!(
            "SUPERINFER_CUBLAS_WORKSPACE_MB: {e}"
        ))),
    }
}
