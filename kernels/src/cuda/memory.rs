//! The two tiers' memory: a device arena (HBM) and a pinned host arena (DRAM), each an array
//! of equal slots addressed by byte offset. Pinned memory is allocated in large chunks (one
//! if the driver allows it), each a whole number of blocks, so no block or copy straddles two.

use std::ffi::c_void;
use std::sync::Arc;

use super::cudarc::driver::{result, sys, CudaContext};
use super::{driver, Gpu};
use crate::error::{Error, Result};

/// Which side of the link an arena is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    Device(i32),
    Host,
}

/// Memory that copies and kernels address by (offset, length).
pub trait Arena {
    /// Bytes in the arena.
    fn len(&self) -> u64;
    /// Bytes of each contiguous chunk (the last may be shorter).
    fn chunk_bytes(&self) -> u64;
    /// The unified (UVA) address of `bytes` bytes at `offset`, usable by copy calls; fails if
    /// the range leaves the arena or crosses a chunk.
    fn addr(&self, offset: u64, bytes: u64) -> Result<u64>;
    /// The address of the same range for a kernel running on the device.
    fn device_addr(&self, offset: u64, bytes: u64) -> Result<u64>;
    fn location(&self) -> Location;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn out_of_range(what: &str, offset: u64, bytes: u64, len: u64) -> Error {
    Error::Invalid(format!(
        "{what}: range {offset}+{bytes} outside or across chunks of {len} bytes"
    ))
}

/// Device memory for the HBM tier: one allocation, its own or a candle tensor's.
pub struct DeviceArena {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    bytes: u64,
    /// Set when the memory is a candle tensor's (the model's KV arena): kept alive here, freed
    /// by candle, never by this arena.
    tensor: Option<candle_core::Tensor>,
}

impl DeviceArena {
    pub fn new(gpu: &Gpu, bytes: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(Error::Invalid("empty device arena".into()));
        }
        gpu.bind()?;
        // SAFETY: a plain allocation of `bytes` bytes in the bound context; the pointer is
        // owned by this arena and freed exactly once, in Drop.
        let ptr = unsafe { result::malloc_sync(bytes as usize) }.map_err(driver("cuMemAlloc"))?;
        Ok(Self {
            ctx: gpu.context().clone(),
            ptr,
            bytes,
            tensor: None,
        })
    }

    /// The memory of a contiguous candle tensor on `gpu` (the model runner's KV arena), so
    /// the copy engine and the model share one HBM tier.
    pub fn from_tensor(gpu: &Gpu, tensor: &candle_core::Tensor) -> Result<Self> {
        use super::cudarc::driver::DevicePtr;
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let bytes = (tensor.elem_count() * tensor.dtype().size_in_bytes()) as u64;
        let ptr = {
            let (storage, layout) = tensor.storage_and_layout();
            let candle_core::Storage::Cuda(cs) = &*storage else {
                return Err(Error::Invalid(
                    "the KV arena tensor is not on the GPU".into(),
                ));
            };
            if !layout.is_contiguous() || layout.start_offset() != 0 || bytes == 0 {
                return Err(Error::Invalid(
                    "the KV arena tensor must be whole and contiguous".into(),
                ));
            }
            let stream = gpu.compute_stream();
            match &cs.slice {
                S::BF16(s) => s.device_ptr(stream).0,
                S::F16(s) => s.device_ptr(stream).0,
                S::F32(s) => s.device_ptr(stream).0,
                _ => return Err(Error::Invalid(format!("KV arena of {:?}", tensor.dtype()))),
            }
        };
        Ok(Self {
            ctx: gpu.context().clone(),
            ptr,
            bytes,
            tensor: Some(tensor.clone()),
        })
    }
}

impl Arena for DeviceArena {
    fn len(&self) -> u64 {
        self.bytes
    }
    fn chunk_bytes(&self) -> u64 {
        self.bytes
    }
    fn addr(&self, offset: u64, bytes: u64) -> Result<u64> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.bytes => Ok(self.ptr + offset),
            _ => Err(out_of_range("device arena", offset, bytes, self.bytes)),
        }
    }
    fn device_addr(&self, offset: u64, bytes: u64) -> Result<u64> {
        self.addr(offset, bytes)
    }
    fn location(&self) -> Location {
        Location::Device(self.ctx.ordinal() as i32)
    }
}

