//! Early refusal of requests that would wait past their TTFT SLO (`EngineConfig::shed_late`).
//!
//! Per tenant, the engine keeps a moving average of how long its requests waited to be
//! admitted, as a fraction of their TTFT SLO (first admissions only), and how many of its
//! requests are waiting now. A new request is refused when its tenant has requests waiting
//! and that average is above the configured fraction: its own request would queue behind
//! them, so it is told at once (503 with Retry-After at the gateway; a router can send it
//! elsewhere) instead of timing out in the queue. The average is per tenant, so a flooding
//! tenant's queue never causes a light tenant's requests to be refused, and a tenant with
//! nothing waiting is always accepted (its average cannot go stale against it).

use std::collections::BTreeMap;
use superinfer_policies::TenantId;

/// Weight of the newest admission in the moving average.
const EWMA_ALPHA: f64 = 0.2;

#[derive(Clone, Debug, Default)]
struct TenantQueue {
    /// Moving average of admission wait / TTFT SLO.
    wait_ratio: f64,
    waiting: usize,
}

#[derive(Clone, Debug, Default)]
pub(super) struct LateGuard {
    tenants: BTreeMap<TenantId, TenantQueue>,
}

impl LateGuard {
    /// Whether a new request of `tenant` should be refused with this threshold; the
    /// tenant's recent admission wait (fraction of its SLO) when it is.
    pub(super) fn refuse(&self, tenant: TenantId, fraction: f64) -> Option<f64> {
        let t = self.tenants.get(&tenant)?;
        (t.waiting > 0 && t.wait_ratio > fraction).then_some(t.wait_ratio)
    }

    /// A request of `tenant` entered the waiting queue (arrival or recompute).
    pub(super) fn queued(&mut self, tenant: TenantId) {
        self.tenants.entry(tenant).or_default().waiting += 1;
    }

    /// A waiting request of `tenant` left the queue (admitted, or ended while waiting).
    pub(super) fn dequeued(&mut self, tenant: TenantId) {
        if let Some(t) = self.tenants.get_mut(&tenant) {
            t.waiting = t.waiting.saturating_sub(1);
        }
    }

    /// A request of `tenant` was admitted for the first time after waiting `ratio` of its
    /// TTFT SLO.
    pub(super) fn admitted(&mut self, tenant: TenantId, ratio: f64) {
        if ratio.is_finite() {
            let t = self.tenants.entry(tenant).or_default();
            t.wait_ratio += EWMA_ALPHA * (ratio.max(0.0) - t.wait_ratio);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_only_a_tenant_whose_queue_is_slow() {
        let (slow, light) = (TenantId(0), TenantId(1));
        let mut g = LateGuard::default();
        for _ in 0..20 {
            g.queued(slow);
            g.admitted(slow, 0.9);
            g.dequeued(slow);
        }
        g.queued(slow);
        assert!(g.refuse(slow, 0.5).is_some_and(|r| r > 0.8));
        assert!(g.refuse(slow, 0.95).is_none(), "below the threshold");
        assert!(
            g.refuse(light, 0.5).is_none(),
            "another tenant is not refused"
        );
        // Nothing waiting: accepted whatever the history.
        g.dequeued(slow);
        assert!(g.refuse(slow, 0.5).is_none());
    }
}
