use super::*;

fn rec(arrival: f64, tokens: &[f64], output_tokens: u32, finish: Option<f64>) -> RequestRecord {
    RequestRecord {
        id: 0,
        tenant: 0,
        arrival_s: arrival,
        first_token_s: tokens.first().copied(),
        token_times_s: tokens.to_vec(),
        finish_s: finish,
        prompt_tokens: 100,
        output_tokens,
        generated_tokens: tokens.len() as u32,
        preemptions: 0,
        cached_tokens: None,
        cached_dram_tokens: None,
        conversation: None,
        turn: None,
        refused: None,
        gpu_s: None,
        queued_s: None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn percentile_interpolates_between_ranks() {
    let v = [1.0, 2.0, 3.0, 4.0];
    assert!(close(percentile(&v, 0.0), 1.0));
    assert!(close(percentile(&v, 0.5), 2.5));
    assert!(close(percentile(&v, 1.0), 4.0));
    assert!(close(percentile(&v, 0.9), 3.7));
    assert!(close(percentile(&[7.0], 0.99), 7.0));
    assert_eq!(percentile(&[], 0.5), 0.0);
}

#[test]
fn jain_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() {
    assert!(close(jain(&[2.0, 2.0, 2.0]), 1.0));
    assert!(close(jain(&[5.0, 0.0, 0.0]), 1.0 / 3.0));
    assert!(close(jain(&[1.0, 3.0]), 0.8));
    assert!(close(jain(&[4.0]), 1.0));
    assert!(close(jain(&[]), 1.0));
    assert!(close(jain(&[0.0, 0.0]), 1.0));
}

#[test]
fn served_request_gets_its_ttft_and_gaps_judged() {
    let o = judge(&rec(0.0, &[1.0, 1.05, 1.3], 3, Some(1.3)), 5.0, 0.1, 10.0);
    assert!(close(o.ttft_s.unwrap(), 1.0) && o.ttft_met);
    assert_eq!(o.gaps_total(), 2);
    assert_eq!(o.gaps_met, 1);
    assert!(close(o.max_stall_s, 0.25));
    assert!(close(o.max_wait_s, 1.0));
    assert_eq!(o.served_tokens, 103);
    assert!(o.finished && !o.good());
    let o = judge(&rec(0.0, &[6.0, 6.05], 2, Some(6.05)), 5.0, 0.1, 10.0);
    assert!(!o.ttft_met, "a first token after the SLO is a miss");
    assert!(close(o.max_wait_s, 6.0));
}

#[test]
fn unserved_request_is_a_miss_that_waited_until_the_end() {
    let o = judge(&rec(2.0, &[], 10, None), 5.0, 0.1, 10.0);
    assert_eq!(o.ttft_s, None);
    assert!(!o.ttft_met);
    assert!(close(o.ttft_censored_s, 8.0));
    assert!(close(o.max_wait_s, 8.0));
    assert_eq!(o.gaps_total(), 0);
    assert_eq!(o.served_tokens, 0, "its prompt was never served");
}

#[test]
fn a_request_shed_before_its_first_token_waited_until_it_was_shed() {
    let shed = RequestRecord {
        refused: Some(503),
        ..rec(2.0, &[], 10, Some(4.5))
    };
    let o = judge(&shed, 5.0, 0.1, 10.0);
    assert!(!o.ttft_met);
    assert!(close(o.ttft_censored_s, 2.5));
    assert!(close(o.max_wait_s, 2.5));
}

#[test]
fn a_stalled_unfinished_request_has_an_open_gap_that_misses() {
    // Two of ten tokens, then nothing until the end of the run at t = 3.
    let o = judge(&rec(0.0, &[1.0, 1.05], 10, None), 5.0, 0.1, 3.0);
    assert_eq!(o.gaps_total(), 2);
    assert_eq!(o.gaps_met, 1);
    assert!(close(o.max_stall_s, 1.95));
    assert!(close(o.max_wait_s, 1.95));
    // An open gap still within the SLO is not judged yet.
    let o = judge(&rec(0.0, &[1.0, 1.05], 10, None), 5.0, 0.1, 1.1);
    assert_eq!((o.gaps_total(), o.gaps_met), (1, 1));
    // A finished request has no open gap, however late the run ends.
    let o = judge(&rec(0.0, &[1.0, 1.05], 2, Some(1.05)), 5.0, 0.1, 100.0);
    assert_eq!((o.gaps_total(), o.gaps_met), (1, 1));
    assert!(close(o.max_stall_s, 0.05));
}

#[test]
fn attainment_pools_gaps_across_requests() {
    let a = judge(
        &rec(0.0, &[1.0, 1.05, 1.1, 1.15], 4, Some(1.15)),
        5.0,
        0.1,
        10.0,
    );
    let b = judge(&rec(0.0, &[2.0, 2.5], 2, Some(2.5)), 5.0, 0.1, 10.0);
    let c = judge(&rec(0.0, &[], 2, None), 5.0, 0.1, 10.0);
    let all = [a, b, c];
    assert!(close(ttft_attainment(&all), 2.0 / 3.0));
    // 3 of 4 gaps, not the mean of per-request shares (1 and 0).
    assert!(close(tbt_attainment(&all), 0.75));
    assert!(
        close(tbt_attainment(&all[2..]), 1.0),
        "no gaps: nothing violated"
    );
}

#[test]
fn bootstrap_is_deterministic_and_brackets_the_estimate() {
    let outcomes: Vec<Outcome> = (0..200)
        .map(|i| {
            let tokens: &[f64] = if i % 4 == 0 {
                &[9.0, 9.5]
            } else {
                &[1.0, 1.05]
            };
            judge(&rec(0.0, tokens, 2, Some(tokens[1])), 5.0, 0.1, 10.0)
        })
        .collect();
    let (ttft, tbt) = bootstrap_attainment(&outcomes, 500, 1);
    assert_eq!((ttft, tbt), bootstrap_attainment(&outcomes, 500, 1));
    for ci in [ttft, tbt] {
        assert!(ci.lo < 0.75 && 0.75 < ci.hi, "{ci:?}");
        assert!(ci.hi - ci.lo < 0.2, "{ci:?}");
    }
    let all_good: Vec<Outcome> = outcomes.iter().filter(|o| o.good()).cloned().collect();
    let (ttft, tbt) = bootstrap_attainment(&all_good, 100, 1);
    assert_eq!(ttft, Ci95 { lo: 1.0, hi: 1.0 });
    assert_eq!(tbt, Ci95 { lo: 1.0, hi: 1.0 });
}
