//! The prefix cache's entries: full, immutable blocks named by their [`BlockHash`], each with
//! a DRAM copy (an entry is made from a synced block; only a pool without a DRAM tier makes
//! entries of HBM copies alone) and maybe an HBM copy, reference counts, and a
//! least-recently-used order per tier for what nobody holds.
//!
//! - `refs`: logical blocks of live requests that reference the entry (any state). While above
//!   zero the entry (and its DRAM copy) stays.
//! - `holders`: the requests holding the HBM copy (their block is `Shared`, or `Restoring`
//!   into it). While any, or while its copy-in is in flight, the HBM copy is pinned.
//! - An unpinned HBM copy can be dropped at once (the DRAM copy has the same bytes): it is
//!   in the HBM LRU. An entry nobody references is in the DRAM LRU; evicting it there deletes
//!   it (and its unpinned HBM copy).
//! - The index forgets lazily: deleting or unlisting an entry leaves its hash in the index,
//!   naming a slab slot that no longer holds that listed hash, and every lookup checks the
//!   slot. A later entry with the same hash overwrites it, and once stale names are half the
//!   index they are swept in one pass. In a full cache every block that fills evicts one, and
//!   the eager removal was a random access into a table of a million names each time (a
//!   tenth of a decode step's host time, docs/BENCHMARKS.md "Per-step cost").

use crate::kv::block::{DramBlock, HbmBlock};
use crate::kv::prefix::BlockHash;
use crate::transfer::Ticket;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::collections::{BTreeMap, BTreeSet};
use superinfer_policies::RequestId;

/// Stale names are swept once there are more than this many and they are half the index.
const STALE_SWEEP_MIN: usize = 1024;

/// An entry's place in the cache's slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId(pub u32);

/// One cached block.
#[derive(Clone, Debug)]
pub struct Entry {
    pub hash: BlockHash,
    /// The base namespace's key ([`crate::kv::CacheScope::base_key`]), for dropping it.
    pub base: u64,
    pub hbm: Option<HbmBlock>,
    /// None only in a pool without a DRAM tier (the entry goes with its HBM copy).
    pub dram: Option<DramBlock>,
    pub refs: u32,
    /// Inline for the usual one or two holders: an entry is made per block that fills, and
    /// a heap allocation each would be a `malloc` per block.
    pub holders: SmallVec<[RequestId; 2]>,
    /// A copy of its bytes in flight under this ticket: the copy-in of its HBM copy, or the
    /// writeback of the block it was made from.
    pub inflight: Option<Ticket>,
    /// Its copy-in is in the batch being built (no ticket yet).
    pub pending: bool,
    /// In the index: new requests can hit it (false once its namespace was dropped).
    pub listed: bool,
    last_use: u64,
}

impl Entry {
    /// Its HBM copy must stay: someone holds it or it is being copied in.
    pub fn pinned(&self) -> bool {
        !self.holders.is_empty() || self.inflight.is_some() || self.pending
    }

    fn hbm_evictable(&self) -> bool {
        self.hbm.is_some() && !self.pinned()
    }

    /// Deleting it frees a DRAM slot (an entry without a DRAM copy goes with its HBM copy).
    fn dram_evictable(&self) -> bool {
        self.refs == 0 && self.inflight.is_none() && !self.pending && self.dram.is_some()
    }
}

/// The entries, their index by hash and the LRU orders.
#[derive(Debug, Default)]
pub struct Cache {
    slab: Vec<Option<Entry>>,
    vacant: Vec<u32>,
    /// Names of listed entries, and stale names (see the module docs).
    index: FxHashMap<BlockHash, EntryId>,
    /// Names in `index` that no longer name a listed entry.
    stale: usize,
    /// Entries with an unpinned HBM copy, least recently used first.
    hbm_lru: BTreeSet<(u64, EntryId)>,
    /// Entries with a DRAM copy nobody references, least recently used first.
    dram_lru: BTreeSet<(u64, EntryId)>,
    tick: u64,
    /// Entries whose copy-in each ticket carries.
    by_ticket: BTreeMap<Ticket, Vec<EntryId>>,
    /// Entries whose copy-in is in the batch being built.
    pending: Vec<EntryId>,
    with_hbm: u32,
}

