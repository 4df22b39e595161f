//! The plan of a decode-only step at fixed offsets, for CUDA graphs: a graph captures the
//! addresses its kernels read, so every step of a bucket must put its metadata in the same
//! places. The kernels read the same sections as from an [`AttentionPlan`] (positions, slots,
//! decode sequences, tables); rows past the step's sequences are padding: position 0, no KV
//! slot ([`NO_SLOT`]: the rotary kernel writes no K/V) and no keys (attention writes zeros).
//!
//! The split count of a graph is fixed (a power of two, so few graphs cover all steps), but
//! the keys per split are the eager plan's ([`decode_split`]) of this step, written into each
//! row's decode entry: each sequence runs the splits the eager step would (a short one 1-2
//! of up to 256 keys), and the grid's CTAs past a sequence's own splits exit at once. (Equal
//! parts of every sequence in the fixed count of splits, the first design, cut a 400-key
//! sequence beside a 1,500-key one into 7 parts of 64 keys instead of 2 of 256: mixed
//! contexts ran several times the eager step's CTAs and partials.)

use super::{decode_split, AttentionShape, SeqSpan};
use crate::error::{Error, Result};

/// A padding row's KV slot: `cu/rope_kv.cu` writes nothing for it.
pub const NO_SLOT: u32 = u32::MAX;
/// Most decode splits a fixed plan uses.
pub const MAX_FIXED_SPLITS: u32 = 64;

/// Where the sections of a fixed decode plan of at most `rows` rows live (in `u32`s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedDecodeLayout {
    /// Rows the buffers hold (the largest bucket).
    pub rows: u32,
    /// Block-table entries the buffer holds (all rows together).
    pub table_entries: u32,
}

impl FixedDecodeLayout {
    pub fn positions(&self) -> usize {
        0
    }
    pub fn slots(&self) -> usize {
        self.rows as usize
    }
    /// `[q_row, context_len, table_start, part]` per row: `part` keys per split (the eager
    /// plan's for this step; 0 in padding rows, which have no keys).
    pub fn seqs(&self) -> usize {
        2 * self.rows as usize
    }
    pub fn tables(&self) -> usize {
        6 * self.rows as usize
    }
    /// `u32`s of the whole buffer.
    pub fn len(&self) -> usize {
        self.tables() + self.table_entries as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the plan of `seqs` (decodes only, one token each at rows 0..n, in order) padded
    /// to `bucket` rows into `out` (cleared first; only the used part of the tables is
    /// written, so `out` may be shorter than [`Self::len`]); returns the decode splits, a
    /// power of two so few graphs cover all steps. Every row's keys per split are
    /// [`decode_split`]'s for the step (the eager plan's), or, where the eager plan would need
    /// more than [`MAX_FIXED_SPLITS`] splits, the longest context in that many parts.
    pub fn write(
        &self,
        shape: &AttentionShape,
        bucket: u32,
        seqs: &[SeqSpan<'_>],
        out: &mut Vec<u32>,
    ) -> Result<u32> {
        let n = seqs.len() as u32;
        if n == 0 || n > bucket || bucket > self.rows {
            return Err(Error::Invalid(format!(
                "{n} decodes in a bucket of {bucket} rows (buffers of {} rows)",
                self.rows
            )));
        }
        let bs = shape.block_size;
        out.clear();
        out.resize(self.tables(), 0);
        let mut max_keys = 0;
        for (i, s) in seqs.iter().enumerate() {
            if s.q_offset != i as u32 || s.end != s.pos + 1 {
                return Err(Error::Invalid(format!(
                    "sequence {i}: rows {}..{} at {} (a fixed plan takes one decode token per row, in order)",
                    s.pos, s.end, s.q_offset
                )));
            }
            let used = s.end.div_ceil(bs) as usize;
            if s.blocks.len() < used {
                return Err(Error::Invalid(format!(
                    "sequence {i}: {} blocks cannot hold {} tokens",
                    s.blocks.len(),
                    s.end
                )));
            }
            let start = out.len() - self.tables();
            if start + used > self.table_entries as usize {
                return Err(Error::Invalid(format!(
                    "the step's block tables need more than {} entries",
                    self.table_entries
                )));
            }
            out.extend_from_slice(&s.blocks[..used]);
            let slot = shape.slot(s.blocks[(s.pos / bs) as usize], s.pos % bs);
            out[self.positions() + i] = s.pos;
            out[self.slots() + i] = u32::try_from(slot)
                .ok()
                .filter(|&v| v != NO_SLOT)
                .ok_or_else(|| Error::Invalid(format!("arena row {slot} does not fit 32 bits")))?;
            out[self.seqs() + 4 * i..][..4].copy_from_slice(&[i as u32, s.end, start as u32, 0]);
            let keys = if shape.window > 0 {
                s.end.min(shape.window)
            } else {
                s.end
            };
            max_keys = max_keys.max(keys);
        }
        for r in n..bucket {
            out[self.slots() + r as usize] = NO_SLOT;
            out[self.seqs() + 4 * r as usize] = r;
        }
        let (part, splits) = decode_split(n, shape.kv_heads, max_keys);
        let fixed = splits.next_power_of_two().min(MAX_FIXED_SPLITS);
        let part = if splits <= fixed {
            part
        } else {
            max_keys.div_ceil(fixed).next_multiple_of(32)
        };
        for i in 0..n as usize {
            out[self.seqs() + 4 * i + 3] = part;
        }
        Ok(fixed)
    }
}