impl Drop for DeviceArena {
    fn drop(&mut self) {
        if self.tensor.is_some() {
            return;
        }
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: `ptr` came from cuMemAlloc in this context and is freed only here. Users
        // of the arena wait for their copies before dropping it (the duplex engine does).
        self.ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}

struct Chunk {
    host: *mut u8,
    dev: sys::CUdeviceptr,
    bytes: u64,
}

/// Pinned, device-mapped host memory for the DRAM tier.
pub struct PinnedArena {
    ctx: Arc<CudaContext>,
    chunks: Vec<Chunk>,
    chunk_bytes: u64,
    bytes: u64,
}

// SAFETY: the arena owns its chunks (freed once, in Drop); the raw pointers are never aliased
// by safe code except through `&self`/`&mut self` borrows of the arena, so moving or sharing
// the arena between threads is as safe as for a `Vec<u8>`.
unsafe impl Send for PinnedArena {}
// SAFETY: see Send; `&self` methods only read addresses.
unsafe impl Sync for PinnedArena {}

impl PinnedArena {
    /// Allocates `bytes` of pinned memory in chunks of at most `max_chunk_bytes`, each a
    /// multiple of `unit` (the block size). If the driver refuses a chunk size, it halves it
    /// (still a multiple of `unit`) and starts over.
    pub fn new(gpu: &Gpu, bytes: u64, max_chunk_bytes: u64, unit: u64) -> Result<Self> {
        if bytes == 0 || unit == 0 || !bytes.is_multiple_of(unit) {
            return Err(Error::Invalid(format!(
                "pinned arena of {bytes} bytes in units of {unit}"
            )));
        }
        gpu.bind()?;
        let mut chunk = (max_chunk_bytes.min(bytes) / unit).max(1) * unit;
        loop {
            match Self::allocate(gpu, bytes, chunk) {
                Ok(arena) => return Ok(arena),
                Err(e) if chunk > unit => {
                    eprintln!("pinned chunks of {chunk} bytes refused ({e}); halving");
                    chunk = (chunk / 2 / unit).max(1) * unit;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn allocate(gpu: &Gpu, bytes: u64, chunk_bytes: u64) -> Result<Self> {
        let mut arena = Self {
            ctx: gpu.context().clone(),
            chunks: Vec::new(),
            chunk_bytes,
            bytes,
        };
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk_bytes);
            let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
            // SAFETY: cuMemHostAlloc returns `n` bytes of page-locked memory owned by us
            // (freed in Drop, also when a later chunk fails and `arena` is dropped).
            let host = unsafe { result::malloc_host(n as usize, flags) }
                .map_err(driver("cuMemHostAlloc"))? as *mut u8;
            let mut dev: sys::CUdeviceptr = 0;
            // SAFETY: `host` is a live DEVICEMAP allocation; the call writes one pointer.
            let got =
                unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) };
            arena.chunks.push(Chunk {
                host,
                dev,
                bytes: n,
            });
            got.result().map_err(driver("cuMemHostGetDevicePointer"))?;
            left -= n;
        }
        Ok(arena)
    }

    /// Number of chunks the driver gave.
    pub fn num_chunks(&self) -> usize {
        self.chunks.len()
    }

    fn locate(&self, offset: u64, bytes: u64) -> Result<(&Chunk, u64)> {
        let i = (offset / self.chunk_bytes) as usize;
        let within = offset % self.chunk_bytes;
        match self.chunks.get(i) {
            Some(c) if within.checked_add(bytes).is_some_and(|end| end <= c.bytes) => {
                Ok((c, within))
            }
            _ => Err(out_of_range("pinned arena", offset, bytes, self.bytes)),
        }
    }

    /// The whole arena as host slices of `piece` bytes each, in address order.
    ///
    /// # Safety
    /// No copy or kernel may read or write the arena while the slices live (wait for every
    /// copy that touches it first).
    pub unsafe fn pieces_mut(&mut self, piece: u64) -> Result<Vec<&mut [u8]>> {
        if piece == 0 || !self.chunk_bytes.is_multiple_of(piece) {
            return Err(Error::Invalid(format!(
                "piece of {piece} bytes in chunks of {}",
                self.chunk_bytes
            )));
        }
        let mut out = Vec::with_capacity((self.bytes / piece) as usize);
        for c in &self.chunks {
            // SAFETY: the chunk is a live allocation of `c.bytes` bytes owned by `self` (pinned
            // pages from the OS, so initialized, zeroed until written), borrowed mutably for the
            // slices' lifetime; the caller guarantees no device access meanwhile.
            let all = unsafe { std::slice::from_raw_parts_mut(c.host, c.bytes as usize) };
            out.extend(all.chunks_exact_mut(piece as usize));
        }
        Ok(out)
    }

    /// The whole arena as read-only host slices of `piece` bytes each, in address order.
    ///
    /// # Safety
    /// No copy or kernel may write the arena while the slices live.
    pub unsafe fn pieces(&self, piece: u64) -> Result<Vec<&[u8]>> {
        if piece == 0 || !self.chunk_bytes.is_multiple_of(piece) {
            return Err(Error::Invalid(format!(
                "piece of {piece} bytes in chunks of {}",
                self.chunk_bytes
            )));
        }
        let mut out = Vec::with_capacity((self.bytes / piece) as usize);
        for c in &self.chunks {
            // SAFETY: as in `pieces_mut`, shared instead of exclusive.
            let all = unsafe { std::slice::from_raw_parts(c.host, c.bytes as usize) };
            out.extend(all.chunks_exact(piece as usize));
        }
        Ok(out)
    }
}

impl Arena for PinnedArena {
    fn len(&self) -> u64 {
        self.bytes
    }
    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }
    fn addr(&self, offset: u64, bytes: u64) -> Result<u64> {
        let (c, within) = self.locate(offset, bytes)?;
        Ok(c.host as u64 + within)
    }
    fn device_addr(&self, offset: u64, bytes: u64) -> Result<u64> {
        let (c, within) = self.locate(offset, bytes)?;
        Ok(c.dev + within)
    }
    fn location(&self) -> Location {
        Location::Host
    }
}

impl Drop for PinnedArena {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        for c in self.chunks.drain(..) {
            // SAFETY: each chunk came from cuMemHostAlloc and is freed only here.
            self.ctx
                .record_err(unsafe { result::free_host(c.host as *mut c_void) });
        }
    }
}
