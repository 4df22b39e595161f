//! The candle runner's step cost on the host CPU, measured when the model loads, so that the
//! engine's step budget (`engine::step_budget`) bounds every step there too: without it, one
//! 4,095-token prompt (under the 8,192-token long-prefill threshold, so never chunked by
//! tokens) was a 5.7-s step and a 5.65-s gap in every stream on the CPU node.
//!
//! The model is the roofline one of the GPU runner with the host's own rate: every term is
//! floating-point work at the rate a matrix product of the model's width reaches here
//! (measured: the fastest of a few runs). A real forward pass is slower (its small
//! operations, its memory traffic), so the model is optimistic and the engine's calibration,
//! which only tightens, scales it to the measured steps.

use super::super::StepCost;
use crate::model::ModelConfig;
use candle_core::{DType, Device, Tensor};
use std::time::Instant;

/// Rows of the product timed (a prompt chunk's worth of queries).
const ROWS: usize = 256;
/// Runs of it; the fastest counts.
const RUNS: usize = 5;

/// The cost terms of `mc` on this CPU, or `None` on another device (or if the measurement
/// failed).
pub(super) fn measured(mc: &ModelConfig, dtype: DType, device: &Device) -> Option<StepCost> {
    if !device.is_cpu() {
        return None;
    }
    let flops = matmul_flops_per_s(mc.hidden_size, dtype, device)?;
    Some(of_rate(mc, flops))
}

/// The cost terms of `mc` at `flops` floating-point operations per second.
pub(super) fn of_rate(mc: &ModelConfig, flops: f64) -> StepCost {
    let h = mc.hidden_size as f64;
    let q_width = (mc.num_heads * mc.head_dim) as f64;
    let kv_width = (mc.num_kv_heads * mc.head_dim) as f64;
    let inter = mc.intermediate_size as f64;
    let per_layer = h * q_width + 2.0 * h * kv_width + q_width * h + 3.0 * h * inter;
    let params = mc.num_layers as f64 * per_layer + mc.vocab_size as f64 * h;
    let token_s = 2.0 * params / flops;
    // Each (query, key) pair: QK^T and PV over every head of every layer.
    let pair_s = 4.0 * mc.num_layers as f64 * q_width / flops;
    StepCost {
        base_s: token_s,
        per_seq_s: 0.0,
        kv_token_s: pair_s,
        prompt_token_s: token_s,
        attn_pair_s: pair_s,
        attn_pair_wide_s: pair_s,
        wide_min: 0.0,
        attn_wave: 0.0,
        attn_tile: 0.0,
    }
}

/// Floating-point operations per second of a `ROWS × h` by `h × h` product in `dtype`.
fn matmul_flops_per_s(h: usize, dtype: DType, device: &Device) -> Option<f64> {
    let a = Tensor::ones((ROWS, h), dtype, device).ok()?;
    let b = Tensor::ones((h, h), dtype, device).ok()?;
    let mut best = f64::INFINITY;
    for _ in 0..RUNS {
        let t = Instant::now();
        std::hint::black_box(a.matmul(&b).ok()?);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best > 0.0).then(|| 2.0 * (ROWS * h * h) as f64 / best)
}

#[cfg(all(test, feature = "model"))]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_measures_a_cost_model_whose_terms_follow_the_model() {
        let dir = tempfile::tempdir().unwrap();
        crate::model::tiny::write_tiny_model(dir.path(), 1).unwrap();
        let mc = ModelConfig::from_model_dir(dir.path()).unwrap();
        let c = measured(&mc, DType::F32, &Device::Cpu).expect("a CPU measures its rate");
        assert!(c.prompt_token_s > 0.0 && c.attn_pair_s > 0.0);
        // A 4,095-token prompt costs more than a step's budget of any TBT target.
        assert!(c.chunk_s(0, 4095) > 100.0 * c.chunk_s(0, 16));
        let twice = of_rate(&mc, 2e10);
        assert!((of_rate(&mc, 1e10).prompt_token_s / twice.prompt_token_s - 2.0).abs() < 1e-9);
    }
}
