//! The `host` copy engine (CPU model path): block copies between the HBM-tier arena (the
//! runner's, shared) and a DRAM-tier arena owned here, done by a worker thread.
//!
//! `submit` hands the batch to the worker over a bounded channel and returns at once; the
//! worker copies the batch's blocks (restores and writebacks/evictions of one ticket, merged
//! into runs of adjacent blocks) and only then reports the ticket, which `poll` collects.
//! Tickets complete in submission order. The KV pool never hands out a block with a copy in
//! flight, and the runner's step is synchronous, so a writeback never reads a block the step
//! is still writing (the `Transfer` contract).
//!
//! A failed copy is reported through `take_failed` (the engine recomputes what it touched);
//! faults can be injected for tests and drills (`inject`).

use super::{CopyBatch, CopyFault, Ticket, Tickets, Transfer};
use crate::error::EngineError;
use crate::model::KvArena;
use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::thread::JoinHandle;

/// Batches queued for the worker beyond this make `submit` wait (the engine submits one per
/// iteration; the worker is far ahead of that).
const QUEUE: usize = 1024;

struct Job {
    ticket: Ticket,
    batch: CopyBatch,
    fault: Option<CopyFault>,
}

/// The `host` [`Transfer`] backend.
pub struct HostTransfer {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<(Ticket, Result<(), String>)>,
    worker: Option<JoinHandle<()>>,
    dram: KvArena,
    next_ticket: u64,
    bytes: (u64, u64),
    faults: VecDeque<CopyFault>,
    failed: Vec<(Ticket, String)>,
}

/// Runs of adjacent copies: `(src, dst, n)` with `src..src+n` → `dst..dst+n`.
fn runs(mut pairs: Vec<(u32, u32)>) -> Vec<(u32, u32, u32)> {
    pairs.sort_unstable();
    let mut out: Vec<(u32, u32, u32)> = Vec::new();
    for (s, d) in pairs {
        match out.last_mut() {
            Some((s0, d0, n)) if *s0 + *n == s && *d0 + *n == d => *n += 1,
            _ => out.push((s, d, 1)),
        }
    }
    out
}

fn copy_batch(hbm: &KvArena, dram: &KvArena, batch: &CopyBatch) -> Result<(), EngineError> {
    let h2d = runs(batch.h2d.iter().map(|c| (c.src.0, c.dst.0)).collect());
    let d2h = runs(batch.d2h.iter().map(|c| (c.src.0, c.dst.0)).collect());
    for (src, dst, n) in d2h {
        dram.set_blocks(dst, &hbm.blocks(src, n)?)?;
    }
    for (src, dst, n) in h2d {
        hbm.set_blocks(dst, &dram.blocks(src, n)?)?;
    }
    Ok(())
}

