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
    /// A chunk's attention costs at least this many queries' pairs over its keys (the GPU
    /// is not filled by fewer: `HardwareProfile::attention_floor_rows`; 0: no floor).
    pub attn_floor_rows: f64,
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
        StepCost {
            base_s: m.weight_bytes() / bandwidth + per_layer * hw.graph_step_overhead_s,
            per_seq_s: per_layer * hw.graph_step_overhead_per_seq_s,
            kv_token_s: geometry.bytes_per_token() as f64 / (bandwidth * hw.kv_read_efficiency),
            prompt_token_s: 2.0 * m.params / flops,
            attn_pair_s: 4.0 * f64::from(m.num_layers) * q_width / hw.attention_flops_per_s(),
            attn_floor_rows: hw.attention_floor_rows(m.num_heads),
        }
    }

    /// Seconds a decode adds at `kv_len` tokens of context (its next token attends to
    /// `kv_len + 1` keys).
    pub fn decode_s(&self, kv_len: u32) -> f64 {
        self.per_seq_s + self.kv_token_s * f64::from(kv_len + 1)
    }

    /// Seconds a prompt chunk of `len` tokens from position `pos` adds: its GEMMs, its causal
    /// attention and its KV read. Each chunk is costed as if alone: beside other chunks its
    /// attention's floor is shared, so a step of several costs at most this sum.
    pub fn chunk_s(&self, pos: u32, len: u32) -> f64 {
        let (pos, len) = (f64::from(pos), f64::from(len));
        let pairs = if len > 1.0 {
            (len * (pos + len / 2.0)).max(self.attn_floor_rows * (pos + len))
        } else {
            len * (pos + len / 2.0)
        };
        self.per_seq_s
            + self.prompt_token_s * len
            + self.attn_pair_s * pairs
            + self.kv_token_s * (pos + len)
    }

    /// The most tokens of a chunk from `pos` that fit in `seconds` (0 if none does).
    pub fn chunk_tokens_within(&self, pos: u32, seconds: f64) -> u32 {
        // `chunk_s` grows with the length (the floor only makes the first rows' attention
        // cost the same): the longest that fits, by bisection.
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
        // Deep in a context, the first ~528 queries' attention costs about the same (the GPU
        // is not full below that): 464 more queries add their GEMMs and KV, and of attention
        // only the floor's growth, not 464 × 40k pairs.
        let extra = c.chunk_s(40_000, 528)
            - c.chunk_s(40_000, 64)
            - (c.prompt_token_s + c.kv_token_s) * 464.0;
        assert!(extra < 0.02 * c.attn_pair_s * 464.0 * 40_000.0, "{extra}");
        // A 100k-token decode costs ~150 prompt tokens of GEMM time, a short one ~0.
        let long = c.kv_equivalent(100_000, 100_001);
        assert!((50..500).contains(&long), "{long}");
        assert!(c.kv_equivalent(100, 101) <= 1);
    }
}
