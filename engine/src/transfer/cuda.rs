//! The CUDA copy engine (feature `cuda`): DuplexKV on a real GPU, through
//! `superinfer_kernels::cuda::DuplexEngine`, which owns the HBM tier (a device arena) and the
//! DRAM tier (pinned host memory), both sized in blocks of the model's [`BlockGeometry`].
//!
//! Each `submit` issues the iteration's restores (H2D) and evictions/writebacks (D2H) at once
//! on two dedicated streams, one batched copy call per direction over merged block ranges.
//! `step_issued` records an event on the model's compute stream and makes both copy streams
//! wait on it, so a writeback never reads a block before the step that fills it is done, and
//! a restore never overwrites a slot (freed by an abort or a recompute) that the step still
//! reads.
//! `poll` reads completion from events (`cuEventQuery`); nothing here synchronizes the device.
//! A batch touching a block with a copy in flight is a bug in the caller (the KV pool never
//! hands such a block out); debug builds assert it, and the kernels crate refuses it anyway.
//!
//! A CUDA failure inside the trait's methods (which return no errors) is a device fault the
//! engine cannot recover from: it panics with the driver's message.

#[cfg(test)]
mod tests;

use superinfer_kernels::cuda::{CopyMode, DeviceArena, Direction, DuplexConfig, DuplexEngine, Gpu};
use superinfer_kernels::BlockCopy;

use super::{CopyBatch, Ticket, Tickets, Transfer};
use crate::kv::block::BlockGeometry;

/// Sizes of the two tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaTransferConfig {
    pub geometry: BlockGeometry,
    pub hbm_blocks: u32,
    pub dram_blocks: u32,
    /// Largest single pinned allocation; the DRAM tier is made of chunks of this size.
    pub pinned_chunk_bytes: u64,
}

/// The `cuda` [`Transfer`] backend.
pub struct CudaTransfer {
    engine: DuplexEngine,
    /// Tickets handed out and not yet reported (a batch's empty direction has none).
    issued: std::collections::BTreeSet<Ticket>,
    block_bytes: u64,
}

impl CudaTransfer {
    /// Allocates both tiers on `gpu` (which shares the model runner's context and compute
    /// stream) and creates the two copy streams.
    pub fn new(gpu: &Gpu, cfg: CudaTransferConfig) -> Result<Self, superinfer_kernels::Error> {
        let engine = DuplexEngine::new(gpu, Self::duplex_config(&cfg))?;
        Ok(Self {
            engine,
            issued: Default::default(),
            block_bytes: cfg.geometry.block_bytes(),
        })
    }

    /// As [`CudaTransfer::new`] over an existing HBM tier: the model runner's KV arena (a
    /// contiguous candle tensor of at least `hbm_blocks` blocks), so the runner and the copy
    /// engine share one HBM tier.
    pub fn with_arena(
        gpu: &Gpu,
        cfg: CudaTransferConfig,
        arena: &candle_core::Tensor,
    ) -> Result<Self, superinfer_kernels::Error> {
        let hbm = DeviceArena::from_tensor(gpu, arena)?;
        let engine = DuplexEngine::with_hbm(gpu, Self::duplex_config(&cfg), hbm)?;
        Ok(Self {
            engine,
            issued: Default::default(),
            block_bytes: cfg.geometry.block_bytes(),
        })
    }

    fn duplex_config(cfg: &CudaTransferConfig) -> DuplexConfig {
        DuplexConfig {
            block_bytes: cfg.geometry.block_bytes(),
            hbm_blocks: cfg.hbm_blocks,
            dram_blocks: cfg.dram_blocks,
            pinned_chunk_bytes: cfg.pinned_chunk_bytes,
            mode: CopyMode::Batched,
            merge: true,
        }
    }

    /// The copy engine, for the model runner (HBM arena addresses) and diagnostics.
    pub fn engine(&self) -> &DuplexEngine {
        &self.engine
    }

    /// The copy engine, mutably: host access to the DRAM tier once no batch is in flight
    /// (loading a prompt's KV, tests).
    pub fn engine_mut(&mut self) -> &mut DuplexEngine {
        &mut self.engine
    }
}

fn copies(batch: &CopyBatch) -> (Vec<BlockCopy>, Vec<BlockCopy>) {
    let h2d = batch
        .h2d
        .iter()
        .map(|c| BlockCopy {
            src: c.src.0,
            dst: c.dst.0,
        })
        .collect();
    let d2h = batch
        .d2h
        .iter()
        .map(|c| BlockCopy {
            src: c.src.0,
            dst: c.dst.0,
        })
        .collect();
    (h2d, d2h)
}

impl Transfer for CudaTransfer {
    /// Batch `id`'s restores are ticket `2·id`, its evictions and writebacks `2·id + 1`.
    fn submit(&mut self, _now: f64, batch: CopyBatch) -> Tickets {
        let (h2d, d2h) = copies(&batch);
        debug_assert!(
            self.engine.conflict(&h2d, &d2h).is_none(),
            "KV pool handed out a block with a copy in flight: {:?}",
            self.engine.conflict(&h2d, &d2h)
        );
        match self.engine.submit(&h2d, &d2h) {
            Ok(id) => {
                let tickets = Tickets {
                    h2d: (!batch.h2d.is_empty()).then_some(Ticket(2 * id)),
                    d2h: (!batch.d2h.is_empty()).then_some(Ticket(2 * id + 1)),
                };
                self.issued
                    .extend(tickets.h2d.into_iter().chain(tickets.d2h));
                tickets
            }
            Err(e) => panic!("cuda transfer: submit failed: {e}"),
        }
    }

    fn poll(&mut self, _now: f64) -> Vec<Ticket> {
        match self.engine.poll_directions() {
            Ok(done) => done
                .into_iter()
                .map(|(id, dir)| Ticket(2 * id + u64::from(dir == Direction::D2h)))
                .filter(|t| self.issued.remove(t))
                .collect(),
            Err(e) => panic!("cuda transfer: event query failed: {e}"),
        }
    }

    fn next_completion(&self) -> Option<f64> {
        None
    }

    fn step_issued(&mut self) {
        if let Err(e) = self.engine.step_issued() {
            panic!("cuda transfer: could not gate writebacks on the step: {e}");
        }
    }

    fn bytes_moved(&self) -> (u64, u64) {
        self.engine.bytes_moved()
    }

    fn block_bytes(&self) -> u64 {
        self.block_bytes
    }
}
