//! Copy plans: which byte ranges move for a list of block copies. Plain Rust, no CUDA, so the
//! merging and layout arithmetic are tested on any machine.
//!
//! An arena is a set of equal-size slots ("blocks") allocated as contiguous chunks; a block
//! never straddles two chunks, and neither does a planned segment. A block is made of
//! `pieces` equal pieces (one per layer per K/V); the layout says where piece `p` of block `b`
//! lives, so the same arena can be read block-first (ours) or layer-first (the naive baseline).

#[cfg(test)]
mod tests;

/// One block copy by slot index in the source and destination arenas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockCopy {
    pub src: u32,
    pub dst: u32,
}

/// One contiguous byte range to copy, as offsets into the source and destination arenas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub src_offset: u64,
    pub dst_offset: u64,
    pub bytes: u64,
}

/// The shape of a block as a transfer unit: `pieces` pieces of `piece_bytes` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockShape {
    pub piece_bytes: u64,
    pub pieces: u32,
}

impl BlockShape {
    /// A KV block: `layers` layers of K and V, each `half_layer_bytes` long.
    pub fn kv(layers: u32, half_layer_bytes: u64) -> Self {
        Self {
            piece_bytes: half_layer_bytes,
            pieces: 2 * layers,
        }
    }

    /// A KV block cut per layer (K and V of a layer adjacent), `layer_bytes` per layer.
    pub fn per_layer(layers: u32, layer_bytes: u64) -> Self {
        Self {
            piece_bytes: layer_bytes,
            pieces: layers,
        }
    }

    pub fn block_bytes(&self) -> u64 {
        self.piece_bytes * u64::from(self.pieces)
    }
}

/// Where the pieces of a block live in an arena of `num_blocks` blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `(num_blocks, pieces, ..)`: all pieces of a block contiguous (one transfer unit).
    BlockFirst,
    /// `(pieces, num_blocks, ..)`: one tensor per layer per K/V, as in vLLM's paged cache.
    LayerFirst { num_blocks: u32 },
}

impl Layout {
    /// Byte offset of piece `piece` of block `block`.
    pub fn offset(&self, shape: BlockShape, block: u32, piece: u32) -> u64 {
        match *self {
            Layout::BlockFirst => {
                u64::from(block) * shape.block_bytes() + u64::from(piece) * shape.piece_bytes
            }
            Layout::LayerFirst { num_blocks } => {
                (u64::from(piece) * u64::from(num_blocks) + u64::from(block)) * shape.piece_bytes
            }
        }
    }

    /// `(block_stride, piece_stride)` with `offset = block * block_stride + piece * piece_stride`
    /// (what the device kernels take).
    pub fn strides(&self, shape: BlockShape) -> (u64, u64) {
        match *self {
            Layout::BlockFirst => (shape.block_bytes(), shape.piece_bytes),
            Layout::LayerFirst { num_blocks } => {
                (shape.piece_bytes, u64::from(num_blocks) * shape.piece_bytes)
            }
        }
    }
}

/// Naive plan: one segment per piece of every block (`2 x layers` copies per block), layer by
/// layer as a per-layer swap loop issues them.
pub fn per_piece(
    copies: &[BlockCopy],
    shape: BlockShape,
    src: Layout,
    dst: Layout,
) -> Vec<Segment> {
    let mut segments = Vec::with_capacity(copies.len() * shape.pieces as usize);
    for piece in 0..shape.pieces {
        for c in copies {
            segments.push(Segment {
                src_offset: src.offset(shape, c.src, piece),
                dst_offset: dst.offset(shape, c.dst, piece),
                bytes: shape.piece_bytes,
            });
        }
    }
    segments
}

/// Block-first plan: one segment per block, in the order given.
pub fn per_block(copies: &[BlockCopy], block_bytes: u64) -> Vec<Segment> {
    copies
        .iter()
        .map(|c| Segment {
            src_offset: u64::from(c.src) * block_bytes,
            dst_offset: u64::from(c.dst) * block_bytes,
            bytes: block_bytes,
        })
        .collect()
}

/// Limits on merging adjacent blocks into one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeLimits {
    /// Blocks per contiguous chunk of the source arena.
    pub src_chunk_blocks: u32,
    /// Blocks per contiguous chunk of the destination arena.
    pub dst_chunk_blocks: u32,
    /// Longest merged segment, in blocks (at least 1).
    pub max_blocks: u32,
}

impl MergeLimits {
    /// No chunk boundaries and no length cap.
    pub const UNLIMITED: MergeLimits = MergeLimits {
        src_chunk_blocks: u32::MAX,
        dst_chunk_blocks: u32::MAX,
        max_blocks: u32::MAX,
    };
}

/// Block-first plan with runs merged: copies are sorted by source, and a run of blocks whose
/// sources and destinations are both consecutive (and stay inside one chunk on each side)
/// becomes one segment. Copies of one direction are independent, so reordering is allowed.
pub fn merged(copies: &[BlockCopy], block_bytes: u64, limits: MergeLimits) -> Vec<Segment> {
    let mut sorted = copies.to_vec();
    sorted.sort_unstable();
    let mut segments: Vec<Segment> = Vec::with_capacity(sorted.len());
    let mut run: Option<(BlockCopy, u32)> = None; // (first copy, length in blocks)
    let max_blocks = limits.max_blocks.max(1);
    for c in sorted {
        run = match run {
            Some((first, len))
                if len < max_blocks
                    && u64::from(c.src) == u64::from(first.src) + u64::from(len)
                    && u64::from(c.dst) == u64::from(first.dst) + u64::from(len)
                    && c.src % limits.src_chunk_blocks.max(1) != 0
                    && c.dst % limits.dst_chunk_blocks.max(1) != 0 =>
            {
                Some((first, len + 1))
            }
            Some((first, len)) => {
                segments.push(run_segment(first, len, block_bytes));
                Some((c, 1))
            }
            None => Some((c, 1)),
        };
    }
    if let Some((first, len)) = run {
        segments.push(run_segment(first, len, block_bytes));
    }
    segments
}

fn run_segment(first: BlockCopy, len: u32, block_bytes: u64) -> Segment {
    Segment {
        src_offset: u64::from(first.src) * block_bytes,
        dst_offset: u64::from(first.dst) * block_bytes,
        bytes: u64::from(len) * block_bytes,
    }
}

/// Total bytes of a plan.
pub fn total_bytes(segments: &[Segment]) -> u64 {
    segments.iter().map(|s| s.bytes).sum()
}

/// The first destination written twice in one direction, if any (a planning bug: copies in a
/// batch run in no particular order).
pub fn duplicate_destination(copies: &[BlockCopy]) -> Option<u32> {
    let mut dsts: Vec<u32> = copies.iter().map(|c| c.dst).collect();
    dsts.sort_unstable();
    dsts.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// The start of the first destination range that overlaps another, if any (copies in a batch
/// run in any order, so overlapping destinations would race).
pub fn overlapping_destination(segments: &[Segment]) -> Option<u64> {
    let mut ranges: Vec<(u64, u64)> = segments
        .iter()
        .map(|s| (s.dst_offset, s.dst_offset + s.bytes))
        .collect();
    ranges.sort_unstable();
    ranges.windows(2).find(|w| w[1].0 < w[0].1).map(|w| w[1].0)
}
