//! Shedding the requests still waiting past their queue deadline (the deadlines themselves:
//! `deadline.rs`).

use super::Engine;
use crate::clock::Clock;
use crate::request::{ErrorCause, FinishReason, ReqState};
use crate::runner::ModelRunner;
use crate::transfer::Transfer;

impl<R: ModelRunner, T: Transfer, C: Clock> Engine<R, T, C> {
    /// Sheds every request still waiting for its first token past its deadline (before the
    /// plan, so none of them is admitted in this step).
    pub(super) fn shed_past_deadline(&mut self, now: f64) {
        if self.deadlines.next().is_none_or(|t| t > now) {
            return;
        }
        let mut due = Vec::new();
        self.deadlines.expired(now, &mut due);
        for (id, deadline) in due {
            let Some(req) = self.requests.get(&id) else {
                continue;
            };
            if req.state != ReqState::Waiting || req.t_first.is_some() {
                continue;
            }
            let error = format!(
                "request {id:?} waited {:.1} s for its first admission, past its queue deadline \
                 of {:.1} s: the node is overloaded",
                now - req.t_arr,
                deadline - req.t_arr
            );
            self.counters.shed_deadline += 1;
            self.finish_with(
                id,
                FinishReason::Error,
                now,
                Some((ErrorCause::QueueDeadline, error)),
            );
        }
    }
}
