//! The KV pool: HBM and DRAM free lists, every request's block table, and the in-flight
//! bookkeeping that keeps a block with a copy in flight from being reused. The copies
//! themselves (eager writeback, eviction, restore, and their tickets landing) are in
//! [`copies`].
//!
//! Every logical block has an HBM slot (while resident), a DRAM mirror (once written back or
//! evicted) and a state from [`BlockState`]; `synced` is the state `Synced`. Allocation failure
//! is a value (`false` / `None`), never an error.
//!
//! Per-step queries cost O(1) per request, whatever its context length: each table keeps a
//! count of its blocks per state, the pool keeps the blocks in flight per direction, and eager
//! writeback resumes from a per-table watermark below which no block can be dirty (full blocks
//! are immutable). Free lists hand out the lowest free slot first, so that a request's blocks
//! tend to be adjacent and their copies merge.

mod cache;
mod check;
mod copies;
mod fault;
mod shared;

pub use cache::EntryId;
pub use shared::HitCost;

use super::block::{DramBlock, HbmBlock};
use super::lifecycle::{allowed, BlockState};
use crate::transfer::Ticket;
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};
use superinfer_policies::RequestId;

/// One logical block of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalBlock {
    pub hbm: Option<HbmBlock>,
    pub dram: Option<DramBlock>,
    pub state: BlockState,
    /// The ticket of the copy in flight, if any.
    pub inflight: Option<Ticket>,
    /// The prefix-cache entry it references (`Shared`, `SharedOut`, or `Restoring` into the
    /// entry's HBM copy); the entry owns `hbm` and `dram` then.
    pub entry: Option<EntryId>,
}

/// A slot of either tier, for the quarantine of slots released while a copy still uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Hbm(HbmBlock),
    Dram(DramBlock),
}

/// Blocks waiting for the ticket of the batch being built (assigned by [`KvPool::commit`]),
/// and whether each carries a copy of its own (a block waiting on a shared entry's copy-in
/// does not).
type Pending = Vec<(RequestId, usize, bool)>;

/// One request's blocks with their per-state counts.
#[derive(Clone, Debug, Default)]
struct Table {
    blocks: Vec<LogicalBlock>,
    counts: [u32; BlockState::COUNT],
    /// No block below this index is dirty (eager writeback resumes here).
    clean_below: usize,
    /// A restore landed since the last write: the block the next write goes to may be synced
    /// (a restored partial tail). Full blocks are never written again, so only the first
    /// write after a restore can hit a synced block; `wrote` looks at the block only then.
    restored: bool,
    /// Prefix-cache hashes of its full blocks (block `i` has `hashes[i]` once it is full).
    hashes: Vec<crate::kv::BlockHash>,
    /// The key of its namespace's base (entries made from its blocks carry it).
    base: u64,
    /// Its `Shared` blocks whose entry nobody else holds (rotating it out frees those).
    sole: u32,
}

impl Table {
    fn count(&self, s: BlockState) -> u32 {
        self.counts[s.index()]
    }

    /// Moves block `i` to `to`, keeping the counts; a transition the table does not allow is
    /// recorded in `illegal`.
    fn set(&mut self, i: usize, to: BlockState, illegal: &mut Vec<(BlockState, BlockState)>) {
        let b = &mut self.blocks[i];
        let from = b.state;
        if !allowed(from, to) {
            illegal.push((from, to));
            debug_assert!(false, "illegal block transition {from:?} -> {to:?}");
        }
        b.state = to;
        self.counts[from.index()] -= 1;
        self.counts[to.index()] += 1;
    }
}

/// A request's block counts: table length, blocks in HBM that rotating it out frees (its
/// own, and shared ones nobody else holds), dirty (unsynced) and parked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockSummary {
    pub len: u32,
    pub held_hbm: u32,
    pub dirty: u32,
    pub parked: u32,
}

/// Free slots of one tier, lowest first.
#[derive(Clone, Debug)]
struct FreeSlots(BTreeSet<u32>);

