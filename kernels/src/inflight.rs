//! Which blocks have a copy in flight, per tier, and whether a new batch may touch them.
//!
//! The rules (PAPER.md §5, hazards): a block being written by a copy is touched by nothing
//! else; a block being read may be read again but not written. So an HBM block whose eviction
//! (D2H, a read) is in flight is never the target of a restore (H2D, a write), and a DRAM mirror
//! being written is not read by a restore until that copy has landed. Plain Rust; the CUDA copy
//! engine consults it before issuing and clears a batch when its events complete.

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;

use crate::plan::BlockCopy;

/// A memory tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    Hbm,
    Dram,
}

/// How a copy touches a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// A batch that would touch a block in a way that races another copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub tier: Tier,
    pub block: u32,
    pub access: Access,
    /// The other copy's batch, or `None` when the clash is inside the new batch itself.
    pub with_batch: Option<u64>,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.access {
            Access::Read => "read",
            Access::Write => "write",
        };
        match self.with_batch {
            Some(b) => write!(
                f,
                "{what} of {:?} block {} races batch {b}",
                self.tier, self.block
            ),
            None => write!(
                f,
                "{what} of {:?} block {} races a copy in the same batch",
                self.tier, self.block
            ),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Use {
    readers: u32,
    writer: Option<u64>,
    last_reader: u64,
}

/// The blocks touched by copies that have not completed yet.
#[derive(Debug, Default)]
pub struct InFlight {
    hbm: HashMap<u32, Use>,
    dram: HashMap<u32, Use>,
    batches: HashMap<u64, Vec<(Tier, u32, Access)>>,
}

/// The accesses of one batch: H2D reads DRAM and writes HBM, D2H reads HBM and writes DRAM.
fn accesses(h2d: &[BlockCopy], d2h: &[BlockCopy]) -> Vec<(Tier, u32, Access)> {
    let mut out = Vec::with_capacity(2 * (h2d.len() + d2h.len()));
    for c in h2d {
        out.push((Tier::Dram, c.src, Access::Read));
        out.push((Tier::Hbm, c.dst, Access::Write));
    }
    for c in d2h {
        out.push((Tier::Hbm, c.src, Access::Read));
        out.push((Tier::Dram, c.dst, Access::Write));
    }
    out
}

impl InFlight {
    fn map(&self, tier: Tier) -> &HashMap<u32, Use> {
        match tier {
            Tier::Hbm => &self.hbm,
            Tier::Dram => &self.dram,
        }
    }

    fn map_mut(&mut self, tier: Tier) -> &mut HashMap<u32, Use> {
        match tier {
            Tier::Hbm => &mut self.hbm,
            Tier::Dram => &mut self.dram,
        }
    }

    /// Whether a batch may be issued now: `Err` names the first racing access.
    pub fn check(&self, h2d: &[BlockCopy], d2h: &[BlockCopy]) -> Result<(), Conflict> {
        let mut own: HashMap<(Tier, u32), (u32, bool)> = HashMap::new();
        for (tier, block, access) in accesses(h2d, d2h) {
            if let Some(u) = self.map(tier).get(&block) {
                let clash = match access {
                    Access::Read => u.writer,
                    Access::Write => u.writer.or((u.readers > 0).then_some(u.last_reader)),
                };
                if clash.is_some() {
                    return Err(Conflict {
                        tier,
                        block,
                        access,
                        with_batch: clash,
                    });
                }
            }
            let entry = own.entry((tier, block)).or_default();
            let clash = match access {
                Access::Read => entry.1,
                Access::Write => entry.1 || entry.0 > 0,
            };
            if clash {
                return Err(Conflict {
                    tier,
                    block,
                    access,
                    with_batch: None,
                });
            }
            match access {
                Access::Read => entry.0 += 1,
                Access::Write => entry.1 = true,
            }
        }
        Ok(())
    }

    /// Records a batch as in flight (after [`InFlight::check`] passed).
    pub fn insert(&mut self, batch: u64, h2d: &[BlockCopy], d2h: &[BlockCopy]) {
        let acc = accesses(h2d, d2h);
        for &(tier, block, access) in &acc {
            let u = self.map_mut(tier).entry(block).or_default();
            match access {
                Access::Read => {
                    u.readers += 1;
                    u.last_reader = batch;
                }
                Access::Write => u.writer = Some(batch),
            }
        }
        self.batches.insert(batch, acc);
    }

    /// Clears a batch whose copies have all landed. Unknown batches are ignored.
    pub fn complete(&mut self, batch: u64) {
        let Some(acc) = self.batches.remove(&batch) else {
            return;
        };
        for (tier, block, access) in acc {
            let map = self.map_mut(tier);
            if let Some(u) = map.get_mut(&block) {
                match access {
                    Access::Read => u.readers = u.readers.saturating_sub(1),
                    Access::Write => u.writer = None,
                }
                if u.readers == 0 && u.writer.is_none() {
                    map.remove(&block);
                }
            }
        }
    }

    /// Whether any copy in flight touches `block` of `tier`.
    pub fn is_busy(&self, tier: Tier, block: u32) -> bool {
        self.map(tier).contains_key(&block)
    }

    /// Batches in flight.
    pub fn batches(&self) -> usize {
        self.batches.len()
    }
}
