//! DuplexKV's copy engine: restores (H2D) and evictions/writebacks (D2H) of one iteration
//! issued together on two dedicated streams, each direction as one batched call of merged
//! block ranges. D2H is gated on the step that produced the blocks (an event recorded on the
//! compute stream by [`DuplexEngine::step_issued`]); completion is read from events by
//! [`DuplexEngine::poll`], never by synchronizing the device; a batch that would touch a
//! block with a copy in flight is refused ([`crate::inflight`]).

use std::collections::VecDeque;
use std::sync::Arc;

use super::copy::{Copier, CopyMode};
use super::cudarc::driver::{CudaEvent, CudaStream};
use super::memory::{Arena, DeviceArena, PinnedArena};
use super::{driver, Gpu};
use crate::error::{Error, Result};
use crate::inflight::{Conflict, InFlight, Tier};
use crate::plan::{self, BlockCopy, MergeLimits, Segment};

/// Sizes and policy of a duplex engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DuplexConfig {
    /// Bytes of one KV block (block-first: all layers, K and V).
    pub block_bytes: u64,
    /// Slots of the HBM tier (device arena).
    pub hbm_blocks: u32,
    /// Slots of the DRAM tier (pinned arena).
    pub dram_blocks: u32,
    /// Largest pinned allocation to ask for; the arena is split into chunks of this size.
    pub pinned_chunk_bytes: u64,
    pub mode: CopyMode,
    /// Merge runs of blocks consecutive on both sides into one copy.
    pub merge: bool,
}

struct Pending {
    id: u64,
    h2d_done: CudaEvent,
    d2h_done: CudaEvent,
    /// Directions already reported by [`DuplexEngine::poll_directions`]: [h2d, d2h].
    reported: [bool; 2],
}

/// One direction of a batch (for [`DuplexEngine::poll_directions`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    H2d,
    D2h,
}

/// The duplex copy engine between one GPU's HBM tier and its pinned DRAM tier.
pub struct DuplexEngine {
    cfg: DuplexConfig,
    ctx_gpu: Gpu,
    h2d: Arc<CudaStream>,
    d2h: Arc<CudaStream>,
    hbm: DeviceArena,
    dram: PinnedArena,
    step_done: CudaEvent,
    copier_h2d: Copier,
    copier_d2h: Copier,
    inflight: InFlight,
    pending: VecDeque<Pending>,
    spare_events: Vec<CudaEvent>,
    next_id: u64,
    bytes: (u64, u64),
    last_segments: (usize, usize),
}

impl DuplexEngine {
    /// Allocates both tiers and the two copy streams on `gpu`.
    pub fn new(gpu: &Gpu, cfg: DuplexConfig) -> Result<Self> {
        if cfg.block_bytes == 0 || cfg.hbm_blocks == 0 {
            return Err(Error::Invalid(format!("duplex engine of {cfg:?}")));
        }
        let hbm = DeviceArena::new(gpu, cfg.block_bytes * u64::from(cfg.hbm_blocks))?;
        Self::with_hbm(gpu, cfg, hbm)
    }

    /// As [`DuplexEngine::new`] over an existing HBM tier (the model's KV arena, see
    /// [`DeviceArena::from_tensor`]) of at least `hbm_blocks` blocks.
    pub fn with_hbm(gpu: &Gpu, cfg: DuplexConfig, hbm: DeviceArena) -> Result<Self> {
        if cfg.block_bytes == 0 || cfg.hbm_blocks == 0 || cfg.dram_blocks == 0 {
            return Err(Error::Invalid(format!("duplex engine of {cfg:?}")));
        }
        if hbm.len() < cfg.block_bytes * u64::from(cfg.hbm_blocks) {
            return Err(Error::Invalid(format!(
                "an HBM arena of {} bytes cannot hold {} blocks of {} bytes",
                hbm.len(),
                cfg.hbm_blocks,
                cfg.block_bytes
            )));
        }
        let dram = PinnedArena::new(
            gpu,
            cfg.block_bytes * u64::from(cfg.dram_blocks),
            cfg.pinned_chunk_bytes,
            cfg.block_bytes,
        )?;
        Ok(Self {
            cfg,
            ctx_gpu: gpu.clone(),
            h2d: gpu.new_stream()?,
            d2h: gpu.new_stream()?,
            hbm,
            dram,
            step_done: gpu.new_event(false)?,
            copier_h2d: Copier::default(),
            copier_d2h: Copier::default(),
            inflight: InFlight::default(),
            pending: VecDeque::new(),
            spare_events: Vec::new(),
            next_id: 0,
            bytes: (0, 0),
            last_segments: (0, 0),
        })
    }

    pub fn config(&self) -> &DuplexConfig {
        &self.cfg
    }