impl FreeSlots {
    fn all(n: u32) -> FreeSlots {
        FreeSlots((0..n).collect())
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn take(&mut self) -> Option<u32> {
        self.0.pop_first()
    }

    fn give(&mut self, slot: u32) {
        let fresh = self.0.insert(slot);
        debug_assert!(fresh, "slot {slot} freed twice");
    }
}

/// Both tiers and all block tables.
#[derive(Debug)]
pub struct KvPool {
    hbm_capacity: u32,
    dram_capacity: u32,
    hbm_free: FreeSlots,
    dram_free: FreeSlots,
    quarantine: Vec<(Ticket, Slot)>,
    /// Hashed: every step looks each running request's table up several times.
    tables: FxHashMap<RequestId, Table>,
    inflight: BTreeMap<Ticket, Vec<(RequestId, usize)>>,
    /// Blocks each ticket copies: (host-to-device, device-to-host), until it completes.
    ticket_blocks: BTreeMap<Ticket, (u32, u32)>,
    /// Σ of `ticket_blocks`: the blocks in flight per direction.
    flight: (u32, u32),
    pending: Pending,
    /// Tables whose `restored` is set: while none is, `wrote` has nothing to look at.
    restored_tables: u32,
    /// Transitions seen that the table does not allow (always empty unless there is a bug).
    illegal: Vec<(BlockState, BlockState)>,
    /// The prefix cache's entries (`kv/pool/cache.rs`).
    cache: cache::Cache,
    /// Full blocks become cache entries; off: freed as before.
    prefix: bool,
    /// Entries may live in DRAM only (off: an HBM-only cache; entries leave with their HBM
    /// copy unless a rotary request still references them).
    dram_level: bool,
}

impl KvPool {
    pub fn new(hbm_blocks: u32, dram_blocks: u32) -> KvPool {
        KvPool {
            hbm_capacity: hbm_blocks,
            dram_capacity: dram_blocks,
            hbm_free: FreeSlots::all(hbm_blocks),
            dram_free: FreeSlots::all(dram_blocks),
            quarantine: Vec::new(),
            tables: FxHashMap::default(),
            inflight: BTreeMap::new(),
            ticket_blocks: BTreeMap::new(),
            flight: (0, 0),
            pending: Vec::new(),
            restored_tables: 0,
            illegal: Vec::new(),
            cache: cache::Cache::default(),
            prefix: false,
            dram_level: true,
        }
    }

