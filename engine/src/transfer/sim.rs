//! The simulated copy engine: per-direction bandwidth, slower per direction when both run at
//! once (duplex ceiling), a fixed latency per batched copy call, queueing behind earlier
//! copies in the same direction. Time is the engine clock's.

use super::{CopyBatch, CopyFault, Ticket, Tickets, Transfer};
use crate::profile::HardwareProfile;
use std::collections::VecDeque;

/// Bandwidth model of the HBM ⇄ DRAM link.
#[derive(Clone, Debug)]
pub struct SimTransfer {
    block_bytes: u64,
    h2d_bps: f64,
    d2h_bps: f64,
    duplex_bps: f64,
    latency_s: f64,
    /// When each direction's last copy ends: [h2d, d2h].
    busy_until: [f64; 2],
    in_flight: Vec<(Ticket, f64)>,
    next_ticket: u64,
    bytes: (u64, u64),
    /// Faults for the next batches, in order.
    faults: VecDeque<CopyFault>,
    /// Failed tickets and when their failure is reported (when they would have ended).
    failing: Vec<(Ticket, f64)>,
    /// The engine time of the latest `poll` (failures are reported up to it).
    in_flight_clock: f64,
    /// Blocks of the batches that hang (their slots stay quarantined).
    hung_blocks: u64,
}

impl SimTransfer {
    /// The next submitted batch fails or hangs (one fault per call, for successive batches).
    pub fn inject(&mut self, fault: CopyFault) {
        self.faults.push_back(fault);
    }

    /// Block copies in batches that were made to hang.
    pub fn hung_blocks(&self) -> u64 {
        self.hung_blocks
    }

    pub fn new(hw: &HardwareProfile, block_bytes: u64) -> SimTransfer {
        SimTransfer {
            block_bytes,
            h2d_bps: hw.h2d_gbps * 1e9,
            d2h_bps: hw.d2h_gbps * 1e9,
            duplex_bps: hw.duplex_each_gbps * 1e9,
            latency_s: hw.per_copy_latency_s,
            busy_until: [0.0; 2],
            in_flight: Vec::new(),
            next_ticket: 0,
            bytes: (0, 0),
            faults: VecDeque::new(),
            failing: Vec::new(),
            in_flight_clock: 0.0,
            hung_blocks: 0,
        }
    }

    /// When copies of `bytes` in direction `dir` issued at `now` end.
    fn schedule(&mut self, dir: usize, bytes: u64, solo_bps: f64, both: bool, now: f64) -> f64 {
        if bytes == 0 {
            return now;
        }
        let bps = if both { self.duplex_bps } else { solo_bps };
        let start = now.max(self.busy_until[dir]);
        let end = start + self.latency_s + bytes as f64 / bps;
        self.busy_until[dir] = end;
        end
    }
}

impl Transfer for SimTransfer {
    fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    fn modelled_rate(&self) -> Option<f64> {
        Some(self.duplex_bps / self.block_bytes.max(1) as f64)
    }

    fn submit(&mut self, now: f64, batch: CopyBatch) -> Tickets {
        let h = batch.h2d.len() as u64 * self.block_bytes;
        let d = batch.d2h.len() as u64 * self.block_bytes;
        let other_busy = |dir: usize| self.busy_until[dir] > now;
        let both_h = d > 0 || other_busy(1);
        let both_d = h > 0 || other_busy(0);
        let end_h = self.schedule(0, h, self.h2d_bps, both_h, now);
        let end_d = self.schedule(1, d, self.d2h_bps, both_d, now);
        self.bytes.0 += h;
        self.bytes.1 += d;
        let fault = if h + d > 0 {
            self.faults.pop_front()
        } else {
            None
        };
        let mut issue = |bytes: u64, end: f64| {
            (bytes > 0).then(|| {
                let t = Ticket(self.next_ticket);
                self.next_ticket += 1;
                match fault {
                    None => self.in_flight.push((t, end)),
                    Some(CopyFault::Fail) => self.failing.push((t, end)),
                    Some(CopyFault::Hang) => self.hung_blocks += bytes / self.block_bytes,
                }
                t
            })
        };
        Tickets {
            h2d: issue(h, end_h),
            d2h: issue(d, end_d),
        }
    }

    fn poll(&mut self, now: f64) -> Vec<Ticket> {
        self.in_flight_clock = now;
        let (done, left): (Vec<_>, Vec<_>) = self
            .in_flight
            .drain(..)
            .partition(|&(_, end)| end <= now + 1e-12);
        self.in_flight = left;
        done.into_iter().map(|(t, _)| t).collect()
    }

    fn take_failed(&mut self) -> Vec<(Ticket, String)> {
        // Reported when the batch would have ended (the sim has no earlier moment to notice).
        let now = self.in_flight_clock;
        let (done, left): (Vec<_>, Vec<_>) = self
            .failing
            .drain(..)
            .partition(|&(_, end)| end <= now + 1e-12);
        self.failing = left;
        done.into_iter()
            .map(|(t, _)| (t, "injected copy failure".to_string()))
            .collect()
    }

    fn next_completion(&self) -> Option<f64> {
        self.in_flight
            .iter()
            .chain(&self.failing)
            .map(|&(_, end)| end)
            .reduce(f64::min)
    }

    fn bytes_moved(&self) -> (u64, u64) {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{DramBlock, HbmBlock};
    use crate::profile::Profile;
    use crate::transfer::{D2hCopy, H2dCopy};

    fn batch(h: u32, d: u32) -> CopyBatch {
        CopyBatch {
            h2d: (0..h)
                .map(|i| H2dCopy {
                    src: DramBlock(i),
                    dst: HbmBlock(i),
                })
                .collect(),
            d2h: (0..d)
                .map(|i| D2hCopy {
                    src: HbmBlock(i),
                    dst: DramBlock(i),
                })
                .collect(),
        }
    }

    #[test]
    fn duplex_is_slower_per_direction_but_faster_overall() {
        let hw = Profile::builtin("h200-qwen2.5-32b").unwrap().hw;
        let mb4 = 4u64 << 20;
        let mut solo = SimTransfer::new(&hw, mb4);
        solo.submit(0.0, batch(1024, 0));
        let t_solo = solo.next_completion().unwrap();
        let mut both = SimTransfer::new(&hw, mb4);
        both.submit(0.0, batch(1024, 1024));
        let t_both = both.next_completion().unwrap();
        // 4 GiB at 55.1 GB/s = 78 ms; both ways at 48.1 GB/s each = 89 ms (not 2 × 78).
        assert!((t_solo - 0.078).abs() < 0.001, "{t_solo}");
        assert!((t_both - 0.0893).abs() < 0.001, "{t_both}");
        assert!(both.poll(0.05).is_empty());
        assert_eq!(both.poll(0.1), vec![Ticket(0), Ticket(1)]);
        assert!(both.poll(1.0).is_empty(), "a ticket is reported once");
    }

    #[test]
    fn each_direction_completes_on_its_own() {
        let hw = Profile::builtin("h200-qwen2.5-32b").unwrap().hw;
        let mut t = SimTransfer::new(&hw, 4u64 << 20);
        // 64 MiB of restores beside 4 GiB of writebacks: the restores land long before.
        let tickets = t.submit(0.0, batch(16, 1024));
        let (h, d) = (tickets.h2d.unwrap(), tickets.d2h.unwrap());
        assert_eq!(t.poll(0.01), vec![h]);
        assert!(t.poll(0.05).is_empty());
        assert_eq!(t.poll(0.1), vec![d]);
        assert_eq!(t.submit(0.2, batch(0, 0)), Tickets::default());
    }
}
