//! A tier of the paged KV cache as one candle tensor in block-first layout:
//! `(num_blocks, num_layers, 2, block_size, kv_heads, head_dim)`, so a block (all layers, K and
//! V) is one contiguous range, the unit the transfer backends copy.
//!
//! The tensor is kept as a 2-D view of rows of width `kv_heads * head_dim`: the row of token
//! offset `o` of layer `l`, K (`kv = 0`) or V (`kv = 1`), in block `b` is
//! `((b * num_layers + l) * 2 + kv) * block_size + o`. Clones share the storage: the runner
//! writes new K/V in place (`scatter_set`) and gathers context rows (`index_select`); the host
//! transfer backend copies whole blocks in and out (`slice_set`) from its worker thread.
//! candle locks the storage for each such operation; the KV pool guarantees that no block is
//! copied while a step writes it.

use crate::error::EngineError;
use crate::kv::BlockGeometry;
use candle_core::{DType, Device, Tensor};

/// One tier's KV storage.
#[derive(Clone, Debug)]
pub struct KvArena {
    rows: Tensor,
    geometry: BlockGeometry,
    num_blocks: u32,
}

pub(crate) fn candle_err(what: &str, e: candle_core::Error) -> EngineError {
    EngineError::Runner(format!("{what}: {e}"))
}

impl KvArena {
    /// A zeroed arena of `num_blocks` blocks of `geometry` in `dtype` on `device`.
    pub fn new(
        geometry: BlockGeometry,
        num_blocks: u32,
        dtype: DType,
        device: &Device,
    ) -> Result<KvArena, EngineError> {
        if geometry.dtype_bytes as usize != dtype.size_in_bytes() {
            return Err(EngineError::Config(format!(
                "KV geometry says {} bytes per element, dtype {dtype:?} has {}",
                geometry.dtype_bytes,
                dtype.size_in_bytes()
            )));
        }
        let rows_per_block = Self::rows_per_block_of(&geometry);
        let total = u64::from(num_blocks) * rows_per_block as u64;
        if total > u64::from(u32::MAX) {
            return Err(EngineError::Config(format!(
                "KV arena of {num_blocks} blocks has {total} rows, more than u32 indexes"
            )));
        }
        let width = (geometry.kv_heads * geometry.head_dim) as usize;
        let rows = Tensor::zeros((total as usize, width), dtype, device)
            .map_err(|e| candle_err("allocating the KV arena", e))?;
        Ok(KvArena {
            rows,
            geometry,
            num_blocks,
        })
    }

    fn rows_per_block_of(g: &BlockGeometry) -> usize {
        (g.num_layers * 2 * g.block_size) as usize
    }

    /// Rows of one block (all layers, K and V).
    pub fn rows_per_block(&self) -> usize {
        Self::rows_per_block_of(&self.geometry)
    }

    pub fn geometry(&self) -> BlockGeometry {
        self.geometry
    }

    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    pub fn dtype(&self) -> DType {
        self.rows.dtype()
    }

    pub fn device(&self) -> &Device {
        self.rows.device()
    }

    /// The whole arena as rows of width `kv_heads * head_dim`.
    pub fn rows(&self) -> &Tensor {
        &self.rows
    }

    /// Row of token offset `offset` (in the block) of `layer`, K (`kv == 0`) or V, in `block`.
    pub fn row(&self, block: u32, layer: usize, kv: usize, offset: usize) -> u32 {
        let g = &self.geometry;
        let bs = g.block_size as usize;
        (((block as usize * g.num_layers as usize + layer) * 2 + kv) * bs + offset) as u32
    }

    /// Blocks `first..first + n` as one contiguous view `(n * rows_per_block, width)`.
    pub fn blocks(&self, first: u32, n: u32) -> Result<Tensor, EngineError> {
        let rpb = self.rows_per_block();
        self.rows
            .narrow(0, first as usize * rpb, n as usize * rpb)
            .map_err(|e| candle_err("KV arena block range", e))
    }

    /// Overwrites blocks `first..` with `src` (whole blocks of the same geometry), in place.
    pub fn set_blocks(&self, first: u32, src: &Tensor) -> Result<(), EngineError> {
        let rpb = self.rows_per_block();
        self.rows
            .slice_set(src, 0, first as usize * rpb)
            .map_err(|e| candle_err("KV arena block write", e))
    }

    /// One block as a host vector of f32 (tests and diagnostics).
    pub fn block_to_vec(&self, block: u32) -> Result<Vec<f32>, EngineError> {
        self.blocks(block, 1)?
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| candle_err("reading a KV block", e))
    }
}