    /// Turns the prefix cache on (`dram_level`: entries may live in DRAM only). Without a
    /// DRAM tier the cache is HBM-only whatever `dram_level` says: its entries are full blocks
    /// of finished requests left in HBM, dropped when their slot is needed.
    pub fn with_prefix_cache(mut self, on: bool, dram_level: bool) -> KvPool {
        self.prefix = on;
        self.dram_level = dram_level && self.dram_capacity > 0;
        if on {
            let entries = self.dram_capacity.max(self.hbm_capacity);
            self.cache = cache::Cache::with_capacity(entries as usize);
        }
        self
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

    /// The prefix-cache hashes a request's table knows (its full blocks' names; for checks).
    pub fn table_hashes(&self, id: RequestId) -> &[crate::kv::BlockHash] {
        self.tables.get(&id).map_or(&[], |t| t.hashes.as_slice())
    }

    /// The block table of a request (empty if it has none).
    pub fn table(&self, id: RequestId) -> &[LogicalBlock] {
        self.tables.get(&id).map_or(&[], |t| t.blocks.as_slice())
    }

    fn count(&self, id: RequestId, s: BlockState) -> u32 {
        self.tables.get(&id).map_or(0, |t| t.count(s))
    }

    /// One request's block counts, in one lookup (for the policy's view).
    pub fn summary(&self, id: RequestId) -> BlockSummary {
        use BlockState::*;
        let Some(t) = self.tables.get(&id) else {
            return BlockSummary::default();
        };
        BlockSummary {
            len: t.blocks.len() as u32,
            held_hbm: [Dirty, WritingBack, Synced, Evicting, Restoring]
                .into_iter()
                .map(|s| t.count(s))
                .sum::<u32>()
                + t.sole,
            dirty: t.count(Dirty),
            parked: t.count(Parked),
        }
    }

    /// HBM slots of a resident request, in logical order (for the runner's block table).
    pub fn hbm_slots(&self, id: RequestId) -> Vec<HbmBlock> {
        self.table(id).iter().filter_map(|b| b.hbm).collect()
    }

    /// Blocks of `id` held in HBM.
    pub fn held_hbm(&self, id: RequestId) -> u32 {
        self.summary(id).held_hbm
    }

    /// Blocks of `id` that rotating it out would have to copy.
    pub fn unsynced(&self, id: RequestId) -> u32 {
        self.count(id, BlockState::Dirty)
    }

    /// Blocks of `id` to copy back to restore it.
    pub fn parked(&self, id: RequestId) -> u32 {
        self.count(id, BlockState::Parked)
    }

    /// Whether any block of `id` has a copy in flight.
    pub fn any_in_flight(&self, id: RequestId) -> bool {
        let (h, d) = self.in_flight_blocks(id);
        h + d > 0
    }

    /// Blocks of `id` with a copy in flight: (restoring into HBM, evicting or being written
    /// back out of it).
    pub fn in_flight_blocks(&self, id: RequestId) -> (u32, u32) {
        use BlockState::*;
        (
            self.count(id, Restoring),
            self.count(id, Evicting) + self.count(id, WritingBack),
        )
    }

    /// Blocks of every submitted, unfinished copy batch, per direction (host-to-device,
    /// device-to-host), including copies of requests that have ended since (their slots are
    /// quarantined until the copy lands).
    pub fn blocks_in_flight(&self) -> (u32, u32) {
        self.flight
    }

    /// Transitions that broke the table (for tests; empty unless there is a bug).
    pub fn illegal_transitions(&self) -> &[(BlockState, BlockState)] {
        &self.illegal
    }

    fn set(&mut self, id: RequestId, i: usize, to: BlockState) {
        self.tables
            .get_mut(&id)
            .expect("caller checked the table exists")
            .set(i, to, &mut self.illegal);
    }

    fn block(&self, id: RequestId, i: usize) -> &LogicalBlock {
        &self.tables[&id].blocks[i]
    }

    fn block_mut(&mut self, id: RequestId, i: usize) -> &mut LogicalBlock {
        &mut self.tables.get_mut(&id).expect("exists").blocks[i]
    }

    /// Grows `id`'s table to `n` blocks with fresh HBM slots. All or nothing.
    pub fn grow_to(&mut self, id: RequestId, n: usize) -> bool {
        let have = self.table(id).len();
        let need = n.saturating_sub(have);
        if need == 0 {
            return true;
        }
        if need > self.hbm_available() as usize {
            return false;
        }
        self.tables.entry(id).or_default();
        for _ in 0..need {
            let slot = self.take_hbm().expect("checked enough free slots");
            let table = self.tables.get_mut(&id).expect("made above");
            table.blocks.push(LogicalBlock {
                hbm: Some(HbmBlock(slot)),
                dram: None,
                state: BlockState::Dirty,
                inflight: None,
                entry: None,
            });
            table.counts[BlockState::Dirty.index()] += 1;
        }
        true
    }

    /// The runner wrote tokens into block `i` of `id`: a synced tail becomes dirty again.
    pub fn wrote(&mut self, id: RequestId, i: usize) {
        // The usual step: no restore landed anywhere, and release builds look at nothing (a
        // lookup of the table would cost a cache miss per request per step).
        if self.restored_tables == 0 && !cfg!(debug_assertions) {
            return;
        }
        let Some(t) = self.tables.get_mut(&id) else {
            return;
        };
        let restored = std::mem::take(&mut t.restored);
        self.restored_tables -= u32::from(restored);
        // Writes go to the first block past the full ones, and a cache hit stops before the
        // last prompt token, so nothing writes a shared block. Checked in debug builds (the
        // randomized tests), not on the hot path: reading every written block's state costs a
        // cache miss per request per step.
        if !restored && !cfg!(debug_assertions) {
            return;
        }
        let state = t.blocks.get(i).map(|b| b.state);
        if state.is_some_and(BlockState::is_shared) {
            self.illegal.push((BlockState::Shared, BlockState::Dirty));
            debug_assert!(false, "a write into shared block {i} of {id:?}");
            return;
        }
        if restored && state == Some(BlockState::Synced) {
            t.set(i, BlockState::Dirty, &mut self.illegal);
            t.clean_below = t.clean_below.min(i);
        }
    }

    /// Releases every block of `id`. Slots with a copy in flight are quarantined until their
    /// ticket completes, so they are never handed out while the copy still uses them.
    pub fn free(&mut self, id: RequestId) {
        self.free_keeping(id, None);
    }

    /// [`Self::free`], except that blocks with a copy in flight under `faulty` (a batch that
    /// failed or timed out) never become cache entries: their DRAM copy is not trusted.
    fn free_keeping(&mut self, id: RequestId, faulty: Option<Ticket>) {
        let Some(table) = self.tables.get(&id) else {
            return;
        };
        // Last block first: the entries it leaves are stamped in that order, so the tail of a
        // history is evicted before the prefix that its next turn starts with.
        for i in (0..table.blocks.len()).rev() {
            // Shared blocks go back to their entry; synced full blocks stay as cache entries.
            let b = self.block(id, i);
            let trusted = faulty.is_none() || b.inflight != faulty;
            match b.state {
                BlockState::Shared | BlockState::SharedOut => self.release(id, i),
                BlockState::Restoring if b.entry.is_some() => self.release(id, i),
                BlockState::Synced | BlockState::Parked | BlockState::WritingBack if trusted => {
                    self.keep_on_free(id, i)
                }
                // Without a DRAM tier nothing is synced: full blocks are cached from HBM.
                BlockState::Dirty if self.dram_capacity == 0 => self.keep_on_free(id, i),
                _ => {}
            }
            self.set(id, i, BlockState::Freed);
        }
        let table = self.tables.remove(&id).expect("exists");
        self.restored_tables -= u32::from(table.restored);
        self.pending.retain(|&(p, _, _)| p != id);
        for b in table.blocks {
            if b.entry.is_some() {
                continue;
            }
            match b.inflight {
                Some(t) => {
                    self.quarantine.extend(b.hbm.map(|h| (t, Slot::Hbm(h))));
                    self.quarantine.extend(b.dram.map(|d| (t, Slot::Dram(d))));
                }
                None => {
                    if let Some(h) = b.hbm {
                        self.hbm_free.give(h.0);
                    }
                    if let Some(d) = b.dram {
                        self.dram_free.give(d.0);
                    }
                }
            }
        }
    }
}
