//! Queue deadlines: a request still waiting for its first admission past its deadline is
//! shed (it ends with an error of cause `ErrorCause::QueueDeadline`; the gateway answers 503
//! with `Retry-After`), so no request waits longer than any answer is still useful, and the
//! work it would have taken goes to requests that can still meet their targets.
//!
//! A request's deadline is its arrival plus `EngineRequest::queue_deadline_s`, or
//! `EngineConfig::queue_deadline_ttfts` times its TTFT target. Deadlines sit in a min-heap, so
//! a step looks only at the ones that have passed. A request that has produced a token, or is
//! running, rotated out or in a copy, is never shed: only one still waiting for its first
//! token (a recompute before its first token included).

use crate::request::EngineRequest;
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
    pub(super) fn expired(&mut self, now: f64, out: &mut Vec<(RequestId, f64)>) {
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
