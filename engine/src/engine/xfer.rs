//! The rotation budget `B_xfer` from the hardware (PAPER.md §4: "the budget should follow
//! measured bandwidth and iteration time").
//!
//! `B_xfer` is what one direction of the link moves in one iteration. With the default
//! (`EngineConfig::b_xfer = None`) the engine derives it every iteration:
//!
//! ```text
//! B_xfer = max( round(share × rate × t_iter), blk_max )
//! ```
//!
//! - `rate`: blocks per second per direction while both directions copy at once: the
//!   profile's for the simulated link, measured once at start for a real one
//!   ([`measure_duplex_rate`]);
//! - `t_iter`: the mean of the last [`WINDOW`] iteration times (model step plus the host work
//!   around it, idle time excluded);
//! - `share`: `EngineConfig::b_xfer_link_share`, the share of an iteration's link capacity the
//!   scheduler may plan (eager writebacks use the same link and count against the budget);
//! - `blk_max`: the largest request now live (blocks it needs resident). A budget below it
//!   would make that request unrotatable (recomputed instead) or, once parked, unrestorable,
//!   so the budget never drops below it.
//!
//! A fixed `b_xfer` overrides all of this, with one exception: a parked request whose copy
//! back needs more blocks than the fixed budget raises that iteration's budget to what it
//! needs. A request holding more HBM blocks than the budget is never rotated out, but a
//! parked one's copy-in can grow past it (the shared prefix blocks it referenced leave HBM
//! while it is parked), and a policy that restores it first (EDF, LVF: the oldest request)
//! would otherwise wait for it forever and admit nothing behind it.

use crate::kv::block::{DramBlock, HbmBlock};
use crate::transfer::{CopyBatch, D2hCopy, H2dCopy, Transfer};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Iterations averaged for `t_iter`.
pub const WINDOW: usize = 32;

/// Bytes each direction moves in the start-up probe (fewer when the tiers are smaller).
const PROBE_BYTES: u64 = 256 << 20;

/// How long the probe may take before the engine gives up on the copy engine.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The state behind the automatic budget.
#[derive(Clone, Debug)]
pub(super) struct XferBudget {
    /// `Some(b)`: fixed by configuration.
    fixed: Option<u32>,
    share: f64,
    /// Blocks per second per direction, both directions busy.
    rate: f64,
    iterations: VecDeque<f64>,
    sum: f64,
    /// The budget of the latest plan (reported in stats).
    last: u32,
}

impl XferBudget {
    pub(super) fn new(fixed: Option<u32>, share: f64, rate: f64) -> XferBudget {
        XferBudget {
            fixed,
            share,
            rate,
            iterations: VecDeque::with_capacity(WINDOW),
            sum: 0.0,
            last: fixed.unwrap_or(0),
        }
    }

    /// One iteration took `seconds`.
    pub(super) fn observe(&mut self, seconds: f64) {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return;
        }
        if self.iterations.len() == WINDOW {
            self.sum -= self.iterations.pop_front().unwrap_or(0.0);
        }
        self.iterations.push_back(seconds);
        self.sum += seconds;
    }

    /// Mean iteration time over the window; `None` before the first iteration.
    pub(super) fn iteration_s(&self) -> Option<f64> {
        (!self.iterations.is_empty()).then(|| self.sum / self.iterations.len() as f64)
    }

    /// The budget for this iteration's plan, when the largest live request needs
    /// `largest_blocks` resident and the largest parked one `largest_copy_in` blocks copied
    /// back (the floor of a fixed budget).
    pub(super) fn budget(&mut self, largest_blocks: u32, largest_copy_in: u32) -> u32 {
        self.last = match self.fixed {
            Some(b) => b.max(largest_copy_in),
            None => {
                let t = self.iteration_s().unwrap_or(0.0);
                let link = (self.share * self.rate * t).round();
                let link = if link.is_finite() {
                    link.min(f64::from(u32::MAX)) as u32
                } else {
                    0
                };
                link.max(largest_blocks)
            }
        };
        self.last
    }

    pub(super) fn last(&self) -> u32 {
        self.last
    }

    pub(super) fn rate(&self) -> f64 {
        self.rate
    }
}

/// Blocks per second each direction of `transfer` moves while both directions copy at once,
/// measured by copying between free slots of tiers of `hbm_blocks` and `dram_blocks` (the pool
/// must be empty: the probe overwrites slots). The probe runs twice and the second run counts
/// (the first pays for first use). Backends on a modelled link answer without copying.
pub fn measure_duplex_rate<T: Transfer + ?Sized>(
    transfer: &mut T,
    hbm_blocks: u32,
    dram_blocks: u32,
) -> Result<f64, String> {
    if let Some(rate) = transfer.modelled_rate() {
        return Ok(rate);
    }
    let per_dir = (PROBE_BYTES / transfer.block_bytes().max(1)).max(1);
    let n = per_dir
        .min(u64::from(hbm_blocks / 2))
        .min(u64::from(dram_blocks / 2)) as u32;
    if n == 0 {
        return Err(format!(
            "the tiers ({hbm_blocks} HBM, {dram_blocks} DRAM blocks) are too small to measure the link"
        ));
    }
    let batch = CopyBatch {
        h2d: (0..n)
            .map(|i| H2dCopy {
                src: DramBlock(i),
                dst: HbmBlock(i),
            })
            .collect(),
        d2h: (0..n)
            .map(|i| D2hCopy {
                src: HbmBlock(n + i),
                dst: DramBlock(n + i),
            })
            .collect(),
    };
    probe_once(transfer, batch.clone())?;
    let seconds = probe_once(transfer, batch)?;
    Ok(f64::from(n) / seconds.max(1e-9))
}

