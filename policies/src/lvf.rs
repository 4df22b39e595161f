//! Largest-VLT-First (PAPER.md §4), single tenant, exactly as the paper states it.

use crate::greedy::{all_fit, plan_greedy, Key, Rules};
use crate::types::{Capacity, Plan, Policy, ReqView};
use crate::vlt::VltConfig;

/// LVF: FCFS when everything fits; otherwise sort by VLT, take lagging waiting/rotary requests
/// from the head within `B_HBM + B_xfer`, and rotate out running requests (VLT < 0) from the
/// tail until the deficit is covered.
#[derive(Clone, Debug, Default)]
pub struct Lvf {
    pub vlt: VltConfig,
}

impl Lvf {
    /// Rules of plain LVF: proactive rotation, no caps.
    pub(crate) const RULES: Rules = Rules {
        preempt_for_admission: true,
        max_consecutive_rotations: None,
        per_phase_queues: false,
        recompute_victims: false,
        tokens_block_lower_tiers: false,
        preempt_for_seats: true,
        long_prompts_yield: false,
    };
}

impl Policy for Lvf {
    fn name(&self) -> &'static str {
        "lvf"
    }

    fn plan(&mut self, now: f64, view: &[ReqView], cap: Capacity) -> Plan {
        if let Some(plan) = all_fit(view, cap) {
            return plan;
        }
        let keys: Vec<Key> = view
            .iter()
            .map(|r| Key::new(0, self.vlt.vlt(r, now)))
            .collect();
        plan_greedy(view, cap, &keys, Self::RULES)
    }
}

#[cfg(test)]
mod tests;
