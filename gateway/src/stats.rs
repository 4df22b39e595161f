//! Live statistics of one tenant since the server started: what `GET /v1/tenant/stats` shows
//! (TTFT and TBT attainment against the tenant's SLO, latency percentiles over a recent
//! window, usage). Kept per tenant id, so they survive patches of the tenant.

use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use superinfer_tenants::Tenant;

/// Latency samples kept for percentiles.
const WINDOW: usize = 4096;

#[derive(Debug, Default)]
pub struct TenantStats {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    requests: u64,
    sequences: u64,
    finished: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    ttft: Attainment,
    tbt: Attainment,
    e2e: Window,
}

#[derive(Debug, Default)]
struct Attainment {
    met: u64,
    total: u64,
    window: Window,
}

#[derive(Debug, Default)]
struct Window(VecDeque<f64>);

impl Window {
    fn push(&mut self, v: f64) {
        if self.0.len() == WINDOW {
            self.0.pop_front();
        }
        self.0.push_back(v);
    }

    fn percentiles(&self) -> Percentiles {
        let mut v: Vec<f64> = self.0.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| -> Option<f64> {
            if v.is_empty() {
                return None;
            }
            let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            Some(v[i])
        };
        Percentiles {
            samples: v.len(),
            p50_s: at(0.5),
            p90_s: at(0.9),
            p99_s: at(0.99),
        }
    }
}

impl Attainment {
    fn record(&mut self, v: f64, slo_s: f64) -> f64 {
        self.total += 1;
        self.met += u64::from(v <= slo_s);
        self.window.push(v);
        self.ratio().unwrap_or(1.0)
    }

    /// A request that never got its value (no first token): a miss; `waited_s` (a lower
    /// bound of what it would have been) goes into the percentiles.
    fn miss(&mut self, waited_s: f64) -> f64 {
        self.total += 1;
        self.window.push(waited_s);
        self.ratio().unwrap_or(1.0)
    }

    fn ratio(&self) -> Option<f64> {
        (self.total > 0).then(|| self.met as f64 / self.total as f64)
    }

    fn report(&self, slo_s: f64) -> LatencyReport {
        LatencyReport {
            slo_s,
            attainment: self.ratio(),
            count: self.total,
            recent: self.window.percentiles(),
        }
    }
}

/// Percentiles over the most recent samples (up to 4096).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    pub samples: usize,
    pub p50_s: Option<f64>,
    pub p90_s: Option<f64>,
    pub p99_s: Option<f64>,
}

/// One latency measure against its SLO.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencyReport {
    pub slo_s: f64,
    /// Share within the SLO since the server started; `null` before any sample.
    pub attainment: Option<f64>,
    pub count: u64,
    pub recent: Percentiles,
}

/// The counters and latency reports of one tenant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatsReport {
    /// Requests submitted to the engine past admission (one per HTTP request).
    pub requests_admitted: u64,
    /// Their sequences (each choice of each prompt): the unit of the TTFT series.
    pub sequences_admitted: u64,
    pub sequences_finished: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub ttft: LatencyReport,
    pub tbt: LatencyReport,
    pub e2e: Percentiles,
}

impl TenantStats {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain counters: consistent after any panic.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One sequence submitted to the engine: the first of its request or not, and the prompt
    /// tokens it adds (0 for a choice whose prompt an earlier choice brought).
    pub fn admitted(&self, first_of_request: bool, prompt_tokens: u64) {
        let mut s = self.lock();
        s.requests += u64::from(first_of_request);
        s.sequences += 1;
        s.prompt_tokens += prompt_tokens;
    }

    /// Records a time to first token; returns the attainment so far.
    pub fn first_token(&self, ttft_s: f64, slo_s: f64) -> f64 {
        self.lock().ttft.record(ttft_s, slo_s)
    }

    /// Records an admitted request that ended without a first token after `waited_s`: a TTFT
    /// miss. Returns the attainment so far.
    pub fn unserved(&self, waited_s: f64) -> f64 {
        self.lock().ttft.miss(waited_s)
    }

    /// Records gaps between tokens; returns the attainment so far.
    pub fn gaps(&self, gaps_s: &[f64], slo_s: f64) -> f64 {
        let mut s = self.lock();
        let mut r = s.tbt.ratio().unwrap_or(1.0);
        for &g in gaps_s {
            r = s.tbt.record(g, slo_s);
        }
        r
    }

    pub fn finished(&self, completion_tokens: u64, e2e_s: f64) {
        let mut s = self.lock();
        s.finished += 1;
        s.completion_tokens += completion_tokens;
        s.e2e.push(e2e_s);
    }

    pub fn report(&self, ttft_slo_s: f64, tbt_slo_s: f64) -> StatsReport {
        let s = self.lock();
        StatsReport {
            requests_admitted: s.requests,
            sequences_admitted: s.sequences,
            sequences_finished: s.finished,
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
            ttft: s.ttft.report(ttft_slo_s),
            tbt: s.tbt.report(tbt_slo_s),
            e2e: s.e2e.percentiles(),
        }
    }
}

/// A tenant's settings, requests in flight, tokens-per-minute balance (where this node keeps it)
/// and statistics: the body of `GET /v1/tenant/stats` and of the admin API's per-tenant stats.
pub fn stats_body(
    t: &Tenant,
    limits: &dyn crate::quota::Limiter,
    stats: &TenantStats,
) -> serde_json::Value {
    serde_json::json!({
        "object": "tenant.stats",
        "tenant": {"id": t.id, "name": t.name},
        "slo": t.slo,
        "weight": t.weight,
        "quotas": t.quotas,
        "in_flight": limits.in_flight(),
        "tokens_available": limits.tokens_available(),
        "stats": stats.report(t.slo.ttft_s(), t.slo.tbt_s()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attainment_and_percentiles() {
        let s = TenantStats::default();
        assert_eq!(s.report(1.0, 0.1).ttft.attainment, None);
        for i in 1..=100 {
            s.first_token(f64::from(i) / 100.0, 0.5);
        }
        let r = s.report(0.5, 0.1);
        assert_eq!(r.ttft.attainment, Some(0.5));
        assert_eq!(r.ttft.recent.p50_s, Some(0.5));
        assert_eq!(r.ttft.recent.p99_s, Some(0.99));
        assert_eq!(s.gaps(&[0.05, 0.2], 0.1), 0.5);
        // A request without a first token is a miss however short its wait.
        assert!((s.unserved(0.01) - 50.0 / 101.0).abs() < 1e-12);
        assert_eq!(s.report(0.5, 0.1).ttft.count, 101);
    }

    #[test]
    fn the_window_keeps_the_most_recent_samples() {
        let mut w = Window::default();
        for i in 0..(WINDOW + 10) {
            w.push(i as f64);
        }
        assert_eq!(w.0.len(), WINDOW);
        assert_eq!(w.0.front(), Some(&10.0));
    }
}