impl HostTransfer {
    /// A DRAM tier of `dram_blocks` blocks of `hbm`'s geometry and dtype (on the CPU), and the
    /// worker that copies between it and `hbm` (a clone of the runner's arena).
    pub fn new(hbm: KvArena, dram_blocks: u32) -> Result<HostTransfer, EngineError> {
        let dram = KvArena::new(
            hbm.geometry(),
            dram_blocks,
            hbm.dtype(),
            &candle_core::Device::Cpu,
        )?;
        let (jobs, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let (tx_done, done) = mpsc::channel();
        let worker_dram = dram.clone();
        let worker = std::thread::Builder::new()
            .name("superinfer-kv-copy".into())
            .spawn(move || {
                for job in rx {
                    let r = match job.fault {
                        None => copy_batch(&hbm, &worker_dram, &job.batch)
                            .map_err(|e| format!("copy failed: {e}")),
                        Some(CopyFault::Fail) => Err("injected copy failure".to_string()),
                        Some(CopyFault::Hang) => continue,
                    };
                    if tx_done.send((job.ticket, r)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| EngineError::Config(format!("cannot start the copy thread: {e}")))?;
        Ok(HostTransfer {
            jobs: Some(jobs),
            done,
            worker: Some(worker),
            dram,
            next_ticket: 0,
            bytes: (0, 0),
            faults: VecDeque::new(),
            failed: Vec::new(),
        })
    }

    /// The next submitted batch fails (nothing copied) or hangs (never reported); one fault
    /// per call, for successive batches.
    pub fn inject(&mut self, fault: CopyFault) {
        self.faults.push_back(fault);
    }

    /// The DRAM tier (tests and diagnostics; read it only while no batch is in flight).
    pub fn dram(&self) -> &KvArena {
        &self.dram
    }
}

impl Transfer for HostTransfer {
    /// One worker job per batch (the worker copies serially, so the directions land together);
    /// both directions' tickets are reported when it is done.
    fn submit(&mut self, _now: f64, batch: CopyBatch) -> Tickets {
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        let tickets = Tickets {
            h2d: (!batch.h2d.is_empty()).then_some(ticket),
            d2h: (!batch.d2h.is_empty()).then_some(ticket),
        };
        let block = self.dram.geometry().block_bytes();
        self.bytes.0 += batch.h2d.len() as u64 * block;
        self.bytes.1 += batch.d2h.len() as u64 * block;
        let fault = self.faults.pop_front();
        let sent = self.jobs.as_ref().is_some_and(|j| {
            j.send(Job {
                ticket,
                batch,
                fault,
            })
            .is_ok()
        });
        assert!(sent, "host transfer: the copy thread is gone");
        tickets
    }

    fn poll(&mut self, _now: f64) -> Vec<Ticket> {
        let mut out = Vec::new();
        loop {
            match self.done.try_recv() {
                Ok((t, Ok(()))) => out.push(t),
                Ok((t, Err(e))) => self.failed.push((t, e)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    assert!(
                        self.worker.as_ref().is_some_and(|w| !w.is_finished()),
                        "host transfer: the copy thread died"
                    );
                    break;
                }
            }
        }
        out
    }

    fn take_failed(&mut self) -> Vec<(Ticket, String)> {
        std::mem::take(&mut self.failed)
    }

    fn next_completion(&self) -> Option<f64> {
        None
    }

    fn bytes_moved(&self) -> (u64, u64) {
        self.bytes
    }

    fn block_bytes(&self) -> u64 {
        self.dram.geometry().block_bytes()
    }
}

impl Drop for HostTransfer {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{BlockGeometry, DramBlock, HbmBlock};
    use crate::transfer::{D2hCopy, H2dCopy};
    use candle_core::{DType, Device, Tensor};

    #[test]
    fn runs_merge_adjacent_blocks_only() {
        assert_eq!(
            runs(vec![(5, 9), (3, 1), (4, 2), (6, 11)]),
            vec![(3, 1, 2), (5, 9, 1), (6, 11, 1)]
        );
    }

    #[test]
    fn blocks_round_trip_through_dram_and_tickets_come_once() {
        let g = BlockGeometry {
            num_layers: 2,
            block_size: 4,
            kv_heads: 1,
            head_dim: 2,
            dtype_bytes: 4,
        };
        let hbm = KvArena::new(g, 4, DType::F32, &Device::Cpu).unwrap();
        let rows = hbm.rows_per_block();
        let fill = |v: f32| Tensor::full(v, (rows, 2), &Device::Cpu).unwrap();
        hbm.set_blocks(1, &fill(1.5)).unwrap();
        hbm.set_blocks(2, &fill(2.5)).unwrap();
        let mut t = HostTransfer::new(hbm.clone(), 8).unwrap();
        let d2h = |s, d| D2hCopy {
            src: HbmBlock(s),
            dst: DramBlock(d),
        };
        let t0 = t
            .submit(
                0.0,
                CopyBatch {
                    h2d: vec![],
                    d2h: vec![d2h(1, 6), d2h(2, 7)],
                },
            )
            .d2h
            .unwrap();
        let mut seen = Vec::new();
        while seen.is_empty() {
            seen = t.poll(0.0);
        }
        assert_eq!(seen, vec![t0]);
        assert_eq!(t.dram().block_to_vec(7).unwrap(), vec![2.5; rows * 2]);
        let t1 = t
            .submit(
                0.0,
                CopyBatch {
                    h2d: vec![H2dCopy {
                        src: DramBlock(6),
                        dst: HbmBlock(3),
                    }],
                    d2h: vec![],
                },
            )
            .h2d
            .unwrap();
        let mut seen = Vec::new();
        while seen.is_empty() {
            seen = t.poll(0.0);
        }
        assert_eq!(seen, vec![t1]);
        assert_eq!(hbm.block_to_vec(3).unwrap(), vec![1.5; rows * 2]);
        assert_eq!(hbm.block_to_vec(0).unwrap(), vec![0.0; rows * 2]);
        assert!(t.poll(0.0).is_empty(), "each ticket once");
        let bb = g.block_bytes();
        assert_eq!(t.bytes_moved(), (bb, 2 * bb));
    }
}
