//! The Llama family (Llama 2/3, Mistral, Qwen2/2.5) on a CUDA GPU (feature `cuda`).
//!
//! Same model and same arena layout as [`super::PagedLlama`], arranged for the GPU: the
//! q/k/v projections are one fused matmul (and gate/up another), matmuls go through candle
//! (cuBLAS, tensor cores), and the rest runs in our NVRTC kernels
//! ([`superinfer_kernels::cuda::ModelKernels`]): bias + rotary + the K/V write into the
//! arena's slots in one kernel, paged attention (prefill chunks on tensor cores, decode split
//! over the context), residual add fused with the next RMSNorm, SiLU·up. A step uploads its
//! metadata once ([`AttentionPlan`]); per layer it launches 4 matmuls and 4–6 kernels.

mod settings;
mod switch;

use super::config::ModelConfig;
use super::kv_arena::{candle_err, KvArena};
use super::llama::SeqChunk;
use super::tiny::RandomLlama;
use crate::error::EngineError;
use candle_core::{DType, Device, Tensor};
use std::path::Path;
use std::sync::Mutex;
use superinfer_kernels::attention_plan::{AttentionPlan, AttentionShape, SeqSpan};
use superinfer_kernels::compile_cache::CompileCache;
use superinfer_kernels::cuda::{
    DecodeGraphs, DecodeSeq, Gpu, GpuSample, LayerWeights, LlamaDims, LlamaWeights, ModelKernels,
};

pub use superinfer_kernels::cuda::{DecodeOut, Overlap};

type R<T> = Result<T, EngineError>;

fn ce(what: &'static str) -> impl Fn(candle_core::Error) -> EngineError {
    move |e| candle_err(what, e)
}

fn ke(what: &'static str) -> impl Fn(superinfer_kernels::Error) -> EngineError {
    move |e| EngineError::Runner(format!("{what}: {e}"))
}

struct Layer {
    ln1: Tensor,
    /// `(q + 2 kv, hidden)`.
    qkv: Tensor,
    qkv_bias: Option<Tensor>,
    o: Tensor,
    ln2: Tensor,
    /// `(2 inter, hidden)`: gate rows, then up rows.
    gate_up: Tensor,
    down: Tensor,
}

/// The model's weights, rotary tables and kernels on one GPU.
pub struct GpuLlama {
    cfg: ModelConfig,
    dtype: DType,
    device: Device,
    gpu: Gpu,
    kernels: ModelKernels,
    shape_base: AttentionShape,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    cos: Tensor,
    sin: Tensor,
    /// Matmuls of at most this many rows use our GEMV kernel instead of cuBLAS (0: never).
    gemv_max_rows: usize,
    /// Row counts of the decode buckets (ascending; empty: decode steps run as any other).
    decode_buckets: Vec<u32>,
    /// Replay decode buckets from CUDA graphs (else launch the same kernels directly).
    decode_graphs: bool,
    /// The decode buckets' buffers and graphs, made at the first decode step.
    decoder: Mutex<Option<DecodeGraphs>>,
    /// Decode buckets split each sequence's keys into the step's split count (the first
    /// design) instead of the eager keys per split (benchmarks compare the two).
    decode_equal_splits: bool,
    /// One-row decode buckets through the GEMV kernel fuse each norm into the GEMV after it
    /// (`SUPERINFER_FUSED_NORM`; off by default: on the H200 the same bits, no faster).
    decode_fused_norm: bool,
    /// Decode buckets through the GEMV kernel compute silu_mul in the gate/up projection's
    /// epilogue (`SUPERINFER_FUSED_SILU`; off by default: on the H200 the same bits, no faster).
    decode_fused_silu: bool,
    /// How the kernels of decode buckets through the GEMV kernel overlap each other
    /// (programmatic dependent launch unless `SUPERINFER_PDL=0`).
    decode_overlap: Overlap,
}

/// Default of [`GpuLlama::set_decode_buckets`]: powers of two up to 128 rows.
pub const DEFAULT_DECODE_BUCKETS: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// Default of [`GpuLlama::set_gemv_max_rows`]: measured on the H200 (docs/BENCHMARKS.md).
pub const DEFAULT_GEMV_MAX_ROWS: usize = 2;

