//! Kernel launches through `cuLaunchKernelEx`, so that a launch can carry programmatic
//! dependent launch (PDL, Hopper and later): the kernel may start placing its CTAs while the
//! kernel before it in the stream still runs; each kernel's `pdl_enter` (`cu/common.cuh`)
//! waits for its predecessor's writes before touching activations, and the GEMV asks L2 for
//! its first weight rows before that wait. Inside a stream capture the driver records the
//! dependency as a programmatic graph edge, so replayed decode graphs overlap the same way.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::super::cudarc::driver::{sys, CudaFunction, DeviceRepr, LaunchConfig};
use super::super::driver;
use super::ModelKernels;
use crate::error::Result;

/// How the launches of [`ModelKernels`] overlap their predecessors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overlap {
    /// Launch with the programmatic-stream-serialization attribute.
    pub pdl: bool,
    /// With `pdl`: bytes of each warp's first weight rows a GEMV asks into L2 before it waits
    /// for the previous kernel (0: none).
    pub prefetch: u32,
}

impl Overlap {
    /// PDL without the GEMV prefetch: the decode buckets' default where every matmul is a
    /// GEMV (on the H200, batch 1: 5.04 ms against 5.11 without PDL and 5.14 with the
    /// prefetch; docs/BENCHMARKS.md "Programmatic dependent launch").
    pub const PDL: Overlap = Overlap {
        pdl: true,
        prefetch: 0,
    };

    /// PDL with each GEMV warp asking L2 for the first 2 KB of its first row before it waits
    /// (about 16 MB over the resident warps, what the HBM delivers in the ~4 µs of a small
    /// kernel before it): measured slower than [`Overlap::PDL`], kept to compare.
    pub const PDL_PREFETCH: Overlap = Overlap {
        pdl: true,
        prefetch: 2048,
    };
}

/// The current [`Overlap`] of a [`ModelKernels`] (read at every launch).
#[derive(Debug, Default)]
pub(super) struct OverlapCell {
    pdl: AtomicBool,
    prefetch: AtomicU32,
}

impl OverlapCell {
    pub(super) fn get(&self) -> Overlap {
        Overlap {
            pdl: self.pdl.load(Ordering::Relaxed),
            prefetch: self.prefetch.load(Ordering::Relaxed),
        }
    }

    fn set(&self, o: Overlap) {
        self.pdl.store(o.pdl, Ordering::Relaxed);
        self.prefetch.store(o.prefetch, Ordering::Relaxed);
    }
}

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
    fn overlap_now(&self) -> Overlap {
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
