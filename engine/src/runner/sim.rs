//! The simulated runner: no model, only the time a step would take on a profile's hardware.
//! Prefill is compute-bound (matmul rate × efficiency); decode is memory-bound (weights read
//! at HBM bandwidth × efficiency, KV bytes at that × the attention kernel's efficiency); every
//! step pays a fixed overhead. Sampled tokens are a constant, so lengths come from
//! `max_tokens` (`ignore_eos`), as in the paper.

use super::{ModelRunner, StepBatch, StepOutput};
use crate::error::EngineError;
use crate::kv::BlockGeometry;
use crate::profile::Profile;

/// The token id every simulated step samples.
pub const SIM_TOKEN: u32 = 0;

/// A [`ModelRunner`] whose step time comes from a [`Profile`].
#[derive(Clone, Debug)]
pub struct SimRunner {
    profile: Profile,
    geometry: BlockGeometry,
}

impl SimRunner {
    pub fn new(profile: Profile, block_size: u32) -> SimRunner {
        let geometry = profile.model.geometry(block_size);
        SimRunner { profile, geometry }
    }

    /// Modelled seconds of one step over `(pos, end)` spans, one per entry.
    pub fn step_time(&self, spans: impl Iterator<Item = (u32, u32)>) -> f64 {
        let m = &self.profile.model;
        let hw = &self.profile.hw;
        let (mut tokens, mut kv_tokens, mut attn_flops) = (0f64, 0f64, 0f64);
        let q_width = f64::from(m.num_heads) * f64::from(m.head_dim);
        for (pos, end) in spans {
            let len = f64::from(end - pos);
            if len == 0.0 {
                continue;
            }
            tokens += len;
            kv_tokens += f64::from(end);
            // QK^T and PV: 2 matmuls × 2 flops per multiply-add over the causal context.
            attn_flops +=
                4.0 * f64::from(m.num_layers) * q_width * len * (f64::from(pos) + len / 2.0);
        }
        if tokens == 0.0 {
            return 0.0;
        }
        let flops = 2.0 * m.params * tokens + attn_flops;
        let compute = flops / (hw.matmul_tflops * 1e12 * hw.prefill_efficiency);
        let bandwidth = hw.hbm_bw_gbps * 1e9 * hw.hbm_bw_efficiency;
        let kv_bytes = kv_tokens * self.geometry.bytes_per_token() as f64;
        let weights = m.weight_bytes() / bandwidth;
        let kv = kv_bytes / (bandwidth * hw.kv_read_efficiency);
        if hw.kv_overlaps_compute {
            hw.step_overhead_s + compute.max(weights + kv)
        } else {
            hw.step_overhead_s + compute.max(weights) + kv
        }
    }
}

impl ModelRunner for SimRunner {
    fn geometry(&self) -> BlockGeometry {
        self.geometry
    }

    fn eos_token_ids(&self) -> &[u32] {
        &[]
    }

    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput, EngineError> {
        let elapsed = self.step_time(batch.entries.iter().map(|e| (e.pos, e.end)));
        let tokens = batch
            .entries
            .iter()
            .map(|e| e.sample.then_some(SIM_TOKEN))
            .collect();
        Ok(StepOutput {
            tokens,
            elapsed,
            ..StepOutput::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner() -> SimRunner {
        SimRunner::new(Profile::builtin("h200-llama-3-8b").unwrap(), 16)
    }

    #[test]
    fn batch_one_decode_is_memory_bound_near_the_roofline() {
        let t = runner().step_time([(100, 101)].into_iter());
        // 16.06 GB at 4.11 TB/s = 3.9 ms, plus 2 ms overhead.
        assert!((t - 0.0059).abs() < 0.0003, "{t}");
    }

    #[test]
    fn long_prefill_is_compute_bound_and_grows_with_tokens() {
        let r = runner();
        let t2k = r.step_time([(0, 2048)].into_iter());
        let t4k = r.step_time([(0, 4096)].into_iter());
        // 2 × 8.03e9 × 2048 flops at 786 TF × 0.6 = 70 ms (+ attention).
        assert!(t2k > 0.06 && t2k < 0.1, "{t2k}");
        assert!(t4k > 1.9 * (t2k - 0.002), "{t4k}");
    }

    #[test]
    fn kv_reads_add_to_a_compute_bound_step_unless_they_overlap() {
        let mut overlapped = Profile::builtin("h200-llama-3-8b").unwrap();
        overlapped.hw.kv_overlaps_compute = true;
        let serial = runner();
        assert!(!serial.profile.hw.kv_overlaps_compute);
        let overlapped = SimRunner::new(overlapped, 16);
        // A 1,988-token prefill chunk beside 60 decodes of 512-token contexts.
        let spans = || std::iter::once((0, 1988)).chain((0..60).map(|_| (512, 513)));
        let (a, b) = (serial.step_time(spans()), overlapped.step_time(spans()));
        let hw = &serial.profile.hw;
        let kv_bytes = (1988.0 + 60.0 * 513.0) * serial.geometry.bytes_per_token() as f64;
        let kv = kv_bytes / (hw.hbm_bw_gbps * 1e9 * hw.hbm_bw_efficiency * hw.kv_read_efficiency);
        assert!(
            (a - b - kv).abs() < 1e-9,
            "serial {a}, overlapped {b}, kv {kv}"
        );
        // Pure decode is memory-bound either way: the same time.
        let decode = || (0..64).map(|_| (512, 513));
        assert!((serial.step_time(decode()) - overlapped.step_time(decode())).abs() < 1e-12);
    }
}
