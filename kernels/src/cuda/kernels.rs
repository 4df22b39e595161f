//! Typed launches of the crate's kernels (`source`): fill and verify blocks with their test
//! pattern, gather/scatter block copies on the SMs, and a memory-bound load.

use std::sync::Arc;

use super::cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use super::memory::Arena;
use super::nvrtc::{load_module, Origin};
use super::{driver, source, Gpu};
use crate::compile_cache::CompileCache;
use crate::error::{Error, Result};
use crate::plan::{BlockShape, Layout, Segment};

/// The compiled kernels of one GPU.
pub struct Kernels {
    fill: CudaFunction,
    verify: CudaFunction,
    copy_segments: CudaFunction,
    stream_copy: CudaFunction,
    multiprocessors: u32,
    /// Whether the module came from the cache or was compiled now.
    pub origin: Origin,
}

/// Blocks of one arena to fill or verify, each with the tag of its expected content.
pub struct Blocks<'a> {
    pub arena: &'a dyn Arena,
    pub layout: Layout,
    pub shape: BlockShape,
    pub ids: &'a [u32],
    pub tags: &'a [u64],
}

impl Blocks<'_> {
    /// Checks ids, tags and the arena's extent; returns (base address, block stride, piece stride).
    fn resolve(&self) -> Result<(u64, u64, u64)> {
        if self.ids.len() != self.tags.len() || self.ids.len() > 65_535 {
            return Err(Error::Invalid(format!(
                "{} blocks with {} tags (at most 65535)",
                self.ids.len(),
                self.tags.len()
            )));
        }
        if !self.shape.piece_bytes.is_multiple_of(8) {
            return Err(Error::Invalid("pieces must be whole 8-byte words".into()));
        }
        let (bs, ps) = self.layout.strides(self.shape);
        let max_block = self.ids.iter().copied().max().unwrap_or(0);
        let end = self
            .layout
            .offset(self.shape, max_block, self.shape.pieces - 1)
            + self.shape.piece_bytes;
        let end = end.max(self.layout.offset(self.shape, max_block, 0) + self.shape.piece_bytes);
        // The kernels address the arena linearly: it must be one chunk up to `end`.
        if end > self.arena.chunk_bytes() {
            return Err(Error::Invalid(format!(
                "blocks up to byte {end} leave the arena's first chunk"
            )));
        }
        Ok((self.arena.device_addr(0, end)?, bs, ps))
    }

    fn grid(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.shape.pieces, self.ids.len() as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

impl Kernels {
    /// Loads (compiling on a cache miss) the kernels for `gpu`.
    pub fn load(gpu: &Gpu, cache: &CompileCache) -> Result<Self> {
        let (module, origin) = load_module(gpu, cache, source::NAME, source::SOURCE, &[])?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(driver("cuModuleGetFunction"))
        };
        Ok(Self {
            fill: f(source::FILL)?,
            verify: f(source::VERIFY)?,
            copy_segments: f(source::COPY_SEGMENTS)?,
            stream_copy: f(source::STREAM_COPY)?,
            multiprocessors: gpu.multiprocessors()?,
            origin,
        })
    }

    /// Writes each block's pattern, after `spin_cycles` SM cycles (0: at once).
    pub fn fill(
        &self,
        stream: &Arc<CudaStream>,
        blocks: &Blocks<'_>,
        spin_cycles: u64,
    ) -> Result<()> {
        if blocks.ids.is_empty() {
            return Ok(());
        }
        let (base, bs, ps) = blocks.resolve()?;
        let ids = stream
            .clone_htod(blocks.ids)
            .map_err(driver("upload block ids"))?;
        let tags = stream
            .clone_htod(blocks.tags)
            .map_err(driver("upload tags"))?;
        let words = (blocks.shape.piece_bytes / 8) as u32;
        let mut b = stream.launch_builder(&self.fill);
        b.arg(&base)
            .arg(&ids)
            .arg(&tags)
            .arg(&bs)
            .arg(&ps)
            .arg(&words)
            .arg(&spin_cycles);
        // SAFETY: every address the kernel writes, base + id * bs + p * ps + [0, piece), lies
        // inside the arena (checked by `resolve`); the caller owns those blocks on this stream.
        unsafe { b.launch(blocks.grid()) }.map_err(driver("launch fill_pieces"))?;
        Ok(())
    }

    /// Words of the blocks that differ from their pattern. Waits for `stream`.
    pub fn verify(&self, stream: &Arc<CudaStream>, blocks: &Blocks<'_>) -> Result<u64> {
        if blocks.ids.is_empty() {
            return Ok(0);
        }
        let (base, bs, ps) = blocks.resolve()?;
        let ids = stream
            .clone_htod(blocks.ids)
            .map_err(driver("upload block ids"))?;
        let tags = stream
            .clone_htod(blocks.tags)
            .map_err(driver("upload tags"))?;
        let mut bad = stream
            .alloc_zeros::<u64>(1)
            .map_err(driver("alloc counter"))?;
        let words = (blocks.shape.piece_bytes / 8) as u32;
        let mut b = stream.launch_builder(&self.verify);
        b.arg(&base)
            .arg(&ids)
            .arg(&tags)
            .arg(&bs)
            .arg(&ps)
            .arg(&words)
            .arg(&mut bad);
        // SAFETY: the kernel only reads inside the arena (checked by `resolve`) and writes the
        // counter it owns.
        unsafe { b.launch(blocks.grid()) }.map_err(driver("launch verify_pieces"))?;
        let host = stream.clone_dtoh(&bad).map_err(driver("read counter"))?;
        Ok(host[0])
    }

    /// Copies equal-size segments with the SMs (a gather/scatter kernel instead of the copy
    /// engines): `src` and `dst` may each be device or device-mapped pinned memory.
    ///
    /// # Safety
    /// As for [`super::Copier::issue`]: until `stream` passes this point the arenas live, no
    /// one else writes the sources or touches the destinations, destinations do not overlap.
    pub unsafe fn copy_segments(
        &self,
        stream: &Arc<CudaStream>,
        src: &dyn Arena,
        dst: &dyn Arena,
        segments: &[Segment],
    ) -> Result<()> {
        let Some(first) = segments.first() else {
            return Ok(());
        };
        let seg_bytes = first.bytes;
        if seg_bytes == 0
            || !seg_bytes.is_multiple_of(source::COPY_TILE_BYTES)
            || segments.iter().any(|s| s.bytes != seg_bytes)
        {
            return Err(Error::Invalid(
                "copy_segments needs equal segments, multiples of 64 KiB".into(),
            ));
        }
        let mut srcs = Vec::with_capacity(segments.len());
        let mut dsts = Vec::with_capacity(segments.len());
        for s in segments {
            srcs.push(src.device_addr(s.src_offset, s.bytes)?);
            dsts.push(dst.device_addr(s.dst_offset, s.bytes)?);
        }
        let d_srcs = stream.clone_htod(&srcs).map_err(driver("upload sources"))?;
        let d_dsts = stream
            .clone_htod(&dsts)
            .map_err(driver("upload destinations"))?;
        let n = segments.len() as u32;
        let cfg = LaunchConfig {
            grid_dim: (self.multiprocessors * 8, 1, 1),
            block_dim: (source::COPY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&self.copy_segments);
        b.arg(&d_srcs).arg(&d_dsts).arg(&n).arg(&seg_bytes);
        // SAFETY: every address was bounds-checked against its arena; the caller guarantees
        // the ranges stay valid and unaliased until the stream passes.
        unsafe { b.launch(cfg) }.map_err(driver("launch copy_segments"))?;
        Ok(())
    }

    /// One pass of a memory-bound copy of `bytes` (a multiple of 16) from `src` to `dst`,
    /// both device arenas.
    pub fn stream_copy(
        &self,
        stream: &Arc<CudaStream>,
        src: &dyn Arena,
        dst: &dyn Arena,
        bytes: u64,
    ) -> Result<()> {
        if !bytes.is_multiple_of(16) {
            return Err(Error::Invalid(
                "stream_copy moves whole 16-byte words".into(),
            ));
        }
        let s = src.device_addr(0, bytes)?;
        let d = dst.device_addr(0, bytes)?;
        let n16 = bytes / 16;
        let cfg = LaunchConfig {
            grid_dim: (self.multiprocessors * 8, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&self.stream_copy);
        b.arg(&s).arg(&d).arg(&n16);
        // SAFETY: both ranges are inside their arenas (checked); the caller dedicates these
        // scratch arenas to the load kernel.
        unsafe { b.launch(cfg) }.map_err(driver("launch stream_copy"))?;
        Ok(())
    }
}
