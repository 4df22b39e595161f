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
        VltConfig { alpha: 3.0, beta_b: 0.0, beta_f: 0.5 }
    }
}

impl VltConfig {
    /// VLT of one request at `now`. Positive means lagging (serve first); running requests are
    /// never positive and sink the longer they run.
    pub fn vlt(&self, r: &ReqView, now: f64) -> f64 {
        match r.phase {
            Phase::Rotary => {
                let t_last = r.since();
                self.alpha * (now - t_last - self.beta_b * r.slo.tbt_s).max(0.0)
            }
            Phase::Waiting => (now - r.t_arr - self.beta_f * r.slo.ttft_s).max(0.0),
            Phase::Running => -(now - r.t_run.unwrap_or(now)).max(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{RequestId, Slo, TenantId};

    fn req(phase: Phase, t_arr: f64, t_last: Option<f64>, t_run: Option<f64>) -> ReqView {
        ReqView {
            id: RequestId(1),
            tenant: TenantId(0),
            weight: 1.0,
            slo: Slo::default(),
            phase,
            t_arr,
            t_last,
            t_run,
            blocks: 1,
            held_hbm: 0,
            copy_in: 0,
            unsynced: 0,
            prefilling: false,
            consecutive_rotations: 0,
        }
    }

    #[test]
    fn paper_formulas() {
        let c = VltConfig::default();
        // waiting: max(0, now - t_arr - 0.5 * 5)
        assert_eq!(c.vlt(&req(Phase::Waiting, 0.0, None, None), 2.0), 0.0);
        assert!((c.vlt(&req(Phase::Waiting, 0.0, None, None), 4.0) - 1.5).abs() < 1e-12);
        // rotary: 3 * max(0, now - t_last - 0)
        assert!((c.vlt(&req(Phase::Rotary, 0.0, Some(1.0), None), 1.5) - 1.5).abs() < 1e-12);
        // running: -(now - t_run)
        assert!((c.vlt(&req(Phase::Running, 0.0, Some(1.0), Some(2.0)), 2.25) + 0.25).abs() < 1e-12);
    }

    #[test]
    fn negative_betas_shift_the_window() {
        let c = VltConfig { alpha: 1.0, beta_b: -1.0, beta_f: -1.0 };
        // waiting with beta_f = -1: lag counts from 5 s before arrival.
        assert!((c.vlt(&req(Phase::Waiting, 10.0, None, None), 10.0) - 5.0).abs() < 1e-12);
        assert!((c.vlt(&req(Phase::Rotary, 0.0, Some(1.0), None), 1.0) - 0.1).abs() < 1e-12);
    }
}
