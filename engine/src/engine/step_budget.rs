//! Keeping each step within the tightest TBT target of the requests decoding in it
//! (`EngineConfig::step_tbt_share`), with the runner's cost model ([`StepCost`]).
//!
//! Every decode in a step waits for the whole step, so whatever else the step holds slows
//! every request decoding in it: a flood's prompt chunks filling the token budget (16,384
//! tokens of an 8B model's prefill take several tenths of a second on an H100), or one long
//! context (at 128k tokens a single decode reads 16 GiB of KV, several times a short chat's
//! whole step). With a cost model, the planner predicts every step that holds a decode and keeps it within
//! `share × the tightest TBT target` of the requests decoding (a batch whose targets are all
//! looser takes longer steps):
//!
//! - **Decodes**, cheapest (shortest context, divided by the steps it has waited) first,
//!   while they fit. The rest skip this step: long contexts take turns instead of slowing
//!   everyone. Then one request that skipped [`MAX_DECODE_SKIPS`] steps in a row runs,
//!   whatever it costs: of several such, the one that waited longest; the others wait their
//!   turn. So each decodes at least every `max(MAX_DECODE_SKIPS + 1, n)` steps, `n` the
//!   decodes that do not fit beside the cheaper ones; at least one decode runs every step.
//! - **Prompt chunks** get the time left, short prompts first (a long chunk deep in its prompt
//!   can take a whole step), at least [`MIN_CHUNK_TOKENS`] for the first, or one wave of the
//!   attention kernel's query tiles where that is more (`StepCost::wave_tokens`: fewer cost
//!   the same attention), so prompts always progress, within the token budget as before.
//!
//! The bound: a step holds every decode that fits the limit in cost order, so a request whose
//! decode costs `d` runs in every step where the cheaper ones leave `d` of room: a short chat
//! beside long contexts runs every step, and its step time is at most the limit plus one
//! decode (the forced one of that step). Without a cost model (the GPU runner until it has a
//! profile) or with no request decoding, steps are bounded by tokens only.
//!
//! **Calibration.** The model comes from a profile, and a real GPU may run some steps slower
//! (a long context's small prompt chunks, say), and the host's work between steps adds to
//! every gap a client sees. [`Calibration`] follows the ratio of each iteration's measured
//! time (to the next step's start) to its step's prediction and shrinks the limit by it, so the
//! budget holds the measured iterations, not the modelled steps, within the target. It only tightens: steps that run
//! faster than modelled (the twin, whose steps overlap compute and memory where the model adds
//! them) leave the limit as configured.

use crate::runner::StepCost;

/// Steps in a row a decode may be skipped; the next step runs it first.
pub const MAX_DECODE_SKIPS: u32 = 3;

/// Prompt tokens the first chunk in admission order gets even when the decodes used the
/// step's time (prompts always progress).
pub const MIN_CHUNK_TOKENS: u32 = 256;

/// How much slower than the cost model the engine's iterations run: an exponentially weighted
/// mean of `measured / predicted` over the steps predicted at [`Calibration::MIN_PREDICTED_S`] or
/// more, each ratio clamped to `[1, MAX_SCALE]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Calibration {
    scale: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration { scale: 1.0 }
    }
}

impl Calibration {
    /// Weight of the latest step.
    const WEIGHT: f64 = 0.1;
    /// Shorter predicted steps are mostly fixed overhead and noise: not observed.
    const MIN_PREDICTED_S: f64 = 1e-3;
    /// The most the limit shrinks.
    const MAX_SCALE: f64 = 4.0;

    /// One step's predicted and measured seconds.
    pub(crate) fn observe(&mut self, predicted: f64, measured: f64) {
        if !(predicted >= Self::MIN_PREDICTED_S && measured.is_finite() && measured > 0.0) {
            return;
        }
        let ratio = (measured / predicted).clamp(1.0, Self::MAX_SCALE);
        self.scale += Self::WEIGHT * (ratio - self.scale);
    }

    /// The share of the TBT target the model's predictions may fill, for a configured `share`.
    pub(crate) fn share(&self, share: f64) -> f64 {
        share / self.scale
    }

    /// Measured over predicted step time, as learned (1 until steps run slower).
    pub(crate) fn scale(&self) -> f64 {
        self.scale
    }
}

/// A step's predicted-time limit.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepLimit {
    pub(super) cost: StepCost,
    pub(super) seconds: f64,
    /// The tightest TBT target itself (`seconds` is its share): a forced prompt chunk may
    /// reach into the difference.
    pub(super) target_s: f64,
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
    // By context divided by the steps it has waited (so the long ones take turns: the one
    // that just ran competes at its full cost, those that skipped at a fraction of theirs;
    // short contexts come first), while they fit.
    order.sort_by_key(|&i| {
        let k = cands[i];
        k.kv_len / (k.skips + 1)
    });
    for &i in order.iter() {
        let d = c.decode_s(cands[i].kv_len);
        if t + d <= limit.seconds || t == c.base_s {
            run[i] = true;
            t += d;
        }
    }
    // Then one decode that skipped its last `MAX_DECODE_SKIPS` steps, the one that waited
    // longest, whatever it costs; the others wait their turn, so decodes that never fit take
    // turns instead of all running in one step.
    let forced = (0..cands.len())
        .filter(|&i| !run[i] && cands[i].skips >= MAX_DECODE_SKIPS)
        .max_by_key(|&i| (cands[i].skips, std::cmp::Reverse(cands[i].kv_len)));
    if let Some(i) = forced {
        run[i] = true;
        t += c.decode_s(cands[i].kv_len);
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
            target_s: seconds / 0.8,
        }
    }

    #[test]
    fn calibration_tightens_to_measured_steps_and_never_loosens() {
        let mut c = Calibration::default();
        // Faster than modelled, or too short to tell: the limit stays as configured.
        for _ in 0..50 {
            c.observe(0.050, 0.030);
            c.observe(0.0005, 0.004);
        }
        assert_eq!(c.share(0.8), 0.8);
        // Steps 1.5x slower than predicted: the share converges to 0.8 / 1.5.
        for _ in 0..200 {
            c.observe(0.060, 0.090);
        }
        assert!((c.scale() - 1.5).abs() < 1e-3, "{}", c.scale());
        assert!((c.share(0.8) - 0.8 / 1.5).abs() < 1e-3);
        // A wild outlier moves it by at most a tenth of the clamp.
        c.observe(0.060, 60.0);
        assert!(c.scale() <= 1.5 + 0.1 * (4.0 - 1.5) + 1e-9, "{}", c.scale());
        // Bad measurements are ignored.
        let before = c.scale();
        c.observe(0.060, f64::NAN);
        c.observe(0.060, 0.0);
        assert_eq!(c.scale(), before);
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
