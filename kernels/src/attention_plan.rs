//! The per-step metadata of the model kernels (`cu/attention.cu`, `cu/rope_kv.cu`), built on
//! the host as one `u32` array so a step uploads it once and every layer reuses it. Plain
//! Rust: built and tested without a GPU.
//!
//! Sections, in order (each at the offset [`AttentionPlan`] records):
//! - `positions[t]`, `slots[t]`: every token's position and the arena row of its K at layer 0
//!   (block-first rows: `((block * layers + layer) * 2 + kv) * block_size + offset`);
//! - prefill tiles `[seq, q0]` ([`AttentionPlan::prefill_tile`] queries each) and prefill sequences
//!   `[q_offset, pos, end, table_start]`;
//! - decode sequences `[q_row, context_len, table_start, 0]`;
//! - the block tables of all sequences, flat.

mod fixed;
#[cfg(test)]
mod tests;

pub use fixed::{FixedDecodeLayout, MAX_FIXED_SPLITS, NO_SLOT};

use crate::error::{Error, Result};

/// Queries per prefill tile of `paged_prefill` (`PF_M` in `cu/prefill.cu`).
pub const PREFILL_TILE: u32 = 64;
/// Queries per prefill tile of `paged_prefill_wide` (`PFW_M` in `cu/prefill_wide.cu`: `PFW_WARPS`
/// warps of `PFW_MT` 16-row tiles).
pub const PREFILL_WIDE_TILE: u32 = 128;
/// Threads of a CTA of either prefill kernel (`PF_THREADS`, `PFW_THREADS`).
pub const PREFILL_THREADS: u32 = 128;
/// Keys per tile the wide kernel stages in shared memory (`PFW_N`).
pub const PREFILL_WIDE_KEY_TILE: u32 = 32;
/// A step with a prompt chunk of at least this many tokens runs the wide kernel: 1.12x the
/// rate on long chunks (H100), but a CTA walks its keys with twice the queries, so a small
/// chunk deep in a context takes about twice as long; at 8,192 queries over 32 heads the
/// wide kernel's CTAs fill an H100 about eight times (docs/BENCHMARKS_GPU.md "Long-context kernels").
pub const PREFILL_WIDE_MIN_TOKENS: u32 = 8192;

/// Dynamic shared memory of a wide prefill CTA at `head_dim`: the CTA's queries and one key
/// tile each of K and V, rows padded by 8 elements of 2 bytes (52,224 bytes at head_dim 128,
/// above the 48 KiB a launch gets without raising the function's limit).
pub const fn prefill_wide_shared_bytes(head_dim: u32) -> u32 {
    (PREFILL_WIDE_TILE + 2 * PREFILL_WIDE_KEY_TILE) * (head_dim + 8) * 2
}
/// Most keys per decode split (`DEC_PART` in the kernel: its shared memory holds that many
/// scores per head).
pub const DECODE_PART: u32 = 256;
/// Decode CTAs (sequences × KV heads × splits) a plan aims for: about two per SM of an H100 or
/// H200, so a handful of sequences still spread their context over the whole GPU.
pub const DECODE_TARGET_CTAS: u32 = 264;
/// Most query heads per KV head the decode kernel serves (`MAX_G`).
pub const MAX_GROUP: u32 = 8;

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct SeqSpan<'a> {
    /// First row of its tokens in the step's flat batch.
    pub q_offset: u32,
    /// The step runs positions `pos..end`.
    pub pos: u32,
    pub end: u32,
    /// HBM block ids covering `0..end`.
    pub blocks: &'a [u32],
}

/// Model geometry the kernels need.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub num_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub num_layers: u32,
    pub block_size: u32,
    /// Sliding window in tokens; 0: none.
    pub window: u32,
}

impl AttentionShape {
    /// Checks what the kernels support.
    pub fn validate(&self) -> Result<()> {
        if ![32, 64, 128].contains(&self.head_dim) {
            return Err(Error::Invalid(format!(
                "head dimension {} (the CUDA kernels support 32, 64 and 128)",
                self.head_dim
            )));
        }
        if self.kv_heads == 0 || !self.num_heads.is_multiple_of(self.kv_heads) {
            return Err(Error::Invalid(format!(
                "{} query heads over {} KV heads",
                self.num_heads, self.kv_heads
            )));
        }
        if self.num_heads / self.kv_heads > MAX_GROUP {
            return Err(Error::Invalid(format!(
                "{} query heads per KV head (at most {MAX_GROUP})",
                self.num_heads / self.kv_heads
            )));
        }
        if self.block_size == 0 || self.num_layers == 0 {
            return Err(Error::Invalid("empty block size or layer count".into()));
        }
        Ok(())
    }

    /// `log2(e) / sqrt(head_dim)`: the kernels' score scale (they use `exp2`).
    pub fn scale_log2(&self) -> f32 {
        std::f32::consts::LOG2_E / (self.head_dim as f32).sqrt()
    }

    /// Arena row of the K of token offset `offset` in `block` at layer 0.
    pub fn slot(&self, block: u32, offset: u32) -> u64 {
        u64::from(block) * u64::from(self.num_layers) * 2 * u64::from(self.block_size)
            + u64::from(offset)
    }
}