    /// The model step that may read or write blocks has been issued on the compute stream:
    /// copies submitted from now on, in both directions, start only after it has finished.
    /// Evictions and writebacks must not read a block before the step that fills it is done;
    /// restores must not overwrite a slot the step still reads (an abort or a recompute frees
    /// slots at once, and the engine does not wait for a step that sampled nothing).
    pub fn step_issued(&mut self) -> Result<()> {
        self.step_done
            .record(self.ctx_gpu.compute_stream())
            .map_err(driver("cuEventRecord"))?;
        self.d2h
            .wait(&self.step_done)
            .map_err(driver("cuStreamWaitEvent"))?;
        self.h2d
            .wait(&self.step_done)
            .map_err(driver("cuStreamWaitEvent"))
    }

    /// Whether a batch may be issued now (block ids in range, no race with copies in flight).
    pub fn check(&self, h2d: &[BlockCopy], d2h: &[BlockCopy]) -> Result<()> {
        let (hbm, dram) = (self.cfg.hbm_blocks, self.cfg.dram_blocks);
        let bad = h2d
            .iter()
            .find(|c| c.src >= dram || c.dst >= hbm)
            .or_else(|| d2h.iter().find(|c| c.src >= hbm || c.dst >= dram));
        if let Some(c) = bad {
            return Err(Error::Invalid(format!(
                "block copy {c:?} outside {hbm} HBM / {dram} DRAM blocks"
            )));
        }
        self.inflight.check(h2d, d2h).map_err(Error::from)
    }

    /// Like [`Self::check`] but only the hazard part, for callers that assert it.
    pub fn conflict(&self, h2d: &[BlockCopy], d2h: &[BlockCopy]) -> Option<Conflict> {
        self.inflight.check(h2d, d2h).err()
    }

    fn plan(&self, copies: &[BlockCopy], src_chunk: u64, dst_chunk: u64) -> Vec<Segment> {
        let bb = self.cfg.block_bytes;
        if self.cfg.merge {
            let limits = MergeLimits {
                src_chunk_blocks: (src_chunk / bb).min(u64::from(u32::MAX)) as u32,
                dst_chunk_blocks: (dst_chunk / bb).min(u64::from(u32::MAX)) as u32,
                max_blocks: u32::MAX,
            };
            plan::merged(copies, bb, limits)
        } else {
            plan::per_block(copies, bb)
        }
    }

    fn event(&mut self) -> Result<CudaEvent> {
        match self.spare_events.pop() {
            Some(e) => Ok(e),
            None => self.ctx_gpu.new_event(false),
        }
    }

    /// Issues one iteration's copies, both directions at once, and returns the batch id.
    /// Never waits for the GPU.
    pub fn submit(&mut self, h2d: &[BlockCopy], d2h: &[BlockCopy]) -> Result<u64> {
        self.check(h2d, d2h)?;
        self.ctx_gpu.bind()?;
        let up = self.plan(h2d, self.dram.chunk_bytes(), self.hbm.chunk_bytes());
        let down = self.plan(d2h, self.hbm.chunk_bytes(), self.dram.chunk_bytes());
        let (h2d_done, d2h_done) = (self.event()?, self.event()?);
        // SAFETY: the arenas live as long as `self`, whose Drop waits for every pending batch;
        // the in-flight check above guarantees no other copy of this engine writes these
        // sources or touches these destinations until this batch's events complete, and that
        // destinations are distinct; the KV pool hands blocks with copies in flight to no one.
        unsafe {
            self.copier_h2d
                .issue(&self.h2d, &self.dram, &self.hbm, &up, self.cfg.mode)?;
            self.copier_d2h
                .issue(&self.d2h, &self.hbm, &self.dram, &down, self.cfg.mode)?;
        }
        h2d_done
            .record(&self.h2d)
            .map_err(driver("cuEventRecord"))?;
        d2h_done
            .record(&self.d2h)
            .map_err(driver("cuEventRecord"))?;
        let id = self.next_id;
        self.next_id += 1;
        // Each direction is its own entry in the hazard tracker (2·id for H2D, 2·id + 1 for
        // D2H), so `poll_directions` can release one direction while the other is in flight.
        self.inflight.insert(2 * id, h2d, &[]);
        self.inflight.insert(2 * id + 1, &[], d2h);
        self.pending.push_back(Pending {
            id,
            h2d_done,
            d2h_done,
            reported: [false; 2],
        });
        self.bytes.0 += plan::total_bytes(&up);
        self.bytes.1 += plan::total_bytes(&down);
        self.last_segments = (up.len(), down.len());
        Ok(id)
    }

