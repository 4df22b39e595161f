use super::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::io::Write;

fn draws(spec: &LengthSpec, limits: LengthLimits, n: usize) -> (Vec<f64>, Vec<f64>) {
    let sampler = spec.sampler(limits).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    (0..n)
        .map(|_| {
            let (p, o) = sampler.sample(&mut rng);
            (f64::from(p), f64::from(o))
        })
        .unzip()
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn assert_close(got: f64, want: f64, rel: f64, what: &str) {
    assert!(
        (got - want).abs() <= rel * want,
        "{what}: got {got}, want {want} within {}%",
        rel * 100.0
    );
}

#[test]
fn fitted_datasets_reproduce_their_published_means_and_medians() {
    let cases = [
        (LengthSpec::Sharegpt, SHAREGPT_PROMPT, SHAREGPT_OUTPUT),
        (LengthSpec::Lmsys, LMSYS_PROMPT, LMSYS_OUTPUT),
    ];
    for (spec, p, o) in cases {
        let (prompts, outputs) = draws(&spec, LengthLimits::default(), 200_000);
        // Clipping at 4096/2048 trims only the far tail: the means stay within a few %.
        assert_close(mean(&prompts), p.mean, 0.04, "prompt mean");
        assert_close(mean(&outputs), o.mean, 0.04, "output mean");
        assert_close(median(&prompts), p.median(), 0.04, "prompt median");
        assert_close(median(&outputs), o.median(), 0.04, "output median");
    }
}

#[test]
fn lmsys_is_lighter_than_sharegpt() {
    let (sp, so) = draws(&LengthSpec::Sharegpt, LengthLimits::default(), 50_000);
    let (lp, lo) = draws(&LengthSpec::Lmsys, LengthLimits::default(), 50_000);
    assert!(mean(&lp) + mean(&lo) < mean(&sp) + mean(&so));
}

#[test]
fn samples_are_clipped_to_the_limits() {
    let limits = LengthLimits {
        max_prompt_tokens: 100,
        max_output_tokens: 50,
    };
    let (prompts, outputs) = draws(&LengthSpec::Sharegpt, limits, 20_000);
    assert!(prompts.iter().all(|&p| (1.0..=100.0).contains(&p)));
    assert!(outputs.iter().all(|&o| (1.0..=50.0).contains(&o)));
    assert!(
        prompts.contains(&100.0),
        "the clip should bind for some draws"
    );
    let (prompts, _) = draws(&LengthSpec::Sharegpt, LengthLimits::default(), 20_000);
    assert!(prompts.iter().all(|&p| (1.0..=4096.0).contains(&p)));
}

#[test]
fn fixed_is_fixed_and_zero_is_rejected() {
    let (p, o) = draws(
        &LengthSpec::Fixed {
            prompt: 512,
            output: 128,
        },
        LengthLimits::default(),
        10,
    );
    assert!(p.iter().all(|&x| x == 512.0) && o.iter().all(|&x| x == 128.0));
    let err = LengthSpec::Fixed {
        prompt: 0,
        output: 1,
    }
    .sampler(LengthLimits::default())
    .err()
    .unwrap();
    assert!(err.to_string().contains("at least 1"), "{err}");
}

#[test]
fn lognormal_rejects_bad_parameters() {
    let spec = LengthSpec::Lognormal {
        prompt: TokenLognormal {
            mean: 100.0,
            sigma: -1.0,
        },
        output: SHAREGPT_OUTPUT,
    };
    let err = spec
        .sampler(LengthLimits::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("prompt") && err.contains("sigma"), "{err}");
}

#[test]
fn trace_samples_only_its_entries() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{{\"prompt_tokens\": 10, \"output_tokens\": 20}}").unwrap();
    writeln!(f, "{{\"prompt_tokens\": 5000, \"output_tokens\": 3}}").unwrap();
    let spec = LengthSpec::Trace {
        path: f.path().to_path_buf(),
    };
    let (p, o) = draws(&spec, LengthLimits::default(), 1000);
    for (p, o) in p.iter().zip(&o) {
        assert!(
            (*p, *o) == (10.0, 20.0) || (*p, *o) == (4096.0, 3.0),
            "{p} {o}"
        );
    }
    assert!(p.contains(&10.0) && p.contains(&4096.0));
}

#[test]
fn names_parse_and_unknown_names_list_the_choices() {
    assert_eq!(
        "sharegpt".parse::<LengthSpec>().unwrap(),
        LengthSpec::Sharegpt
    );
    assert_eq!(" LMSYS ".parse::<LengthSpec>().unwrap(), LengthSpec::Lmsys);
    assert_eq!(
        "fixed:512:64".parse::<LengthSpec>().unwrap(),
        LengthSpec::Fixed {
            prompt: 512,
            output: 64
        }
    );
    assert_eq!(
        "trace:data/Lengths.jsonl".parse::<LengthSpec>().unwrap(),
        LengthSpec::Trace {
            path: "data/Lengths.jsonl".into()
        }
    );
    for bad in ["alpaca", "fixed:1", "fixed:a:b", "trace:"] {
        let err = bad.parse::<LengthSpec>().unwrap_err().to_string();
        assert!(err.contains("sharegpt") && err.contains(bad), "{err}");
    }
}
