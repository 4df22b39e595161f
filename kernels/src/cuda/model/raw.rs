//! Pointer-level launches of the model kernels: every argument is a device address or a
//! number, so a CUDA graph can capture them (no allocation, no host copy, no event in
//! between) and the tensor methods of [`ModelKernels`] share them. Outputs go where the caller
//! says; nothing is checked beyond what the arguments carry, hence `unsafe`.

use candle_core::{DType, Tensor};

use super::super::cudarc::cublas::{result as blas, sys as blas_sys};
use super::super::cudarc::driver::sys;
use super::super::driver;
use super::launch::Args;
use super::spec::{grid, DecodeLaunch, GemvOut, RopeLaunch, StepGraph, GEMV_NORM_MAX_K};
use super::state::{ptr, suffix, ModelKernels};
use crate::attention_plan::AttentionShape;
use crate::error::{Error, Result};

fn half_dtype(dtype: DType, what: &str) -> Result<&'static str> {
    match suffix(dtype)? {
        "f32" => Err(Error::Invalid(format!("{what} runs in bf16 or f16"))),
        s => Ok(s),
    }
}

impl ModelKernels {
    /// The device address of a contiguous tensor on this GPU (for pointer-level launches).
    pub fn address(&self, t: &Tensor) -> Result<u64> {
        ptr(t, &self.stream)
    }

