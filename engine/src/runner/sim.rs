//! The simulated runner: no model, only the time a step would take on a profile's hardware.
//! Prefill is compute-bound (matmul rate × efficiency); decode is memory-bound (weights read
//! at HBM bandwidth × efficiency, KV bytes at that × the attention kernel's efficiency); every
//! step pays an overhead, fixed plus a part per sequence (smaller for a decode-only step the
//! runner replays from a CUDA graph). A prompt chunk's attention runs at its kernel's rate, its
//! pairs rounded up to the kernel's whole waves of query tiles (`cost::attention_pairs`): a
//! small chunk deep in a context walks all its keys however few its queries. Sampled tokens
//! are a constant, so lengths come from `max_tokens` (`ignore_eos`), as in the paper.

use super::cost::attention_pairs;
use super::{ModelRunner, StepBatch, StepCost, StepOutput};
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
        let (mut tokens, mut kv_tokens, mut pairs, mut seqs) = (0f64, 0f64, 0f64, 0f64);
        // The chunks' attention is one launch: their pairs, and at least the waves of the
        // chunk that needs the most (`cost::attention_pairs`).
        let (mut waved, mut longest) = (0f64, 0f64);
        let (wave, tile) = hw.attention_waves(m.num_heads);
        let mut decode_only = true;
        let q_width = f64::from(m.num_heads) * f64::from(m.head_dim);
        for (pos, end) in spans {
            let len = f64::from(end - pos);
            if len == 0.0 {
                continue;
            }
            tokens += len;
            seqs += 1.0;
            decode_only &= len == 1.0;
            kv_tokens += f64::from(end);
            // A prompt chunk's QK^T and PV: 2 matmuls × 2 flops per multiply-add over the
            // causal context (a decode's attention is its KV read, below).
            if len > 1.0 {
                let pos = f64::from(pos);
                pairs += len * (pos + len / 2.0);
                waved = waved.max(attention_pairs(pos, len, wave, tile));
                longest = longest.max(len);
            }
        }
        if tokens == 0.0 {
            return 0.0;
        }
        // A step with a chunk of the wide kernel's length runs every chunk in it (its pairs:
        // a chunk that long fills many waves); else the narrow kernel's waves.
        let pair_flops = 4.0 * f64::from(m.num_layers) * q_width;
        let attention = match hw.wide_attention() {
            Some((min, rate)) if longest >= min => pair_flops * pairs / rate,
            _ => pair_flops * pairs.max(waved) / hw.attention_flops_per_s(),
        };
        let compute =
            2.0 * m.params * tokens / (hw.matmul_tflops * 1e12 * hw.prefill_efficiency) + attention;
        let bandwidth = hw.hbm_bw_gbps * 1e9 * hw.hbm_bw_efficiency;
        let kv_bytes = kv_tokens * self.geometry.bytes_per_token() as f64;
        let weights = m.weight_bytes() / bandwidth;
        let kv = kv_bytes / (bandwidth * hw.kv_read_efficiency);
        let graph = decode_only && seqs <= f64::from(hw.graph_max_seqs);
        let per_layer = if hw.overhead_layers > 0 {
            f64::from(m.num_layers) / f64::from(hw.overhead_layers)
        } else {
            1.0
        };
        let overhead = per_layer
            * if graph {
                hw.graph_step_overhead_s + hw.graph_step_overhead_per_seq_s * seqs
            } else {
                hw.step_overhead_s + hw.step_overhead_per_seq_s * seqs
            };
        if hw.kv_overlaps_compute {
            overhead + compute.max(weights + kv)
        } else {
            overhead + compute.max(weights) + kv
        }
    }
}

impl ModelRunner for SimRunner {
    fn geometry(&self) -> BlockGeometry {
        self.geometry
    }

