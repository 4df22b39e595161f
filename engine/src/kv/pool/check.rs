//! The pool's invariant check, run by the tests after every operation.

use super::{BlockState, KvPool, Slot};

impl KvPool {
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
}
