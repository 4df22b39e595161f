//! The device: candle's CUDA device, whose context and stream the model uses for compute, plus
//! the streams and events that the copy engine adds to the same context.

use std::sync::Arc;

use candle_core::cuda_backend::CudaDevice;

use super::cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use super::driver;
use crate::error::{Error, Result};

/// One GPU: its context and compute stream (candle's), shared by everything on it.
#[derive(Clone)]
pub struct Gpu {
    device: CudaDevice,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({})", self.ctx.ordinal())
    }
}

impl Gpu {
    /// Opens GPU `ordinal` with a fresh candle device and its own compute stream.
    pub fn new(ordinal: usize) -> Result<Self> {
        let device = CudaDevice::new_with_stream(ordinal).map_err(|e| Error::Cuda {
            op: "open device",
            detail: e.to_string(),
        })?;
        Ok(Self::from_candle(&device))
    }

    /// Shares the device (context and compute stream) of an existing candle model.
    pub fn from_candle(device: &CudaDevice) -> Self {
        let compute = device.cuda_stream();
        let ctx = compute.context().clone();
        Self {
            device: device.clone(),
            ctx,
            compute,
        }
    }

    pub fn candle(&self) -> &CudaDevice {
        &self.device
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream that model kernels run on.
    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// Makes the context current on the calling thread (the engine runs on its own thread).
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
    }

    /// A new non-blocking stream in this context.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().map_err(driver("cuStreamCreate"))
    }

    /// A new event; `timing` events can be passed to `elapsed_ms`, others are cheaper.
    pub fn new_event(&self, timing: bool) -> Result<CudaEvent> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.ctx
            .new_event(Some(flags))
            .map_err(driver("cuEventCreate"))
    }

    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    pub fn name(&self) -> Result<String> {
        self.ctx.name().map_err(driver("cuDeviceGetName"))
    }

    /// NVRTC's name of this GPU's architecture, e.g. `sm_90`.
    pub fn arch(&self) -> Result<String> {
        let (major, minor) = self.compute_capability()?;
        Ok(format!("sm_{major}{minor}"))
    }

    /// The compute capability, (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))
    }

    /// Number of multiprocessors (to size persistent grids).
    pub fn multiprocessors(&self) -> Result<u32> {
        let n = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("cuDeviceGetAttribute"))?;
        Ok(n.max(1) as u32)
    }

    /// The driver's CUDA version, e.g. (13, 0).
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer and has no other
        // preconditions.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(driver("cuDriverGetVersion"))?;
        Ok((v / 1000, (v % 1000) / 10))
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(driver("cuMemGetInfo"))
    }
}
