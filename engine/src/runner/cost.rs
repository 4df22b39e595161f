//! A step's cost, as the planner predicts it (`EngineConfig::step_tbt_share`): linear in what
//! the batch holds, from the hardware and model profile. A decode step reads the weights once
//! and each sequence's KV; a prompt chunk adds its GEMMs and its causal attention. The same
//! terms as the twin's step time (`runner/sim.rs`), without its max() of compute and memory
//! (a decode step is memory-bound, a long chunk compute-bound; the sum over-predicts a mixed
//! step a little, which only makes the budget safer).

use crate::kv::BlockGeometry;
use crate::profile::Profile;

/// Seconds of one step, term by term.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCost {
    /// Every step: the weights read once and the fixed launch overhead.
    pub base_s: f64,
    /// Each sequence in the batch (launch overhead per sequence).
    pub per_seq_s: f64,
    /// Each token of KV attention reads (keys and values, all layers).
    pub kv_token_s: f64,
    /// Each prompt token computed (its GEMMs).
    pub prompt_token_s: f64,
    /// Each (query, key) pair of a prompt chunk's causal attention.
    pub attn_pair_s: f64,
    /// Each pair of a chunk of at least `wide_min` tokens (the wide kernel; 0: none).
    pub attn_pair_wide_s: f64,
    pub wide_min: f64,
    /// Queries of one wave of the prefill-attention kernel and its tile
    /// (`HardwareProfile::attention_waves`; 0: pairs only).
    pub attn_wave: f64,
    pub attn_tile: f64,
}

/// The (query, key) pairs a prompt chunk of `len` queries from `pos` costs: its causal pairs,
/// rounded up to whole waves of `wave` queries (its queries in tiles of `tile`) where the
/// kernel runs its query tiles in waves, each as long as its tiles' walk over the keys. A
/// chunk deep in a context with fewer queries than a wave costs a whole wave; one of many
/// waves, about its pairs. Measured on the H100 (docs/BENCHMARKS_GPU.md, "Long-context kernels"): steps
/// with one chunk at 0.89-0.98x this model, 0.95-1.48x of pairs with a one-wave floor.
pub fn attention_pairs(pos: f64, len: f64, wave: f64, tile: f64) -> f64 {
    let pairs = len * (pos + len / 2.0);
    if len <= 1.0 || wave <= 0.0 || tile <= 0.0 {
        return pairs;
    }
    let waves = ((len / tile).ceil() * tile / wave).ceil();
    pairs.max(waves * wave * (pos + len / 2.0))
}

impl StepCost {
    /// The cost terms of `profile`'s model on its hardware, for blocks of `geometry`.
    pub fn of_profile(profile: &Profile, geometry: BlockGeometry) -> StepCost {
        let (m, hw) = (&profile.model, &profile.hw);
        let bandwidth = hw.hbm_bw_gbps * 1e9 * hw.hbm_bw_efficiency;
        let flops = hw.matmul_tflops * 1e12 * hw.prefill_efficiency;
        let per_layer = if hw.overhead_layers > 0 {
            f64::from(m.num_layers) / f64::from(hw.overhead_layers)
        } else {
            1.0
        };
        let q_width = f64::from(m.num_heads) * f64::from(m.head_dim);
        let (attn_wave, attn_tile) = hw.attention_waves(m.num_heads);
        let pair_flops = 4.0 * f64::from(m.num_layers) * q_width;
        let (wide_min, wide_rate) = hw.wide_attention().unwrap_or((0.0, 1.0));
        StepCost {
            base_s: m.weight_bytes() / bandwidth + per_layer * hw.graph_step_overhead_s,
            per_seq_s: per_layer * hw.graph_step_overhead_per_seq_s,
            kv_token_s: geometry.bytes_per_token() as f64 / (bandwidth * hw.kv_read_efficiency),
            prompt_token_s: 2.0 * m.params / flops,
            attn_pair_s: pair_flops / hw.attention_flops_per_s(),
            attn_pair_wide_s: pair_flops / wide_rate,
            wide_min,
            attn_wave,
            attn_tile,
        }
    }

    /// Seconds a decode adds at `kv_len` tokens of context (its next token attends to
    /// `kv_len + 1` keys).
    pub fn decode_s(&self, kv_len: u32) -> f64 {
        self.per_seq_s + self.kv_token_s * f64::from(kv_len + 1)
    }

    /// Seconds a prompt chunk of `len` tokens from position `pos` adds: its GEMMs, its causal
    /// attention and its KV read. Each chunk is costed as if alone: beside other chunks the
    /// attention kernel's waves are shared, so a step of several costs at most this sum.
    pub fn chunk_s(&self, pos: u32, len: u32) -> f64 {
        let (pos, len) = (f64::from(pos), f64::from(len));
        self.per_seq_s
            + self.prompt_token_s * len
            + self.chunk_attention_s(pos, len)
            + self.kv_token_s * (pos + len)
    }

