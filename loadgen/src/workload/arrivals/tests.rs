use super::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::io::Write;

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn rate(times: &[f64], duration_s: f64) -> f64 {
    times.len() as f64 / duration_s
}

fn gaps(times: &[f64]) -> Vec<f64> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

fn mean_cv(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt() / mean)
}

/// Variance over mean of the counts in consecutive windows: 1 for Poisson, larger if bursty.
fn fano(times: &[f64], duration_s: f64, window_s: f64) -> f64 {
    let bins = (duration_s / window_s) as usize;
    let mut counts = vec![0.0; bins];
    for &t in times {
        let b = (t / window_s) as usize;
        if b < bins {
            counts[b] += 1.0;
        }
    }
    let (mean, cv) = mean_cv(&counts);
    cv * cv * mean
}

fn assert_close(got: f64, want: f64, rel: f64, what: &str) {
    assert!(
        (got - want).abs() <= rel * want,
        "{what}: got {got}, want {want} within {}%",
        rel * 100.0
    );
}

fn assert_sorted_within(times: &[f64], duration_s: f64) {
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "not sorted");
    assert!(
        times.iter().all(|&t| (0.0..duration_s).contains(&t)),
        "out of range"
    );
}

#[test]
fn poisson_rate_and_cv_match() {
    let spec = ArrivalSpec::Poisson { rps: 10.0 };
    let d = 20_000.0;
    let times = spec.generate(d, &mut rng(1)).unwrap();
    assert_sorted_within(&times, d);
    assert_close(rate(&times, d), 10.0, 0.02, "poisson rate");
    let (_, cv) = mean_cv(&gaps(&times));
    assert_close(cv, 1.0, 0.03, "poisson cv");
    assert_close(fano(&times, d, 10.0), 1.0, 0.15, "poisson fano");
}

#[test]
fn gamma_rate_and_cv_match() {
    let d = 20_000.0;
    for (cv_want, seed) in [(0.5, 2), (1.0, 3), (2.0, 4), (3.0, 5)] {
        let spec = ArrivalSpec::Gamma {
            rps: 5.0,
            cv: cv_want,
        };
        let times = spec.generate(d, &mut rng(seed)).unwrap();
        assert_sorted_within(&times, d);
        assert_close(rate(&times, d), 5.0, 0.03, "gamma rate");
        let (_, cv) = mean_cv(&gaps(&times));
        assert_close(cv, cv_want, 0.05, "gamma cv");
    }
}

#[test]
fn hawkes_mean_rate_is_baseline_over_one_minus_branching() {
    let d = 20_000.0;
    for (mu, n, beta, seed) in [(4.0, 0.5, 2.0, 6), (2.0, 0.8, 1.0, 7), (5.0, 0.0, 3.0, 8)] {
        let spec = ArrivalSpec::Hawkes {
            baseline_rps: mu,
            excitation: n,
            decay_per_s: beta,
        };
        let want = mu / (1.0 - n);
        assert_close(spec.mean_rps().unwrap(), want, 1e-12, "hawkes mean_rps");
        let times = spec.generate(d, &mut rng(seed)).unwrap();
        assert_sorted_within(&times, d);
        assert_close(rate(&times, d), want, 0.04, "hawkes empirical rate");
    }
}

#[test]
fn hawkes_is_bursty_and_poisson_without_excitation() {
    let d = 20_000.0;
    let bursty = ArrivalSpec::Hawkes {
        baseline_rps: 2.0,
        excitation: 0.8,
        decay_per_s: 1.0,
    };
    let times = bursty.generate(d, &mut rng(9)).unwrap();
    // Counts over windows much longer than 1/decay have Fano factor 1/(1-n)^2 = 25.
    let f = fano(&times, d, 50.0);
    assert!(f > 10.0, "hawkes n=0.8 should be overdispersed, fano {f}");
    let flat = ArrivalSpec::Hawkes {
        baseline_rps: 2.0,
        excitation: 0.0,
        decay_per_s: 1.0,
    };
    let times = flat.generate(d, &mut rng(10)).unwrap();
    assert_close(fano(&times, d, 50.0), 1.0, 0.2, "hawkes n=0 fano");
}

#[test]
fn hawkes_rejects_explosive_branching_with_a_clear_error() {
    for n in [1.0, 1.5, -0.1, f64::NAN] {
        let spec = ArrivalSpec::Hawkes {
            baseline_rps: 1.0,
            excitation: n,
            decay_per_s: 1.0,
        };
        let err = spec.validate().unwrap_err().to_string();
        assert!(
            err.contains("excitation") && err.contains("branching"),
            "{err}"
        );
        assert!(spec.generate(10.0, &mut rng(0)).is_err());
        assert!(spec.mean_rps().is_err());
    }
}

