//! The pool's invariant check, run by the tests after every operation.

use super::cache::EntryId;
use super::{BlockState, KvPool, Slot};
use std::collections::BTreeMap;
use superinfer_policies::RequestId;

type Mark = fn(&mut Vec<u8>, u32, &str) -> Result<(), String>;

impl KvPool {
    /// Checks the pool's invariants: every slot of each tier is exactly one of free,
    /// quarantined or owned by one live block; free + used = capacity; block states agree with
    /// the slots they hold; no illegal transition happened.
    pub fn check(&self) -> Result<(), String> {
        let mut hbm_seen = vec![0u8; self.hbm_capacity as usize];
        let mut dram_seen = vec![0u8; self.dram_capacity as usize];
        let mark: Mark = |seen, i, what| {
            let c = seen
                .get_mut(i as usize)
                .ok_or_else(|| format!("{what} slot {i} out of range"))?;
            *c += 1;
            if *c > 1 {
                return Err(format!("{what} slot {i} owned twice"));
            }
            Ok(())
        };
        let restored = self.tables.values().filter(|t| t.restored).count() as u32;
        if restored != self.restored_tables {
            return Err(format!(
                "{restored} tables have a restore landed, the count says {}",
                self.restored_tables
            ));
        }
        for &h in &self.hbm_free.0 {
            mark(&mut hbm_seen, h, "HBM")?;
        }
        for &d in &self.dram_free.0 {
            mark(&mut dram_seen, d, "DRAM")?;
        }
        for (_, slot) in &self.quarantine {
            match slot {
                Slot::Hbm(h) => mark(&mut hbm_seen, h.0, "HBM")?,
                Slot::Dram(d) => mark(&mut dram_seen, d.0, "DRAM")?,
            }
        }
        // Per entry: the blocks referencing it, and the requests holding its HBM copy.
        let mut refs: std::collections::BTreeMap<_, (u32, Vec<_>)> = Default::default();
        for (id, table) in &self.tables {
            let mut counts = [0u32; BlockState::COUNT];
            for b in &table.blocks {
                counts[b.state.index()] += 1;
            }
            if counts != table.counts {
                return Err(format!(
                    "{id:?}: state counts {:?}, kept {:?}",
                    counts, table.counts
                ));
            }
            if let Some(i) = table.blocks[..table.clean_below.min(table.blocks.len())]
                .iter()
                .position(|b| b.state == BlockState::Dirty)
            {
                return Err(format!(
                    "{id:?} block {i} dirty below the writeback mark {}",
                    table.clean_below
                ));
            }
            for (i, b) in table.blocks.iter().enumerate() {
                if b.state.in_hbm() != b.hbm.is_some() {
                    return Err(format!(
                        "{id:?} block {i}: {:?} with HBM {:?}",
                        b.state, b.hbm
                    ));
                }
                let pending = self.pending.iter().any(|&(p, j, _)| p == *id && j == i);
                if b.state.in_flight() != b.inflight.is_some() && !pending {
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
                if let Some(e) = b.entry {
                    // The entry owns the slots: the block names the same ones.
                    refs.entry(e).or_default().0 += 1;
                    let resident = matches!(b.state, BlockState::Shared | BlockState::Restoring);
                    if resident {
                        refs.entry(e).or_default().1.push(*id);
                    }
                    let (hbm, dram) = self.entry_slots(e);
                    if b.dram != dram || (resident && b.hbm != hbm) {
                        return Err(format!("{id:?} block {i} disagrees with its entry"));
                    }
                    if table.hashes.get(i) != Some(&self.cache.get(e).hash) {
                        return Err(format!("{id:?} block {i} hit an entry of another hash"));
                    }
                    continue;
                }
                if b.state.is_shared() {
                    return Err(format!("{id:?} block {i}: {:?} without an entry", b.state));
                }
                if let Some(h) = b.hbm {
                    mark(&mut hbm_seen, h.0, "HBM")?;
                }
                if let Some(d) = b.dram {
                    mark(&mut dram_seen, d.0, "DRAM")?;
                }
            }
        }
        self.check_entries(&refs, &mut hbm_seen, &mut dram_seen, mark)?;
        if let Some(i) = hbm_seen.iter().position(|&c| c == 0) {
            return Err(format!("HBM slot {i} leaked"));
        }
        if let Some(i) = dram_seen.iter().position(|&c| c == 0) {
            return Err(format!("DRAM slot {i} leaked"));
        }
        let flight = self
            .ticket_blocks
            .values()
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        if flight != self.flight {
            return Err(format!(
                "blocks in flight {:?}, tickets say {flight:?}",
                self.flight
            ));
        }
        if let Some(t) = self.illegal.first() {
            return Err(format!("illegal transition {:?} -> {:?}", t.0, t.1));
        }
        Ok(())
    }

    /// The prefix cache's invariants: reference counts and holders match the blocks, the
    /// sole-holder counts match the holders, every entry owns its slots once, the index names
    /// listed entries by their hash, and no copy-in is lost.
    fn check_entries(
        &self,
        refs: &BTreeMap<EntryId, (u32, Vec<RequestId>)>,
        hbm_seen: &mut Vec<u8>,
        dram_seen: &mut Vec<u8>,
        mark: Mark,
    ) -> Result<(), String> {
        let mut sole: BTreeMap<RequestId, u32> = BTreeMap::new();
        for (e, entry) in self.cache.entries() {
            let (n, mut holders) = refs.get(&e).cloned().unwrap_or_default();
            let mut kept = entry.holders.to_vec();
            holders.sort();
            kept.sort();
            if n != entry.refs || holders != kept {
                return Err(format!(
                    "entry {e:?}: {n} references and holders {holders:?}, kept {} and {kept:?}",
                    entry.refs
                ));
            }
            if let [only] = kept.as_slice() {
                *sole.entry(*only).or_default() += 1;
            }
            if let Some(h) = entry.hbm {
                mark(hbm_seen, h.0, "HBM")?;
            }
            match entry.dram {
                Some(d) => mark(dram_seen, d.0, "DRAM")?,
                None if self.dram_capacity > 0 || entry.hbm.is_none() => {
                    return Err(format!(
                        "entry {e:?} has no DRAM copy beside a DRAM tier, or no copy at all"
                    ));
                }
                None => {}
            }
            if entry.listed != (self.cache.lookup(entry.hash) == Some(e)) {
                return Err(format!("entry {e:?}: listed {} disagrees", entry.listed));
            }
            let copying = entry.inflight.is_some() || entry.pending;
            if copying && entry.hbm.is_none() {
                return Err(format!("entry {e:?} copied in without an HBM slot"));
            }
            if !self.dram_level && entry.hbm.is_none() && entry.refs == 0 {
                return Err(format!(
                    "entry {e:?} lives in DRAM only in an HBM-only cache"
                ));
            }
            if !entry.listed && entry.refs == 0 && !copying {
                return Err(format!("entry {e:?} dropped but kept"));
            }
        }
        for (id, table) in &self.tables {
            let want = sole.get(id).copied().unwrap_or(0);
            if table.sole != want {
                return Err(format!(
                    "{id:?}: sole holder of {want}, kept {}",
                    table.sole
                ));
            }
        }
        for (t, es) in self.cache.in_flight() {
            if let Some(e) = es.iter().find(|e| self.cache.get(**e).inflight != Some(*t)) {
                return Err(format!(
                    "entry {e:?} listed under {t:?} but not in flight there"
                ));
            }
        }
        if self.cache.listed().count() != self.cache.entries().filter(|(_, e)| e.listed).count() {
            return Err("the index and the listed entries differ".into());
        }
        let (walked, kept) = self.cache.stale_names();
        if walked != kept {
            return Err(format!("{walked} stale names in the index, {kept} counted"));
        }
        Ok(())
    }
}
