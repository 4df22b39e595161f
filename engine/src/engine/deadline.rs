//! Queue deadlines: a request still waiting for its first admission past its deadline is
//! shed (it ends with an error of cause [`ErrorCause::QueueDeadline`]; the gateway answers 503
//! with `Retry-After`), so no request waits longer than any answer is still useful, and the
//! work it would have taken goes to requests that can still meet their targets.
//!
//! A request's deadline is its arrival plus `EngineRequest::queue_deadline_s`, or
//! `EngineConfig::queue_deadline_ttfts` times its TTFT target. Deadlines sit in a min-heap, so
//! a step looks only at the ones that have passed. A request that has produced a token, or is
//! running, rotated out or in a copy, is never shed: only one still waiting for its first
//! token (a recompute before its first token included).

use super::Engine;
use crate::clock::Clock;
use crate::request::{EngineRequest, ErrorCause, FinishReason, ReqState};
use crate::runner::ModelRunner;
use crate::transfer::Transfer;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use superinfer_policies::RequestId;

/// Pending deadlines, earliest first: (engine time as ordered bits, request).
#[derive(Clone, Debug, Default)]
pub(super) struct Deadlines(BinaryHeap<Reverse<(u64, RequestId)>>);

impl Deadlines {
    /// A request's deadline in engine time, if it has one: `arrival + spec's own seconds`, or
    /// `arrival + ttfts × its TTFT target`.
    pub(super) fn of(spec: &EngineRequest, arrival: f64, ttfts: Option<f64>) -> Option<f64> {
        spec.queue_deadline_s
            .or(ttfts.map(|k| k * spec.slo.ttft_s))
            .map(|s| arrival + s)
    }

    pub(super) fn push(&mut self, t: f64, id: RequestId) {
        // Non-negative finite times order as their bits.
        self.0.push(Reverse((t.max(0.0).to_bits(), id)));
    }

    /// The earliest pending deadline (a shed request's entry may still be here: harmless).
    pub(super) fn next(&self) -> Option<f64> {
        self.0.peek().map(|Reverse((t, _))| f64::from_bits(*t))
    }

    /// Takes the requests whose deadline is at or before `now`.
    fn expired(&mut self, now: f64, out: &mut Vec<(RequestId, f64)>) {
        while let Some(&Reverse((t, id))) = self.0.peek() {
            let t = f64::from_bits(t);
            if t > now {
                break;
            }
            self.0.pop();
            out.push((id, t));
        }
    }
}

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