/// Seconds until both directions of `batch` landed.
fn probe_once<T: Transfer + ?Sized>(transfer: &mut T, batch: CopyBatch) -> Result<f64, String> {
    let start = Instant::now();
    let tickets = transfer.submit(0.0, batch);
    let mut pending: Vec<_> = tickets.h2d.into_iter().chain(tickets.d2h).collect();
    pending.dedup();
    while !pending.is_empty() {
        let done = transfer.poll(0.0);
        pending.retain(|t| !done.contains(t));
        if start.elapsed() > PROBE_TIMEOUT {
            return Err(format!(
                "the copy engine did not finish a probe copy within {} s",
                PROBE_TIMEOUT.as_secs()
            ));
        }
        std::thread::yield_now();
    }
    Ok(start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_follows_rate_times_iteration_time_and_never_drops_below_the_largest_request() {
        // 10,000 blocks/s, full share.
        let mut b = XferBudget::new(None, 1.0, 10_000.0);
        assert_eq!(
            b.budget(40, 0),
            40,
            "no iteration measured yet: the largest request"
        );
        for _ in 0..WINDOW {
            b.observe(0.05);
        }
        assert_eq!(b.budget(40, 0), 500);
        assert_eq!(b.budget(700, 0), 700);
        // The window forgets: after WINDOW iterations of 10 ms the mean is 10 ms.
        for _ in 0..WINDOW {
            b.observe(0.01);
        }
        assert_eq!(b.budget(40, 0), 100);
        let mut half = XferBudget::new(None, 0.5, 10_000.0);
        half.observe(0.05);
        assert_eq!(half.budget(1, 0), 250);
        assert_eq!(half.last(), 250);
    }

    #[test]
    fn a_fixed_budget_ignores_rate_and_iterations() {
        let mut b = XferBudget::new(Some(512), 1.0, 10_000.0);
        b.observe(1.0);
        assert_eq!(b.budget(4000, 0), 512);
        assert_eq!(b.budget(4000, 300), 512);
    }

    #[test]
    fn a_fixed_budget_rises_to_let_the_largest_parked_request_back() {
        let mut b = XferBudget::new(Some(12), 1.0, 10_000.0);
        assert_eq!(b.budget(13, 13), 13);
        assert_eq!(b.last(), 13);
        assert_eq!(b.budget(13, 0), 12, "only a parked request raises it");
    }

    #[test]
    fn bad_iteration_times_are_ignored() {
        let mut b = XferBudget::new(None, 1.0, 1000.0);
        b.observe(f64::NAN);
        b.observe(-1.0);
        assert_eq!(b.iteration_s(), None);
        b.observe(0.1);
        assert_eq!(b.budget(0, 0), 100);
    }

    #[test]
    #[cfg(feature = "model")]
    fn the_host_copy_engine_is_measured_and_the_simulated_link_is_taken_from_its_profile() {
        use crate::kv::BlockGeometry;
        use crate::model::kv_arena::KvArena;
        use crate::transfer::host::HostTransfer;
        use candle_core::{DType, Device};
        let g = BlockGeometry {
            num_layers: 2,
            block_size: 16,
            kv_heads: 2,
            head_dim: 64,
            dtype_bytes: 4,
        };
        let hbm = KvArena::new(g, 64, DType::F32, &Device::Cpu).unwrap();
        let mut host = HostTransfer::new(hbm, 64).unwrap();
        let rate = measure_duplex_rate(&mut host, 64, 64).unwrap();
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
        // Too small to probe: a clear error, not a made-up rate.
        let err = measure_duplex_rate(&mut host, 1, 64).unwrap_err();
        assert!(err.contains("too small"), "{err}");

        let profile = crate::profile::Profile::builtin("h200-llama-3-8b").unwrap();
        let block = profile.model.geometry(16).block_bytes();
        let mut sim = crate::transfer::sim::SimTransfer::new(&profile.hw, block);
        let rate = measure_duplex_rate(&mut sim, 8, 8).unwrap();
        let want = profile.hw.duplex_each_gbps * 1e9 / block as f64;
        assert!((rate - want).abs() < 1e-6 * want, "{rate} vs {want}");
        assert_eq!(sim.bytes_moved(), (0, 0), "the modelled link is not probed");
    }
}
