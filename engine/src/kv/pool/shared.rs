//! The pool's prefix-cache operations: slots that fall back on evicting unused cache entries,
//! hits at admission, full blocks turning into entries, and references let go and released.
//! The entries themselves live in [`super::cache`].

use super::cache::{Cache, EntryId};
use super::{KvPool, LogicalBlock, Table};
use crate::kv::block::{DramBlock, HbmBlock};
use crate::kv::lifecycle::BlockState;
use crate::kv::prefix::BlockHash;
use crate::transfer::H2dCopy;
use superinfer_policies::RequestId;

/// What a run of cached blocks costs to bring into HBM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HitCost {
    /// Blocks found (a prefix of the hashes asked about).
    pub blocks: u32,
    /// HBM slots they take from what is available (an HBM copy someone holds costs none).
    pub slots: u32,
    /// Host-to-device copies they need (entries found only in DRAM).
    pub copies: u32,
    /// Blocks found with an HBM copy (the rest come from DRAM).
    pub in_hbm: u32,
}

impl KvPool {
    /// HBM slots available: free, plus cached copies nobody holds (dropped on demand).
    pub fn hbm_available(&self) -> u32 {
        self.hbm_free.len() as u32 + self.cache.hbm_evictable()
    }

    /// DRAM slots available: free, plus cache entries nobody references.
    pub fn dram_available(&self) -> u32 {
        self.dram_free.len() as u32 + self.cache.dram_evictable()
    }

    /// Prefix-cache blocks with an HBM copy, and with a DRAM copy (every entry has one,
    /// except in a pool without a DRAM tier: none has).
    pub fn prefix_blocks(&self) -> (u32, u32) {
        let (hbm, all) = self.cache.blocks_per_tier();
        (hbm, if self.dram_capacity == 0 { 0 } else { all })
    }

    /// Whether full blocks are kept as a prefix cache.
    pub fn prefix_cache(&self) -> bool {
        self.prefix
    }

    /// A free HBM slot, or the slot of the least recently used cached copy nobody holds.
    pub(super) fn take_hbm(&mut self) -> Option<u32> {
        if let Some(s) = self.hbm_free.take() {
            return Some(s);
        }
        let (e, slot) = self.cache.drop_lru_hbm()?;
        let entry = self.cache.get(e);
        // Nobody holds its HBM copy, so a reference is a rotary request's, and rotating out
        // needs a DRAM tier, where every entry has a DRAM copy.
        debug_assert!(entry.dram.is_some() || entry.refs == 0);
        if !self.dram_level && entry.refs == 0 {
            // An HBM-only cache keeps no entry without its HBM copy.
            self.delete_entry(e);
        }
        Some(slot.0)
    }

    /// A free DRAM slot, or that of the least recently used entry nobody references (deleted).
    pub(super) fn take_dram(&mut self) -> Option<u32> {
        if let Some(s) = self.dram_free.take() {
            return Some(s);
        }
        let (hbm, dram) = self.cache.remove_lru()?;
        if let Some(h) = hbm {
            self.hbm_free.give(h.0);
        }
        Some(dram.0)
    }

    /// Deletes an entry nobody references and gives its slots back.
    pub(super) fn delete_entry(&mut self, e: EntryId) {
        let (hbm, dram) = self.cache.remove(e);
        if let Some(h) = hbm {
            self.hbm_free.give(h.0);
        }
        if let Some(d) = dram {
            self.dram_free.give(d.0);
        }
    }

    /// The cached run at the start of `hashes` and what bringing it in costs.
    pub fn hit_cost(&self, hashes: &[BlockHash]) -> HitCost {
        let mut c = HitCost::default();
        if !self.prefix {
            return c;
        }
        for &h in hashes {
            let Some(e) = self.cache.lookup(h) else {
                break;
            };
            let entry = self.cache.get(e);
            match entry.hbm {
                Some(_) => {
                    c.slots += u32::from(!entry.pinned());
                    c.in_hbm += 1;
                }
                None if self.dram_level => {
                    c.slots += 1;
                    c.copies += 1;
                }
                None => break,
            }
            c.blocks += 1;
        }
        c
    }