/// Offsets (in `u32`s) of the sections of [`AttentionPlan::data`] and their sizes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttentionPlan {
    pub data: Vec<u32>,
    pub tokens: u32,
    pub positions: usize,
    pub slots: usize,
    pub prefill_tiles: usize,
    pub num_tiles: u32,
    /// Queries per prefill tile: [`PREFILL_WIDE_TILE`] (the wide kernel) when a chunk has
    /// [`PREFILL_WIDE_MIN_TOKENS`] or more, else [`PREFILL_TILE`].
    pub prefill_tile: u32,
    pub prefill_seqs: usize,
    pub decode_seqs: usize,
    pub num_decodes: u32,
    pub tables: usize,
    /// Splits of the decode kernel: enough for the longest decode context.
    pub decode_splits: u32,
    /// Keys per decode split (a multiple of 32, at most [`DECODE_PART`]): smaller when few
    /// sequences decode, so the grid still fills the GPU.
    pub decode_part: u32,
}

/// Keys per split and splits for `decodes` sequences of at most `max_keys` keys.
pub fn decode_split(decodes: u32, kv_heads: u32, max_keys: u32) -> (u32, u32) {
    let per_split_ctas = decodes.max(1) * kv_heads.max(1);
    let keys = max_keys.max(1);
    // Enough splits to fill the GPU and to keep parts within DECODE_PART, then parts of equal
    // size (513 keys: 3 × 192, not 256 + 256 + 1, whose last CTA would do a CTA's fixed work
    // for one key).
    let wanted = DECODE_TARGET_CTAS
        .div_ceil(per_split_ctas)
        .max(keys.div_ceil(DECODE_PART))
        .max(1);
    let part = keys
        .div_ceil(wanted)
        .next_multiple_of(32)
        .clamp(32, DECODE_PART);
    (part, keys.div_ceil(part))
}

impl AttentionPlan {
    /// The plan of one step. Sequences must tile the flat batch in order; a sequence with
    /// `end - pos == 1` decodes, any longer one runs through the prefill kernel.
    pub fn new(shape: &AttentionShape, seqs: &[SeqSpan<'_>]) -> Result<AttentionPlan> {
        shape.validate()?;
        let bs = shape.block_size;
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        let mut tiles = Vec::new();
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        let mut tables: Vec<u32> = Vec::new();
        let mut max_keys = 0u32;
        let prefill_tile = if seqs
            .iter()
            .any(|s| s.end.saturating_sub(s.pos) >= PREFILL_WIDE_MIN_TOKENS)
        {
            PREFILL_WIDE_TILE
        } else {
            PREFILL_TILE
        };
        for (i, s) in seqs.iter().enumerate() {
            if s.pos >= s.end {
                return Err(Error::Invalid(format!(
                    "sequence {i}: empty span {}..{}",
                    s.pos, s.end
                )));
            }
            if s.q_offset as usize != positions.len() {
                return Err(Error::Invalid(format!(
                    "sequence {i}: starts at row {}, expected {}",
                    s.q_offset,
                    positions.len()
                )));
            }
            if (s.blocks.len() as u64) * u64::from(bs) < u64::from(s.end) {
                return Err(Error::Invalid(format!(
                    "sequence {i}: {} blocks cannot hold {} tokens",
                    s.blocks.len(),
                    s.end
                )));
            }
            let table_start = tables.len() as u32;
            tables.extend_from_slice(&s.blocks[..s.end.div_ceil(bs) as usize]);
            for p in s.pos..s.end {
                positions.push(p);
                let slot = shape.slot(s.blocks[(p / bs) as usize], p % bs);
                slots.push(u32::try_from(slot).map_err(|_| {
                    Error::Invalid(format!("arena row {slot} does not fit 32 bits"))
                })?);
            }
            if s.end - s.pos == 1 {
                decode.extend_from_slice(&[s.q_offset, s.end, table_start, 0]);
                let keys = if shape.window > 0 {
                    s.end.min(shape.window)
                } else {
                    s.end
                };
                max_keys = max_keys.max(keys);
            } else {
                let seq = (prefill.len() / 4) as u32;
                prefill.extend_from_slice(&[s.q_offset, s.pos, s.end, table_start]);
                let mut q0 = 0;
                while q0 < s.end - s.pos {
                    tiles.extend_from_slice(&[seq, q0]);
                    q0 += prefill_tile;
                }
            }
        }
        let tokens = positions.len() as u32;
        let num_decodes = (decode.len() / 4) as u32;
        let (decode_part, decode_splits) = decode_split(num_decodes, shape.kv_heads, max_keys);
        let mut plan = AttentionPlan {
            tokens,
            num_tiles: (tiles.len() / 2) as u32,
            prefill_tile,
            num_decodes,
            decode_splits,
            decode_part,
            ..AttentionPlan::default()
        };
        let mut data = Vec::with_capacity(
            positions.len() * 2 + tiles.len() + prefill.len() + decode.len() + tables.len(),
        );
        let mut section = |v: &[u32]| {
            let at = data.len();
            data.extend_from_slice(v);
            at
        };
        plan.positions = section(&positions);
        plan.slots = section(&slots);
        plan.prefill_tiles = section(&tiles);
        plan.prefill_seqs = section(&prefill);
        plan.decode_seqs = section(&decode);
        plan.tables = section(&tables);
        if data.is_empty() {
            data.push(0);
        }
        plan.data = data;
        Ok(plan)
    }
}
