//! Decode-only steps of a Llama-family model through fixed buffers, replayed from CUDA graphs
//! (issue 14 item 1).
//!
//! A step whose every sequence decodes one token runs in a bucket of rows (the smallest of the
//! configured sizes that holds it; rows past its sequences are padding that writes no KV and
//! reads no keys). Its metadata goes to fixed places ([`FixedDecodeLayout`]) and its
//! activations to buffers allocated once, so the whole step (embedding, per layer [norm, QKV,
//! rotary + KV write, attention, O, norm, gate/up, SiLU·up, down], final norm, LM head and,
//! when every row samples on the GPU, sampling) is the same launches with the same arguments
//! for every step of one bucket and split count: captured once into a graph, replayed with one
//! call. The first step of a key runs the launches directly, then captures them for the next.
//! With graphs off the same launches run directly every step (to compare the two).
//!
//! Safety rests on what [`DecodeGraphs::new`] and [`DecodeGraphs::run`] check: every weight's
//! shape and dtype, the arena's, and every block id of a step inside the arena.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use super::model::{
    sample_params, DecodeLaunch, GemvOut, GpuSample, ModelKernels, Overlap, RopeLaunch, StepGraph,
    GEMV_NORM_MAX_K,
};
use crate::attention_plan::{AttentionShape, FixedDecodeLayout, SeqSpan, MAX_FIXED_SPLITS};
use crate::error::{Error, Result};

/// The model's sizes the decode step needs.
#[derive(Clone, Copy, Debug)]
pub struct LlamaDims {
    pub hidden: usize,
    pub inter: usize,
    pub vocab: usize,
    pub max_positions: usize,
    pub eps: f32,
}

/// One layer's weights (candle tensors, shared, not copied).
pub struct LayerWeights {
    pub ln1: Tensor,
    /// `(q + 2 kv, hidden)`.
    pub qkv: Tensor,
    pub qkv_bias: Option<Tensor>,
    pub o: Tensor,
    pub ln2: Tensor,
    /// `(2 inter, hidden)`.
    pub gate_up: Tensor,
    pub down: Tensor,
}

/// The model's weights and rotary tables.
pub struct LlamaWeights {
    pub embed: Tensor,
    pub lm_head: Tensor,
    pub norm: Tensor,
    /// f32 `(max_positions, head_dim / 2)`.
    pub cos: Tensor,
    pub sin: Tensor,
    pub layers: Vec<LayerWeights>,
}

/// A decode step's sequence: its new token, its position, its blocks.
pub struct DecodeSeq<'a> {
    pub token: u32,
    pub pos: u32,
    /// HBM block ids covering positions `0..=pos`.
    pub blocks: &'a [u32],
}

/// What a decode step gives back.
pub enum DecodeOut {
    /// The sampled ids of the step's rows (every row sampled on the GPU).
    Ids(Vec<u32>),
    /// The logits `(rows, vocab)`: a view of the fixed buffer, valid until the next step.
    Logits(Tensor),
}

/// A graph's key: rows of its bucket, decode splits, whether it samples.
type Key = (u32, u32, bool);

struct LayerAddrs {
    ln1: u64,
    qkv: u64,
    qkv_bias: u64,
    o: u64,
    ln2: u64,
    gate_up: u64,
    down: u64,
}

/// Every address a step launches with (buffers kept alive by `tensors`, weights by `_w`).
struct Addrs {
    ids: u64,
    plan: u64,
    params: u64,
    sampled: u64,
    x: u64,
    /// The residual stream's second buffer (fused norms write the next residual here while
    /// the current one is still read).
    x2: u64,
    h: u64,
    qkv: u64,
    q: u64,
    attn: u64,
    o: u64,
    h2: u64,
    gu: u64,
    act: u64,
    down: u64,
    logits: u64,
    ws_acc: u64,
    ws_ml: u64,
    embed: u64,
    lm_head: u64,
    norm: u64,
    cos: u64,
    sin: u64,
    layers: Vec<LayerAddrs>,
}

