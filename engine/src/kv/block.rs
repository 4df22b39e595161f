//! Block identities and geometry. Tiers are types, not booleans.

use serde::{Deserialize, Serialize};

/// A slot in the HBM tier (device memory on a GPU; a host arena on the CPU path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HbmBlock(pub u32);

/// A slot in the DRAM tier (pinned host memory on a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DramBlock(pub u32);

/// Whole blocks of `block_bytes` in `bytes` (at most `u32::MAX`): how every tier is sized from
/// a byte count (the servers' and the twin's, so they agree block for block).
pub fn whole_blocks(bytes: f64, block_bytes: u64) -> u32 {
    (bytes.max(0.0) / block_bytes.max(1) as f64)
        .floor()
        .min(f64::from(u32::MAX)) as u32
}

/// Shape of one KV block in block-first layout:
/// `(num_layers, 2 /* K, V */, block_size, kv_heads, head_dim)` contiguous, so a block is one
/// transfer unit and layer `l` of block `b` starts at `b * block_bytes + l * layer_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockGeometry {
    pub num_layers: u32,
    pub block_size: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype_bytes: u32,
}

impl BlockGeometry {
    /// Bytes of K (or V) for one layer of one block.
    pub fn half_layer_bytes(&self) -> u64 {
        u64::from(self.block_size)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    /// Bytes between layer `l` and `l + 1` inside a block (K then V).
    pub fn layer_stride(&self) -> u64 {
        2 * self.half_layer_bytes()
    }

    /// Bytes of one whole block (all layers, K and V).
    pub fn block_bytes(&self) -> u64 {
        u64::from(self.num_layers) * self.layer_stride()
    }

    /// KV bytes of one token across all layers.
    pub fn bytes_per_token(&self) -> u64 {
        self.block_bytes() / u64::from(self.block_size.max(1))
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size.max(1))
    }
}
