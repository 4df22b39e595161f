//! Keeping each step within the tightest TBT target of the requests decoding in it
//! (`EngineConfig::step_tbt_share`), with the runner's cost model ([`StepCost`]).
//!
//! Every decode in a step waits for the whole step, so one long context slows every request
//! beside it: at 128k tokens a single decode reads 16 GiB of KV, several times a short
//! chat's whole step. With a cost model, the planner predicts the step and keeps it within
//! `share × the tightest TBT target` of the requests decoding:
//!
//! - **Decodes**, cheapest (shortest context, divided by the steps it has waited) first,
//!   while they fit. The rest skip this step: long contexts take turns instead of slowing
//!   everyone. A request that skipped
//!   [`MAX_DECODE_SKIPS`] steps in a row goes first the next step, whatever it costs, so each
//!   decodes at least every `MAX_DECODE_SKIPS + 1` steps; at least one decode runs every step.
//! - **Prompt chunks** get the time left, short prompts first (a long chunk deep in its prompt
//!   can take a whole step), at least [`MIN_CHUNK_TOKENS`] for the first (so prompts always
//!   progress), within the token budget as before.
//!
//! The bound: a step holds every decode that fits the limit in cost order, so a request whose
//! decode costs `d` runs in every step where the forced decodes plus the cheaper ones leave
//! `d` of room: a short chat beside long contexts runs every step, and its step time is at
//! most the limit plus the forced decodes of that step (at most one in `MAX_DECODE_SKIPS + 1`
//! steps per long request, on average). Without a cost model (the GPU runner until it has
//! a profile) or with no request decoding, steps are bounded by tokens only.

use crate::runner::StepCost;

/// Steps in a row a decode may be skipped; the next step runs it first.
pub const MAX_DECODE_SKIPS: u32 = 3;

/// Prompt tokens the first chunk in admission order gets even when the decodes used the
/// step's time (prompts always progress).
pub const MIN_CHUNK_TOKENS: u32 = 256;

/// A step's predicted-time limit.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepLimit {
    pub(super) cost: StepCost,
    pub(super) seconds: f64,
}

/// One decode candidate: its context and how many steps in a row it was skipped.
#[derive(Clone, Copy, Debug)]
pub(super) struct Candidate {
    pub(super) kv_len: u32,
    pub(super) skips: u32,
}

/// Which candidates decode this step (`run[i]`) under `limit`; returns the predicted seconds
/// of the decodes chosen (the fixed cost of a step included). `order` is scratch.
pub(super) fn choose_decodes(
    cands: &[Candidate],
    limit: &StepLimit,
    run: &mut Vec<bool>,
    order: &mut Vec<usize>,
) -> f64 {
    let c = &limit.cost;
    run.clear();
    run.resize(cands.len(), false);
    let mut t = c.base_s;
    let all: f64 = cands.iter().map(|k| c.decode_s(k.kv_len)).sum();
    if t + all <= limit.seconds {
        run.fill(true);
        return t + all;
    }
    order.clear();
    order.extend(0..cands.len());
    // Forced first, then by context divided by the steps it has waited (so the long ones
    // take turns: the one that just ran competes at its full cost, those that skipped at a
    // fraction of theirs; short contexts still come first).
    order.sort_by_key(|&i| {
        let k = cands[i];
        (k.skips < MAX_DECODE_SKIPS, k.kv_len / (k.skips + 1))
    });
    for &i in order.iter() {
        let k = cands[i];
        let d = c.decode_s(k.kv_len);
        let forced = k.skips >= MAX_DECODE_SKIPS;
        if forced || t + d <= limit.seconds || t == c.base_s {
            run[i] = true;
            t += d;
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn limit(seconds: f64) -> StepLimit {
        let p = Profile::builtin("h100-llama-3.1-8b").unwrap();
        StepLimit {
            cost: StepCost::of_profile(&p, p.model.geometry(16)),
            seconds,
        }
    }

    #[test]
    fn short_contexts_decode_every_step_and_long_ones_share_what_is_left() {
        // Room for the two short decodes and one and a half long ones.
        let c = limit(0.0).cost;
        let seconds = c.base_s + 2.0 * c.decode_s(500) + 1.5 * c.decode_s(120_000);
        let l = limit(seconds);
        let short = Candidate {
            kv_len: 500,
            skips: 0,
        };
        let long = Candidate {
            kv_len: 120_000,
            skips: 0,
        };
        let cands = vec![long, short, long, short, long];
        let (mut run, mut order) = (Vec::new(), Vec::new());
        let t = choose_decodes(&cands, &l, &mut run, &mut order);
        assert_eq!(
            run,
            [true, true, false, true, false],
            "both shorts and one long fit"
        );
        assert!(t <= seconds, "{t}");
        // Everything fits a loose limit.
        let t = choose_decodes(&cands, &limit(10.0), &mut run, &mut order);
        assert!(run.iter().all(|&r| r) && t < 10.0);
        // A long one skipped MAX_DECODE_SKIPS times goes first, over the limit.
        let mut cands = cands;
        cands[4].skips = MAX_DECODE_SKIPS;
        cands[0].skips = MAX_DECODE_SKIPS;
        choose_decodes(&cands, &l, &mut run, &mut order);
        assert!(run[0] && run[4], "{run:?}");
        assert!(!run[2], "{run:?}");
        // One decode runs even when none fits.
        let t = choose_decodes(&[long], &limit(0.001), &mut run, &mut order);
        assert_eq!(run, [true]);
        assert!(t > 0.001);
    }
}