/// Decode steps at fixed addresses and their graphs (one per bucket, split count and
/// sampling mode).
pub struct DecodeGraphs {
    dims: LlamaDims,
    shape: AttentionShape,
    dtype: DType,
    layout: FixedDecodeLayout,
    buckets: Vec<u32>,
    graphs_on: bool,
    /// Matmuls of at most this many rows through the GEMV kernel.
    gemv_max_rows: usize,
    _w: LlamaWeights,
    _tensors: Vec<Tensor>,
    logits: Tensor,
    a: Addrs,
    graphs: HashMap<Key, StepGraph>,
    /// The arena address the graphs captured (a new arena drops them).
    arena: u64,
    host: Vec<u32>,
    /// Graphs captured so far.
    pub captures: u64,
    /// Why a capture failed (graphs are then off for these buffers; the step that tried ran
    /// directly and stands), until [`DecodeGraphs::take_capture_error`] takes it.
    capture_error: Option<String>,
    /// Each sequence's keys in the graph's split count (the first design), instead of the
    /// eager plan's keys per split: kept to measure the two in one run (benches).
    equal_splits: bool,
    /// One-row GEMV steps fuse their norms (`set_fused_norm`).
    fused_norm: bool,
    /// GEMV steps fuse silu_mul into the gate/up projection (`set_fused_silu`).
    fused_silu: bool,
    /// How the step's kernels overlap each other (`set_overlap`).
    overlap: Overlap,
}

fn invalid(what: String) -> Error {
    Error::Invalid(what)
}

fn expect(t: &Tensor, dims: &[usize], dtype: DType, what: &str) -> Result<()> {
    if t.dims() != dims || t.dtype() != dtype || !t.is_contiguous() {
        return Err(invalid(format!(
            "{what}: {:?} {:?}, expected contiguous {dims:?} {dtype:?}",
            t.dims(),
            t.dtype()
        )));
    }
    Ok(())
}

