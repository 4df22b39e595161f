//! The decode buckets' settings of a [`GpuLlama`] (which matmuls go through the GEMV kernel,
//! the buckets and their graphs, the fusions and launch overlap). Each setter drops the
//! buckets' buffers and graphs, so the next decode step builds them with the new setting. The
//! environment switches that set them at load are in `switch.rs`.

use super::GpuLlama;
use std::sync::Mutex;
use superinfer_kernels::cuda::{Overlap, GEMV_MAX_ROWS};

impl GpuLlama {
    /// Drops the buckets' buffers and graphs: the next decode step builds them anew.
    fn drop_decoder(&mut self) {
        self.decoder = Mutex::new(None);
    }

    /// Matmuls of at most `rows` rows (at most 8) go through our GEMV kernel, larger ones
    /// through cuBLAS; 0 sends everything to cuBLAS (benchmarks compare the two).
    pub fn set_gemv_max_rows(&mut self, rows: usize) {
        self.gemv_max_rows = rows.min(GEMV_MAX_ROWS);
        self.drop_decoder();
    }

    /// Decode-only steps of at most the largest of `buckets` rows run through fixed buffers
    /// ([`GpuLlama::decode`]), replayed from CUDA graphs when `graphs` is set; an empty list
    /// sends them through [`GpuLlama::forward`] as any other step.
    pub fn set_decode_buckets(&mut self, buckets: &[u32], graphs: bool) {
        let mut b = buckets.to_vec();
        b.retain(|&r| r > 0);
        b.sort_unstable();
        b.dedup();
        self.decode_buckets = b;
        self.decode_graphs = graphs;
        self.drop_decoder();
    }

    /// Decode buckets split every sequence's keys into the step's split count (`true`: the
    /// first design, slower with mixed contexts) or, the default, into the eager plan's keys
    /// per split: for benchmarks that compare the two.
    pub fn set_decode_equal_splits(&mut self, on: bool) {
        self.decode_equal_splits = on;
        self.drop_decoder();
    }

    /// One-row decode steps through the GEMV kernel fuse each `add_rmsnorm` after the first
    /// into the GEMV that consumes it (gemv.cu's `gemv_norm`, two kernels a layer fewer; the
    /// same bits, checked by engine/tests/gpu_decode_graphs.rs). Off by default.
    pub fn set_decode_fused_norm(&mut self, on: bool) {
        self.decode_fused_norm = on;
        self.drop_decoder();
    }

    /// Decode steps through the GEMV kernel compute the gate/up projection's `silu_mul` in its
    /// epilogue (gemv.cu's `gemv_silu`, one kernel a layer fewer; the same bits, checked by
    /// engine/tests/gpu_decode_graphs.rs). Off by default.
    pub fn set_decode_fused_silu(&mut self, on: bool) {
        self.decode_fused_silu = on;
        self.drop_decoder();
    }

    /// Decode buckets whose matmuls go through the GEMV kernel launch each kernel with
    /// programmatic dependent launch, so that it starts while the kernel before it drains:
    /// the same bits, checked by engine/tests/gpu_decode_graphs.rs. [`Overlap::PDL`] by
    /// default (`SUPERINFER_PDL=0`: none).
    pub fn set_decode_overlap(&mut self, o: Overlap) {
        self.decode_overlap = o;
        self.drop_decoder();
    }
}