    /// Batches whose copies have all landed since the last poll, oldest first, each once.
    /// Streams are FIFO, so batches complete in submission order.
    pub fn poll(&mut self) -> Result<Vec<u64>> {
        let mut done = Vec::new();
        while let Some(front) = self.pending.front() {
            let h = front
                .h2d_done
                .try_is_complete()
                .map_err(driver("cuEventQuery"))?;
            let d = h
                && front
                    .d2h_done
                    .try_is_complete()
                    .map_err(driver("cuEventQuery"))?;
            if !d {
                break;
            }
            if let Some(p) = self.pending.pop_front() {
                self.inflight.complete(2 * p.id);
                self.inflight.complete(2 * p.id + 1);
                done.push(p.id);
                self.spare_events.push(p.h2d_done);
                self.spare_events.push(p.d2h_done);
            }
        }
        Ok(done)
    }

    /// Each direction of each batch whose copies have landed since the last call, each once:
    /// a batch's restores are reported as soon as they land, without waiting for its
    /// writebacks (or the other way round). A batch is retired (its blocks released for new
    /// copies) once both directions have landed. Use either this or [`Self::poll`], not both.
    pub fn poll_directions(&mut self) -> Result<Vec<(u64, Direction)>> {
        let mut done = Vec::new();
        for p in self.pending.iter_mut() {
            for (k, dir) in [(0, Direction::H2d), (1, Direction::D2h)] {
                if p.reported[k] {
                    continue;
                }
                let event = if k == 0 { &p.h2d_done } else { &p.d2h_done };
                if event.try_is_complete().map_err(driver("cuEventQuery"))? {
                    p.reported[k] = true;
                    self.inflight.complete(2 * p.id + k as u64);
                    done.push((p.id, dir));
                }
            }
        }
        while self
            .pending
            .front()
            .is_some_and(|p| p.reported == [true; 2])
        {
            if let Some(p) = self.pending.pop_front() {
                self.spare_events.push(p.h2d_done);
                self.spare_events.push(p.d2h_done);
            }
        }
        Ok(done)
    }

    /// Blocks the calling thread until every pending batch has landed (event waits, not a
    /// device synchronize: compute keeps running). For shutdown and tests.
    pub fn wait_all(&mut self) -> Result<Vec<u64>> {
        for p in &self.pending {
            p.h2d_done
                .synchronize()
                .map_err(driver("cuEventSynchronize"))?;
            p.d2h_done
                .synchronize()
                .map_err(driver("cuEventSynchronize"))?;
        }
        self.poll()
    }

    /// Bytes copied so far: (host-to-device, device-to-host).
    pub fn bytes_moved(&self) -> (u64, u64) {
        self.bytes
    }

    /// Copy calls' segments of the last batch: (H2D, D2H).
    pub fn last_segments(&self) -> (usize, usize) {
        self.last_segments
    }

    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Whether a copy in flight touches `block` of `tier`.
    pub fn is_busy(&self, tier: Tier, block: u32) -> bool {
        self.inflight.is_busy(tier, block)
    }

    /// The H2D and D2H streams (for timing around a batch).
    pub fn streams(&self) -> (&Arc<CudaStream>, &Arc<CudaStream>) {
        (&self.h2d, &self.d2h)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.ctx_gpu
    }

    /// The HBM tier (model kernels read layer `l` of block `b` at
    /// `addr(b * block_bytes + l * layer_stride, ..)`).
    pub fn hbm(&self) -> &DeviceArena {
        &self.hbm
    }

    pub fn dram(&self) -> &PinnedArena {
        &self.dram
    }

    /// The DRAM tier as host slices of `piece` bytes, once no batch is in flight.
    pub fn dram_pieces_mut(&mut self, piece: u64) -> Result<Vec<&mut [u8]>> {
        if !self.pending.is_empty() {
            return Err(Error::Invalid(format!(
                "{} batches still in flight",
                self.pending.len()
            )));
        }
        // SAFETY: every copy this engine issued has completed (no pending batch), and the
        // engine's streams issue nothing else; `&mut self` keeps new batches out meanwhile.
        unsafe { self.dram.pieces_mut(piece) }
    }

    /// The DRAM tier as read-only host slices of `piece` bytes, once no batch is in flight.
    pub fn dram_pieces(&self, piece: u64) -> Result<Vec<&[u8]>> {
        if !self.pending.is_empty() {
            return Err(Error::Invalid(format!(
                "{} batches still in flight",
                self.pending.len()
            )));
        }
        // SAFETY: as for `dram_pieces_mut`; `&self` keeps `submit` (which takes `&mut`) out.
        unsafe { self.dram.pieces(piece) }
    }
}

impl Drop for DuplexEngine {
    fn drop(&mut self) {
        // The arenas must outlive the copies that use them.
        for p in &self.pending {
            let _ = p.h2d_done.synchronize();
            let _ = p.d2h_done.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn engine_is_send() {
        fn send<T: Send>() {}
        send::<super::DuplexEngine>();
    }
}
