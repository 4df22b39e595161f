//! Weighted LVF: LVF inside each tenant, a virtual token counter across tenants (in the spirit
//! of VTC, Sheng et al., OSDI'24), starvation caps. The formula, the fairness bound and its
//! proof are in `docs/SCHEDULING.md` §5.

mod counters;

use crate::greedy::{all_fit, plan_greedy, Key, Rules};
use crate::types::{Capacity, Phase, Plan, Policy, ReqView, Service, TenantId};
use crate::vlt::VltConfig;
use counters::Counters;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Knobs of weighted LVF.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WlvfConfig {
    pub vlt: VltConfig,
    /// A waiting request older than this, or a rotary request paused longer than this, is
    /// promoted ahead of everything else. `None`: no promotion.
    pub max_wait_s: Option<f64>,
    /// A running request rotated out (or recomputed) this many times in a row is not a victim
    /// again until it has made progress. `None`: no cap.
    pub max_consecutive_rotations: Option<u32>,
    /// Fairness band `Q`, in weighted cost units (tokens per unit of weight): requests whose
    /// virtual start lies in the same band compete on VLT; an earlier band always goes first.
    pub fairness_quantum_tokens: f64,
    /// Cost of one generated token, in prompt tokens (VTC's `w_q / w_p`).
    pub decode_cost: f64,
    /// Cost of one prompt token found in the prefix cache, in prompt tokens: it takes HBM (and
    /// maybe a copy-in) but no compute (docs/SCHEDULING.md, "Prefix cache").
    pub cached_cost: f64,
    /// Serve first what can still meet its SLO: a waiting request whose TTFT deadline has
    /// passed ranks below every other request of its band (it is still served, after them,
    /// and the wait cap still promotes it). Off: plain LVF's order inside a band.
    pub defer_late: bool,
    /// A candidate may displace running requests to get a seat (`max_num_seqs`) while HBM has
    /// room, as plain LVF does. Off (the default): running requests are displaced only for HBM
    /// room; seats are a compute limit, and rotating for one only trades a victim's TBT for a
    /// candidate's TTFT (docs/SCHEDULING.md, "Compute-bound overload").
    pub preempt_for_seats: bool,
    /// What the wait cap promotes an overdue request past: every request (`Global`, the
    /// default), or only its own tenant's (`Tenant`: it takes its tenant's earliest virtual
    /// starts, so a flood's overdue requests use the flood's share and no one else's).
    pub wait_cap_scope: WaitCapScope,
}

/// See [`WlvfConfig::wait_cap_scope`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitCapScope {
    #[default]
    Global,
    Tenant,
}

impl std::str::FromStr for WaitCapScope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "global" => Ok(WaitCapScope::Global),
            "tenant" => Ok(WaitCapScope::Tenant),
            _ => Err(format!(
                "the wait cap's scope is global or tenant, got {s:?}"
            )),
        }
    }
}

impl Default for WlvfConfig {
    fn default() -> Self {
        WlvfConfig {
            vlt: VltConfig::default(),
            max_wait_s: None,
            // A minimum time slice (with the engine's progress tokens): measured best on the
            // H200 and in the noisy-neighbour twin runs (docs/BENCHMARKS.md).
            max_consecutive_rotations: Some(1),
            fairness_quantum_tokens: 1024.0,
            decode_cost: 1.0,
            cached_cost: 0.1,
            defer_late: true,
            preempt_for_seats: false,
            wait_cap_scope: WaitCapScope::Global,
        }
    }
}

impl WlvfConfig {
    /// Refuses knobs that make no ranking (the VLT knobs', a band or decode cost that is not a
    /// positive number, a wait cap that is not).
    pub fn validate(&self) -> Result<(), String> {
        self.vlt.validate()?;
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.fairness_quantum_tokens) {
            return Err(format!(
                "fairness_quantum_tokens must be a number above 0, got {}",
                self.fairness_quantum_tokens
            ));
        }
        if !positive(self.decode_cost) {
            return Err(format!(
                "decode_cost must be a number above 0, got {}",
                self.decode_cost
            ));
        }
        if !(self.cached_cost.is_finite() && self.cached_cost >= 0.0) {
            return Err(format!(
                "cached_cost must be a number of at least 0, got {}",
                self.cached_cost
            ));
        }
        if let Some(c) = self.max_wait_s.filter(|&c| !positive(c)) {
            return Err(format!("max_wait_s must be a number above 0, got {c}"));
        }
        Ok(())
    }
}

/// Weighted LVF with starvation caps. With one tenant, no caps, `defer_late` off and
/// `preempt_for_seats` on it plans exactly as [`crate::Lvf`].
#[derive(Clone, Debug, Default)]
pub struct Wlvf {
    pub cfg: WlvfConfig,
    counters: Counters,
    /// Durations of the last batches (engine time), for the wait cap's promotion lead.
    steps: VecDeque<f64>,
}

