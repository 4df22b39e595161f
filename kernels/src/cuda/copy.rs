//! One direction's copies on one stream: per segment (`cuMemcpyAsync`, one call each) or as
//! one batched call (`cuMemcpyBatchAsync`, CUDA 12.8+; in CUDA 13 the name binds to `_v2`).

use super::cudarc::driver::{sys, CudaStream};
use super::driver;
use super::memory::{Arena, Location};
use crate::error::Result;
use crate::plan::Segment;

/// How a list of segments is issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMode {
    /// One `cuMemcpyAsync` per segment.
    PerSegment,
    /// One `cuMemcpyAsync` per segment, each waited for before the next is issued (the
    /// synchronous swap loop of some engines; a baseline, never used by DuplexKV).
    Synchronous,
    /// One `cuMemcpyBatchAsync` per list (split only past `max_batch` operations).
    Batched,
}

/// Reusable scratch for issuing copies (the batched call takes three parallel arrays).
#[derive(Debug)]
pub struct Copier {
    dsts: Vec<sys::CUdeviceptr>,
    srcs: Vec<sys::CUdeviceptr>,
    sizes: Vec<usize>,
    /// Most operations in one batched call.
    pub max_batch: usize,
}

impl Default for Copier {
    fn default() -> Self {
        Self {
            dsts: Vec::new(),
            srcs: Vec::new(),
            sizes: Vec::new(),
            max_batch: 1 << 16,
        }
    }
}

fn mem_location(loc: Location) -> sys::CUmemLocation {
    match loc {
        Location::Device(id) => sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id,
        },
        Location::Host => sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
    }
}

impl Copier {
    /// Resolves and bounds-checks every segment (so a bad plan fails before anything is issued).
    fn resolve(&mut self, src: &dyn Arena, dst: &dyn Arena, segments: &[Segment]) -> Result<()> {
        self.dsts.clear();
        self.srcs.clear();
        self.sizes.clear();
        for s in segments {
            self.srcs.push(src.addr(s.src_offset, s.bytes)?);
            self.dsts.push(dst.addr(s.dst_offset, s.bytes)?);
            self.sizes.push(s.bytes as usize);
        }
        Ok(())
    }

    /// Issues `segments` from `src` to `dst` on `stream`, in stream order. Returns the number
    /// of driver calls made.
    ///
    /// # Safety
    /// Until `stream` has passed this point: both arenas stay alive, nothing (host code, other
    /// streams, kernels) writes the source ranges or touches the destination ranges, and the
    /// destination ranges do not overlap each other. The source is read in stream order, so
    /// work issued earlier on `stream` (or waited on by it) that writes the source is safe.
    pub unsafe fn issue(
        &mut self,
        stream: &CudaStream,
        src: &dyn Arena,
        dst: &dyn Arena,
        segments: &[Segment],
        mode: CopyMode,
    ) -> Result<u64> {
        self.resolve(src, dst, segments)?;
        if segments.is_empty() {
            return Ok(0);
        }
        stream
            .context()
            .bind_to_thread()
            .map_err(driver("cuCtxSetCurrent"))?;
        let cu_stream = stream.cu_stream();
        match mode {
            CopyMode::PerSegment | CopyMode::Synchronous => {
                for i in 0..self.sizes.len() {
                    // SAFETY: addresses were bounds-checked against live arenas; the caller
                    // guarantees they stay valid and unaliased until the stream passes.
                    unsafe {
                        sys::cuMemcpyAsync(self.dsts[i], self.srcs[i], self.sizes[i], cu_stream)
                    }
                    .result()
                    .map_err(driver("cuMemcpyAsync"))?;
                    if mode == CopyMode::Synchronous {
                        stream
                            .synchronize()
                            .map_err(driver("cuStreamSynchronize"))?;
                    }
                }
                Ok(self.sizes.len() as u64)
            }
            CopyMode::Batched => {
                let mut attr = sys::CUmemcpyAttributes {
                    srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
                    srcLocHint: mem_location(src.location()),
                    dstLocHint: mem_location(dst.location()),
                    flags: 0,
                };
                let mut calls = 0;
                let n = self.sizes.len();
                let step = self.max_batch.max(1);
                let mut start = 0;
                while start < n {
                    let count = step.min(n - start);
                    let mut attr_idx: usize = 0;
                    // SAFETY: the three arrays hold `count` valid entries from `start` (the
                    // driver reads them during the call only); one attribute applies to all
                    // (index 0). Addresses as for PerSegment.
                    unsafe {
                        sys::cuMemcpyBatchAsync_v2(
                            self.dsts[start..].as_mut_ptr(),
                            self.srcs[start..].as_mut_ptr(),
                            self.sizes[start..].as_mut_ptr(),
                            count,
                            &mut attr,
                            &mut attr_idx,
                            1,
                            cu_stream,
                        )
                    }
                    .result()
                    .map_err(driver("cuMemcpyBatchAsync"))?;
                    calls += 1;
                    start += count;
                }
                Ok(calls)
            }
        }
    }
}
