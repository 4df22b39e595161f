//! The pool's copies: eager writeback, eviction and restore (the D2H/H2D copies they add to
//! the batch being built), the tickets those copies get, and what landing them does to the
//! blocks (writebacks synced, evictions parked, restores back in HBM).

use super::shared::donate_in;
use super::{BlockState, KvPool, Slot};
use crate::kv::block::{DramBlock, HbmBlock};
use crate::transfer::{D2hCopy, H2dCopy, Ticket, Tickets};
use superinfer_policies::RequestId;

impl KvPool {
    /// Eager writeback: D2H copies for the dirty blocks among the first `full` blocks of `id`
    /// (full blocks are immutable), each into its DRAM mirror (allocated now), at most
    /// `*budget` of them (decremented). Stops when DRAM or the budget runs out (the blocks stay
    /// dirty). The copies join the batch being built. Returns whether every one of the first
    /// `full` blocks is clean or on its way (nothing left to write back).
    pub fn writeback(
        &mut self,
        id: RequestId,
        full: usize,
        out: &mut Vec<D2hCopy>,
        budget: &mut u32,
    ) -> bool {
        let Some(t) = self.tables.get(&id) else {
            return true;
        };
        let n = full.min(t.blocks.len());
        let mut i = t.clean_below;
        while i < n {
            let b = self.block(id, i);
            if b.state == BlockState::Dirty {
                if *budget == 0 {
                    break;
                }
                let mirror = b.dram;
                let Some(dram) = mirror.or_else(|| self.take_dram().map(DramBlock)) else {
                    break;
                };
                self.copy_out(id, i, dram, BlockState::WritingBack, out);
                *budget -= 1;
            }
            i += 1;
            self.tables.get_mut(&id).expect("exists").clean_below = i;
        }
        i >= n
    }

    /// Copies dirty block `i` of `id` to its mirror `dram` (writeback or eviction, as `to`
    /// says): the copy joins the batch being built.
    fn copy_out(
        &mut self,
        id: RequestId,
        i: usize,
        dram: DramBlock,
        to: BlockState,
        out: &mut Vec<D2hCopy>,
    ) {
        let b = self.block_mut(id, i);
        let hbm = b.hbm.expect("dirty blocks are in HBM");
        b.dram = Some(dram);
        self.set(id, i, to);
        self.pending.push((id, i, true));
        out.push(D2hCopy {
            src: hbm,
            dst: dram,
        });
    }

    /// DRAM blocks that rotating `id` out would newly need.
    fn mirrors_missing(&self, id: RequestId) -> usize {
        let t = self.table(id);
        t.iter()
            .filter(|b| b.state == BlockState::Dirty && b.dram.is_none())
            .count()
    }

    /// Rotates `id` out: synced blocks drop their HBM slot, dirty ones are copied to their
    /// mirror, blocks being written back finish that copy as their eviction. Returns `false`
    /// (and changes nothing) when DRAM cannot hold the missing mirrors.
    pub fn evict(&mut self, id: RequestId, out: &mut Vec<D2hCopy>) -> bool {
        if self.mirrors_missing(id) > self.dram_available() as usize {
            return false;
        }
        for i in 0..self.table(id).len() {
            let b = self.block(id, i);
            match b.state {
                BlockState::Synced => {
                    let slot = b.hbm.expect("synced blocks are in HBM");
                    self.block_mut(id, i).hbm = None;
                    self.hbm_free.give(slot.0);
                    self.set(id, i, BlockState::Parked);
                }
                BlockState::Dirty => {
                    let dram = match b.dram {
                        Some(d) => d,
                        None => DramBlock(self.take_dram().expect("checked enough DRAM")),
                    };
                    self.copy_out(id, i, dram, BlockState::Evicting, out);
                }
                BlockState::WritingBack => self.set(id, i, BlockState::Evicting),
                BlockState::Shared => self.let_go(id, i),
                s => debug_assert!(false, "evicting a block in state {s:?}"),
            }
        }
        true
    }