#[test]
fn on_off_rate_and_silence() {
    let spec = ArrivalSpec::OnOff {
        rps_on: 20.0,
        on_s: 2.0,
        off_s: 6.0,
    };
    let d = 16_000.0;
    assert_close(spec.mean_rps().unwrap(), 5.0, 1e-12, "on/off mean_rps");
    let times = spec.generate(d, &mut rng(11)).unwrap();
    assert_sorted_within(&times, d);
    assert_close(rate(&times, d), 5.0, 0.03, "on/off empirical rate");
    assert!(
        times.iter().all(|t| t.rem_euclid(8.0) < 2.0),
        "an arrival fell in an off window"
    );
}

#[test]
fn invalid_parameters_are_rejected_with_their_name() {
    let cases = [
        (ArrivalSpec::Poisson { rps: 0.0 }, "rps"),
        (ArrivalSpec::Poisson { rps: f64::INFINITY }, "rps"),
        (ArrivalSpec::Gamma { rps: 1.0, cv: -1.0 }, "cv"),
        (
            ArrivalSpec::Hawkes {
                baseline_rps: 1.0,
                excitation: 0.5,
                decay_per_s: 0.0,
            },
            "decay_per_s",
        ),
        (
            ArrivalSpec::OnOff {
                rps_on: 1.0,
                on_s: 1.0,
                off_s: -1.0,
            },
            "off_s",
        ),
    ];
    for (spec, field) in cases {
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{spec:?}: {err}");
    }
    let err = ArrivalSpec::Poisson { rps: 1.0 }
        .generate(-1.0, &mut rng(0))
        .unwrap_err();
    assert!(err.to_string().contains("duration"), "{err}");
}

#[test]
fn same_seed_same_times_and_different_seed_different_times() {
    let spec = ArrivalSpec::Hawkes {
        baseline_rps: 3.0,
        excitation: 0.6,
        decay_per_s: 2.0,
    };
    let a = spec.generate(100.0, &mut rng(42)).unwrap();
    let b = spec.generate(100.0, &mut rng(42)).unwrap();
    let c = spec.generate(100.0, &mut rng(43)).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn scaling_multiplies_the_mean_rate_and_keeps_the_shape() {
    let specs = [
        ArrivalSpec::Poisson { rps: 2.0 },
        ArrivalSpec::Gamma { rps: 2.0, cv: 3.0 },
        ArrivalSpec::Hawkes {
            baseline_rps: 1.0,
            excitation: 0.5,
            decay_per_s: 1.0,
        },
        ArrivalSpec::OnOff {
            rps_on: 4.0,
            on_s: 1.0,
            off_s: 1.0,
        },
    ];
    for spec in specs {
        let scaled = spec.scaled(2.5);
        assert_close(
            scaled.mean_rps().unwrap(),
            2.5 * spec.mean_rps().unwrap(),
            1e-12,
            spec.kind(),
        );
    }
}

#[test]
fn trace_replays_sorted_times_scaled_and_cut_at_duration() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{{\"arrival_s\": 3.0, \"prompt_tokens\": 5}}").unwrap();
    writeln!(f).unwrap();
    writeln!(f, "{{\"arrival_s\": 1.0}}").unwrap();
    writeln!(f, "{{\"arrival_s\": 9.0}}").unwrap();
    let spec = ArrivalSpec::Trace {
        path: f.path().to_path_buf(),
        time_scale: 2.0,
    };
    assert_eq!(spec.generate(4.0, &mut rng(0)).unwrap(), vec![0.5, 1.5]);
    // 3 arrivals over 4.5 s once replayed twice as fast.
    assert_close(spec.mean_rps().unwrap(), 3.0 / 4.5, 1e-12, "trace rate");
    assert_close(
        spec.scaled(2.0).mean_rps().unwrap(),
        6.0 / 4.5,
        1e-12,
        "scaled trace",
    );
}

#[test]
fn trace_errors_name_the_file_and_line() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{{\"arrival_s\": 1.0}}").unwrap();
    writeln!(f, "{{\"arrival\": 2.0}}").unwrap();
    let spec = ArrivalSpec::Trace {
        path: f.path().to_path_buf(),
        time_scale: 1.0,
    };
    let err = spec.generate(10.0, &mut rng(0)).unwrap_err().to_string();
    assert!(err.contains(":2:") && err.contains("arrival_s"), "{err}");
    let missing = ArrivalSpec::Trace {
        path: "/nonexistent/arrivals.jsonl".into(),
        time_scale: 1.0,
    };
    let err = missing.generate(10.0, &mut rng(0)).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/arrivals.jsonl"), "{err}");
}