    /// What restoring a rotary `id` costs: its parked blocks, and its shared blocks whose
    /// entry's HBM copy nobody else holds.
    pub fn restore_cost(&self, id: RequestId) -> HitCost {
        let Some(t) = self.tables.get(&id) else {
            return HitCost::default();
        };
        let parked = t.count(BlockState::Parked);
        let mut c = HitCost {
            blocks: parked,
            slots: parked,
            copies: parked,
            in_hbm: 0,
        };
        if t.count(BlockState::SharedOut) == 0 {
            return c;
        }
        for b in t.blocks.iter().filter(|b| b.state == BlockState::SharedOut) {
            let entry = self
                .cache
                .get(b.entry.expect("shared blocks have an entry"));
            c.blocks += 1;
            match entry.hbm {
                Some(_) => {
                    c.slots += u32::from(!entry.pinned());
                    c.in_hbm += 1;
                }
                None => {
                    c.slots += 1;
                    c.copies += 1;
                }
            }
        }
        c
    }

    /// Admits `id` with the cached run at the start of `hashes` and fresh blocks up to
    /// `total`: hits in HBM are used in place, hits in DRAM copied in (into `out`). `base`
    /// is its namespace's base key; its table starts with room for `expected` blocks. Returns
    /// the hit blocks in HBM and from DRAM, or `None` (changing nothing) when HBM has no room.
    pub fn admit(
        &mut self,
        id: RequestId,
        hashes: &[BlockHash],
        (total, expected): (usize, usize),
        base: u64,
        out: &mut Vec<H2dCopy>,
    ) -> Option<(u32, u32)> {
        let cost = self.hit_cost(hashes);
        let fresh = total.saturating_sub(cost.blocks as usize) as u32;
        if cost.slots + fresh > self.hbm_available() || self.tables.contains_key(&id) {
            return None;
        }
        let hits = &hashes[..cost.blocks as usize];
        let table = self.tables.entry(id).or_default();
        table.base = base;
        table.blocks.reserve(expected.max(total));
        let named = if self.prefix { expected } else { 0 };
        table.hashes = Vec::with_capacity(named.max(hits.len()));
        table.hashes.extend_from_slice(hits);
        for &h in hits {
            let e = self.cache.lookup(h).expect("costed above");
            let dram = self.cache.get(e).dram;
            self.cache.update(e, |entry| entry.refs += 1);
            let table = self.tables.get_mut(&id).expect("made above");
            table.blocks.push(LogicalBlock {
                hbm: None,
                dram,
                state: BlockState::SharedOut,
                inflight: None,
                entry: Some(e),
            });
            table.counts[BlockState::SharedOut.index()] += 1;
        }
        self.hold_shared(id, out);
        let grown = self.grow_to(id, total);
        debug_assert!(grown, "costed the fresh blocks above");
        Some((cost.in_hbm, cost.blocks - cost.in_hbm))
    }

    /// Full blocks of `id` below `full` have the hashes `hashes[..full]` (its KV holds them):
    /// the table learns the new ones, and any already synced becomes a cache entry.
    pub fn sealed(&mut self, id: RequestId, full: usize, hashes: &[BlockHash]) {
        if !self.prefix {
            return;
        }
        let Some(t) = self.tables.get_mut(&id) else {
            return;
        };
        let upto = full.min(hashes.len()).min(t.blocks.len());
        let from = t.hashes.len();
        if upto <= from {
            return;
        }
        for &h in &hashes[from..upto] {
            t.hashes.push(h);
        }
        // A block is named as it fills, before its writeback: one already synced is rare (a
        // restored one), and with none in the table its blocks need not be looked at.
        if t.count(BlockState::Synced) == 0 {
            return;
        }
        for i in from..upto {
            if self.block(id, i).state == BlockState::Synced {
                self.donate(id, i);
            }
        }
    }

    /// Synced full block `i` of `id` becomes a cache entry that `id` holds (unless its hash
    /// is cached already: then it stays private).
    pub(super) fn donate(&mut self, id: RequestId, i: usize) {
        if let Some(t) = self.tables.get_mut(&id) {
            donate_in(t, id, i, self.prefix, &mut self.cache, &mut self.illegal);
        }
    }