/// Where weights come from: a name and shape in, a tensor in the model's dtype out.
type Source<'a> = dyn FnMut(&str, &[usize]) -> R<Tensor> + 'a;

impl GpuLlama {
    /// Loads the weights of a Hugging Face directory onto `device` (a CUDA device).
    pub fn load(dir: &Path, cfg: &ModelConfig, dtype: DType, device: &Device) -> R<GpuLlama> {
        let w = super::weights::load(dir, dtype, device)?;
        let tie = cfg.tie_word_embeddings && !w.contains("lm_head.weight");
        let mut get = |name: &str, shape: &[usize]| -> R<Tensor> {
            let name = if tie && name == "lm_head.weight" {
                "model.embed_tokens.weight"
            } else {
                name
            };
            w.get(shape, name)
        };
        Self::build(cfg, dtype, device, &mut get)
    }

    /// A random-weight model of shape `spec` built directly in GPU memory (no files): the
    /// same uniform distributions as [`super::tiny::write_random_llama`], drawn by the GPU's
    /// generator seeded with `seed`. Its outputs are meaningless; it exists for benchmarks
    /// and load experiments at real sizes.
    pub fn random(
        spec: &RandomLlama,
        vocab: usize,
        dtype: DType,
        device: &Device,
        seed: u64,
    ) -> R<GpuLlama> {
        let cfg = spec.model_config(vocab)?;
        device
            .set_seed(seed)
            .map_err(ce("seeding the GPU generator"))?;
        let tensors = spec.uniform_tensors(vocab);
        let mut get = |name: &str, shape: &[usize]| -> R<Tensor> {
            let name = if cfg.tie_word_embeddings && name == "lm_head.weight" {
                "model.embed_tokens.weight"
            } else {
                name
            };
            let (_, s, centre, half) = tensors
                .iter()
                .find(|(n, ..)| n == name)
                .ok_or_else(|| EngineError::Config(format!("random model has no {name}")))?;
            if s.as_slice() != shape {
                return Err(EngineError::Config(format!(
                    "{name}: shape {s:?}, wanted {shape:?}"
                )));
            }
            let (lo, hi) = (f64::from(centre - half), f64::from(centre + half));
            let t = if half > &0.0 {
                Tensor::rand(lo as f32, hi as f32, shape, device)
            } else {
                Tensor::full(*centre, shape, device)
            };
            t.and_then(|t| t.to_dtype(dtype))
                .map_err(ce("random weights"))
        };
        Self::build(&cfg, dtype, device, &mut get)
    }

