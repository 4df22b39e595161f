//! The transfer engine contract: batched block copies between the tiers, both directions at
//! once, completion reported by polling (never by synchronizing the device).
//!
//! Backends: [`sim`] (a bandwidth model on the engine clock), `host` (memcpy between two host
//! arenas on a worker thread; CPU model path) and `cuda` (two copy streams; feature `cuda`).

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "model")]
pub mod host;
pub mod sim;

use crate::kv::block::{DramBlock, HbmBlock};

/// One block copy from DRAM into HBM (restore).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H2dCopy {
    pub src: DramBlock,
    pub dst: HbmBlock,
}

/// One block copy from HBM into its DRAM mirror (writeback or eviction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct D2hCopy {
    pub src: HbmBlock,
    pub dst: DramBlock,
}

/// The copies of one iteration, one list per direction. A backend issues both lists at once
/// (duplex) and may merge adjacent blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyBatch {
    pub h2d: Vec<H2dCopy>,
    pub d2h: Vec<D2hCopy>,
}

impl CopyBatch {
    pub fn is_empty(&self) -> bool {
        self.h2d.is_empty() && self.d2h.is_empty()
    }
}

/// Identifies one direction of one submitted batch; completes as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// The tickets of one submitted batch, one per direction that has copies: each completes on
/// its own, so an iteration's restores never wait for its writebacks (or the reverse).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tickets {
    pub h2d: Option<Ticket>,
    pub d2h: Option<Ticket>,
}

/// A fault to inject into the next submitted batch (tests and fault drills: the sim and host
/// backends take it through their `inject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyFault {
    /// The batch fails: nothing is copied and its tickets come back through
    /// [`Transfer::take_failed`] (the copy is over; nothing of it is in flight).
    Fail,
    /// The batch never completes: its tickets are never reported (the engine's copy timeout
    /// gives up on them).
    Hang,
}

/// A copy engine between the HBM and DRAM tiers.
///
/// Contract: `submit` never blocks on the copies; D2H copies of blocks written by the step
/// that just ran start only after that step's writes are complete (a backend whose `step` is
/// synchronous satisfies this trivially; the CUDA backend records an event after the step);
/// each ticket is reported by `poll` exactly once, after all its copies (of its direction)
/// have landed.
pub trait Transfer: Send {
    /// Starts the copies of one iteration at engine time `now` (seconds): one ticket per
    /// direction that has copies.
    fn submit(&mut self, now: f64, batch: CopyBatch) -> Tickets;
    /// Tickets completed by engine time `now`, each reported once.
    fn poll(&mut self, now: f64) -> Vec<Ticket>;
    /// Tickets whose copies failed since the last call, with the reason, each reported once
    /// and never by `poll`: nothing of them is in flight any more, and the bytes they were to
    /// copy must not be trusted.
    fn take_failed(&mut self) -> Vec<(Ticket, String)> {
        Vec::new()
    }
    /// For backends on a virtual clock: the engine time at which the next ticket completes,
    /// so an idle engine can advance its clock to it. Real backends return `None`.
    fn next_completion(&self) -> Option<f64>;
    /// Called by the engine right after the model step was issued, before the `submit` of the
    /// copies that may read blocks it wrote or overwrite slots it reads. The CUDA backend
    /// records an event on the compute stream here and makes both copy streams wait on it;
    /// synchronous backends do nothing.
    fn step_issued(&mut self) {}
    /// Bytes copied so far per direction: (host-to-device, device-to-host).
    fn bytes_moved(&self) -> (u64, u64);
    /// Bytes of one block (one copy unit).
    fn block_bytes(&self) -> u64;
    /// For a modelled link (the twin): blocks per second per direction while both directions
    /// copy at once. Real backends return `None`; the engine measures them at start
    /// (`engine::measure_duplex_rate`).
    fn modelled_rate(&self) -> Option<f64> {
        None
    }
}