/// Tier of overdue requests (the global wait cap), above every band's tiers. A band `b <= 0`
/// has the tiers `3b + 2` for requests past a tenant-scoped wait cap, `3b + 1` for requests
/// that can still meet their SLO and `3b` for late waiting ones.
const TIER_OVERDUE: i32 = 3;
/// The lowest band: tenants further ahead than this many bands share it.
const LOWEST_BAND: i32 = -1_000_000;

/// Steps remembered for the promotion lead of the wait cap.
const STEP_WINDOW: usize = 32;

impl Wlvf {
    pub fn new(cfg: WlvfConfig) -> Wlvf {
        Wlvf {
            cfg,
            counters: Counters::default(),
            steps: VecDeque::new(),
        }
    }

    /// A tenant's virtual counter: its weighted service, cost units per unit of weight.
    pub fn counter(&self, tenant: TenantId) -> Option<f64> {
        self.counters.get(tenant)
    }

    /// The longest of the last measured steps (0 before the first).
    fn longest_step(&self) -> f64 {
        self.steps.iter().copied().fold(0.0, f64::max)
    }

    /// Overdue key of a waiting or rotary request past the wait cap (promoted `lead` early:
    /// one step for the restore copy, one for the step that produces its next token).
    fn overdue(&self, r: &ReqView, now: f64, lead: f64) -> Option<Key> {
        let global = self.cfg.wait_cap_scope == WaitCapScope::Global;
        (global && self.past_cap(r, now, lead)).then(|| Key::new(TIER_OVERDUE, now - r.since()))
    }

    /// The key inside band `band` of a request of class `class` ([`Wlvf::class`]) that has
    /// waited `waited`: past a tenant-scoped wait cap above the rest (the longest wait first),
    /// late waiting requests (TTFT deadline passed, with `defer_late`) below them; VLT decides
    /// inside a tier.
    fn key_in_band(band: i32, class: u8, waited: f64, vlt: f64) -> Key {
        match class {
            0 => Key::new(3 * band + 2, waited),
            1 => Key::new(3 * band + 1, vlt),
            _ => Key::new(3 * band, vlt),
        }
    }

    /// Where `r` stands in its tenant's own order: 0 past a tenant-scoped wait cap, 1 able to
    /// meet its TTFT (or running), 2 late.
    fn class(&self, r: &ReqView, now: f64, lead: f64) -> u8 {
        match (self.overdue_in_tenant(r, now, lead), self.late(r, now)) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        }
    }

    /// With the wait cap scoped to the tenant: `r` is past it (promoted `lead` early).
    fn overdue_in_tenant(&self, r: &ReqView, now: f64, lead: f64) -> bool {
        self.cfg.wait_cap_scope == WaitCapScope::Tenant && self.past_cap(r, now, lead)
    }

    /// A waiting or rotary request past the wait cap, promoted `lead` early.
    fn past_cap(&self, r: &ReqView, now: f64, lead: f64) -> bool {
        self.cfg
            .max_wait_s
            .is_some_and(|cap| r.phase != Phase::Running && now - r.since() + lead >= cap)
    }

    /// With `defer_late`: `r` waits for its first token and its TTFT deadline has passed.
    fn late(&self, r: &ReqView, now: f64) -> bool {
        self.cfg.defer_late
            && r.phase == Phase::Waiting
            && r.t_last.is_none()
            && now > r.t_arr + r.slo.ttft_s
    }

    /// The band of a virtual start `s`, counted down from the least counter `v0`.
    fn band(&self, s: f64, v0: f64) -> i32 {
        let q = self.cfg.fairness_quantum_tokens.max(f64::MIN_POSITIVE);
        let bands = ((s - v0) / q).floor();
        (-bands).clamp(f64::from(LOWEST_BAND), 0.0) as i32
    }

    /// Keys for a view of two or more tenants. A candidate's virtual start is its tenant's
    /// counter plus the prefill that the tenant's candidates ranked before it (by VLT) would
    /// add; a running request's is its tenant's counter. Band first, VLT inside a band.
    fn fair_keys(&self, view: &[ReqView], now: f64, lead: f64) -> Vec<Key> {
        let vlt: Vec<f64> = view.iter().map(|r| self.cfg.vlt.vlt(r, now)).collect();
        let class: Vec<u8> = view.iter().map(|r| self.class(r, now, lead)).collect();
        let start = |r: &ReqView| self.counters.get(r.tenant).unwrap_or(0.0);
        let v0 = view.iter().map(start).fold(f64::INFINITY, f64::min);
        let mut by_tenant: BTreeMap<TenantId, Vec<usize>> = BTreeMap::new();
        for (i, r) in view.iter().enumerate() {
            if r.phase != Phase::Running {
                by_tenant.entry(r.tenant).or_default().push(i);
            }
        }
        // Running requests: their tenant's band (candidates are keyed per tenant below).
        let mut keys: Vec<Key> = view
            .iter()
            .zip(&vlt)
            .map(|(r, &v)| match r.phase {
                Phase::Running => Wlvf::key_in_band(self.band(start(r), v0), 1, 0.0, v),
                _ => Key::new(0, v),
            })
            .collect();
        for (tenant, mut cands) in by_tenant {
            // The tenant's own order: past a tenant-scoped wait cap first (longest wait
            // first), then, with `defer_late`, requests that can still meet their TTFT before
            // late ones (so they, not the late ones, take the tenant's earliest virtual
            // starts); then LVF's: highest VLT, earliest arrival, lowest id.
            let since = |i: usize| if class[i] == 0 { view[i].since() } else { 0.0 };
            cands.sort_unstable_by(|&a, &b| {
                class[a]
                    .cmp(&class[b])
                    .then(since(a).total_cmp(&since(b)))
                    .then(vlt[b].total_cmp(&vlt[a]))
                    .then(view[a].t_arr.total_cmp(&view[b].t_arr))
                    .then(view[a].id.cmp(&view[b].id))
            });
            let weight = self.counters.weight(tenant, view[cands[0]].weight);
            let mut s = self.counters.get(tenant).unwrap_or(0.0);
            for i in cands {
                let waited = now - view[i].since();
                keys[i] = Wlvf::key_in_band(self.band(s, v0), class[i], waited, vlt[i]);
                s += f64::from(view[i].prefill) / weight;
            }
        }
        for (i, r) in view.iter().enumerate() {
            if let Some(k) = self.overdue(r, now, lead) {
                keys[i] = k;
            }
        }
        keys
    }
}

