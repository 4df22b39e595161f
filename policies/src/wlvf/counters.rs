//! Per-tenant virtual counters: weighted service, and the rule that a tenant coming back from
//! idleness collects no credit for the time it had nothing to run.
//!
//! A tenant is *active* while it has live requests (arrivals minus departures, as the engine
//! reports them) or appears in the view a plan is given. A tenant that becomes active is
//! lifted to the floor: the least counter of the tenants already active (VTC's lift, start-time
//! fair queueing's `S = max(F, v(t))`). The floor never decreases; it stays where it was while
//! nobody is active, so a tenant returning to an empty node cannot come back with old credit
//! either. Requests hidden from the view (copies in flight) keep their tenant active, so a
//! tenant whose requests are all mid-copy keeps the service it is owed.

use crate::types::{ReqView, TenantId};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Default)]
struct Tenant {
    /// Weighted service: cost units divided by the weight at the time they were charged.
    counter: f64,
    weight: f64,
    /// Live requests (arrivals minus departures).
    live: u64,
    active: bool,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Counters {
    tenants: BTreeMap<TenantId, Tenant>,
    floor: f64,
}

impl Counters {
    pub(super) fn get(&self, tenant: TenantId) -> Option<f64> {
        self.tenants.get(&tenant).map(|t| t.counter)
    }

    /// The floor: the least counter of the active tenants as of the last plan or arrival
    /// (it never decreases).
    pub(super) fn floor(&self) -> f64 {
        self.floor
    }

    /// The tenant's weight as last reported, or `fallback` if it was never reported.
    pub(super) fn weight(&self, tenant: TenantId, fallback: f64) -> f64 {
        self.tenants
            .get(&tenant)
            .map(|t| t.weight)
            .filter(|w| *w > 0.0)
            .unwrap_or(fallback)
            .max(f64::MIN_POSITIVE)
    }

    /// Raises the floor to the least counter of the active tenants.
    fn raise_floor(&mut self) {
        let least = self
            .tenants
            .values()
            .filter(|t| t.active)
            .map(|t| t.counter)
            .fold(f64::INFINITY, f64::min);
        if least.is_finite() {
            self.floor = self.floor.max(least);
        }
    }

    /// Marks `tenant` active, lifting it to the floor if it was not.
    fn activate(&mut self, tenant: TenantId, weight: f64) {
        let floor = self.floor;
        let t = self.tenants.entry(tenant).or_default();
        if weight.is_finite() && weight > 0.0 {
            t.weight = weight;
        }
        if !t.active {
            t.counter = t.counter.max(floor);
            t.active = true;
        }
    }

    pub(super) fn arrive(&mut self, tenant: TenantId, weight: f64) {
        self.raise_floor();
        self.activate(tenant, weight);
        self.tenants.get_mut(&tenant).expect("activated").live += 1;
    }

    pub(super) fn depart(&mut self, tenant: TenantId) {
        if let Some(t) = self.tenants.get_mut(&tenant) {
            t.live = t.live.saturating_sub(1);
        }
    }

    pub(super) fn charge(&mut self, tenant: TenantId, weight: f64, cost: f64) {
        if !(cost.is_finite() && cost > 0.0) {
            return;
        }
        let w = if weight.is_finite() && weight > 0.0 {
            weight
        } else {
            self.weight(tenant, 1.0)
        };
        let t = self.tenants.entry(tenant).or_default();
        t.weight = w;
        t.counter += cost / w;
    }

    /// A plan sees `view`: tenants in it are active (lifted if they were not); afterwards a
    /// tenant stays active only while it has live requests or was in the view.
    pub(super) fn observe(&mut self, view: &[ReqView]) {
        self.raise_floor();
        let mut present: BTreeMap<TenantId, f64> = BTreeMap::new();
        for r in view {
            // The largest weight seen, so that the view's order cannot matter.
            let w = present.entry(r.tenant).or_insert(f64::MIN_POSITIVE);
            *w = w.max(r.weight);
        }
        for (&tenant, &w) in &present {
            self.activate(tenant, w);
        }
        let present: BTreeSet<TenantId> = present.into_keys().collect();
        for (id, t) in self.tenants.iter_mut() {
            t.active = t.live > 0 || present.contains(id);
        }
    }
}
