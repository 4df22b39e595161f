//! The KV pool: HBM and DRAM free lists, every request's block table, eager writeback, and
//! the in-flight bookkeeping that keeps a block with a copy in flight from being reused.
//!
//! Every logical block has an HBM slot (while resident), a DRAM mirror (once written back or
//! evicted) and a state from [`BlockState`]; `synced` is the state `Synced`. Allocation failure
//! is a value (`false` / `None`), never an error.

use super::block::{DramBlock, HbmBlock};
use super::lifecycle::{allowed, BlockState};
use crate::transfer::{D2hCopy, H2dCopy, Ticket};
use std::collections::BTreeMap;
use superinfer_policies::RequestId;

/// One logical block of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalBlock {
    pub hbm: Option<HbmBlock>,
    pub dram: Option<DramBlock>,
    pub state: BlockState,
    /// The ticket of the copy in flight, if any.
    pub inflight: Option<Ticket>,
}

/// A slot of either tier, for the quarantine of slots released while a copy still uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Hbm(HbmBlock),
    Dram(DramBlock),
}

/// Blocks waiting for the ticket of the batch being built (assigned by [`KvPool::commit`]).
type Pending = Vec<(RequestId, usize)>;

/// Both tiers and all block tables.
#[derive(Debug)]
pub struct KvPool {
    hbm_capacity: u32,
    dram_capacity: u32,
    hbm_free: Vec<HbmBlock>,
    dram_free: Vec<DramBlock>,
    quarantine: Vec<(Ticket, Slot)>,
    tables: BTreeMap<RequestId, Vec<LogicalBlock>>,
    inflight: BTreeMap<Ticket, Vec<(RequestId, usize)>>,
    pending: Pending,
    /// Transitions seen that the table does not allow (always empty unless there is a bug).
    illegal: Vec<(BlockState, BlockState)>,
}

impl KvPool {
    pub fn new(hbm_blocks: u32, dram_blocks: u32) -> KvPool {
        KvPool {
            hbm_capacity: hbm_blocks,
            dram_capacity: dram_blocks,
            // Popped from the end: low ids first, so adjacent allocations tend to be adjacent.
            hbm_free: (0..hbm_blocks).rev().map(HbmBlock).collect(),
            dram_free: (0..dram_blocks).rev().map(DramBlock).collect(),
            quarantine: Vec::new(),
            tables: BTreeMap::new(),
            inflight: BTreeMap::new(),
            pending: Vec::new(),
            illegal: Vec::new(),
        }
    }

    pub fn hbm_capacity(&self) -> u32 {
        self.hbm_capacity
    }

    pub fn dram_capacity(&self) -> u32 {
        self.dram_capacity
    }

    pub fn hbm_free(&self) -> u32 {
        self.hbm_free.len() as u32
    }

    pub fn dram_free(&self) -> u32 {
        self.dram_free.len() as u32
    }

    /// The block table of a request (empty if it has none).
    pub fn table(&self, id: RequestId) -> &[LogicalBlock] {
        self.tables.get(&id).map_or(&[], |t| t.as_slice())
    }

    /// HBM slots of a resident request, in logical order (for the runner's block table).
    pub fn hbm_slots(&self, id: RequestId) -> Vec<HbmBlock> {
        self.table(id).iter().filter_map(|b| b.hbm).collect()
    }

    /// Blocks of `id` held in HBM.
    pub fn held_hbm(&self, id: RequestId) -> u32 {
        self.table(id).iter().filter(|b| b.state.in_hbm()).count() as u32
    }

    /// Blocks of `id` that rotating it out would have to copy.
    pub fn unsynced(&self, id: RequestId) -> u32 {
        let t = self.table(id);
        t.iter().filter(|b| b.state == BlockState::Dirty).count() as u32
    }

    /// Blocks of `id` to copy back to restore it.
    pub fn parked(&self, id: RequestId) -> u32 {
        let t = self.table(id);
        t.iter().filter(|b| b.state == BlockState::Parked).count() as u32
    }

    /// Whether any block of `id` has a copy in flight.
    pub fn any_in_flight(&self, id: RequestId) -> bool {
        self.table(id).iter().any(|b| b.state.in_flight())
    }

    /// Blocks of `id` with a copy in flight: (restoring into HBM, evicting out of it).
    pub fn in_flight_blocks(&self, id: RequestId) -> (u32, u32) {
        self.table(id)
            .iter()
            .fold((0, 0), |(h, d), b| match b.state {
                BlockState::Restoring => (h + 1, d),
                BlockState::Evicting => (h, d + 1),
                _ => (h, d),
            })
    }

    /// Transitions that broke the table (for tests; empty unless there is a bug).
    pub fn illegal_transitions(&self) -> &[(BlockState, BlockState)] {
        &self.illegal
    }

