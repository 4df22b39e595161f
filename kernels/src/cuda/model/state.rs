//! The model kernels' state ([`ModelKernels`]: the compiled modules, the stream, cuBLAS) and
//! their tensor-level launches; `raw.rs` holds the pointer-level ones, `launch.rs` the launch
//! path with overlap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{DType, Device, Storage, Tensor};

use super::super::cudarc::cublas::CudaBlas;
use super::super::cudarc::driver::sys::CUfunction_attribute;
use super::super::cudarc::driver::{CudaFunction, CudaStream, DevicePtr, PushKernelArg};
use super::super::nvrtc::{load_module, Origin};
use super::super::{driver, Gpu};
use super::decode_kernel::DecodeKernel;
use super::overlap::OverlapCell;
use super::spec::{grid, DecodeLaunch, GemvOut, RopeLaunch};
use crate::attention_plan::{
    prefill_wide_shared_bytes, AttentionPlan, AttentionShape, PREFILL_THREADS, PREFILL_WIDE_TILE,
};
use crate::compile_cache::CompileCache;
use crate::error::{Error, Result};

const COMMON: &str = include_str!("../cu/common.cuh");
const PREFILL: &str = include_str!("../cu/prefill.cu");
const PREFILL_WIDE: &str = include_str!("../cu/prefill_wide.cu");
const ATTENTION: &str = include_str!("../cu/attention.cu");
const DECODE: &str = include_str!("../cu/decode.cu");
const DECODE_MMA: &str = include_str!("../cu/decode_mma.cu");
const ROPE_KV: &str = include_str!("../cu/rope_kv.cu");
const NORM_ACT: &str = include_str!("../cu/norm_act.cu");
const SAMPLE: &str = include_str!("../cu/sample.cu");
const GEMV: &str = include_str!("../cu/gemv.cu");

/// Most rows [`ModelKernels::gemv`] takes (its kernels are instantiated for 1 to 8).
pub const GEMV_MAX_ROWS: usize = 8;

fn candle(op: &'static str) -> impl FnOnce(candle_core::Error) -> Error {
    move |e| Error::Cuda {
        op,
        detail: e.to_string(),
    }
}

/// Name suffix of a dtype's kernel instances.
pub(super) fn suffix(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::BF16 => Ok("bf16"),
        DType::F16 => Ok("f16"),
        DType::F32 => Ok("f32"),
        d => Err(Error::Invalid(format!("no CUDA model kernels for {d:?}"))),
    }
}

/// The device address of a contiguous CUDA tensor's first element.
pub(super) fn ptr(t: &Tensor, stream: &Arc<CudaStream>) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        return Err(Error::Invalid(
            "a model kernel got a tensor that is not on the GPU".into(),
        ));
    };
    if !layout.is_contiguous() {
        return Err(Error::Invalid(
            "a model kernel got a non-contiguous tensor".into(),
        ));
    }
    let (base, elem) = match &cs.slice {
        CudaStorageSlice::BF16(s) => (s.device_ptr(stream).0, 2),
        CudaStorageSlice::F16(s) => (s.device_ptr(stream).0, 2),
        CudaStorageSlice::F32(s) => (s.device_ptr(stream).0, 4),
        CudaStorageSlice::U32(s) => (s.device_ptr(stream).0, 4),
        _ => {
            return Err(Error::Invalid(format!(
                "model kernels do not take {:?}",
                t.dtype()
            )))
        }
    };
    Ok(base + layout.start_offset() as u64 * elem)
}