    /// Restores a rotary `id`: every parked block gets a fresh HBM slot and an H2D copy; a
    /// shared block uses its entry's HBM copy in place, or copies the entry in. Returns
    /// `false` (and changes nothing) when HBM has no room.
    pub fn restore(&mut self, id: RequestId, out: &mut Vec<H2dCopy>) -> bool {
        if self.restore_cost(id).slots > self.hbm_available() {
            return false;
        }
        // Shared blocks first, then the parked ones.
        self.hold_shared(id, out);
        for i in 0..self.table(id).len() {
            let b = self.block(id, i);
            if b.state != BlockState::Parked {
                continue;
            }
            let dram = b.dram.expect("parked blocks have a mirror");
            let slot = HbmBlock(self.take_hbm().expect("checked enough HBM"));
            self.block_mut(id, i).hbm = Some(slot);
            self.set(id, i, BlockState::Restoring);
            self.pending.push((id, i, true));
            out.push(H2dCopy {
                src: dram,
                dst: slot,
            });
        }
        true
    }

    /// The batch just built was submitted as `tickets`: its blocks are now in flight, each
    /// under the ticket of its direction (restores host-to-device, the rest device-to-host).
    pub fn commit(&mut self, tickets: Tickets) {
        self.cache.commit(tickets.h2d);
        // Drained in place: the buffer keeps its allocation for the next batch (growing it
        // again every step was a realloc chain per step).
        let batch = self.pending.len();
        for (id, i, copies) in self.pending.drain(..) {
            let Some(b) = self.tables.get_mut(&id).and_then(|t| t.blocks.get_mut(i)) else {
                continue;
            };
            let h2d = b.state == BlockState::Restoring;
            let Some(ticket) = (if h2d { tickets.h2d } else { tickets.d2h }) else {
                debug_assert!(false, "a copy without a ticket for its direction");
                continue;
            };
            b.inflight = Some(ticket);
            self.inflight
                .entry(ticket)
                .or_insert_with(|| Vec::with_capacity(batch))
                .push((id, i));
            if !copies {
                continue;
            }
            let n = self.ticket_blocks.entry(ticket).or_default();
            if h2d {
                n.0 += 1;
                self.flight.0 += 1;
            } else {
                n.1 += 1;
                self.flight.1 += 1;
            }
        }
    }

    /// Whether a batch is being built (blocks waiting for a ticket).
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The copies of `ticket` landed: writebacks become synced, evictions parked (their HBM
    /// slot is free now), restores synced; quarantined slots of that ticket are released.
    pub fn complete(&mut self, ticket: Ticket) {
        if let Some((h, d)) = self.ticket_blocks.remove(&ticket) {
            self.flight.0 -= h;
            self.flight.1 -= d;
        }
        for e in self.cache.complete(ticket) {
            self.delete_entry(e);
        }
        for (id, i) in self.inflight.remove(&ticket).unwrap_or_default() {
            // One lookup of the table per landed block (thousands a step at scale).
            let Some(t) = self.tables.get_mut(&id) else {
                continue;
            };
            let Some(b) = t.blocks.get_mut(i) else {
                continue;
            };
            if b.inflight != Some(ticket) {
                continue;
            }
            let to = match b.state {
                BlockState::Restoring if b.entry.is_some() => BlockState::Shared,
                BlockState::WritingBack | BlockState::Restoring => BlockState::Synced,
                BlockState::Evicting => BlockState::Parked,
                _ => continue,
            };
            let restored = b.state == BlockState::Restoring && to == BlockState::Synced;
            b.inflight = None;
            if to == BlockState::Parked {
                let slot = b.hbm.take().expect("evicting blocks hold their HBM slot");
                self.hbm_free.give(slot.0);
            }
            if restored {
                self.restored_tables += u32::from(!t.restored);
                t.restored = true;
            }
            t.set(i, to, &mut self.illegal);
            if to == BlockState::Synced {
                donate_in(t, id, i, self.prefix, &mut self.cache, &mut self.illegal);
            }
        }
        let (done, keep): (Vec<_>, Vec<_>) =
            self.quarantine.drain(..).partition(|(t, _)| *t == ticket);
        self.quarantine = keep;
        for (_, slot) in done {
            match slot {
                Slot::Hbm(h) => self.hbm_free.give(h.0),
                Slot::Dram(d) => self.dram_free.give(d.0),
            }
        }
    }
}