impl DecodeGraphs {
    /// Buffers for `buckets` (row counts, ascending) of the model `w` of sizes `dims`
    /// (whose attention `shape` gives heads, head dim, layers and the arenas' block size) in
    /// `dtype`. Checks every weight's shape.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        k: &ModelKernels,
        w: LlamaWeights,
        dims: LlamaDims,
        shape: AttentionShape,
        dtype: DType,
        buckets: &[u32],
        graphs_on: bool,
        gemv_max_rows: usize,
    ) -> Result<DecodeGraphs> {
        let ascending =
            buckets.first().is_some_and(|&b| b > 0) && buckets.windows(2).all(|w| w[0] < w[1]);
        if !ascending {
            return Err(invalid(format!(
                "decode buckets {buckets:?}: row counts above 0, ascending"
            )));
        }
        let rows = buckets[buckets.len() - 1];
        shape.validate()?;
        let d = dims;
        let s = &shape;
        let hd = s.head_dim as usize;
        let (qw, kvw) = (s.num_heads as usize * hd, s.kv_heads as usize * hd);
        if !k.decode_kernel(s).per_sequence_parts()
            || !d.hidden.is_multiple_of(8)
            || !d.inter.is_multiple_of(8)
            || w.layers.len() != s.num_layers as usize
            || !matches!(dtype, DType::BF16 | DType::F16)
        {
            return Err(invalid(format!(
                "decode graphs need a decode kernel with per-sequence parts (one-pass or tensor-core), bf16/f16, hidden and intermediate sizes that are multiples of 8 and one weight set per layer (head dim {}, {} layers for {})",
                s.head_dim,
                w.layers.len(),
                s.num_layers
            )));
        }
        expect(&w.embed, &[d.vocab, d.hidden], dtype, "embedding")?;
        expect(&w.lm_head, &[d.vocab, d.hidden], dtype, "lm head")?;
        expect(&w.norm, &[d.hidden], dtype, "final norm")?;
        expect(&w.cos, &[d.max_positions, hd / 2], DType::F32, "rotary cos")?;
        expect(&w.sin, &[d.max_positions, hd / 2], DType::F32, "rotary sin")?;
        for (i, l) in w.layers.iter().enumerate() {
            let at = |n: &str| format!("layer {i} {n}");
            expect(&l.ln1, &[d.hidden], dtype, &at("ln1"))?;
            expect(&l.qkv, &[qw + 2 * kvw, d.hidden], dtype, &at("qkv"))?;
            if let Some(b) = &l.qkv_bias {
                expect(b, &[qw + 2 * kvw], dtype, &at("qkv bias"))?;
            }
            expect(&l.o, &[d.hidden, qw], dtype, &at("o"))?;
            expect(&l.ln2, &[d.hidden], dtype, &at("ln2"))?;
            expect(&l.gate_up, &[2 * d.inter, d.hidden], dtype, &at("gate/up"))?;
            expect(&l.down, &[d.hidden, d.inter], dtype, &at("down"))?;
        }
        let per_row = d.max_positions.div_ceil(s.block_size as usize) as u32;
        let layout = FixedDecodeLayout {
            rows,
            table_entries: rows * per_row,
        };
        let r = rows as usize;
        let ws = r * s.num_heads as usize * MAX_FIXED_SPLITS as usize;
        let dev: Device = w.embed.device().clone();
        let mut tensors = Vec::new();
        let mut alloc = |n: usize, dt: DType| -> Result<u64> {
            let t = Tensor::zeros(n, dt, &dev).map_err(|e| Error::Cuda {
                op: "decode buffers",
                detail: e.to_string(),
            })?;
            let a = k.address(&t)?;
            tensors.push(t);
            Ok(a)
        };
        let (h, i) = (d.hidden, d.inter);
        let mut a = Addrs {
            ids: alloc(r, DType::U32)?,
            plan: alloc(layout.len(), DType::U32)?,
            params: alloc(4 * r, DType::U32)?,
            sampled: alloc(r, DType::U32)?,
            x: alloc(r * h, dtype)?,
            x2: alloc(h, dtype)?,
            h: alloc(r * h, dtype)?,
            qkv: alloc(r * (qw + 2 * kvw), dtype)?,
            q: alloc(r * qw, dtype)?,
            attn: alloc(r * qw, dtype)?,
            o: alloc(r * h, dtype)?,
            h2: alloc(r * h, dtype)?,
            gu: alloc(r * 2 * i, dtype)?,
            act: alloc(r * i, dtype)?,
            down: alloc(r * h, dtype)?,
            ws_acc: alloc(ws * hd, DType::F32)?,
            ws_ml: alloc(ws * 2, DType::F32)?,
            logits: 0,
            embed: k.address(&w.embed)?,
            lm_head: k.address(&w.lm_head)?,
            norm: k.address(&w.norm)?,
            cos: k.address(&w.cos)?,
            sin: k.address(&w.sin)?,
            layers: Vec::with_capacity(w.layers.len()),
        };
        // Kept as a tensor too: a step without GPU sampling hands out a view of it.
        a.logits = alloc(r * d.vocab, dtype)?;
        let logits = tensors[tensors.len() - 1]
            .reshape((r, d.vocab))
            .map_err(|e| Error::Cuda {
                op: "decode buffers",
                detail: e.to_string(),
            })?;
        for l in &w.layers {
            a.layers.push(LayerAddrs {
                ln1: k.address(&l.ln1)?,
                qkv: k.address(&l.qkv)?,
                qkv_bias: l.qkv_bias.as_ref().map_or(Ok(0), |b| k.address(b))?,
                o: k.address(&l.o)?,
                ln2: k.address(&l.ln2)?,
                gate_up: k.address(&l.gate_up)?,
                down: k.address(&l.down)?,
            });
        }
        Ok(DecodeGraphs {
            dims,
            shape,
            dtype,
            layout,
            buckets: buckets.to_vec(),
            graphs_on,
            gemv_max_rows,
            _w: w,
            _tensors: tensors,
            logits,
            a,
            graphs: HashMap::new(),
            arena: 0,
            host: Vec::new(),
            captures: 0,
            capture_error: None,
            equal_splits: false,
            fused_norm: false,
            fused_silu: false,
            overlap: Overlap::default(),
        })
    }

    /// Why capturing a graph failed, once (decode steps go on without graphs after it).
    pub fn take_capture_error(&mut self) -> Option<String> {
        self.capture_error.take()
    }

    /// Splits every sequence's keys into the graph's split count (the first design; the
    /// kernels take a row's keys per split of 0 so) instead of the eager plan's keys per
    /// split: for benchmarks that compare the two.
    pub fn set_equal_splits(&mut self, on: bool) {
        self.equal_splits = on;
    }

    /// One-row steps through the GEMV kernel fuse each `add_rmsnorm` after the first into the
    /// GEMV that consumes it (gemv.cu's `gemv_norm`: the same bits, two kernels a layer fewer).
    /// Captured graphs are dropped.
    pub fn set_fused_norm(&mut self, on: bool) {
        self.fused_norm = on;
        self.graphs.clear();
    }

    /// Steps through the GEMV kernel compute the gate/up projection's `silu_mul` in its
    /// epilogue (gemv.cu's `gemv_silu`: the same bits, one kernel a layer fewer). Captured
    /// graphs are dropped.
    pub fn set_fused_silu(&mut self, on: bool) {
        self.fused_silu = on;
        self.graphs.clear();
    }

    /// Launches each kernel of the steps whose matmuls go through the GEMV kernel with
    /// programmatic dependent launch (and the GEMV weight prefetch `o` names) so that it
    /// overlaps the tail of the kernel before it: the same bits, in order (steps through
    /// cuBLAS launch as before). Captured graphs are dropped.
    pub fn set_overlap(&mut self, o: Overlap) {
        self.overlap = o;
        self.graphs.clear();
    }

    /// Tokens per block of the arenas these buffers are laid out for.
    pub fn block_size(&self) -> u32 {
        self.shape.block_size
    }

    /// Runs the decode step of `seqs` (one row each, in order) writing their K/V into `arena`
    /// (the block-first arena `(rows, kv_heads × head_dim)` of the shape's layers and block
    /// size); `draws` (one per sequence) samples on the GPU. `Ok(None)`: the step has more rows
    /// than the largest bucket; run it another way.
    pub fn run(
        &mut self,
        k: &ModelKernels,
        seqs: &[DecodeSeq<'_>],
        arena: &Tensor,
        draws: Option<&[GpuSample]>,
    ) -> Result<Option<DecodeOut>> {
        let n = seqs.len() as u32;
        if n == 0 {
            return Err(invalid("a decode step of no rows".into()));
        }
        let Some(&bucket) = self.buckets.iter().find(|&&b| b >= n) else {
            return Ok(None);
        };
        let s = self.shape;
        let kvw = (s.kv_heads * s.head_dim) as usize;
        let per_block = 2 * s.num_layers as usize * s.block_size as usize;
        let (rows, width) = arena.dims2().map_err(|e| invalid(format!("arena: {e}")))?;
        if width != kvw || arena.dtype() != self.dtype || !arena.is_contiguous() {
            return Err(invalid(format!(
                "arena {:?} {:?} for KV rows of {kvw} {:?}",
                arena.dims(),
                arena.dtype(),
                self.dtype
            )));
        }
        let blocks = rows / per_block;
        if draws.is_some_and(|d| d.len() != seqs.len()) {
            return Err(invalid("one GPU draw per decode row".into()));
        }
        let mut spans = Vec::with_capacity(seqs.len());
        let mut ids = Vec::with_capacity(bucket as usize);
        for (i, q) in seqs.iter().enumerate() {
            if q.pos as usize >= self.dims.max_positions || q.token as usize >= self.dims.vocab {
                return Err(invalid(format!(
                    "row {i}: token {} at position {} (vocabulary {}, {} positions)",
                    q.token, q.pos, self.dims.vocab, self.dims.max_positions
                )));
            }
            if let Some(b) = q.blocks.iter().find(|&&b| b as usize >= blocks) {
                return Err(invalid(format!(
                    "row {i}: block {b} is outside the arena of {blocks} blocks"
                )));
            }
            spans.push(SeqSpan {
                q_offset: i as u32,
                pos: q.pos,
                end: q.pos + 1,
                blocks: q.blocks,
            });
            ids.push(q.token);
        }
        ids.resize(bucket as usize, 0);
        // The tables fit: every row's position is below max_positions (checked above), and
        // the layout holds that many positions' blocks for every row.
        let mut host = std::mem::take(&mut self.host);
        let splits = self.layout.write(&s, bucket, &spans, &mut host)?;
        if self.equal_splits {
            for i in 0..n as usize {
                host[self.layout.seqs() + 4 * i + 3] = 0;
            }
        }
        // SAFETY: each buffer holds what is copied (plan: layout.len() u32s >= host.len(),
        // checked by the layout; ids: max_rows; params: 4 max_rows), and the copies are ordered
        // on the compute stream after the previous step's kernels that read them.
        unsafe {
            k.upload_u32(self.a.plan, &host)?;
            k.upload_u32(self.a.ids, &ids)?;
        }
        self.host = host;
        if let Some(d) = draws {
            let mut params = sample_params(d);
            params.resize(4 * bucket as usize, 0);
            // SAFETY: as above.
            unsafe { k.upload_u32(self.a.params, &params) }?;
        }
        let at = k.address(arena)?;
        if at != self.arena {
            self.graphs.clear();
            self.arena = at;
        }
        let key = (bucket, splits, draws.is_some());
        match self.graphs.get(&key) {
            Some(g) if self.graphs_on => g.launch()?,
            _ => {
                self.launch(k, key)?;
                if self.graphs_on {
                    // The step already ran; a capture that fails turns graphs off here
                    // instead of failing it.
                    match k.capture(|| self.launch(k, key)) {
                        Ok(g) => {
                            self.graphs.insert(key, g);
                            self.captures += 1;
                        }
                        Err(e) => {
                            self.graphs_on = false;
                            self.graphs.clear();
                            self.capture_error = Some(e.to_string());
                        }
                    }
                }
            }
        }
        if draws.is_some() {
            // SAFETY: the sampled buffer holds max_rows >= n u32s.
            let ids = unsafe { k.read_u32(self.a.sampled, n as usize) }?;
            return Ok(Some(DecodeOut::Ids(ids)));
        }
        let logits = self
            .logits
            .narrow(0, 0, n as usize)
            .map_err(|e| Error::Cuda {
                op: "decode logits",
                detail: e.to_string(),
            })?;
        Ok(Some(DecodeOut::Logits(logits)))
    }

    /// Launches the step of `key` over the fixed buffers (directly, or into a capture).
    fn launch(&self, k: &ModelKernels, key: Key) -> Result<()> {
        let (rows, splits, sample) = key;
        let (b, dt, d, s) = (&self.a, self.dtype, &self.dims, &self.shape);
        let (h, i, v) = (d.hidden as u32, d.inter as u32, d.vocab as u32);
        let qw = s.num_heads * s.head_dim;
        let kvw = s.kv_heads * s.head_dim;
        let gemv = rows as usize <= self.gemv_max_rows;
        // PDL only where every kernel is ours: cuBLAS's kernels neither wait nor trigger, and
        // steps with them measured no faster with it.
        let _overlap = k.overlap_scope(if gemv {
            self.overlap
        } else {
            Overlap::default()
        });
        // `y = x @ w^T` (n columns), or with `SiluMul` the gate/up projection's activation (n =
        // inter columns, w (2n, kk)).
        let mm = |x: u64, w: u64, y: u64, n: u32, kk: u32, out: GemvOut| -> Result<()> {
            // SAFETY: x holds rows × kk, w n × kk (2n × kk with SiluMul) and y rows × n elements
            // (buffers sized for the largest bucket, weights checked in `new`).
            unsafe {
                if gemv {
                    k.launch_gemv(dt, x, w, y, rows, n, kk, out)
                } else {
                    debug_assert_eq!(out, GemvOut::Plain, "silu_mul is fused only into GEMVs");
                    k.launch_gemm(dt, x, w, y, rows, n, kk)
                }
            }
        };
        let l = &self.layout;
        let plan = |off: usize| b.plan + off as u64 * 4;
        // SAFETY (every launch below): the buffers hold the largest bucket's rows; the plan was
        // written for `rows` rows with every block inside the arena (checked in `run`; padding
        // rows write no KV and read no keys).
        unsafe {
            k.launch_embed(dt, b.embed, b.ids, b.x, rows, h)?;
            k.launch_add_rmsnorm(dt, b.x, 0, b.layers[0].ln1, b.h, rows, h, d.eps)?;
        }
        let fuse = self.fused_norm && gemv && rows == 1 && h <= GEMV_NORM_MAX_K;
        let fuse_silu = self.fused_silu && gemv;
        // The residual stream's current buffer (fused norms alternate between two).
        let mut res = b.x;
        // `add_rmsnorm(res += y)` with weight `g` (into `normed` unless fused), then
        // `out = normed @ w^T` (n columns; with `SiluMul`, the activation of n = inter columns).
        let mut norm_mm = |y: u64, g: u64, normed: u64, w: u64, out: u64, n: u32, e: GemvOut| {
            if fuse {
                let next = if res == b.x { b.x2 } else { b.x };
                // SAFETY: one row of `h` elements in res, y, next and g; w (n, h) ((2n, h) with
                // SiluMul), out n.
                unsafe { k.launch_gemv_norm(dt, res, y, g, w, out, next, n, h, d.eps, e) }?;
                res = next;
                Ok(())
            } else {
                // SAFETY: as above.
                unsafe { k.launch_add_rmsnorm(dt, b.x, y, g, normed, rows, h, d.eps) }?;
                mm(normed, w, out, n, h, e)
            }
        };
        use GemvOut::{Plain, SiluMul};
        mm(b.h, b.layers[0].qkv, b.qkv, qw + 2 * kvw, h, Plain)?;
        for (li, la) in b.layers.iter().enumerate() {
            let rope = RopeLaunch {
                qkv: b.qkv,
                bias: la.qkv_bias,
                q: b.q,
                kv: self.arena,
                cos: b.cos,
                sin: b.sin,
                positions: plan(l.positions()),
                slots: plan(l.slots()),
                tokens: rows,
            };
            let attn = DecodeLaunch {
                q: b.q,
                kv: self.arena,
                out: b.attn,
                ws_acc: b.ws_acc,
                ws_ml: b.ws_ml,
                seqs: plan(l.seqs()),
                tables: plan(l.tables()),
                decodes: rows,
                splits,
                // Each row's keys per split from the plan (the eager plan's for the step).
                part: 0,
            };
            // SAFETY: as above.
            unsafe {
                k.launch_rope_kv(dt, &rope, s, li as u32)?;
                k.launch_decode(dt, &attn, s, li as u32)?;
            }
            mm(b.attn, la.o, b.o, h, qw, Plain)?;
            if fuse_silu {
                norm_mm(b.o, la.ln2, b.h2, la.gate_up, b.act, i, SiluMul)?;
            } else {
                norm_mm(b.o, la.ln2, b.h2, la.gate_up, b.gu, 2 * i, Plain)?;
                // SAFETY: as above.
                unsafe { k.launch_silu_mul(dt, b.gu, b.act, rows, i) }?;
            }
            mm(b.act, la.down, b.down, h, i, Plain)?;
            // The next layer's norm and QKV projection, or the final norm and the LM head.
            match b.layers.get(li + 1) {
                Some(n) => norm_mm(b.down, n.ln1, b.h, n.qkv, b.qkv, qw + 2 * kvw, Plain)?,
                None => norm_mm(b.down, b.norm, b.h, b.lm_head, b.logits, v, Plain)?,
            }
        }
        if sample {
            // SAFETY: logits rows × vocab, params 4 rows, sampled rows (padding rows greedy).
            unsafe { k.launch_sample(dt, b.logits, b.params, b.sampled, rows, v) }?;
        }
        Ok(())
    }
}
