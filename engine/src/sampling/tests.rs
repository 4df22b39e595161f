use super::*;

fn params() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    }
}

fn counts(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut c = vec![0; logits.len()];
    for _ in 0..n {
        let mut l = logits.to_vec();
        c[sample(&mut l, p, &[], 0, &mut rng).token as usize] += 1;
    }
    c
}

#[test]
fn greedy_takes_the_first_maximum() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut l = vec![0.5, 2.0, 2.0, f32::NAN, -1.0];
    let s = sample(&mut l, &SamplingParams::default(), &[], 0, &mut rng);
    assert_eq!(s.token, 1);
    assert_eq!(s.logprobs, None);
}

#[test]
fn temperature_one_follows_the_softmax() {
    let logits = [0.0, (3f32).ln()];
    let c = counts(&logits, &params(), 20_000);
    let share = c[1] as f64 / 20_000.0;
    assert!((share - 0.75).abs() < 0.02, "{share}");
}

#[test]
fn top_k_min_p_and_top_p_cut_the_tail() {
    let logits = [3.0, 2.9, 1.0, 0.0, -1.0];
    let k = counts(
        &logits,
        &SamplingParams {
            top_k: 2,
            ..params()
        },
        2000,
    );
    assert_eq!(k[2] + k[3] + k[4], 0, "{k:?}");
    assert!(k[0] > 0 && k[1] > 0);
    // exp(1 - 3) = 0.135 < 0.2: only the first two survive min-p 0.2.
    let m = counts(
        &logits,
        &SamplingParams {
            min_p: 0.2,
            ..params()
        },
        2000,
    );
    assert_eq!(m[2] + m[3] + m[4], 0, "{m:?}");
    // The first token alone has about 46% of the mass: top-p 0.4 keeps only it.
    let p = counts(
        &logits,
        &SamplingParams {
            top_p: 0.4,
            ..params()
        },
        500,
    );
    assert_eq!(p[0], 500, "{p:?}");
}

#[test]
fn seeded_draws_depend_only_on_seed_and_position() {
    let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
    let p = SamplingParams {
        seed: Some(42),
        ..params()
    };
    let history = [1, 2, 3];
    let mut a = ChaCha8Rng::seed_from_u64(1);
    let mut b = ChaCha8Rng::seed_from_u64(2);
    let x = sample(&mut logits.clone(), &p, &history, 3, &mut a).token;
    let y = sample(&mut logits.clone(), &p, &history, 3, &mut b).token;
    assert_eq!(x, y);
    let draws: std::collections::BTreeSet<u32> = (0..40)
        .map(|n| sample(&mut logits.clone(), &p, &vec![0; n], n, &mut a).token)
        .collect();
    assert!(draws.len() > 3, "positions give different draws: {draws:?}");
}

#[test]
fn penalties_follow_vllm_and_openai() {
    let mut l = vec![2.0, -2.0, 1.0, 1.0];
    let p = SamplingParams {
        repetition_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplingParams::default()
    };
    // Token 0 in the prompt; token 1 once and token 2 twice in the output.
    apply_penalties(&mut l, &p, &[0, 1, 2, 2], 1);
    assert_eq!(l, vec![1.0, -4.0 - 0.75, 0.5 - 1.25, 1.0]);
}

#[test]
fn logprobs_report_the_token_and_the_top_alternatives() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut l = vec![0.0, (3f32).ln(), -50.0];
    let p = SamplingParams {
        logprobs: Some(2),
        ..SamplingParams::default()
    };
    let s = sample(&mut l, &p, &[], 0, &mut rng);
    let lp = s.logprobs.unwrap();
    assert_eq!(s.token, 1);
    assert!((lp.logprob - 0.75f32.ln()).abs() < 1e-5);
    assert_eq!(lp.top.len(), 2);
    assert_eq!(lp.top[0].0, 1);
    assert_eq!(lp.top[1].0, 0);
    assert!((lp.top[1].1 - 0.25f32.ln()).abs() < 1e-5);
}

#[test]
fn logit_bias_and_min_tokens_change_the_logits_before_sampling() {
    let p = SamplingParams {
        logit_bias: vec![(1, 5.0)],
        min_tokens: 2,
        min_tokens_stops: vec![3],
        ..SamplingParams::default()
    };
    // Prompt of 2, one token generated: eos (0) and stop token 3 are held back.
    let mut l = vec![9.0, 1.0, 2.0, 8.0];
    bias_and_hold_stops(&mut l, &p, &[0], &[7, 7, 7], 2);
    assert_eq!(l, vec![f32::NEG_INFINITY, 6.0, 2.0, f32::NEG_INFINITY]);
    // Two generated: only the bias.
    let mut l = vec![9.0, 1.0, 2.0, 8.0];
    bias_and_hold_stops(&mut l, &p, &[0], &[7, 7, 7, 7], 2);
    assert_eq!(l, vec![9.0, 6.0, 2.0, 8.0]);
}
