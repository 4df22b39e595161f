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
        just_started: false,
        consecutive_rotations: 0,
        prefill: 0,
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
    let c = VltConfig {
        alpha: 1.0,
        beta_b: -1.0,
        beta_f: -1.0,
    };
    // waiting with beta_f = -1: lag counts from 5 s before arrival.
    assert!((c.vlt(&req(Phase::Waiting, 10.0, None, None), 10.0) - 5.0).abs() < 1e-12);
    assert!((c.vlt(&req(Phase::Rotary, 0.0, Some(1.0), None), 1.0) - 0.1).abs() < 1e-12);
}

#[test]
fn knobs_that_make_no_ranking_are_refused() {
    assert_eq!(VltConfig::default().validate(), Ok(()));
    let negative_windows = VltConfig {
        beta_b: -1.0,
        beta_f: -0.5,
        ..VltConfig::default()
    };
    assert_eq!(negative_windows.validate(), Ok(()));
    for (bad, want) in [
        (
            VltConfig {
                alpha: 0.0,
                ..VltConfig::default()
            },
            "alpha must be a number above 0",
        ),
        (
            VltConfig {
                alpha: f64::NAN,
                ..VltConfig::default()
            },
            "alpha",
        ),
        (
            VltConfig {
                beta_b: f64::INFINITY,
                ..VltConfig::default()
            },
            "beta_b must be a finite",
        ),
        (
            VltConfig {
                beta_f: f64::NAN,
                ..VltConfig::default()
            },
            "beta_f must be a finite",
        ),
    ] {
        assert!(bad.validate().unwrap_err().contains(want), "{bad:?}");
    }
}