impl Cache {
    /// A cache for at most `entries` entries (the DRAM tier's blocks, or the HBM tier's in a
    /// pool without DRAM), its index and slab sized once: the index holds at most twice the entries in
    /// names (stale ones are swept past half), so it never grows or rehashes while serving
    /// (growing a table of a million names in a decode step was ~10% of the step's host time,
    /// docs/BENCHMARKS.md "Per-step cost").
    pub fn with_capacity(entries: usize) -> Cache {
        let mut index = FxHashMap::default();
        index.reserve(2 * entries + 2 * STALE_SWEEP_MIN);
        Cache {
            slab: Vec::with_capacity(entries),
            index,
            ..Cache::default()
        }
    }

    pub fn get(&self, e: EntryId) -> &Entry {
        self.slab[e.0 as usize].as_ref().expect("live entry")
    }

    /// Changes entry `e` through `f`, keeping the LRU orders true (touching them only where
    /// the entry's place in them changed: most updates are of held entries, in neither).
    pub fn update<T>(&mut self, e: EntryId, f: impl FnOnce(&mut Entry) -> T) -> T {
        let entry = self.slab[e.0 as usize].as_mut().expect("live entry");
        let place = |en: &Entry| (en.last_use, en.hbm_evictable(), en.dram_evictable());
        let (before, had_hbm) = (place(entry), entry.hbm.is_some());
        let out = f(entry);
        let (after, has_hbm) = (place(entry), entry.hbm.is_some());
        if before != after {
            let (old, new) = ((before.0, e), (after.0, e));
            if before.1 {
                self.hbm_lru.remove(&old);
            }
            if before.2 {
                self.dram_lru.remove(&old);
            }
            if after.1 {
                self.hbm_lru.insert(new);
            }
            if after.2 {
                self.dram_lru.insert(new);
            }
        }
        match (had_hbm, has_hbm) {
            (false, true) => self.with_hbm += 1,
            (true, false) => self.with_hbm -= 1,
            _ => {}
        }
        out
    }

    /// Marks `e` as just used (it goes to the back of the LRU orders).
    pub fn touch(&mut self, e: EntryId) {
        self.tick += 1;
        let tick = self.tick;
        self.update(e, |entry| entry.last_use = tick);
    }

    /// One reference of `e` let go, which counts as a use: a finishing request releases its
    /// blocks from the last to the first, so that a conversation's tail, not the start its
    /// next turn would hit, is the first to be evicted.
    pub fn unref(&mut self, e: EntryId) {
        self.tick += 1;
        let tick = self.tick;
        self.update(e, |entry| {
            entry.refs -= 1;
            entry.last_use = tick;
        });
    }

    /// Whether the index's name `hash` → `e` is current (the slot holds that listed hash).
    fn names(&self, hash: &BlockHash, e: EntryId) -> bool {
        self.slab
            .get(e.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|en| en.listed && en.hash == *hash)
    }

    /// The listed entry named `hash`.
    pub fn lookup(&self, hash: BlockHash) -> Option<EntryId> {
        let e = *self.index.get(&hash)?;
        self.names(&hash, e).then_some(e)
    }

    /// One more name in the index went stale; sweeps them all once they are half of it.
    fn forget(&mut self) {
        self.stale += 1;
        if self.stale > STALE_SWEEP_MIN && self.stale * 2 > self.index.len() {
            let mut index = std::mem::take(&mut self.index);
            index.retain(|h, e| self.names(h, *e));
            self.index = index;
            self.stale = 0;
        }
    }