    fn set(&mut self, id: RequestId, i: usize, to: BlockState) {
        let b = &mut self
            .tables
            .get_mut(&id)
            .expect("caller checked the table exists")[i];
        let from = b.state;
        if !allowed(from, to) {
            self.illegal.push((from, to));
            debug_assert!(false, "illegal block transition {from:?} -> {to:?}");
        }
        b.state = to;
    }

    /// Grows `id`'s table to `n` blocks with fresh HBM slots. All or nothing.
    pub fn grow_to(&mut self, id: RequestId, n: usize) -> bool {
        let have = self.table(id).len();
        let need = n.saturating_sub(have);
        if need > self.hbm_free.len() {
            return false;
        }
        let table = self.tables.entry(id).or_default();
        for _ in 0..need {
            let slot = self.hbm_free.pop().expect("checked enough free slots");
            table.push(LogicalBlock {
                hbm: Some(slot),
                dram: None,
                state: BlockState::Dirty,
                inflight: None,
            });
        }
        true
    }

    /// The runner wrote tokens into block `i` of `id`: a synced tail becomes dirty again.
    pub fn wrote(&mut self, id: RequestId, i: usize) {
        if self
            .table(id)
            .get(i)
            .is_some_and(|b| b.state == BlockState::Synced)
        {
            self.set(id, i, BlockState::Dirty);
        }
    }

    /// Eager writeback: D2H copies for the dirty blocks among the first `full` blocks of `id`
    /// (full blocks are immutable), each into its DRAM mirror (allocated now; skipped when
    /// DRAM is full, the block then stays dirty). The copies join the batch being built.
    pub fn writeback(&mut self, id: RequestId, full: usize, out: &mut Vec<D2hCopy>) {
        let n = full.min(self.table(id).len());
        for i in 0..n {
            let b = &self.tables[&id][i];
            if b.state != BlockState::Dirty {
                continue;
            }
            let Some(dram) = b.dram.or_else(|| self.dram_free.pop()) else {
                return;
            };
            let hbm = b.hbm.expect("dirty blocks are in HBM");
            self.tables.get_mut(&id).expect("exists")[i].dram = Some(dram);
            self.set(id, i, BlockState::WritingBack);
            self.pending.push((id, i));
            out.push(D2hCopy {
                src: hbm,
                dst: dram,
            });
        }
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
        if self.mirrors_missing(id) > self.dram_free.len() {
            return false;
        }
        for i in 0..self.table(id).len() {
            let b = &self.tables[&id][i];
            match b.state {
                BlockState::Synced => {
                    let slot = b.hbm.expect("synced blocks are in HBM");
                    self.tables.get_mut(&id).expect("exists")[i].hbm = None;
                    self.hbm_free.push(slot);
                    self.set(id, i, BlockState::Parked);
                }
                BlockState::Dirty => {
                    let hbm = b.hbm.expect("dirty blocks are in HBM");
                    let dram = match b.dram {
                        Some(d) => d,
                        None => self.dram_free.pop().expect("checked enough DRAM"),
                    };
                    self.tables.get_mut(&id).expect("exists")[i].dram = Some(dram);
                    self.set(id, i, BlockState::Evicting);
                    self.pending.push((id, i));
                    out.push(D2hCopy {
                        src: hbm,
                        dst: dram,
                    });
                }
                BlockState::WritingBack => self.set(id, i, BlockState::Evicting),
                s => debug_assert!(false, "evicting a block in state {s:?}"),
            }
        }
        true
    }

    /// Restores a rotary `id`: every parked block gets a fresh HBM slot and an H2D copy.
    /// Returns `false` (and changes nothing) when HBM has no room.
    pub fn restore(&mut self, id: RequestId, out: &mut Vec<H2dCopy>) -> bool {
        let parked = self.parked(id) as usize;
        if parked > self.hbm_free.len() {
            return false;
        }
        for i in 0..self.table(id).len() {
            let b = &self.tables[&id][i];
            if b.state != BlockState::Parked {
                continue;
            }
            let dram = b.dram.expect("parked blocks have a mirror");
            let slot = self.hbm_free.pop().expect("checked enough HBM");
            self.tables.get_mut(&id).expect("exists")[i].hbm = Some(slot);
            self.set(id, i, BlockState::Restoring);
            self.pending.push((id, i));
            out.push(H2dCopy {
                src: dram,
                dst: slot,
            });
        }
        true
    }

    /// The batch just built was submitted as `ticket`: its blocks are now in flight.
    pub fn commit(&mut self, ticket: Ticket) {
        let pending = std::mem::take(&mut self.pending);
        for &(id, i) in &pending {
            if let Some(b) = self.tables.get_mut(&id).and_then(|t| t.get_mut(i)) {
                b.inflight = Some(ticket);
            }
        }
        if !pending.is_empty() {
            self.inflight.insert(ticket, pending);
        }
    }