    fn step_cost(&self) -> Option<StepCost> {
        Some(StepCost::of_profile(&self.profile, self.geometry))
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
    fn h100_long_context_steps() {
        // Measured on our H100 (docs/BENCHMARKS_GPU.md "Long-context kernels", 2026-12-06 20:27 UTC):
        // Llama-3.1-8B decode steps of `batch` sequences reading `keys` keys each, and a
        // 32k-token prompt prefilled in two chunks of 16,384 tokens.
        let r = SimRunner::new(Profile::builtin("h100-llama-3.1-8b").unwrap(), 16);
        let decode = |keys: u32, batch: usize| r.step_time((0..batch).map(|_| (keys - 1, keys)));
        for (keys, batch, measured_ms) in [
            (4096, 1, 5.90),
            (4096, 8, 8.18),
            (32768, 1, 7.49),
            (32768, 8, 19.13),
            (131_072, 1, 12.60),
        ] {
            let ratio = decode(keys, batch) * 1e3 / measured_ms;
            assert!((ratio - 1.0).abs() <= 0.06, "{keys} x {batch}: {ratio}");
        }
        // Prompts of 32k and 128k in chunks of 16,384 (2026-12-07 06:42 UTC, the kernel of
        // `prefill_attention_efficiency`).
        for (n, measured_ms) in [(32_768u32, 1761.0), (131_072, 18_227.0)] {
            let prefill: f64 = (0..n)
                .step_by(16384)
                .map(|p| r.step_time([(p, p + 16384)].into_iter()))
                .sum();
            let ratio = prefill * 1e3 / measured_ms;
            println!("{n} prefill: twin / measured {ratio:.3}");
            assert!((ratio - 1.0).abs() <= 0.1, "{n} prefill: {ratio}");
        }
    }

    #[test]
    fn a_small_chunk_deep_in_a_context_pays_the_walk_over_its_keys() {
        let r = SimRunner::new(Profile::builtin("h100-llama-3.1-8b").unwrap(), 16);
        assert_eq!(r.profile.hw.attention_waves(32), (528.0, 64.0));
        let step = |pos: u32, len: u32| r.step_time([(pos, pos + len)].into_iter());
        // At 40k of context, 64 or 256 queries take about as long as a wave's 512: the GPU
        // is not full (their GEMMs and KV reads differ a little); 576 start a second wave.
        let (t64, t256, t512) = (step(40_000, 64), step(40_000, 256), step(40_000, 512));
        assert!(t64 < t256 && t256 < t512, "{t64} {t256} {t512}");
        assert!(t64 > 0.6 * t512, "{t64} {t512}");
        assert!(step(40_000, 576) > 1.5 * t512);
        // Without waves the 64-query chunk's attention would be an eighth of it.
        let mut flat = r.profile.clone();
        flat.hw.prefill_attention_tile = 0;
        let flat = SimRunner::new(flat, 16);
        assert!(flat.step_time([(40_000, 40_064)].into_iter()) < 0.5 * t64);
        // A long chunk fills the GPU many times over: the waves add at most the last one's
        // rounding.
        let (waved, pairs) = (
            step(40_000, 8192),
            flat.step_time([(40_000, 48_192)].into_iter()),
        );
        assert!(waved >= pairs && waved < 1.05 * pairs, "{waved} {pairs}");
        // Two chunks in one step: their pairs, or the waves of the costlier, not both.
        let both = r.step_time([(40_000, 40_064), (0, 2048)].into_iter());
        assert!(both < t64 + step(0, 2048), "{both}");
        // A step with a chunk of 8,192 or more runs the wide kernel, the small chunk beside it
        // too (its pairs at the wide rate).
        let long = step(0, 8192);
        let with_small = r.step_time([(40_000, 40_064), (0, 8192)].into_iter());
        assert!(with_small < long + 0.5 * t64, "{with_small} {long} {t64}");
    }

    #[test]
    fn batch_one_decode_is_memory_bound_near_the_roofline() {
        let t = runner().step_time([(100, 101)].into_iter());
        // 16.06 GB at 4.11 TB/s = 3.91 ms, plus 0.624 ms per step and 9.5 us per sequence of
        // a decode replayed from a CUDA graph (the served step measured 4.38 ms at batch 1).
        assert!((t - 0.00455).abs() < 0.0002, "{t}");
    }

    #[test]
    fn each_sequence_adds_the_per_sequence_overhead() {
        let r = runner();
        let hw = &r.profile.hw;
        assert!(hw.graph_step_overhead_per_seq_s > 0.0);
        // 64 decodes of 513-token contexts against one decode of 64 × 513 keys: the same KV
        // and weights, so they differ by 63 × the per-sequence part.
        let many = r.step_time((0..64).map(|_| (512, 513)));
        let one_long = r.step_time([(64 * 513 - 1, 64 * 513)].into_iter());
        let want = 63.0 * hw.graph_step_overhead_per_seq_s;
        assert!(
            (many - one_long - want).abs() < 1e-9,
            "{many} {one_long} {want}"
        );
    }

    #[test]
    fn a_step_with_a_prompt_chunk_or_past_the_graphs_pays_the_eager_overhead() {
        let r = runner();
        let hw = &r.profile.hw;
        assert!(hw.graph_max_seqs > 0 && hw.graph_step_overhead_s < hw.step_overhead_s);
        let decode = |n: u32| r.step_time((0..n).map(|_| (512, 513)));
        // One more sequence than the graphs take: the eager overhead in full.
        let n = hw.graph_max_seqs;
        let kv_one = decode(n) - decode(n - 1) - hw.graph_step_overhead_per_seq_s;
        let jump = decode(n + 1) - decode(n) - kv_one;
        let want = (hw.step_overhead_s + hw.step_overhead_per_seq_s * f64::from(n + 1))
            - (hw.graph_step_overhead_s + hw.graph_step_overhead_per_seq_s * f64::from(n));
        assert!((jump - want).abs() < 1e-9, "{jump} {want}");
        // A two-token prompt chunk beside eight decodes: eager as well.
        let mixed = r.step_time((0..8).map(|_| (512, 513)).chain([(0, 2)]));
        let eager = hw.step_overhead_s + 9.0 * hw.step_overhead_per_seq_s;
        let graph = hw.graph_step_overhead_s + 8.0 * hw.graph_step_overhead_per_seq_s;
        assert!(mixed - decode(8) >= eager - graph, "{mixed}");
    }

    #[test]
    fn the_overheads_scale_with_the_layers_they_were_measured_at() {
        let base = Profile::builtin("h200-qwen2.5-32b").unwrap();
        assert_eq!(base.hw.overhead_layers, 32);
        assert_eq!(base.model.num_layers, 64);
        let mut flat = base.clone();
        flat.hw.overhead_layers = 0;
        let (scaled, flat) = (SimRunner::new(base, 16), SimRunner::new(flat, 16));
        let hw = &flat.profile.hw;
        // A decode of one sequence (graphs) and a prompt chunk beside it (eager): the 64-layer
        // model pays each overhead twice, the rest of the step is the same.
        let decode = || [(512, 513)].into_iter();
        let graph = hw.graph_step_overhead_s + hw.graph_step_overhead_per_seq_s;
        let d = scaled.step_time(decode()) - flat.step_time(decode());
        assert!((d - graph).abs() < 1e-12, "{d} {graph}");
        let mixed = || [(512, 513), (0, 100)].into_iter();
        let eager = hw.step_overhead_s + 2.0 * hw.step_overhead_per_seq_s;
        let d = scaled.step_time(mixed()) - flat.step_time(mixed());
        assert!((d - eager).abs() < 1e-12, "{d} {eager}");
    }

    #[test]
    fn long_prefill_is_compute_bound_and_grows_with_tokens() {
        let r = runner();
        let t2k = r.step_time([(0, 2048)].into_iter());
        let t4k = r.step_time([(0, 4096)].into_iter());
        // 2 × 8.03e9 × 2048 flops at 786 TF × 0.75 = 56 ms (+ attention); measured 61.7 ms.
        assert!(t2k > 0.05 && t2k < 0.08, "{t2k}");
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