impl Policy for Wlvf {
    fn name(&self) -> &'static str {
        "wlvf"
    }

    /// Fairness quanta above the floor (the least active counter as of the last plan): one
    /// map lookup, as the engine asks for each prompt chunk of a step.
    fn chunk_band(&self, tenant: TenantId) -> u32 {
        let Some(s) = self.counters.get(tenant) else {
            return 0;
        };
        let q = self.cfg.fairness_quantum_tokens.max(f64::MIN_POSITIVE);
        ((s - self.counters.floor()) / q)
            .floor()
            .clamp(0.0, f64::from(u32::MAX)) as u32
    }

    fn plan(&mut self, now: f64, view: &[ReqView], cap: Capacity) -> Plan {
        self.counters.observe(view);
        if let Some(plan) = all_fit(view, cap) {
            return plan;
        }
        let lead = 2.0 * self.longest_step();
        let lone_tenant = view.windows(2).all(|w| w[0].tenant == w[1].tenant);
        let keys: Vec<Key> = if lone_tenant {
            view.iter()
                .map(|r| {
                    self.overdue(r, now, lead).unwrap_or_else(|| {
                        let class = self.class(r, now, lead);
                        Wlvf::key_in_band(0, class, now - r.since(), self.cfg.vlt.vlt(r, now))
                    })
                })
                .collect()
        } else {
            self.fair_keys(view, now, lead)
        };
        let rules = Rules {
            max_consecutive_rotations: self.cfg.max_consecutive_rotations,
            tokens_block_lower_tiers: !lone_tenant,
            preempt_for_seats: self.cfg.preempt_for_seats,
            // Short prompts of a tenant are not held back by its long ones (docs/SCHEDULING.md,
            // "Long prompts").
            long_prompts_yield: true,
            ..crate::lvf::Lvf::RULES
        };
        plan_greedy(view, cap, &keys, rules)
    }

    fn on_service(&mut self, tenant: TenantId, weight: f64, service: Service) {
        let cost = service.prefill as f64
            + self.cfg.decode_cost * service.decode as f64
            + self.cfg.cached_cost * service.cached as f64
            + service.kv_read as f64
            + service.host as f64;
        self.counters.charge(tenant, weight, cost);
    }

    fn on_arrival(&mut self, tenant: TenantId, weight: f64) {
        self.counters.arrive(tenant, weight);
    }

    fn on_departure(&mut self, tenant: TenantId) {
        self.counters.depart(tenant);
    }

    fn on_step(&mut self, elapsed_s: f64) {
        if !(elapsed_s.is_finite() && elapsed_s >= 0.0) {
            return;
        }
        if self.steps.len() == STEP_WINDOW {
            self.steps.pop_front();
        }
        self.steps.push_back(elapsed_s);
    }
}

#[cfg(test)]
mod tests;