    fn build(cfg: &ModelConfig, dtype: DType, device: &Device, get: &mut Source<'_>) -> R<Self> {
        let Device::Cuda(cuda) = device else {
            return Err(EngineError::Config(
                "the GPU model needs a CUDA device".into(),
            ));
        };
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(EngineError::Config(format!(
                "the GPU model runs in bf16 or f16, not {dtype:?}"
            )));
        }
        if !matches!(cfg.hidden_act, candle_nn::Activation::Silu) {
            return Err(EngineError::Config(format!(
                "the GPU model supports the SiLU MLP only, not {:?}",
                cfg.hidden_act
            )));
        }
        let gpu = Gpu::from_candle(cuda);
        let cache = CompileCache::new(CompileCache::default_dir());
        let kernels = ModelKernels::load(&gpu, &cache).map_err(ke("loading the CUDA kernels"))?;
        let shape_base = AttentionShape {
            num_heads: cfg.num_heads as u32,
            kv_heads: cfg.num_kv_heads as u32,
            head_dim: cfg.head_dim as u32,
            num_layers: cfg.num_layers as u32,
            block_size: 16,
            window: cfg.sliding_window.map_or(0, |w| w as u32),
        };
        shape_base
            .validate()
            .map_err(|e| EngineError::Config(format!("this model on the GPU: {e}")))?;
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (q, kv) = (cfg.q_width(), cfg.kv_width());
        let cat = |parts: &[Tensor], what: &'static str| Tensor::cat(parts, 0).map_err(ce(what));
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let qkv = cat(
                &[
                    get(&format!("{a}.q_proj.weight"), &[q, h])?,
                    get(&format!("{a}.k_proj.weight"), &[kv, h])?,
                    get(&format!("{a}.v_proj.weight"), &[kv, h])?,
                ],
                "fusing q/k/v",
            )?;
            let qkv_bias = if cfg.qkv_bias {
                Some(cat(
                    &[
                        get(&format!("{a}.q_proj.bias"), &[q])?,
                        get(&format!("{a}.k_proj.bias"), &[kv])?,
                        get(&format!("{a}.v_proj.bias"), &[kv])?,
                    ],
                    "fusing q/k/v biases",
                )?)
            } else {
                None
            };
            let gate_up = cat(
                &[
                    get(&format!("{p}.mlp.gate_proj.weight"), &[i, h])?,
                    get(&format!("{p}.mlp.up_proj.weight"), &[i, h])?,
                ],
                "fusing gate/up",
            )?;
            layers.push(Layer {
                ln1: get(&format!("{p}.input_layernorm.weight"), &[h])?,
                qkv,
                qkv_bias,
                o: get(&format!("{a}.o_proj.weight"), &[h, q])?,
                ln2: get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_up,
                down: get(&format!("{p}.mlp.down_proj.weight"), &[h, i])?,
            });
        }
        let embed = get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
        let lm_head = get("lm_head.weight", &[cfg.vocab_size, h])?;
        let norm = get("model.norm.weight", &[h])?;
        let (cos, sin) = rotary_tables_f32(cfg, device)?;
        Ok(GpuLlama {
            cfg: cfg.clone(),
            dtype,
            device: device.clone(),
            gpu,
            kernels,
            shape_base,
            embed,
            layers,
            norm,
            lm_head,
            cos,
            sin,
            gemv_max_rows: DEFAULT_GEMV_MAX_ROWS,
            decode_buckets: DEFAULT_DECODE_BUCKETS.to_vec(),
            decode_graphs: true,
            decoder: Mutex::new(None),
            decode_equal_splits: false,
            decode_fused_norm: switch::switch_from_env("SUPERINFER_FUSED_NORM", false)?,
            decode_fused_silu: switch::switch_from_env("SUPERINFER_FUSED_SILU", false)?,
            decode_overlap: match switch::switch_from_env("SUPERINFER_PDL", true)? {
                true => Overlap::PDL,
                false => Overlap::default(),
            },
        })
    }

    /// Graphs captured so far (each bucket, split count and sampling mode once).
    pub fn decode_graph_captures(&self) -> u64 {
        let d = self.decoder.lock().unwrap_or_else(|p| p.into_inner());
        d.as_ref().map_or(0, |d| d.captures)
    }

    /// Runs a decode-only step through the decode buckets: the sampled ids when `draws` (one
    /// per chunk) is given, else the logits. `None`: the step is not one the buckets take
    /// (a prefill chunk, prompt rows, more rows than the largest bucket, buckets off); run
    /// it through [`GpuLlama::forward`].
    pub fn decode(
        &self,
        chunks: &[SeqChunk<'_>],
        kv: &KvArena,
        draws: Option<&[GpuSample]>,
    ) -> R<Option<DecodeOut>> {
        let shape = AttentionShape {
            block_size: kv.geometry().block_size,
            ..self.shape_base
        };
        let decodes = chunks
            .iter()
            .all(|c| c.end == c.pos + 1 && c.sample && !c.all_rows);
        if self.decode_buckets.is_empty()
            || chunks.is_empty()
            || !decodes
            || !self.kernels.decode_kernel(&shape).per_sequence_parts()
        {
            return Ok(None);
        }
        self.check(chunks, kv)?;
        let mut slot = self.decoder.lock().unwrap_or_else(|p| p.into_inner());
        if slot
            .as_ref()
            .is_none_or(|d| d.block_size() != shape.block_size)
        {
            // The old buffers go first, so the two sets are never in GPU memory together.
            *slot = None;
            *slot = Some(self.decode_graphs(shape)?);
        }
        let seqs: Vec<DecodeSeq<'_>> = chunks
            .iter()
            .map(|c| DecodeSeq {
                token: c.tokens[c.pos],
                pos: c.pos as u32,
                blocks: c.blocks,
            })
            .collect();
        let d = slot.as_mut().expect("made above");
        let out = d
            .run(&self.kernels, &seqs, kv.rows(), draws)
            .map_err(ke("decode step"))?;
        if let Some(e) = d.take_capture_error() {
            tracing::warn!(error = %e, "capturing a CUDA graph failed; decode steps run without graphs from now on");
        }
        Ok(out)
    }

    /// The decode buckets' buffers for arenas of `shape`'s block size.
    fn decode_graphs(&self, shape: AttentionShape) -> R<DecodeGraphs> {
        let c = &self.cfg;
        let weights = LlamaWeights {
            embed: self.embed.clone(),
            lm_head: self.lm_head.clone(),
            norm: self.norm.clone(),
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            layers: self
                .layers
                .iter()
                .map(|l| LayerWeights {
                    ln1: l.ln1.clone(),
                    qkv: l.qkv.clone(),
                    qkv_bias: l.qkv_bias.clone(),
                    o: l.o.clone(),
                    ln2: l.ln2.clone(),
                    gate_up: l.gate_up.clone(),
                    down: l.down.clone(),
                })
                .collect(),
        };
        let dims = LlamaDims {
            hidden: c.hidden_size,
            inter: c.intermediate_size,
            vocab: c.vocab_size,
            max_positions: c.max_position_embeddings,
            eps: c.rms_norm_eps as f32,
        };
        let mut d = DecodeGraphs::new(
            &self.kernels,
            weights,
            dims,
            shape,
            self.dtype,
            &self.decode_buckets,
            self.decode_graphs,
            self.gemv_max_rows,
        )
        .map_err(ke("decode buffers"))?;
        d.set_equal_splits(self.decode_equal_splits);
        d.set_fused_norm(self.decode_fused_norm);
        d.set_fused_silu(self.decode_fused_silu);
        d.set_overlap(self.decode_overlap);
        Ok(d)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn kernels(&self) -> &ModelKernels {
        &self.kernels
    }

    /// Bytes of all weights (for rooflines and memory sizing).
    pub fn weight_bytes(&self) -> u64 {
        let n = |t: &Tensor| t.elem_count() as u64;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                n(&l.ln1)
                    + n(&l.qkv)
                    + l.qkv_bias.as_ref().map_or(0, n)
                    + n(&l.o)
                    + n(&l.ln2)
                    + n(&l.gate_up)
                    + n(&l.down)
            })
            .sum();
        let tied = self.cfg.tie_word_embeddings;
        let head = if tied { 0 } else { n(&self.lm_head) };
        (layers + n(&self.embed) + head + n(&self.norm)) * self.dtype.size_in_bytes() as u64
    }

    /// Checks `chunks` against the model and `kv`: positions inside each sequence and the
    /// model's range, blocks inside the arena.
    fn check(&self, chunks: &[SeqChunk<'_>], kv: &KvArena) -> R<()> {
        let g = kv.geometry();
        if kv.dtype() != self.dtype || g.num_layers as usize != self.cfg.num_layers {
            return Err(EngineError::Runner(
                "the KV arena does not match the model".into(),
            ));
        }
        for (i, c) in chunks.iter().enumerate() {
            if c.pos >= c.end || c.end > c.tokens.len() {
                return Err(EngineError::Runner(format!(
                    "chunk {i}: positions {}..{} of a {}-token sequence",
                    c.pos,
                    c.end,
                    c.tokens.len()
                )));
            }
            if c.end > self.cfg.max_position_embeddings {
                return Err(EngineError::Runner(format!(
                    "chunk {i}: position {} is past max_position_embeddings {}",
                    c.end - 1,
                    self.cfg.max_position_embeddings
                )));
            }
            if let Some(b) = c.blocks.iter().find(|&&b| b >= kv.num_blocks()) {
                return Err(EngineError::Runner(format!(
                    "chunk {i}: block {b} is outside the arena of {} blocks",
                    kv.num_blocks()
                )));
            }
        }
        Ok(())
    }

    /// Runs one step over `chunks`, writing their K/V into `kv`; returns the logits
    /// `(sampling chunks, vocab)` in the model's dtype, one row per chunk with `sample`.
    pub fn forward(&self, chunks: &[SeqChunk<'_>], kv: &KvArena) -> R<Tensor> {
        let shape = AttentionShape {
            block_size: kv.geometry().block_size,
            ..self.shape_base
        };
        self.check(chunks, kv)?;
        let mut spans = Vec::with_capacity(chunks.len());
        let mut ids = Vec::new();
        let mut sample_rows = Vec::new();
        for c in chunks {
            spans.push(SeqSpan {
                q_offset: ids.len() as u32,
                pos: c.pos as u32,
                end: c.end as u32,
                blocks: c.blocks,
            });
            ids.extend_from_slice(&c.tokens[c.pos..c.end]);
            if c.sample {
                sample_rows.push((ids.len() - 1) as u32);
            }
        }
        let plan = AttentionPlan::new(&shape, &spans).map_err(ke("step plan"))?;
        let meta = self
            .kernels
            .upload(plan, &shape)
            .map_err(ke("step plan upload"))?;
        let dev = &self.device;
        let ids = Tensor::from_slice(&ids, ids.len(), dev).map_err(ce("token ids"))?;
        // Uploaded before the layers are enqueued: a copy from pageable memory may wait for
        // the stream.
        let rows =
            Tensor::from_slice(&sample_rows, sample_rows.len(), dev).map_err(ce("sample rows"))?;
        let x = self.embed.index_select(&ids, 0).map_err(ce("embedding"))?;
        let eps = self.cfg.rms_norm_eps as f32;
        let k = &self.kernels;
        let mut h = k
            .add_rmsnorm(&x, None, &self.layers[0].ln1, eps)
            .map_err(ke("attention norm"))?;
        // Small batches (decode) through our GEMV kernel: cuBLAS's GEMM tiles leave most SMs
        // idle at a handful of rows.
        let mm = |a: &Tensor, w: &Tensor, what: &'static str| -> R<Tensor> {
            let (rows, inner) = a.dims2().map_err(ce(what))?;
            if rows <= self.gemv_max_rows && inner % 8 == 0 {
                return k.gemv(a, w).map_err(ke(what));
            }
            a.matmul(&w.t().map_err(ce(what))?).map_err(ce(what))
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let qkv = mm(&h, &layer.qkv, "qkv projection")?;
            let q = k
                .rope_kv(
                    &qkv,
                    layer.qkv_bias.as_ref(),
                    &self.cos,
                    &self.sin,
                    &meta,
                    kv.rows(),
                    &shape,
                    l as u32,
                )
                .map_err(ke("rotary and KV write"))?;
            let attn = k
                .attention(&q, kv.rows(), &meta, &shape, l as u32)
                .map_err(ke("attention"))?;
            let o = mm(&attn, &layer.o, "o projection")?;
            let h2 = k
                .add_rmsnorm(&x, Some(&o), &layer.ln2, eps)
                .map_err(ke("mlp norm"))?;
            let gu = mm(&h2, &layer.gate_up, "gate/up projection")?;
            let act = k.silu_mul(&gu).map_err(ke("silu"))?;
            let down = mm(&act, &layer.down, "down projection")?;
            let next_norm = match self.layers.get(l + 1) {
                Some(n) => &n.ln1,
                None => &self.norm,
            };
            h = k
                .add_rmsnorm(&x, Some(&down), next_norm, eps)
                .map_err(ke("residual and norm"))?;
        }
        if sample_rows.is_empty() {
            return Tensor::zeros((0, self.cfg.vocab_size), self.dtype, dev)
                .map_err(ce("empty logits"));
        }
        let last = h.index_select(&rows, 0).map_err(ce("sample rows"))?;
        mm(&last, &self.lm_head, "lm head")
    }
}

/// f32 `cos`/`sin` tables `(max_position_embeddings, head_dim / 2)` for the rotary kernel.
fn rotary_tables_f32(cfg: &ModelConfig, dev: &Device) -> R<(Tensor, Tensor)> {
    let inv = cfg.inv_freq();
    let n = cfg.max_position_embeddings;
    let run = || -> candle_core::Result<(Tensor, Tensor)> {
        let inv = Tensor::new(inv.as_slice(), dev)?;
        let t = Tensor::arange(0, n as u32, dev)?
            .to_dtype(DType::F32)?
            .reshape((n, 1))?
            .matmul(&inv.reshape((1, inv.elem_count()))?)?;
        Ok((t.cos()?.contiguous()?, t.sin()?.contiguous()?))
    };
    run().map_err(ce("rotary tables"))
}