    /// Block `i` of a finishing `id`, synced, parked or being written back (or, in a pool
    /// without a DRAM tier, dirty): it stays as an entry nobody references (unless its hash is
    /// cached already, or it is not full). One being written back is pinned until its copy
    /// lands (a hit in the meantime waits for it).
    pub(super) fn keep_on_free(&mut self, id: RequestId, i: usize) {
        let t = &self.tables[&id];
        let Some(&hash) = t.hashes.get(i) else {
            return;
        };
        let b = &t.blocks[i];
        let parked = b.state == BlockState::Parked;
        if !self.prefix || (parked && !self.dram_level) || self.cache.lookup(hash).is_some() {
            return;
        }
        let dram = match b.dram {
            Some(d) => Some(d),
            // A full block in HBM with no DRAM tier to mirror it: cached by its HBM copy.
            None if self.dram_capacity == 0 && b.state == BlockState::Dirty => None,
            None => {
                debug_assert!(false, "a {:?} block without a mirror", b.state);
                return;
            }
        };
        let (hbm, writing) = (b.hbm, b.inflight);
        let e = self.cache.insert(hash, t.base, hbm, dram, None);
        if let Some(ticket) = writing {
            self.cache.track(e, ticket);
        }
        self.block_mut(id, i).entry = Some(e);
    }

    /// `id` rotates out: its shared block `i` lets go of the entry's HBM copy (kept for others,
    /// or cached) but keeps the reference.
    pub(super) fn let_go(&mut self, id: RequestId, i: usize) {
        let e = self
            .block(id, i)
            .entry
            .expect("shared blocks have an entry");
        self.unhold(e, id);
        self.block_mut(id, i).hbm = None;
        self.set(id, i, BlockState::SharedOut);
    }

    /// Shared block `i` of `id` takes the entry's HBM copy again: in place, waiting on a
    /// copy-in already under way, or copying the entry in now (into `out`).
    pub(super) fn hold_again(&mut self, id: RequestId, i: usize, out: &mut Vec<H2dCopy>) {
        let e = self
            .block(id, i)
            .entry
            .expect("shared blocks have an entry");
        let entry = self.cache.get(e);
        let (hbm, inflight, pending, dram) = (entry.hbm, entry.inflight, entry.pending, entry.dram);
        let slot = match hbm {
            Some(h) => h,
            None => {
                let slot = HbmBlock(self.take_hbm().expect("the caller checked the room"));
                self.cache.update(e, |entry| entry.hbm = Some(slot));
                self.cache.copy_in_pending(e);
                out.push(H2dCopy {
                    // Only a DRAM tier's entries lose their HBM copy while referenced.
                    src: dram.expect("an entry out of HBM has a DRAM copy"),
                    dst: slot,
                });
                self.pending.push((id, i, true));
                self.block_mut(id, i).hbm = Some(slot);
                self.set(id, i, BlockState::Restoring);
                self.hold(e, id);
                self.cache.touch(e);
                return;
            }
        };
        self.block_mut(id, i).hbm = Some(slot);
        if let Some(t) = inflight {
            self.block_mut(id, i).inflight = Some(t);
            self.inflight.entry(t).or_default().push((id, i));
            self.set(id, i, BlockState::Restoring);
        } else if pending {
            self.pending.push((id, i, false));
            self.set(id, i, BlockState::Restoring);
        } else {
            self.set(id, i, BlockState::Shared);
        }
        self.hold(e, id);
        self.cache.touch(e);
    }

    /// A finishing `id` releases its reference of block `i` (the state change is the
    /// caller's). An entry nobody references stays cached, unless its namespace was dropped
    /// or (HBM-only cache) it has no HBM copy.
    pub(super) fn release(&mut self, id: RequestId, i: usize) {
        let b = self.block(id, i);
        let e = b.entry.expect("shared blocks have an entry");
        if matches!(b.state, BlockState::Shared | BlockState::Restoring) {
            self.unhold(e, id);
        }
        self.cache.unref(e);
        let entry = self.cache.get(e);
        let idle = entry.refs == 0 && entry.inflight.is_none() && !entry.pending;
        if idle && (!entry.listed || (!self.dram_level && entry.hbm.is_none())) {
            self.delete_entry(e);
        }
    }

