//! Long prompts do not hold back short ones of the same tenant (issue 16, item 8): the bound
//! is one iteration for a short prompt that arrives behind any number of long ones.

use super::*;

/// Iterations from the short request's arrival to its first token, with 20 prompts of 4,000
/// tokens submitted just before it (one tenant, 2,048 batched tokens).
fn short_waits(long_prefill_tokens: Option<u32>) -> u32 {
    let mut e = engine_with(
        PolicyKind::Wlvf,
        EngineConfig {
            hbm_blocks: 8192,
            dram_blocks: 8192,
            b_xfer: Some(512),
            max_batched_tokens: 2048,
            max_num_seqs: 64,
            long_prefill_tokens,
            ..EngineConfig::default()
        },
    );
    for i in 0..20 {
        e.submit(request(i, 0, 4000, 8)).unwrap();
    }
    e.step().unwrap();
    e.submit(request(99, 0, 6, 8)).unwrap();
    for n in 1..=200 {
        e.step().unwrap();
        let first = e
            .take_events()
            .into_iter()
            .any(|ev| matches!(ev, EngineEvent::Token { id, .. } if id == RequestId(99)));
        if first {
            return n;
        }
    }
    panic!("the short request never started");
}

#[test]
fn a_short_prompt_behind_twenty_long_ones_starts_within_one_iteration() {
    // Default: long prefills (over half the budget) take at most half of it while others want
    // tokens, one at a time, and the policy lets shorter prompts past a waiting long one.
    assert_eq!(short_waits(None), 1);
    // No prompt long: the short one waits for the long prompts ahead of it.
    let strict = short_waits(Some(u32::MAX));
    assert!(
        strict > 20,
        "without long prefills the short one waited {strict} iterations"
    );
}