    /// Whether a batch is being built (blocks waiting for a ticket).
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The copies of `ticket` landed: writebacks become synced, evictions parked (their HBM
    /// slot is free now), restores synced; quarantined slots of that ticket are released.
    pub fn complete(&mut self, ticket: Ticket) {
        for (id, i) in self.inflight.remove(&ticket).unwrap_or_default() {
            let Some(b) = self.tables.get(&id).and_then(|t| t.get(i)) else {
                continue;
            };
            if b.inflight != Some(ticket) {
                continue;
            }
            let to = match b.state {
                BlockState::WritingBack | BlockState::Restoring => BlockState::Synced,
                BlockState::Evicting => BlockState::Parked,
                _ => continue,
            };
            let b = &mut self.tables.get_mut(&id).expect("exists")[i];
            b.inflight = None;
            if to == BlockState::Parked {
                let slot = b.hbm.take().expect("evicting blocks hold their HBM slot");
                self.hbm_free.push(slot);
            }
            self.set(id, i, to);
        }
        let (done, keep): (Vec<_>, Vec<_>) =
            self.quarantine.drain(..).partition(|(t, _)| *t == ticket);
        self.quarantine = keep;
        for (_, slot) in done {
            match slot {
                Slot::Hbm(h) => self.hbm_free.push(h),
                Slot::Dram(d) => self.dram_free.push(d),
            }
        }
    }

    /// Releases every block of `id`. Slots with a copy in flight are quarantined until their
    /// ticket completes, so they are never handed out while the copy still uses them.
    pub fn free(&mut self, id: RequestId) {
        let Some(table) = self.tables.get(&id) else {
            return;
        };
        for i in 0..table.len() {
            self.set(id, i, BlockState::Freed);
        }
        let table = self.tables.remove(&id).expect("exists");
        self.pending.retain(|&(p, _)| p != id);
        for b in table {
            match b.inflight {
                Some(t) => {
                    self.quarantine.extend(b.hbm.map(|h| (t, Slot::Hbm(h))));
                    self.quarantine.extend(b.dram.map(|d| (t, Slot::Dram(d))));
                }
                None => {
                    self.hbm_free.extend(b.hbm);
                    self.dram_free.extend(b.dram);
                }
            }
        }
    }

    /// Checks the pool's invariants: every slot of each tier is exactly one of free,
    /// quarantined or owned by one live block; free + used = capacity; block states agree with
    /// the slots they hold; no illegal transition happened.
    pub fn check(&self) -> Result<(), String> {
        let mut hbm_seen = vec![0u8; self.hbm_capacity as usize];
        let mut dram_seen = vec![0u8; self.dram_capacity as usize];
        let mark = |seen: &mut Vec<u8>, i: u32, what: &str| -> Result<(), String> {
            let c = seen
                .get_mut(i as usize)
                .ok_or_else(|| format!("{what} slot {i} out of range"))?;
            *c += 1;
            if *c > 1 {
                return Err(format!("{what} slot {i} owned twice"));
            }
            Ok(())
        };
        for h in &self.hbm_free {
            mark(&mut hbm_seen, h.0, "HBM")?;
        }
        for d in &self.dram_free {
            mark(&mut dram_seen, d.0, "DRAM")?;
        }
        for (_, slot) in &self.quarantine {
            match slot {
                Slot::Hbm(h) => mark(&mut hbm_seen, h.0, "HBM")?,
                Slot::Dram(d) => mark(&mut dram_seen, d.0, "DRAM")?,
            }
        }
        for (id, table) in &self.tables {
            for (i, b) in table.iter().enumerate() {
                if b.state.in_hbm() != b.hbm.is_some() {
                    return Err(format!(
                        "{id:?} block {i}: {:?} with HBM {:?}",
                        b.state, b.hbm
                    ));
                }
                if b.state.in_flight() != b.inflight.is_some() && !self.pending.contains(&(*id, i))
                {
                    return Err(format!(
                        "{id:?} block {i}: {:?} in flight {:?}",
                        b.state, b.inflight
                    ));
                }
                let needs_mirror = matches!(
                    b.state,
                    BlockState::WritingBack
                        | BlockState::Synced
                        | BlockState::Evicting
                        | BlockState::Parked
                        | BlockState::Restoring
                );
                if needs_mirror && b.dram.is_none() {
                    return Err(format!("{id:?} block {i}: {:?} without a mirror", b.state));
                }
                if let Some(h) = b.hbm {
                    mark(&mut hbm_seen, h.0, "HBM")?;
                }
                if let Some(d) = b.dram {
                    mark(&mut dram_seen, d.0, "DRAM")?;
                }
            }
        }
        if let Some(i) = hbm_seen.iter().position(|&c| c == 0) {
            return Err(format!("HBM slot {i} leaked"));
        }
        if let Some(i) = dram_seen.iter().position(|&c| c == 0) {
            return Err(format!("DRAM slot {i} leaked"));
        }
        if let Some(t) = self.illegal.first() {
            return Err(format!("illegal transition {:?} -> {:?}", t.0, t.1));
        }
        Ok(())
    }
}