    /// The causal attention of a chunk of `len` queries from `pos`: in the wide kernel (its
    /// pairs: a chunk that long fills many waves) from `wide_min` tokens, else in the kernel
    /// of `attn_tile`-query tiles, its pairs rounded up to whole waves.
    pub fn chunk_attention_s(&self, pos: f64, len: f64) -> f64 {
        if self.wide_min > 0.0 && len >= self.wide_min {
            return self.attn_pair_wide_s * len * (pos + len / 2.0);
        }
        self.attn_pair_s * attention_pairs(pos, len, self.attn_wave, self.attn_tile)
    }

    /// The most queries one wave of the attention kernel takes in whole tiles (what a chunk
    /// deep in a context gets for the time of one query), 0 without waves.
    pub fn wave_tokens(&self) -> u32 {
        if self.attn_tile <= 0.0 {
            return 0;
        }
        ((self.attn_wave / self.attn_tile).floor() * self.attn_tile) as u32
    }

    /// The most tokens of a chunk from `pos` that fit in `seconds` (0 if none does).
    pub fn chunk_tokens_within(&self, pos: u32, seconds: f64) -> u32 {
        // `chunk_s` grows with the length (in steps where a wave starts): the longest that
        // fits, by bisection.
        if self.chunk_s(pos, 1) > seconds {
            return 0;
        }
        let (mut lo, mut hi) = (1u32, 2u32);
        while self.chunk_s(pos, hi) <= seconds {
            if hi >= u32::MAX / 2 {
                return hi;
            }
            (lo, hi) = (hi, hi * 2);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.chunk_s(pos, mid) <= seconds {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The work of a span in prompt-token equivalents beyond its own tokens (what fairness
    /// charges for the KV it reads and its attention, `Service::kv_read`): a decode at 100k
    /// tokens of context reads as much as ~150 prompt tokens' GEMMs take on an H100.
    pub fn kv_equivalent(&self, pos: u32, end: u32) -> u64 {
        let len = f64::from(end - pos);
        let attention = if len > 1.0 {
            self.attn_pair_s * len * (f64::from(pos) + len / 2.0)
        } else {
            0.0
        };
        let s = self.kv_token_s * f64::from(end) + attention;
        // Whole tokens only: a short decode (under ~700 tokens of context on an H100) adds
        // nothing, so short-context fairness is as before.
        (s / self.prompt_token_s).floor() as u64
    }

    /// `seconds` of other work (a grammar's token masks on the host) in prompt-token
    /// equivalents: the prompt tokens whose GEMMs would take as long, whole tokens only.
    pub fn seconds_equivalent(&self, seconds: f64) -> u64 {
        if self.prompt_token_s > 0.0 && seconds > 0.0 {
            (seconds / self.prompt_token_s).floor() as u64
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chunk_that_fits_a_time_is_the_largest_whose_cost_is_within_it() {
        let p = Profile::builtin("h100-llama-3.1-8b").unwrap();
        let c = StepCost::of_profile(&p, p.model.geometry(16));
        for pos in [0u32, 4096, 65_536, 120_000] {
            for s in [0.005, 0.02, 0.1, 1.0] {
                let n = c.chunk_tokens_within(pos, s);
                if n > 0 {
                    assert!(c.chunk_s(pos, n) <= s + 1e-12, "{pos} {s} {n}");
                }
                assert!(c.chunk_s(pos, n + 1) > s, "{pos} {s} {n}: one more fits");
            }
        }
        // Deep in a context the first wave's queries (512 in 8 tiles on the H100) cost about
        // the same attention: 448 more queries add their GEMMs and KV, and of attention only
        // the wave's growth, not 448 × 40k pairs; one tile more starts a second wave.
        assert_eq!(c.wave_tokens(), 512);
        let extra = c.chunk_s(40_000, 512)
            - c.chunk_s(40_000, 64)
            - (c.prompt_token_s + c.kv_token_s) * 448.0;
        assert!(extra < 0.02 * c.attn_pair_s * 448.0 * 40_000.0, "{extra}");
        let second = c.chunk_s(40_000, 576) - c.chunk_s(40_000, 512);
        assert!(second > 0.9 * c.attn_pair_s * 528.0 * 40_000.0, "{second}");
        // From 8,192 tokens the wide kernel: its pairs at its rate (1/0.89 the narrow's).
        assert_eq!(c.wide_min, 8192.0);
        let (narrow, wide) = (
            c.chunk_attention_s(40_000.0, 8191.0),
            c.chunk_attention_s(40_000.0, 8192.0),
        );
        assert!(wide < 0.92 * narrow, "{wide} {narrow}");
        let pairs = 8192.0 * (40_000.0 + 4096.0);
        assert!((wide / (c.attn_pair_s * pairs) - 0.331 / 0.372).abs() < 1e-9);
        // Many waves: about the pairs (within the last wave's rounding).
        let big = attention_pairs(0.0, 16_384.0, c.attn_wave, c.attn_tile);
        let pairs = 16_384.0 * 8_192.0;
        assert!(big >= pairs && big < 1.05 * pairs, "{big} {pairs}");
        // A 100k-token decode costs ~150 prompt tokens of GEMM time, a short one ~0.
        let long = c.kv_equivalent(100_000, 100_001);
        assert!((50..500).contains(&long), "{long}");
        assert!(c.kv_equivalent(100, 101) <= 1);
    }
}
