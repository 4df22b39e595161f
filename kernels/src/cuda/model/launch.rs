//! Kernel launches through `cuLaunchKernelEx`, so that a launch can carry programmatic
//! dependent launch (PDL, Hopper and later): the kernel may start placing its CTAs while the
//! kernel before it in the stream still runs; each kernel's `pdl_enter` (`cu/common.cuh`)
//! waits for its predecessor's writes before touching activations, and the GEMV asks L2 for
//! its first weight rows before that wait. Inside a stream capture the driver records the
//! dependency as a programmatic graph edge, so replayed decode graphs overlap the same way.

use std::ffi::c_void;
use std::marker::PhantomData;

use super::super::cudarc::driver::{sys, CudaFunction, DeviceRepr, LaunchConfig};
use super::super::driver;
use super::overlap::Overlap;
use super::state::ModelKernels;
use crate::error::Result;

/// Kernel arguments by address, each borrowed until the launch.
#[derive(Default)]
pub(super) struct Args<'a> {
    ptrs: Vec<*mut c_void>,
    _borrows: PhantomData<&'a ()>,
}

impl<'a> Args<'a> {
    pub(super) fn arg<T: DeviceRepr>(&mut self, v: &'a T) -> &mut Self {
        self.ptrs.push(v as *const T as *mut c_void);
        self
    }
}

/// Restores the overlap a [`ModelKernels`] had when dropped.
pub struct OverlapGuard<'k> {
    kernels: &'k ModelKernels,
    before: Overlap,
}

impl Drop for OverlapGuard<'_> {
    fn drop(&mut self) {
        self.kernels.overlap.set(self.before);
    }
}

impl ModelKernels {
    /// Launches made until the guard drops overlap as `o` says (the decode graphs set their
    /// choice around a step's launches; every other launch keeps the default: none).
    pub fn overlap_scope(&self, o: Overlap) -> OverlapGuard<'_> {
        let before = self.overlap.get();
        self.overlap.set(o);
        OverlapGuard {
            kernels: self,
            before,
        }
    }

    /// The overlap launches take now: the scope's, or none on a GPU without PDL.
    pub(super) fn overlap_now(&self) -> Overlap {
        if self.pdl_capable {
            self.overlap.get()
        } else {
            Overlap::default()
        }
    }

    /// The GEMV prefetch to pass now (0 without PDL: nothing would overlap it).
    pub(super) fn gemv_prefetch(&self) -> u32 {
        let o = self.overlap_now();
        if o.pdl {
            o.prefetch
        } else {
            0
        }
    }

    /// Launches `f` on the compute stream with `args`, with the PDL attribute when the
    /// current overlap says so.
    ///
    /// # Safety
    /// `args` are the kernel's parameters, in order and of its types, and every address in
    /// them holds what the kernel reads and writes for `cfg`.
    pub(super) unsafe fn launch(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &mut Args<'_>,
        what: &'static str,
    ) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: an all-zero launch attribute is a valid value (id 0 is "ignore").
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let conf = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.overlap_now().pdl),
        };
        // SAFETY: `conf` and `attr` outlive the call; the parameters as the contract says.
        unsafe {
            sys::cuLaunchKernelEx(
                &conf,
                f.cu_function(),
                args.ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(driver(what))
    }
}
