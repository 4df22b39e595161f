//! Copy faults: a batch the transfer backend reported failed, or one that did not land within
//! the engine's copy timeout. None of its copies can be trusted, so the engine recomputes
//! every request it [affects](KvPool::affected_by) and discards their blocks without keeping
//! any copy of that batch as a cache entry ([`KvPool::discard`]); the cache entries the batch
//! copies leave the index at once and the cache once unreferenced ([`KvPool::settle_fault`]).
//!
//! Slots the batch may still touch: a failed batch is over (nothing of it is in flight), so its
//! quarantined slots return at once; a batch that timed out may still land, so its slots stay
//! quarantined until it does (and are counted in use until then); its blocks stop counting
//! against the rotation budget.

use super::{KvPool, Ticket};
use crate::kv::pool::cache::EntryId;
use std::collections::BTreeSet;
use superinfer_policies::RequestId;

impl KvPool {
    /// Entries whose copy (copy-in, or the writeback they were made from) is `ticket`'s.
    fn entries_of(&self, ticket: Ticket) -> BTreeSet<EntryId> {
        self.cache
            .entries()
            .filter(|(_, e)| e.inflight == Some(ticket))
            .map(|(id, _)| id)
            .collect()
    }

    /// The requests a fault of `ticket` affects: those with a block in it, and those
    /// referencing an entry it copies (whose HBM or DRAM copy is not trusted now).
    pub fn affected_by(&self, ticket: Ticket) -> Vec<RequestId> {
        let entries = self.entries_of(ticket);
        let mut out: Vec<RequestId> = self
            .tables
            .iter()
            .filter(|(_, t)| {
                t.blocks.iter().any(|b| {
                    b.inflight == Some(ticket) || b.entry.is_some_and(|e| entries.contains(&e))
                })
            })
            .map(|(id, _)| *id)
            .collect();
        out.sort_unstable();
        out
    }

    /// Releases every block of `id` after a fault of `ticket`: as [`Self::free`], but no block
    /// of that batch becomes a cache entry.
    pub fn discard(&mut self, id: RequestId, ticket: Ticket) {
        self.free_keeping(id, Some(ticket));
    }

    /// After the affected requests were discarded: the entries `ticket` copies leave the
    /// index (no new hit finds them) and, once unreferenced, the cache. `landed`: the batch is
    /// over (it failed), so its quarantined slots are released now; otherwise (it timed out)
    /// they stay until it lands, and it stops counting as in flight.
    pub fn settle_fault(&mut self, ticket: Ticket, landed: bool) {
        for e in self.entries_of(ticket) {
            self.cache.unlist(e);
        }
        if landed {
            self.complete(ticket);
        } else if let Some((h, d)) = self.ticket_blocks.remove(&ticket) {
            self.flight.0 -= h;
            self.flight.1 -= d;
        }
    }
}
