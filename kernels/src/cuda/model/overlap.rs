//! How kernel launches overlap their predecessors (programmatic dependent launch), and the
//! setting a `ModelKernels` reads at every launch.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// How the launches of `ModelKernels` overlap their predecessors.
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
    /// prefetch; docs/BENCHMARKS_GPU.md "Programmatic dependent launch").
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

/// The current [`Overlap`] of a `ModelKernels` (read at every launch).
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

    pub(super) fn set(&self, o: Overlap) {
        self.pdl.store(o.pdl, Ordering::Relaxed);
        self.prefetch.store(o.prefetch, Ordering::Relaxed);
    }
}
