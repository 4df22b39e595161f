//! Copy faults in the engine: a batch the transfer backend reports failed, or one that did not
//! land within `EngineConfig::copy_timeout_s`. Every request it affects loses its KV (no copy
//! of that batch is trusted, none becomes a cache entry) and waits to prefill again: no request
//! is lost or left hanging, and no block leaks (`kv/pool/fault.rs` says what happens to the
//! slots). Counted in `EngineStats::copy_faults` and `recomputes`, and logged.

use super::Engine;
use crate::clock::Clock;
use crate::request::ReqState;
use crate::runner::ModelRunner;
use crate::transfer::{Ticket, Transfer};

impl<R: ModelRunner, T: Transfer, C: Clock> Engine<R, T, C> {
    /// Faults reported since the last step, and batches past the copy timeout.
    pub(super) fn ingest_faults(&mut self, now: f64) {
        let failed = self.transfer.take_failed();
        let timeout = self.cfg.copy_timeout_s;
        let late: Vec<Ticket> = self
            .outstanding
            .iter()
            .filter(|&(t, &since)| now - since > timeout && !failed.iter().any(|(f, _)| f == t))
            .map(|(t, _)| *t)
            .collect();
        for (t, why) in failed {
            self.copy_fault(t, true, &why);
        }
        for t in late {
            self.copy_fault(t, false, &format!("did not land within {timeout} s"));
        }
    }

    /// Recomputes what copy batch `ticket` touched. `landed`: the backend reported it over.
    fn copy_fault(&mut self, ticket: Ticket, landed: bool, why: &str) {
        self.outstanding.remove(&ticket);
        self.counters.copy_faults += 1;
        let affected = self.pool.affected_by(ticket);
        tracing::warn!(
            ticket = ticket.0,
            requests = affected.len(),
            "copy batch fault ({why}): its requests are recomputed"
        );
        for id in affected {
            if !self.requests.contains_key(&id) {
                continue;
            }
            self.pool.discard(id, ticket);
            if self.requests[&id].state == ReqState::Waiting {
                continue;
            }
            self.requeue(id);
        }
        self.pool.settle_fault(ticket, landed);
    }

    /// When the oldest outstanding copy batch times out (an idle engine on a virtual clock
    /// advances to it, so a batch that never lands is noticed there too).
    pub(super) fn copy_deadline(&self) -> Option<f64> {
        self.outstanding
            .values()
            .map(|since| since + self.cfg.copy_timeout_s)
            .reduce(f64::min)
    }
}