    /// Captures the launches `body` makes on the compute stream into a graph (nothing runs
    /// now). `body` must only launch (the `launch_*` methods): no allocation, no copy, no
    /// synchronization. Capture is thread-local, so other threads' CUDA calls (the copy
    /// engine's) go on.
    pub fn capture(&self, body: impl FnOnce() -> Result<()>) -> Result<StepGraph> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream
            .begin_capture(mode)
            .map_err(driver("cuStreamBeginCapture"))?;
        let ran = body();
        // Capture always ends, also when a launch failed, so the stream is usable after.
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(driver("cuStreamEndCapture"));
        ran?;
        let graph = graph?.ok_or_else(|| Error::Cuda {
            op: "cuStreamEndCapture",
            detail: "no graph was captured".into(),
        })?;
        graph.upload().map_err(driver("cuGraphUpload"))?;
        Ok(StepGraph(graph))
    }

    /// Copies `src` to device address `dst` on the compute stream (ordered after the kernels
    /// launched before it and before those launched after; `src` may be reused once this
    /// returns).
    ///
    /// # Safety
    /// `dst` holds `src.len()` u32s that no other stream reads or writes meanwhile.
    pub unsafe fn upload_u32(&self, dst: u64, src: &[u32]) -> Result<()> {
        // SAFETY: the contract; a pageable source is staged before the call returns.
        unsafe {
            super::super::cudarc::driver::result::memcpy_htod_async(
                dst,
                src,
                self.stream.cu_stream(),
            )
        }
        .map_err(driver("cuMemcpyHtoDAsync"))
    }

    /// Reads `n` u32s at device address `src` once the compute stream has reached this point.
    ///
    /// # Safety
    /// `src` holds `n` u32s.
    pub unsafe fn read_u32(&self, src: u64, n: usize) -> Result<Vec<u32>> {
        let mut out = vec![0u32; n];
        // SAFETY: the contract; the stream is synchronized before `out` is read.
        unsafe {
            super::super::cudarc::driver::result::memcpy_dtoh_async(
                &mut out,
                src,
                self.stream.cu_stream(),
            )
        }
        .map_err(driver("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))?;
        Ok(out)
    }

    /// `out[t] = table[ids[t]]` for `rows` rows of `hidden` elements.
    ///
    /// # Safety
    /// `table` holds every row `ids` names, `ids` `rows` u32s, `out` `rows × hidden` elements
    /// of `dtype`; `hidden` is a multiple of 8.
    pub unsafe fn launch_embed(
        &self,
        dtype: DType,
        table: u64,
        ids: u64,
        out: u64,
        rows: u32,
        hidden: u32,
    ) -> Result<()> {
        let f = self.func(
            &self.norm_act,
            format_args!("embed_rows_{}", suffix(dtype)?),
        )?;
        let mut b = Args::default();
        b.arg(&table).arg(&ids).arg(&out).arg(&hidden);
        let cfg = grid((rows, 1, 1), 128);
        // SAFETY: the arguments are as this function's contract requires.
        unsafe { self.launch(&f, cfg, &mut b, "launch embed_rows") }?;
        Ok(())
    }

    /// `x += y` in place (`y` 0: none), then `out = rmsnorm(x) * w`, over `rows` rows.
    ///
    /// # Safety
    /// `x`, `y` (if not 0) and `out` hold `rows × hidden` elements of `dtype`, `w` `hidden`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_add_rmsnorm(
        &self,
        dtype: DType,
        x: u64,
        y: u64,
        w: u64,
        out: u64,
        rows: u32,
        hidden: u32,
        eps: f32,
    ) -> Result<()> {
        let f = self.func(
            &self.norm_act,
            format_args!("add_rmsnorm_{}", suffix(dtype)?),
        )?;
        let mut b = Args::default();
        b.arg(&x).arg(&y).arg(&w).arg(&out).arg(&hidden).arg(&eps);
        let cfg = grid((rows, 1, 1), 256);
        // SAFETY: the arguments are as this function's contract requires.
        unsafe { self.launch(&f, cfg, &mut b, "launch add_rmsnorm") }?;
        Ok(())
    }

    /// `out = silu(gate) * up` over the fused projection `(rows, 2 * inter)`.
    ///
    /// # Safety
    /// `gate_up` holds `rows × 2 inter` elements of `dtype`, `out` `rows × inter`.
    pub unsafe fn launch_silu_mul(
        &self,
        dtype: DType,
        gate_up: u64,
        out: u64,
        rows: u32,
        inter: u32,
    ) -> Result<()> {
        let f = self.func(&self.norm_act, format_args!("silu_mul_{}", suffix(dtype)?))?;
        let mut b = Args::default();
        b.arg(&gate_up).arg(&out).arg(&rows).arg(&inter);
        let n = u64::from(rows) * u64::from(inter);
        let cfg = grid((n.div_ceil(256).min(65_535) as u32, 1, 1), 256);
        // SAFETY: the arguments are as this function's contract requires.
        unsafe { self.launch(&f, cfg, &mut b, "launch silu_mul") }?;
        Ok(())
    }

    /// `y = x @ w^T` by our GEMV kernel: `x` `(m, k)` with `1 <= m <= GEMV_MAX_ROWS`, `w`
    /// `(n, k)`, `k` a multiple of 8; with [`GemvOut::SiluMul`], `w` `(2n, k)` and `y` the
    /// activation `(m, n)`.
    ///
    /// # Safety
    /// The three addresses hold those shapes in `dtype`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_gemv(
        &self,
        dtype: DType,
        x: u64,
        w: u64,
        y: u64,
        m: u32,
        n: u32,
        k: u32,
        out: GemvOut,
    ) -> Result<()> {
        let name = half_dtype(dtype, "gemv")?;
        let f = self.func(&self.gemv, format_args!("gemv{}_{name}_m{m}", out.infix()))?;
        let mut b = Args::default();
        let prefetch = self.gemv_prefetch();
        b.arg(&x).arg(&w).arg(&y).arg(&n).arg(&k).arg(&prefetch);
        let cfg = grid(
            (n.div_ceil(8).min(self.multiprocessors * 16).max(1), 1, 1),
            256,
        );
        // SAFETY: the arguments are as this function's contract requires.
        unsafe { self.launch(&f, cfg, &mut b, "launch gemv") }?;
        Ok(())
    }

    /// `out = rmsnorm(x + y) * g @ w^T` for one row, by gemv.cu's `gemv_norm`: the
    /// `add_rmsnorm` before a GEMV fused into its prologue (bitwise the two kernels' result);
    /// `x + y` goes to `x_out` (y null: nothing is written, the residual stays in `x`). With
    /// [`GemvOut::SiluMul`] the GEMV's epilogue is `silu_mul` too (gemv.cu's `gemv_norm_silu`).
    ///
    /// # Safety
    /// `x`, `x_out` and `g` hold `k` elements of `dtype`, `y` too unless 0, `w` `(n, k)`
    /// (`(2n, k)` with `SiluMul`), `out` `n`; `x_out` is not `x` or `y`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_gemv_norm(
        &self,
        dtype: DType,
        x: u64,
        y: u64,
        g: u64,
        w: u64,
        out: u64,
        x_out: u64,
        n: u32,
        k: u32,
        eps: f32,
        epilogue: GemvOut,
    ) -> Result<()> {
        // The normalised row in dynamic shared memory, within the 48 KB a launch may take
        // without opting in.
        if !k.is_multiple_of(8) || k > GEMV_NORM_MAX_K {
            return Err(Error::Invalid(format!(
                "gemv_norm: k {k} (a multiple of 8, at most {GEMV_NORM_MAX_K})"
            )));
        }
        let name = half_dtype(dtype, "gemv_norm")?;
        let f = self.func(
            &self.gemv,
            format_args!("gemv_norm{}_{name}", epilogue.infix()),
        )?;
        let prefetch = self.gemv_prefetch();
        let mut b = Args::default();
        b.arg(&x)
            .arg(&y)
            .arg(&g)
            .arg(&w)
            .arg(&out)
            .arg(&x_out)
            .arg(&n)
            .arg(&k)
            .arg(&eps)
            .arg(&prefetch);
        // Four CTAs an SM at most: each one's prologue reads the row and the residual (2k
        // elements from L2), so fewer CTAs with more columns each than gemv's grid.
        let mut cfg = grid(
            (n.div_ceil(8).min(self.multiprocessors * 4).max(1), 1, 1),
            256,
        );
        cfg.shared_mem_bytes = k * 4;
        // SAFETY: the arguments are as this function's contract requires.
        unsafe { self.launch(&f, cfg, &mut b, "launch gemv_norm") }?;
        Ok(())
    }

    /// `y = x @ w^T` through cuBLAS (candle's handle, the compute stream; the call candle's
    /// own matmul makes, f32 accumulation): `x` `(m, k)`, `w` `(n, k)`, `y` `(m, n)`.
    ///
    /// # Safety
    /// The three addresses hold those shapes in `dtype`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_gemm(
        &self,
        dtype: DType,
        x: u64,
        w: u64,
        y: u64,
        m: u32,
        n: u32,
        k: u32,
    ) -> Result<()> {
        let dt = match dtype {
            DType::BF16 => blas_sys::cudaDataType_t::CUDA_R_16BF,
            DType::F16 => blas_sys::cudaDataType_t::CUDA_R_16F,
            d => return Err(Error::Invalid(format!("gemm in {d:?}"))),
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (m, n, k) = (m as i32, n as i32, k as i32);
        // Column-major: y^T (n × m) = w (stored k × n, transposed) · x^T (k × m).
        // SAFETY: the addresses hold these shapes (the contract); alpha and beta outlive the
        // call, which reads them before it returns (host pointer mode).
        unsafe {
            blas::gemm_strided_batched_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                (&alpha as *const f32).cast(),
                w as *const std::ffi::c_void,
                dt,
                k,
                i64::from(n) * i64::from(k),
                x as *const std::ffi::c_void,
                dt,
                k,
                i64::from(m) * i64::from(k),
                (&beta as *const f32).cast(),
                y as *mut std::ffi::c_void,
                dt,
                n,
                i64::from(m) * i64::from(n),
                1,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
        .map_err(|e| Error::Cuda {
            op: "cublasGemmStridedBatchedEx",
            detail: format!("{e:?}"),
        })
    }

    /// Bias + rotary + K/V write of `layer`.
    ///
    /// # Safety
    /// As `cu/rope_kv.cu` reads them: `qkv` `(tokens, (heads + 2 kv) × d)`, `q` `(tokens,
    /// heads × d)`, positions inside the tables, slots inside the arena (or `NO_SLOT`).
    pub unsafe fn launch_rope_kv(
        &self,
        dtype: DType,
        a: &RopeLaunch,
        s: &AttentionShape,
        layer: u32,
    ) -> Result<()> {
        let f = self.func(&self.rope_kv, format_args!("rope_kv_{}", suffix(dtype)?))?;
        let mut b = Args::default();
        b.arg(&a.qkv)
            .arg(&a.bias)
            .arg(&a.q)
            .arg(&a.kv)
            .arg(&a.cos)
            .arg(&a.sin)
            .arg(&a.positions)
            .arg(&a.slots)
            .arg(&s.num_heads)
            .arg(&s.kv_heads)
            .arg(&s.head_dim)
            .arg(&s.block_size)
            .arg(&layer);
        let cfg = grid((a.tokens, s.num_heads + 2 * s.kv_heads, 1), s.head_dim / 2);
        // SAFETY: the arguments are as this function's contract requires.
        unsafe { self.launch(&f, cfg, &mut b, "launch rope_kv") }?;
        Ok(())
    }

    /// Decode attention of `layer` (and the merge of its splits when there are several),
    /// through the kernel [`ModelKernels::decode_kernel`] picks.
    ///
    /// # Safety
    /// Sequences, tables and arena rows as `cu/decode.cu` reads them; the workspace holds
    /// `decodes × heads × splits` entries when `splits > 1`. `part` 0 needs a kernel with
    /// per-sequence parts (not the three-phase one).
    pub unsafe fn launch_decode(
        &self,
        dtype: DType,
        a: &DecodeLaunch,
        s: &AttentionShape,
        layer: u32,
    ) -> Result<()> {
        let name = half_dtype(dtype, "attention")?;
        let kernel = self.decode_kernel(s);
        let (d, g) = (s.head_dim, s.num_heads / s.kv_heads);
        let f = match kernel {
            k if a.part == 0 && !k.per_sequence_parts() => {
                return Err(Error::Invalid(format!(
                    "per-sequence decode splits need a kernel that reads them, not {k:?}"
                )))
            }
            super::DecodeKernel::ThreePhase => {
                self.func(&self.attention, format_args!("paged_decode_{name}_d{d}"))?
            }
            super::DecodeKernel::OnePass => self.func(
                &self.decode,
                format_args!("paged_decode_fused_{name}_d{d}_g{g}"),
            )?,
            super::DecodeKernel::TensorCore => {
                self.func(&self.decode, format_args!("paged_decode_mma_{name}_d{d}"))?
            }
        };
        let scale = s.scale_log2();
        let mut b = Args::default();
        b.arg(&a.q)
            .arg(&a.kv)
            .arg(&a.out)
            .arg(&a.ws_acc)
            .arg(&a.ws_ml)
            .arg(&a.seqs)
            .arg(&a.tables)
            .arg(&s.num_heads)
            .arg(&s.kv_heads)
            .arg(&s.num_layers)
            .arg(&s.block_size)
            .arg(&layer)
            .arg(&scale)
            .arg(&s.window)
            .arg(&a.splits)
            .arg(&a.part);
        let cfg = grid((a.decodes, s.kv_heads, a.splits), kernel.threads());
        // SAFETY: the arguments are as this function's contract requires.
        unsafe { self.launch(&f, cfg, &mut b, "launch paged_decode") }?;
        if a.splits > 1 {
            let f = self.func(
                &self.attention,
                format_args!("decode_reduce_{name}_d{}", s.head_dim),
            )?;
            let mut b = Args::default();
            b.arg(&a.ws_acc)
                .arg(&a.ws_ml)
                .arg(&a.out)
                .arg(&a.seqs)
                .arg(&s.num_heads)
                .arg(&a.splits);
            let cfg = grid((a.decodes, s.num_heads, 1), s.head_dim);
            // SAFETY: the arguments are as this function's contract requires.
            unsafe { self.launch(&f, cfg, &mut b, "launch decode_reduce") }?;
        }
        Ok(())
    }

    /// One token id per row of `logits` `(rows, vocab)` into `ids`, drawn as
    /// `params[4 r..4 r + 4]` says (see [`super::GpuSample`]).
    ///
    /// # Safety
    /// `logits` holds `rows × vocab` elements of `dtype`, `params` `4 rows` u32s, `ids` `rows`.
    pub unsafe fn launch_sample(
        &self,
        dtype: DType,
        logits: u64,
        params: u64,
        ids: u64,
        rows: u32,
        vocab: u32,
    ) -> Result<()> {
        let f = self.func(&self.sample, format_args!("sample_rows_{}", suffix(dtype)?))?;
        let mut b = Args::default();
        b.arg(&logits).arg(&params).arg(&ids).arg(&vocab);
        let cfg = grid((rows, 1, 1), 1024);
        // SAFETY: the arguments are as this function's contract requires.
        unsafe { self.launch(&f, cfg, &mut b, "launch sample_rows") }?;
        Ok(())
    }
}