    /// Whether the entry block `b` references has an HBM copy.
    fn entry_in_hbm(&self, b: &LogicalBlock) -> bool {
        b.entry.is_some_and(|e| self.cache.get(e).hbm.is_some())
    }

    /// Every `SharedOut` block of `id` takes its entry's HBM copy again (a restore, or the
    /// hits of an admission): those whose entry is in HBM first, so that the slots the others
    /// take cannot evict the copies they use.
    pub(super) fn hold_shared(&mut self, id: RequestId, out: &mut Vec<H2dCopy>) {
        for in_hbm in [true, false] {
            for i in 0..self.table(id).len() {
                let b = self.block(id, i);
                if b.state == BlockState::SharedOut && self.entry_in_hbm(b) == in_hbm {
                    self.hold_again(id, i, out);
                }
            }
        }
    }

    /// `id` holds entry `e`'s HBM copy; the sole-holder counts follow.
    fn hold(&mut self, e: EntryId, id: RequestId) {
        let (n, first) = self.cache.update(e, |entry| {
            entry.holders.push(id);
            (entry.holders.len(), entry.holders[0])
        });
        match n {
            1 => self.table_mut(first).sole += 1,
            2 => self.table_mut(first).sole -= 1,
            _ => {}
        }
    }

    /// `id` no longer holds entry `e`'s HBM copy.
    fn unhold(&mut self, e: EntryId, id: RequestId) {
        let (was_sole, now_sole) = self.cache.update(e, |entry| {
            let at = entry.holders.iter().position(|&h| h == id);
            debug_assert!(at.is_some(), "{id:?} does not hold the entry");
            let was_sole = entry.holders.len() == 1;
            if let Some(at) = at {
                entry.holders.swap_remove(at);
            }
            (
                was_sole,
                (entry.holders.len() == 1).then(|| entry.holders[0]),
            )
        });
        if was_sole {
            self.table_mut(id).sole -= 1;
        }
        if let Some(other) = now_sole {
            self.table_mut(other).sole += 1;
        }
    }

    fn table_mut(&mut self, id: RequestId) -> &mut super::Table {
        self.tables.get_mut(&id).expect("holders are live")
    }

    /// Drops the cache of the namespace whose base key is `base` (every salt of it): no new
    /// hits; entries nobody references go now, the rest when released. Returns the entries
    /// dropped from the index.
    pub fn drop_namespace(&mut self, base: u64) -> u32 {
        let doomed: Vec<EntryId> = self
            .cache
            .entries()
            .filter(|(_, entry)| entry.base == base && entry.listed)
            .map(|(e, _)| e)
            .collect();
        for &e in &doomed {
            self.cache.unlist(e);
            let entry = self.cache.get(e);
            if entry.refs == 0 && entry.inflight.is_none() && !entry.pending {
                self.delete_entry(e);
            }
        }
        doomed.len() as u32
    }

    /// The DRAM slot of a referencing block is its entry's (for checks).
    pub(super) fn entry_slots(&self, e: EntryId) -> (Option<HbmBlock>, Option<DramBlock>) {
        let entry = self.cache.get(e);
        (entry.hbm, entry.dram)
    }
}

/// [`KvPool::donate`] with `id`'s table in hand (a block landing looks it up once).
pub(super) fn donate_in(
    t: &mut Table,
    id: RequestId,
    i: usize,
    prefix: bool,
    cache: &mut Cache,
    illegal: &mut Vec<(BlockState, BlockState)>,
) {
    let Some(&hash) = t.hashes.get(i) else {
        return;
    };
    if !prefix || cache.lookup(hash).is_some() {
        return;
    }
    let b = &t.blocks[i];
    let (hbm, dram) = (b.hbm, b.dram);
    debug_assert!(dram.is_some(), "synced blocks have a mirror");
    let e = cache.insert(hash, t.base, hbm, dram, Some(id));
    t.blocks[i].entry = Some(e);
    t.set(i, BlockState::Shared, illegal);
    // It holds the new entry alone.
    t.sole += 1;
}