    /// Adds an entry for a synced block (or, without a DRAM tier, a full block in HBM),
    /// referenced and held by `holder` if given (else nobody's, and cached). The hash must not
    /// be listed yet.
    pub fn insert(
        &mut self,
        hash: BlockHash,
        base: u64,
        hbm: Option<HbmBlock>,
        dram: Option<DramBlock>,
        holder: Option<RequestId>,
    ) -> EntryId {
        let entry = Entry {
            hash,
            base,
            hbm,
            dram,
            refs: u32::from(holder.is_some()),
            holders: holder.into_iter().collect(),
            inflight: None,
            pending: false,
            listed: true,
            last_use: 0,
        };
        let held = entry.refs > 0;
        let id = match self.vacant.pop() {
            Some(i) => {
                self.slab[i as usize] = Some(entry);
                EntryId(i)
            }
            None => {
                self.slab.push(Some(entry));
                EntryId(self.slab.len() as u32 - 1)
            }
        };
        if let Some(prev) = self.index.insert(hash, id) {
            // `id`'s slot was vacant until now: a name pointing at it was stale.
            let current = prev != id && self.names(&hash, prev);
            debug_assert!(!current, "hash listed twice");
            if !current {
                self.stale -= 1;
            }
        }
        if hbm.is_some() {
            self.with_hbm += 1;
        }
        self.tick += 1;
        let tick = self.tick;
        if held {
            // In neither LRU order (it is held and referenced): only its time changes.
            self.slab[id.0 as usize]
                .as_mut()
                .expect("just made")
                .last_use = tick;
        } else {
            self.update(id, |entry| entry.last_use = tick);
        }
        id
    }

    /// Deletes entry `e` (nobody references it, no copy in flight); returns its slots.
    pub fn remove(&mut self, e: EntryId) -> (Option<HbmBlock>, Option<DramBlock>) {
        let last_use = self.get(e).last_use;
        self.dram_lru.remove(&(last_use, e));
        self.remove_unlisted(e)
    }

    /// Deletes the least recently used entry with a DRAM copy nobody references; returns its
    /// slots. (One descent of the LRU order: a full cache does this for every block written
    /// back.)
    pub fn remove_lru(&mut self) -> Option<(Option<HbmBlock>, DramBlock)> {
        let (_, e) = self.dram_lru.pop_first()?;
        let (hbm, dram) = self.remove_unlisted(e);
        Some((
            hbm,
            dram.expect("entries in the DRAM order have a DRAM copy"),
        ))
    }

    /// [`Cache::remove`] of an entry already out of the DRAM LRU order.
    fn remove_unlisted(&mut self, e: EntryId) -> (Option<HbmBlock>, Option<DramBlock>) {
        let entry = self.slab[e.0 as usize].take().expect("live entry");
        debug_assert!(entry.refs == 0 && entry.inflight.is_none() && !entry.pending);
        if entry.hbm_evictable() {
            self.hbm_lru.remove(&(entry.last_use, e));
        }
        if entry.hbm.is_some() {
            self.with_hbm -= 1;
        }
        self.vacant.push(e.0);
        if entry.listed {
            // Its name stays in the index, stale (the slot is vacant now).
            self.forget();
        }
        (entry.hbm, entry.dram)
    }

    /// Takes `e` out of the index: no new hits; it goes once nobody references it.
    pub fn unlist(&mut self, e: EntryId) {
        let was = self.update(e, |entry| std::mem::replace(&mut entry.listed, false));
        if was {
            self.forget();
        }
    }

    /// Drops the HBM copy of the least recently used entry with an unpinned one (its DRAM
    /// copy stays, and its place in the DRAM order: that does not depend on the HBM copy);
    /// returns the entry and the slot. One descent of the LRU order: a full HBM tier does this
    /// for every block a running request grows by.
    pub fn drop_lru_hbm(&mut self) -> Option<(EntryId, HbmBlock)> {
        let (_, e) = self.hbm_lru.pop_first()?;
        let entry = self.slab[e.0 as usize].as_mut().expect("live entry");
        let slot = entry
            .hbm
            .take()
            .expect("entries in the HBM order have an HBM copy");
        self.with_hbm -= 1;
        Some((e, slot))
    }

    /// HBM copies that could be dropped now.
    pub fn hbm_evictable(&self) -> u32 {
        self.hbm_lru.len() as u32
    }

    /// Entries with a DRAM copy that could be deleted now.
    pub fn dram_evictable(&self) -> u32 {
        self.dram_lru.len() as u32
    }

    /// Entries with an HBM copy, and entries in all.
    pub fn blocks_per_tier(&self) -> (u32, u32) {
        (self.with_hbm, (self.slab.len() - self.vacant.len()) as u32)
    }

    /// Entry `e`'s copy-in joins the batch being built.
    pub fn copy_in_pending(&mut self, e: EntryId) {
        self.update(e, |entry| entry.pending = true);
        self.pending.push(e);
    }

