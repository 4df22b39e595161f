//! Virtual Lag Time (PAPER.md §3): one priority axis for waiting, running and rotary requests.

use crate::types::{Phase, ReqView};
use serde::{Deserialize, Serialize};

/// The knobs of VLT. `S_F` and `S_B` come from each request's SLO; the defaults here are used
/// only where a request carries none.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct VltConfig {
    /// Weight of TBT urgency (rotary) against TTFT urgency (waiting). Paper: 3.
    pub alpha: f64,
    /// Tolerance window for rotary requests, as a fraction of `S_B`. Paper: 0.
    pub beta_b: f64,
    /// Tolerance window for waiting requests, as a fraction of `S_F`. Paper: 0.5.
    pub beta_f: f64,
}

impl Default for VltConfig {
    fn default() -> Self {
        VltConfig {
            alpha: 3.0,
            beta_b: 0.0,
            beta_f: 0.5,
        }
    }
}

impl VltConfig {
    /// Refuses knobs that make no ranking: `alpha` must be a number above 0 (else a paused
    /// request never lags), the windows finite numbers (they may be negative).
    pub fn validate(&self) -> Result<(), String> {
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!(
                "alpha must be a number above 0, got {}",
                self.alpha
            ));
        }
        for (name, v) in [("beta_b", self.beta_b), ("beta_f", self.beta_f)] {
            if !v.is_finite() {
                return Err(format!("{name} must be a finite number, got {v}"));
            }
        }
        Ok(())
    }

    /// VLT of one request at `now`. Positive means lagging (serve first); running requests are
    /// never positive and sink the longer they run.
    pub fn vlt(&self, r: &ReqView, now: f64) -> f64 {
        match r.phase {
            Phase::Rotary => {
                let t_last = r.since();
                self.alpha * (now - t_last - self.beta_b * r.slo.tbt_s).max(0.0)
            }
            Phase::Waiting => (now - r.t_arr - self.beta_f * r.slo.ttft_s).max(0.0),
            Phase::Running => 0.0 - (now - r.t_run.unwrap_or(now)).max(0.0),
        }
    }
}

#[cfg(test)]
mod tests;
