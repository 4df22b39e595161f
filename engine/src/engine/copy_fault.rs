//! Copy faults in the engine: a batch the transfer backend reports failed, or one that did not
//! land within `EngineConfig::copy_timeout_s` of time in which the engine watched for it (a
//! long model step is not the copies' fault: `Engine::ingest_faults`). Every request it
//! affects loses its KV (no copy of that batch is trusted, none becomes a cache entry) and
//! waits to prefill again: no request is lost or left hanging, and no block leaks
//! (`kv/pool/fault.rs` says what happens to the slots). Counted in `EngineStats::copy_faults` and `recomputes`, and logged.

use super::Engine;
use crate::clock::Clock;
use crate::request::ReqState;
use crate::runner::ModelRunner;
use crate::transfer::{Ticket, Transfer};

impl<R: ModelRunner, T: Transfer, C: Clock> Engine<R, T, C> {
    /// Faults reported since the last step, and batches past the copy timeout. Called after
    /// the batches that landed by `now` were taken in.
    ///
    /// A batch is late when it was past its deadline already at the previous poll and still
    /// has not landed: the timeout counts only time in which the engine could see it land. A
    /// model step longer than the timeout (a CPU model on long prompts) delays the next poll,
    /// not the copies issued before it, so those are not faults for having waited out that
    /// step; a batch that never lands is given up one poll after its deadline.
    pub(super) fn ingest_faults(&mut self, now: f64) {
        let failed = self.transfer.take_failed();
        let judged_at = self.last_poll.replace(now);
        let late: Vec<Ticket> = match judged_at {
            Some(at) => self
                .outstanding
                .iter()
                .filter(|&(t, &since)| {
                    at >= self.copy_due(since) && !failed.iter().any(|(f, _)| f == t)
                })
                .map(|(t, _)| *t)
                .collect(),
            None => Vec::new(),
        };
        for (t, why) in failed {
            self.copy_fault(t, true, &why);
        }
        let timeout = self.cfg.copy_timeout_s;
        for t in late {
            self.copy_fault(t, false, &format!("did not land within {timeout} s"));
        }
    }

    /// When a batch submitted at `since` is past the copy timeout. The one place this sum is
    /// formed, so the check and [`Self::copy_deadline`] agree to the last bit.
    fn copy_due(&self, since: f64) -> f64 {
        since + self.cfg.copy_timeout_s
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

    /// When the oldest outstanding copy batch times out: at the first poll after one at or
    /// past its deadline (an idle engine on a virtual clock advances to it, so a batch that
    /// never lands is noticed there too).
    pub(super) fn copy_deadline(&self) -> Option<f64> {
        let due = self
            .outstanding
            .values()
            .map(|&since| self.copy_due(since))
            .reduce(f64::min)?;
        Some(self.last_poll.map_or(due, |at| due.max(at)))
    }
}
