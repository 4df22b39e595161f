//! Each request's share of the GPU's time: a step's time split among its spans by what each
//! adds to it under the runner's cost model (a decode its KV read, a prompt chunk its GEMMs
//! and attention), the step's fixed part (the weights read once, launches) in equal parts.
//! Without a cost model, by tokens. Summed per tenant, it is the GPU time split that weighted
//! fairness is meant to follow (`RequestEnd::gpu_s`).

use super::scratch::Span;
use crate::runner::StepCost;

/// `shares[k]`: seconds of the step's `elapsed` that span `k` took; the first `decodes` spans
/// are decodes, the rest prompt chunks. Returns the cost model's prediction of the step's time
/// (`None` without a model).
pub(super) fn step_shares(
    cost: Option<&StepCost>,
    spans: &[Span],
    decodes: usize,
    elapsed: f64,
    shares: &mut Vec<f64>,
) -> Option<f64> {
    shares.clear();
    if spans.is_empty() {
        return None;
    }
    let n = spans.len() as f64;
    shares.extend(spans.iter().enumerate().map(|(k, s)| match cost {
        Some(c) if k < decodes => c.base_s / n + c.decode_s(s.pos),
        Some(c) => c.base_s / n + c.chunk_s(s.pos, s.end - s.pos),
        None => f64::from(s.end - s.pos),
    }));
    let total: f64 = shares.iter().sum();
    let scale = if total > 0.0 { elapsed / total } else { 0.0 };
    for x in shares.iter_mut() {
        *x *= scale;
    }
    cost.map(|_| total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;
    use superinfer_policies::RequestId;

    fn span(id: u64, pos: u32, end: u32) -> Span {
        Span {
            id: RequestId(id),
            pos,
            end,
            sample: true,
        }
    }

    #[test]
    fn a_step_is_split_by_cost_and_sums_to_its_time() {
        let p = Profile::builtin("h100-llama-3.1-8b").unwrap();
        let cost = StepCost::of_profile(&p, p.model.geometry(16));
        // A short chat's decode, a 100k-token context's decode, a 2k-token prompt chunk.
        let spans = [
            span(1, 300, 301),
            span(2, 100_000, 100_001),
            span(3, 0, 2048),
        ];
        let mut shares = Vec::new();
        step_shares(Some(&cost), &spans, 2, 0.25, &mut shares);
        let sum: f64 = shares.iter().sum();
        assert!((sum - 0.25).abs() < 1e-12, "{sum}");
        // The long decode reads ~300x the chat's KV; the chunk's GEMMs dominate both.
        assert!(shares[1] > 3.0 * shares[0], "{shares:?}");
        assert!(shares[2] > shares[1], "{shares:?}");
        // Without a cost model: by tokens.
        step_shares(None, &spans, 2, 2050.0, &mut shares);
        assert_eq!(shares, vec![1.0, 1.0, 2048.0]);
    }
}
