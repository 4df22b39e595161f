//! The baselines the paper compares against: vLLM's FCFS, the static Waiting-First and
//! Swapped-First policies of its motivation, and earliest-deadline-first.

use crate::greedy::{plan_greedy, Key, Rules};
use crate::types::{Capacity, Phase, Plan, Policy, ReqView};

/// vLLM-like FCFS: preempted requests resume first (in arrival order) and block new
/// admissions until all are back; new requests are admitted in arrival order while they fit;
/// on a shortage the newest running request is preempted by recompute (vLLM V1 removed
/// swap-based preemption), so it waits, ahead of newer arrivals, to prefill again. Never
/// preempts to admit.
#[derive(Clone, Debug, Default)]
pub struct Fcfs;

/// Swapped-First: like FCFS, preempted requests resume first (in arrival order), but new
/// requests may use room left after them: a restore that does not fit (HBM or copy budget)
/// stops only the restores behind it, and waiting requests are still admitted, in arrival
/// order, while they fit. Never preempts to admit.
#[derive(Clone, Debug, Default)]
pub struct SwappedFirst;

/// Waiting-First: new requests first, pushing the newest running requests out to make room;
/// preempted requests resume only when no waiting request is left in front of them.
#[derive(Clone, Debug, Default)]
pub struct WaitingFirst;

/// Earliest deadline first: the next deadline is `t_arr + TTFT` before the first token and
/// `t_last + TBT` after; a candidate displaces a running request only if its deadline is
/// earlier.
#[derive(Clone, Debug, Default)]
pub struct Edf;

fn by_arrival(view: &[ReqView], tier: impl Fn(Phase) -> i32) -> Vec<Key> {
    view.iter()
        .map(|r| Key::new(tier(r.phase), -r.t_arr))
        .collect()
}

const NO_PREEMPT: Rules = Rules {
    preempt_for_admission: false,
    max_consecutive_rotations: None,
    per_phase_queues: false,
    recompute_victims: false,
    tokens_block_lower_tiers: false,
    preempt_for_seats: true,
    long_prompts_yield: false,
};

impl Policy for Fcfs {
    fn name(&self) -> &'static str {
        "fcfs"
    }

    fn plan(&mut self, _now: f64, view: &[ReqView], cap: Capacity) -> Plan {
        let keys = by_arrival(view, |p| i32::from(p == Phase::Rotary));
        let rules = Rules {
            recompute_victims: true,
            ..NO_PREEMPT
        };
        plan_greedy(view, cap, &keys, rules)
    }
}

impl Policy for SwappedFirst {
    fn name(&self) -> &'static str {
        "sf"
    }

    fn plan(&mut self, _now: f64, view: &[ReqView], cap: Capacity) -> Plan {
        let keys = by_arrival(view, |p| i32::from(p == Phase::Rotary));
        let rules = Rules {
            per_phase_queues: true,
            recompute_victims: false,
            ..NO_PREEMPT
        };
        plan_greedy(view, cap, &keys, rules)
    }
}

impl Policy for WaitingFirst {
    fn name(&self) -> &'static str {
        "wf"
    }

    fn plan(&mut self, _now: f64, view: &[ReqView], cap: Capacity) -> Plan {
        let keys = by_arrival(view, |p| match p {
            Phase::Waiting => 2,
            Phase::Running => 1,
            Phase::Rotary => 0,
        });
        let rules = Rules {
            preempt_for_admission: true,
            max_consecutive_rotations: None,
            per_phase_queues: false,
            recompute_victims: false,
            tokens_block_lower_tiers: false,
            preempt_for_seats: true,
            long_prompts_yield: false,
        };
        plan_greedy(view, cap, &keys, rules)
    }
}

impl Policy for Edf {
    fn name(&self) -> &'static str {
        "edf"
    }

    fn plan(&mut self, _now: f64, view: &[ReqView], cap: Capacity) -> Plan {
        let keys: Vec<Key> = view.iter().map(|r| Key::new(0, -r.deadline())).collect();
        let rules = Rules {
            preempt_for_admission: true,
            max_consecutive_rotations: None,
            per_phase_queues: false,
            recompute_victims: false,
            tokens_block_lower_tiers: false,
            preempt_for_seats: true,
            long_prompts_yield: false,
        };
        plan_greedy(view, cap, &keys, rules)
    }
}

#[cfg(test)]
mod tests;
