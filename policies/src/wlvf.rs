//! Weighted LVF: LVF across many tenants with weighted fair shares and starvation caps.
//! The formula and the argument for its guarantees are in `docs/SCHEDULING.md`.

use crate::greedy::{all_fit, plan_greedy, Key, Rules};
use crate::types::{Capacity, Phase, Plan, Policy, ReqView, TenantId};
use crate::vlt::VltConfig;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Knobs of weighted LVF.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WlvfConfig {
    pub vlt: VltConfig,
    /// A waiting request older than this, or a rotary request paused longer than this, is
    /// promoted ahead of everything else. `None`: no promotion.
    pub max_wait_s: Option<f64>,
    /// A running request rotated out this many times in a row is not rotated out again until
    /// it has made progress. `None`: no cap.
    pub max_consecutive_rotations: Option<u32>,
    /// Fairness band: tenants whose normalized service is within this many tokens (per unit of
    /// normalized weight) of the least-served active tenant compete on VLT alone; tenants
    /// further ahead rank below them.
    pub fairness_quantum_tokens: f64,
}

impl Default for WlvfConfig {
    fn default() -> Self {
        WlvfConfig {
            vlt: VltConfig::default(),
            max_wait_s: None,
            max_consecutive_rotations: None,
            fairness_quantum_tokens: 4096.0,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct TenantState {
    /// Tokens served, cumulative.
    tokens: f64,
    weight: f64,
    /// Had requests in the previous plan.
    active: bool,
}

/// Weighted LVF with starvation caps. With one tenant and no caps it plans exactly as
/// [`crate::Lvf`].
#[derive(Clone, Debug, Default)]
pub struct Wlvf {
    pub cfg: WlvfConfig,
    tenants: BTreeMap<TenantId, TenantState>,
    /// `now` of the previous plan, and the lengths of the last iterations (time between plans).
    last_now: Option<f64>,
    iterations: VecDeque<f64>,
}

/// Tiers of the weighted key, highest first.
const TIER_OVERDUE: i32 = 2;
const TIER_FAIR: i32 = 1;
const TIER_AHEAD: i32 = 0;

/// Iterations remembered for the promotion lead of the wait cap.
const ITERATION_WINDOW: usize = 32;

impl Wlvf {
    pub fn new(cfg: WlvfConfig) -> Wlvf {
        Wlvf {
            cfg,
            tenants: BTreeMap::new(),
            last_now: None,
            iterations: VecDeque::new(),
        }
    }

    /// Normalized service of every active tenant: tokens / (weight / mean active weight).
    /// Tenants that just became active catch up to the least-served one (no credit for
    /// idle time, as in start-time fair queueing).
    fn normalized_service(&mut self, view: &[ReqView]) -> BTreeMap<TenantId, f64> {
        let mut present: BTreeMap<TenantId, f64> = BTreeMap::new();
        for r in view {
            // The largest weight seen, so that the view's order cannot matter.
            let w = present.entry(r.tenant).or_insert(f64::MIN_POSITIVE);
            *w = w.max(r.weight);
        }
        let mean_w = present.values().sum::<f64>() / present.len().max(1) as f64;
        let norm = |t: &TenantState, w: f64| t.tokens / (w / mean_w);
        let continuing_min = present
            .iter()
            .filter_map(|(id, &w)| {
                self.tenants
                    .get(id)
                    .filter(|t| t.active)
                    .map(|t| norm(t, w))
            })
            .fold(f64::INFINITY, f64::min);
        for t in self.tenants.values_mut() {
            t.active = false;
        }
        let mut out = BTreeMap::new();
        for (&id, &w) in &present {
            let t = self.tenants.entry(id).or_default();
            t.weight = w;
            if !t.active && continuing_min.is_finite() && norm(t, w) < continuing_min {
                t.tokens = continuing_min * (w / mean_w);
            }
            t.active = true;
            out.insert(id, norm(t, w));
        }
        out
    }

    /// The longest of the last iterations (0 before the second plan).
    fn longest_iteration(&self) -> f64 {
        self.iterations.iter().copied().fold(0.0, f64::max)
    }

    /// `lead`: how long before the wait cap a request is promoted (two recent iterations).
    fn key(
        &self,
        r: &ReqView,
        now: f64,
        lead: f64,
        tier_of_tenant: &BTreeMap<TenantId, i32>,
    ) -> Key {
        let vlt = self.cfg.vlt.vlt(r, now);
        if r.phase != Phase::Running {
            if let Some(cap) = self.cfg.max_wait_s {
                // Promoted two (long) iterations early: one for the restore copy, one for the
                // step that produces its next token, so that the token lands by the cap.
                let waited = now - r.since();
                if waited + lead >= cap {
                    return Key::new(TIER_OVERDUE, waited);
                }
            }
        }
        Key::new(tier_of_tenant[&r.tenant], vlt)
    }
}

impl Policy for Wlvf {
    fn name(&self) -> &'static str {
        "wlvf"
    }

    fn plan(&mut self, now: f64, view: &[ReqView], cap: Capacity) -> Plan {
        if let Some(last) = self.last_now {
            if self.iterations.len() == ITERATION_WINDOW {
                self.iterations.pop_front();
            }
            self.iterations.push_back((now - last).max(0.0));
        }
        self.last_now = Some(now);
        let service = self.normalized_service(view);
        if let Some(plan) = all_fit(view, cap) {
            return plan;
        }
        let v_min = service.values().copied().fold(f64::INFINITY, f64::min);
        let tiers: BTreeMap<TenantId, i32> = service
            .iter()
            .map(|(&id, &v)| {
                let fair = v <= v_min + self.cfg.fairness_quantum_tokens;
                (id, if fair { TIER_FAIR } else { TIER_AHEAD })
            })
            .collect();
        let lead = 2.0 * self.longest_iteration();
        let keys: Vec<Key> = view
            .iter()
            .map(|r| self.key(r, now, lead, &tiers))
            .collect();
        let rules = Rules {
            max_consecutive_rotations: self.cfg.max_consecutive_rotations,
            ..crate::lvf::Lvf::RULES
        };
        plan_greedy(view, cap, &keys, rules)
    }

    fn on_service(&mut self, tenant: TenantId, weight: f64, tokens: u64) {
        let t = self.tenants.entry(tenant).or_default();
        t.weight = weight;
        t.tokens += tokens as f64;
    }
}

#[cfg(test)]
mod tests;