    /// Entry `e`'s bytes are still being copied under `ticket` (the writeback of the block it
    /// was made from): pinned until that lands.
    pub fn track(&mut self, e: EntryId, ticket: Ticket) {
        self.update(e, |entry| entry.inflight = Some(ticket));
        self.by_ticket.entry(ticket).or_default().push(e);
    }

    /// The batch was submitted: its copy-ins are in flight under `ticket`.
    pub fn commit(&mut self, ticket: Option<Ticket>) {
        for e in std::mem::take(&mut self.pending) {
            let Some(t) = ticket else {
                debug_assert!(false, "a copy-in without a ticket");
                continue;
            };
            self.update(e, |entry| {
                entry.pending = false;
                entry.inflight = Some(t);
            });
            self.by_ticket.entry(t).or_default().push(e);
        }
    }

    /// The copies of `ticket` landed: entries copied in by it are settled. Returns those that
    /// nobody references and that were dropped from the index meanwhile (to delete).
    pub fn complete(&mut self, ticket: Ticket) -> Vec<EntryId> {
        let mut orphans = Vec::new();
        for e in self.by_ticket.remove(&ticket).unwrap_or_default() {
            let orphan = self.update(e, |entry| {
                entry.inflight = None;
                entry.refs == 0 && !entry.listed
            });
            if orphan {
                orphans.push(e);
            }
        }
        orphans
    }

    /// Every live entry (for checks and for dropping a namespace).
    pub fn entries(&self) -> impl Iterator<Item = (EntryId, &Entry)> {
        self.slab
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (EntryId(i as u32), e)))
    }

    /// The current names of the index (for checks).
    pub fn listed(&self) -> impl Iterator<Item = (&BlockHash, &EntryId)> {
        self.index.iter().filter(|(h, e)| self.names(h, **e))
    }

    /// Names in the index that are stale, counted by walking it (for checks: the count kept
    /// must match).
    pub fn stale_names(&self) -> (usize, usize) {
        let walked = self
            .index
            .iter()
            .filter(|(h, e)| !self.names(h, **e))
            .count();
        (walked, self.stale)
    }

    /// Entries whose copy-in is in flight, per ticket (for checks).
    pub fn in_flight(&self) -> impl Iterator<Item = (&Ticket, &Vec<EntryId>)> {
        self.by_ticket.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(i: u64) -> BlockHash {
        BlockHash(u128::from(i) * 0x9e37_79b9_7f4a_7c15)
    }

    #[test]
    fn names_of_deleted_entries_are_forgotten_lazily_and_swept() {
        let mut c = Cache::default();
        let ids: Vec<EntryId> = (0..3000)
            .map(|i| c.insert(hash(i), 0, None, Some(DramBlock(i as u32)), None))
            .collect();
        // Deleted entries miss at once; their slots are reused by other hashes.
        for (i, &e) in ids.iter().enumerate().take(1000) {
            c.remove(e);
            assert_eq!(c.lookup(hash(i as u64)), None);
        }
        assert_eq!(c.stale_names(), (1000, 1000));
        for i in 3000..3500 {
            let e = c.insert(hash(i), 0, None, Some(DramBlock(i as u32)), None);
            assert_eq!(c.lookup(hash(i)), Some(e));
        }
        for i in 0..1000 {
            assert_eq!(c.lookup(hash(i)), None, "a reused slot names another hash");
        }
        // A hash listed again overwrites its stale name.
        let again = c.insert(hash(7), 0, None, Some(DramBlock(7)), None);
        assert_eq!(c.lookup(hash(7)), Some(again));
        assert_eq!(c.stale_names(), (999, 999));
        // Unlisting leaves a stale name too; past half the index they are swept.
        for &e in &ids[1000..2500] {
            c.unlist(e);
        }
        let (walked, kept) = c.stale_names();
        assert_eq!(walked, kept);
        assert!(c.index.len() < 3500, "swept: {} names", c.index.len());
        assert_eq!(c.listed().count(), 500 + 500 + 1);
        for i in 1000..2500 {
            assert_eq!(c.lookup(hash(i)), None);
        }
        for i in 2500..3000 {
            assert_eq!(c.lookup(hash(i)), Some(ids[i as usize]));
        }
    }
}