/// The source of `cu/<file>`: the embedded one, or, when `SUPERINFER_CUDA_SOURCES` names a
/// folder (kernel development: edit and rerun without rebuilding), the file there.
fn kernel_source(file: &str, embedded: &'static str) -> Result<std::borrow::Cow<'static, str>> {
    match std::env::var_os("SUPERINFER_CUDA_SOURCES") {
        None => Ok(embedded.into()),
        Some(dir) => {
            let path = std::path::Path::new(&dir).join(file);
            std::fs::read_to_string(&path).map(Into::into).map_err(|e| {
                Error::Invalid(format!("SUPERINFER_CUDA_SOURCES: {}: {e}", path.display()))
            })
        }
    }
}

/// A step's [`AttentionPlan`] uploaded once; every layer's kernels read it.
pub struct StepMeta {
    pub plan: AttentionPlan,
    /// The uploaded plan: kept alive while this step's kernels read it through `base`.
    _data: Tensor,
    base: u64,
    /// Workspace of split decodes (accumulators, then max/sum pairs), when splits > 1.
    ws: Option<(Tensor, Tensor)>,
}

impl StepMeta {
    fn at(&self, offset: usize) -> u64 {
        self.base + offset as u64 * 4
    }
}

/// The compiled model kernels of one GPU.
pub struct ModelKernels {
    pub(super) attention: Arc<super::super::cudarc::driver::CudaModule>,
    pub(super) decode: Arc<super::super::cudarc::driver::CudaModule>,
    /// The decode attention kernel, a [`DecodeKernel`] as u8.
    pub(super) decode_kernel: std::sync::atomic::AtomicU8,
    /// How launches overlap their predecessors (PDL; none unless a scope sets it).
    pub(super) overlap: OverlapCell,
    /// Compute capability 9.0 or later: launches may carry the PDL attribute (older GPUs
    /// launch as before whatever the overlap says).
    pub(super) pdl_capable: bool,
    pub(super) rope_kv: Arc<super::super::cudarc::driver::CudaModule>,
    pub(super) norm_act: Arc<super::super::cudarc::driver::CudaModule>,
    pub(super) sample: Arc<super::super::cudarc::driver::CudaModule>,
    pub(super) gemv: Arc<super::super::cudarc::driver::CudaModule>,
    pub(super) multiprocessors: u32,
    pub(super) stream: Arc<CudaStream>,
    /// candle's cuBLAS handle (on the compute stream), for matmuls into given buffers.
    pub(super) blas: Arc<CudaBlas>,
    pub(super) device: Device,
    /// Functions looked up so far, by instance name (`cuModuleGetFunction` once per name, not
    /// once per launch: a decode step launches about 200 kernels).
    pub(super) funcs: Mutex<HashMap<String, CudaFunction>>,
    /// Per module: from the cache or compiled now.
    pub origins: Vec<(&'static str, Origin)>,
}

impl ModelKernels {
    /// Loads (compiling on a cache miss) the kernels for `gpu`, whose candle device the model
    /// uses.
    pub fn load(gpu: &Gpu, cache: &CompileCache) -> Result<Self> {
        let mut origins = Vec::new();
        let common = kernel_source("common.cuh", COMMON)?;
        let mut module = |name: &'static str, files: &[(&str, &'static str)]| {
            let mut source = common.to_string();
            for (file, embedded) in files {
                source.push('\n');
                source.push_str(&kernel_source(file, embedded)?);
            }
            let (m, o) = load_module(gpu, cache, name, &source, &["--std=c++17".to_string()])?;
            origins.push((name, o));
            Ok::<_, Error>(m)
        };
        let attention = module(
            "superinfer_attention",
            &[
                ("prefill.cu", PREFILL),
                ("prefill_wide.cu", PREFILL_WIDE),
                ("attention.cu", ATTENTION),
            ],
        )?;
        let decode = module(
            "superinfer_decode",
            &[("decode.cu", DECODE), ("decode_mma.cu", DECODE_MMA)],
        )?;
        let rope_kv = module("superinfer_rope_kv", &[("rope_kv.cu", ROPE_KV)])?;
        let norm_act = module("superinfer_norm_act", &[("norm_act.cu", NORM_ACT)])?;
        let sample = module("superinfer_sample", &[("sample.cu", SAMPLE)])?;
        let gemv = module("superinfer_gemv", &[("gemv.cu", GEMV)])?;
        Ok(Self {
            attention,
            decode,
            decode_kernel: std::sync::atomic::AtomicU8::new(DecodeKernel::from_env()? as u8),
            overlap: OverlapCell::default(),
            pdl_capable: gpu.compute_capability()?.0 >= 9,
            rope_kv,
            norm_act,
            sample,
            gemv,
            multiprocessors: gpu.multiprocessors()?,
            stream: gpu.compute_stream().clone(),
            blas: gpu.candle().cublas_handle(),
            device: Device::Cuda(gpu.candle().clone()),
            funcs: Mutex::new(HashMap::new()),
            origins,
        })
    }

    /// Chooses the decode attention kernel (kept selectable to compare them in one run:
    /// benches/gpu_model.rs).
    pub fn set_decode_kernel(&self, k: DecodeKernel) {
        self.decode_kernel
            .store(k as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// The kernel decodes of `shape` run through: the chosen one where it has an instance
    /// (the one-pass and tensor-core kernels: head dim 64 or 128, at most 8 query heads per kv
    /// head).
    pub fn decode_kernel(&self, shape: &AttentionShape) -> DecodeKernel {
        let g = shape.num_heads / shape.kv_heads.max(1);
        let k = DecodeKernel::ALL[self
            .decode_kernel
            .load(std::sync::atomic::Ordering::Relaxed) as usize];
        let one_pass = matches!(shape.head_dim, 64 | 128)
            && (1..=crate::attention_plan::MAX_GROUP).contains(&g);
        if one_pass {
            k
        } else {
            DecodeKernel::ThreePhase
        }
    }

    /// An output tensor that the launching kernel writes completely (no memset).
    pub(super) fn output<S: Into<candle_core::Shape>>(
        &self,
        shape: S,
        dtype: DType,
    ) -> Result<Tensor> {
        // SAFETY: every caller launches, right after, a kernel on the same stream that writes
        // every element (each documents its coverage); nothing reads the tensor before.
        unsafe { Tensor::empty(shape, dtype, &self.device) }.map_err(candle("output tensor"))
    }

    /// The kernel instance `name` of module `m`, looked up in the driver on first use only.
    /// Instance names are unique across the modules (each carries its family's prefix).
    pub(super) fn func(
        &self,
        m: &Arc<super::super::cudarc::driver::CudaModule>,
        name: std::fmt::Arguments<'_>,
    ) -> Result<CudaFunction> {
        self.func_with(m, name, |_| Ok(()))
    }

    /// [`Self::func`], with `init` run once on the function when it is first looked up (an
    /// attribute a launch needs, such as its dynamic shared memory limit).
    pub(super) fn func_with(
        &self,
        m: &Arc<super::super::cudarc::driver::CudaModule>,
        name: std::fmt::Arguments<'_>,
        init: impl FnOnce(&CudaFunction) -> Result<()>,
    ) -> Result<CudaFunction> {
        let mut key = String::with_capacity(32);
        std::fmt::write(&mut key, name).expect("formatting a kernel name");
        let mut funcs = self.funcs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = funcs.get(&key) {
            return Ok(f.clone());
        }
        let f = m
            .load_function(&key)
            .map_err(driver("cuModuleGetFunction"))?;
        init(&f)?;
        funcs.insert(key, f.clone());
        Ok(f)
    }

    /// Uploads a step's plan (one host-to-device copy).
    pub fn upload(&self, plan: AttentionPlan, shape: &AttentionShape) -> Result<StepMeta> {
        let data = Tensor::from_slice(&plan.data, plan.data.len(), &self.device)
            .map_err(candle("upload step plan"))?;
        let base = ptr(&data, &self.stream)?;
        let ws = if plan.num_decodes > 0 && plan.decode_splits > 1 {
            let n =
                plan.num_decodes as usize * shape.num_heads as usize * plan.decode_splits as usize;
            let acc = Tensor::zeros(n * shape.head_dim as usize, DType::F32, &self.device)
                .map_err(candle("decode workspace"))?;
            let ml = Tensor::zeros(n * 2, DType::F32, &self.device)
                .map_err(candle("decode workspace"))?;
            Some((acc, ml))
        } else {
            None
        };
        Ok(StepMeta {
            plan,
            _data: data,
            base,
            ws,
        })
    }

    /// Adds the QKV bias (if any), rotates Q and K, writes K and V into their arena slots for
    /// `layer`; returns Q `(tokens, num_heads * head_dim)`. `qkv` is the fused projection
    /// `(tokens, (num_heads + 2 kv_heads) * head_dim)`; `cos`/`sin` are f32
    /// `(positions, head_dim / 2)`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv(
        &self,
        qkv: &Tensor,
        bias: Option<&Tensor>,
        cos: &Tensor,
        sin: &Tensor,
        meta: &StepMeta,
        arena: &Tensor,
        shape: &AttentionShape,
        layer: u32,
    ) -> Result<Tensor> {
        let s = shape;
        let tokens = meta.plan.tokens;
        let width = ((s.num_heads + 2 * s.kv_heads) * s.head_dim) as usize;
        if qkv.dims() != [tokens as usize, width] || arena.dtype() != qkv.dtype() {
            return Err(Error::Invalid(format!(
                "rope_kv: qkv {:?} {:?}, expected ({tokens}, {width}) {:?}",
                qkv.dims(),
                qkv.dtype(),
                arena.dtype()
            )));
        }
        // Every (token, query head) of q is written by one CTA.
        let q = self.output(
            (tokens as usize, (s.num_heads * s.head_dim) as usize),
            qkv.dtype(),
        )?;
        if tokens == 0 {
            return Ok(q);
        }
        let st = &self.stream;
        let a = RopeLaunch {
            qkv: ptr(qkv, st)?,
            bias: match bias {
                Some(b) => ptr(b, st)?,
                None => 0,
            },
            q: ptr(&q, st)?,
            kv: ptr(arena, st)?,
            cos: ptr(cos, st)?,
            sin: ptr(sin, st)?,
            positions: meta.at(meta.plan.positions),
            slots: meta.at(meta.plan.slots),
            tokens,
        };
        // SAFETY: the kernel reads qkv/bias/cos/sin/plan inside their tensors (shapes checked
        // above; positions < the tables' rows is checked by the model) and writes q and the
        // arena rows of this step's slots, which the engine reserved for these tokens.
        unsafe { self.launch_rope_kv(qkv.dtype(), &a, s, layer) }?;
        Ok(q)
    }

    /// Attention of every token of the step over its sequence's context at `layer`:
    /// `(tokens, num_heads * head_dim)`.
    pub fn attention(
        &self,
        q: &Tensor,
        arena: &Tensor,
        meta: &StepMeta,
        shape: &AttentionShape,
        layer: u32,
    ) -> Result<Tensor> {
        let s = shape;
        let p = &meta.plan;
        let name = suffix(q.dtype())?;
        if name == "f32" {
            return Err(Error::Invalid(
                "the attention kernels run in bf16 or f16".into(),
            ));
        }
        // Every token belongs to one span: a decode row (written by paged_decode, or by
        // decode_reduce when split) or a prefill chunk (written tile by tile).
        let out = self.output(q.dims(), q.dtype())?;
        let st = &self.stream;
        let (p_q, p_kv, p_out) = (ptr(q, st)?, ptr(arena, st)?, ptr(&out, st)?);
        let scale = s.scale_log2();
        let tables = meta.at(p.tables);
        if p.num_tiles > 0 {
            // The wide kernel's tiles for a step with a long chunk (AttentionPlan::new).
            let (kernel, smem) = if p.prefill_tile == PREFILL_WIDE_TILE {
                ("paged_prefill_wide", prefill_wide_shared_bytes(s.head_dim))
            } else {
                ("paged_prefill", 0)
            };
            let f = self.func_with(
                &self.attention,
                format_args!("{kernel}_{name}_d{}", s.head_dim),
                |f| {
                    if smem == 0 {
                        return Ok(());
                    }
                    f.set_attribute(
                        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .map_err(driver(
                        "raise the wide prefill kernel's shared memory limit",
                    ))
                },
            )?;
            let (tiles, seqs) = (meta.at(p.prefill_tiles), meta.at(p.prefill_seqs));
            let mut b = st.launch_builder(&f);
            b.arg(&p_q)
                .arg(&p_kv)
                .arg(&p_out)
                .arg(&tiles)
                .arg(&seqs)
                .arg(&tables)
                .arg(&s.num_heads)
                .arg(&s.kv_heads)
                .arg(&s.num_layers)
                .arg(&s.block_size)
                .arg(&layer)
                .arg(&scale)
                .arg(&s.window);
            let mut cfg = grid((p.num_tiles, s.num_heads, 1), PREFILL_THREADS);
            cfg.shared_mem_bytes = smem;
            // SAFETY: tiles, sequences and tables come from one AttentionPlan (validated on
            // the host); every key row read is in a block of the sequence's table, inside the
            // arena (the engine's block ids; the engine's arena has fewer than 2^32 rows, the
            // kernel's row index); rows written are the chunk's own.
            unsafe { b.launch(cfg) }.map_err(driver("launch paged_prefill"))?;
        }
        if p.num_decodes > 0 {
            let (ws_acc, ws_ml) = match &meta.ws {
                Some((a, m)) => (ptr(a, st)?, ptr(m, st)?),
                None => (0u64, 0u64),
            };
            let a = DecodeLaunch {
                q: p_q,
                kv: p_kv,
                out: p_out,
                ws_acc,
                ws_ml,
                seqs: meta.at(p.decode_seqs),
                tables,
                decodes: p.num_decodes,
                splits: p.decode_splits,
                part: p.decode_part,
            };
            // SAFETY: as for prefill; the workspace holds decodes × heads × splits entries.
            unsafe { self.launch_decode(q.dtype(), &a, s, layer) }?;
        }
        Ok(out)
    }

    /// `x += y` in place (rounded to the dtype; `y` may be absent), then returns
    /// `rmsnorm(x) * weight`. `x` must be a tensor the caller owns alone.
    pub fn add_rmsnorm(
        &self,
        x: &Tensor,
        y: Option<&Tensor>,
        weight: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        let (tokens, hidden) = x.dims2().map_err(candle("add_rmsnorm input"))?;
        if y.is_some_and(|y| y.dims() != x.dims()) || weight.dims() != [hidden] {
            return Err(Error::Invalid("add_rmsnorm: shapes disagree".into()));
        }
        // One CTA per row writes all of it.
        let out = self.output((tokens, hidden), x.dtype())?;
        if tokens == 0 {
            return Ok(out);
        }
        let st = &self.stream;
        let (p_x, p_w, p_out) = (ptr(x, st)?, ptr(weight, st)?, ptr(&out, st)?);
        let p_y = match y {
            Some(y) => ptr(y, st)?,
            None => 0u64,
        };
        // SAFETY: each CTA reads and writes one row of x, y, out (shapes checked).
        unsafe {
            self.launch_add_rmsnorm(
                x.dtype(),
                p_x,
                p_y,
                p_w,
                p_out,
                tokens as u32,
                hidden as u32,
                eps,
            )
        }?;
        Ok(out)
    }

    /// `x @ w^T` for `x` `(m, k)` with `m <= GEMV_MAX_ROWS` and `w` `(n, k)` (a Linear weight),
    /// `k` a multiple of 8: one warp per output column, reading `w` once at full bandwidth.
    pub fn gemv(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let (m, k) = x.dims2().map_err(candle("gemv input"))?;
        let (n, kw) = w.dims2().map_err(candle("gemv weight"))?;
        if m == 0 || m > GEMV_MAX_ROWS || k != kw || !k.is_multiple_of(8) || x.dtype() != w.dtype()
        {
            return Err(Error::Invalid(format!(
                "gemv: x {:?} and w {:?} (at most {GEMV_MAX_ROWS} rows, k a multiple of 8)",
                x.dims(),
                w.dims()
            )));
        }
        // Each column's warp writes its m outputs.
        let out = self.output((m, n), x.dtype())?;
        let st = &self.stream;
        let (p_x, p_w, p_y) = (ptr(x, st)?, ptr(w, st)?, ptr(&out, st)?);
        // SAFETY: warps read rows of w and x inside (n, k) and (m, k) and write y (m, n); all
        // three are contiguous tensors of those shapes (checked).
        unsafe {
            self.launch_gemv(
                x.dtype(),
                p_x,
                p_w,
                p_y,
                m as u32,
                n as u32,
                k as u32,
                GemvOut::Plain,
            )
        }?;
        Ok(out)
    }

    /// `silu(gate) * up` over the fused projection `(tokens, 2 * inter)`.
    pub fn silu_mul(&self, gate_up: &Tensor) -> Result<Tensor> {
        let (tokens, two_i) = gate_up.dims2().map_err(candle("silu_mul input"))?;
        let inter = two_i / 2;
        // The grid-stride loop covers every element.
        let out = self.output((tokens, inter), gate_up.dtype())?;
        if tokens == 0 {
            return Ok(out);
        }
        let st = &self.stream;
        let (p_in, p_out) = (ptr(gate_up, st)?, ptr(&out, st)?);
        // SAFETY: grid-stride over tokens × inter elements of both tensors (shapes checked).
        unsafe { self.launch_silu_mul(gate_up.dtype(), p_in, p_out, tokens as u32, inter as u32) }?;
        Ok(out)
    }

    /// One token id per row of `logits` `(rows, vocab)`: greedy where the temperature is 0,
    /// else a draw from softmax(logits / temperature) keyed by `(seed, counter)`.
    pub fn sample(&self, logits: &Tensor, rows: &[GpuSample]) -> Result<Vec<u32>> {
        let (n, vocab) = logits.dims2().map_err(candle("sample input"))?;
        if n != rows.len() {
            return Err(Error::Invalid(format!(
                "{n} logits rows for {} samples",
                rows.len()
            )));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let params = sample_params(rows);
        let params = Tensor::from_slice(&params, params.len(), &self.device)
            .map_err(candle("upload sampling params"))?;
        let ids = Tensor::zeros(n, DType::U32, &self.device).map_err(candle("sample ids"))?;
        let st = &self.stream;
        let (p_l, p_p, p_i) = (ptr(logits, st)?, ptr(&params, st)?, ptr(&ids, st)?);
        // SAFETY: one CTA per row reads that row and its params, writes one id.
        unsafe { self.launch_sample(logits.dtype(), p_l, p_p, p_i, n as u32, vocab as u32) }?;
        ids.to_vec1::<u32>().map_err(candle("read sampled ids"))
    }
}

/// The sampling kernel's parameters of `rows`: per row `[temperature bits, seed lo, seed hi,
/// counter]`.
pub fn sample_params(rows: &[GpuSample]) -> Vec<u32> {
    let mut params = Vec::with_capacity(4 * rows.len());
    for r in rows {
        params.extend_from_slice(&[
            r.temperature.max(0.0).to_bits(),
            r.seed as u32,
            (r.seed >> 32) as u32,
            r.counter,
        ]);
    }
    params
}

/// How to draw one row on the GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuSample {
    /// 0: greedy.
    pub temperature: f32,
    pub seed: u64,
    /// Distinguishes the draws of one request (its position).
    pub counter: u32,
}
