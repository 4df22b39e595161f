//! The Llama-family transformer (Llama 2/3, Mistral, Qwen2/2.5) over a paged KV cache, written
//! against candle's [`Device`] so the CPU and CUDA runners share it.
//!
//! One [`PagedLlama::forward`] runs a whole step: every sequence's chunk (a prefill chunk of any
//! length from any position, or one decode token) goes through the dense layers as one flat
//! batch of tokens; each layer writes the new K/V into the sequences' slots of the
//! [`KvArena`] (through their block tables) and then attends over their whole context read
//! back from the arena. Decode tokens attend as one padded batch; prefill chunks one by one
//! (causal mask from their start position). Logits come out only for the sequences that
//! sample, from their last token.

use super::config::ModelConfig;
use super::cpu_attention::{self, DecodeSeq, Heads};
use super::kv_arena::{candle_err, KvArena};
use super::weights::Weights;
use crate::error::EngineError;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, Linear, RmsNorm};
use std::path::Path;

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    /// The sequence so far; the step runs `tokens[pos..end]`.
    pub tokens: &'a [u32],
    pub pos: usize,
    pub end: usize,
    /// HBM block ids covering positions `0..end`, in order.
    pub blocks: &'a [u32],
    /// Return logits for the last token of the chunk.
    pub sample: bool,
    /// Return logits for every token of the chunk (prompt log-probabilities), in order; the
    /// last of them is the sampling row when `sample` is set.
    pub all_rows: bool,
}

struct Layer {
    ln1: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// The model's weights and rotary tables on one device.
pub struct PagedLlama {
    cfg: ModelConfig,
    dtype: DType,
    device: Device,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    /// Decode through the device-generic path even on the CPU (tests of that path).
    generic_decode: bool,
}

type R<T> = Result<T, EngineError>;

fn ce(what: &'static str) -> impl Fn(candle_core::Error) -> EngineError {
    move |e| candle_err(what, e)
}

fn linear(w: &Weights, name: &str, out: usize, inp: usize, bias: bool) -> R<Linear> {
    let weight = w.get(&[out, inp], &format!("{name}.weight"))?;
    let bias = if bias {
        Some(w.get(&[out], &format!("{name}.bias"))?)
    } else {
        None
    };
    Ok(Linear::new(weight, bias))
}

fn rms(w: &Weights, name: &str, size: usize, eps: f64) -> R<RmsNorm> {
    Ok(RmsNorm::new(
        w.get(&[size], &format!("{name}.weight"))?,
        eps,
    ))
}

impl PagedLlama {
    /// Loads the weights of `dir` (described by `cfg`) in `dtype` onto `device`.
    pub fn load(dir: &Path, cfg: &ModelConfig, dtype: DType, device: &Device) -> R<PagedLlama> {
        let w = super::weights::load(dir, dtype, device)?;
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let embed_w = w.get(&[cfg.vocab_size, h], "model.embed_tokens.weight")?;
        let lm_head = if cfg.tie_word_embeddings && !w.contains("lm_head.weight") {
            Linear::new(embed_w.clone(), None)
        } else {
            linear(&w, "lm_head", cfg.vocab_size, h, false)?
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("model.layers.{l}");
            let (q, kv, i) = (cfg.q_width(), cfg.kv_width(), cfg.intermediate_size);
            let b = cfg.qkv_bias;
            layers.push(Layer {
                ln1: rms(&w, &format!("{p}.input_layernorm"), h, eps)?,
                q: linear(&w, &format!("{p}.self_attn.q_proj"), q, h, b)?,
                k: linear(&w, &format!("{p}.self_attn.k_proj"), kv, h, b)?,
                v: linear(&w, &format!("{p}.self_attn.v_proj"), kv, h, b)?,
                o: linear(&w, &format!("{p}.self_attn.o_proj"), h, q, false)?,
                ln2: rms(&w, &format!("{p}.post_attention_layernorm"), h, eps)?,
                gate: linear(&w, &format!("{p}.mlp.gate_proj"), i, h, false)?,
                up: linear(&w, &format!("{p}.mlp.up_proj"), i, h, false)?,
                down: linear(&w, &format!("{p}.mlp.down_proj"), h, i, false)?,
            });
        }
        let norm = rms(&w, "model.norm", h, eps)?;
        let (cos, sin) = rotary_tables(cfg, dtype, device)?;
        Ok(PagedLlama {
            cfg: cfg.clone(),
            dtype,
            device: device.clone(),
            embed: Embedding::new(embed_w, h),
            layers,
            norm,
            lm_head,
            cos,
            sin,
            generic_decode: false,
        })
    }

    /// Decode attention through the device-generic candle path (the one the CUDA device
    /// uses) even on the CPU, where reading the arena in place is the default.
    pub fn set_generic_decode(&mut self, on: bool) {
        self.generic_decode = on;
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

    /// Runs one step over `chunks`, writing their K/V into `kv`; returns f32 logits
    /// `(rows, vocab)`, in chunk order: every token's row for a chunk with `all_rows`, else
    /// one row (its last token's) for a chunk with `sample`.
    pub fn forward(&self, chunks: &[SeqChunk<'_>], kv: &KvArena) -> R<Tensor> {
        let plan = StepPlan::new(chunks, kv, &self.cfg)?;
        let dev = &self.device;
        let ids = Tensor::from_slice(&plan.ids, plan.ids.len(), dev).map_err(ce("token ids"))?;
        let pos = Tensor::from_slice(&plan.positions, plan.positions.len(), dev)
            .map_err(ce("positions"))?;
        let cos = self.cos.index_select(&pos, 0).map_err(ce("rope"))?;
        let sin = self.sin.index_select(&pos, 0).map_err(ce("rope"))?;
        let mut x = self.embed.forward(&ids).map_err(ce("embedding"))?;
        for (l, layer) in self.layers.iter().enumerate() {
            x = self.layer(layer, l, &x, (&cos, &sin), &plan, kv)?;
        }
        if plan.sample_rows.is_empty() {
            return Tensor::zeros((0, self.cfg.vocab_size), DType::F32, dev)
                .map_err(ce("empty logits"));
        }
        let rows = Tensor::from_slice(&plan.sample_rows, plan.sample_rows.len(), dev)
            .map_err(ce("sample rows"))?;
        let last = x.index_select(&rows, 0).map_err(ce("sample rows"))?;
        let h = self.norm.forward(&last).map_err(ce("final norm"))?;
        self.lm_head
            .forward(&h)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(ce("lm head"))
    }

    fn layer(
        &self,
        layer: &Layer,
        l: usize,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        plan: &StepPlan,
        kv: &KvArena,
    ) -> R<Tensor> {
        let c = &self.cfg;
        let t = plan.ids.len();
        let h = layer.ln1.forward(x).map_err(ce("attention norm"))?;
        let rot = |y: Tensor, heads: usize| -> candle_core::Result<Tensor> {
            let y = y.reshape((1, t, heads, c.head_dim))?;
            candle_nn::rotary_emb::rope_thd(&y, rope.0, rope.1)?.reshape((t, heads * c.head_dim))
        };
        let q = layer.q.forward(&h).and_then(|q| rot(q, c.num_heads));
        let q = q.map_err(ce("q projection"))?;
        let k = layer.k.forward(&h).and_then(|k| rot(k, c.num_kv_heads));
        let k = k.map_err(ce("k projection"))?;
        let v = layer.v.forward(&h).map_err(ce("v projection"))?;
        // New K/V into their slots first: the attention below reads them back with the context.
        for (which, src) in [(0, &k), (1, &v)] {
            let idx = plan.write_index(kv, l, which, c.kv_width(), &self.device)?;
            let src = src.contiguous().map_err(ce("kv write"))?;
            kv.rows()
                .scatter_set(&idx, &src, 0)
                .map_err(ce("kv write"))?;
        }
        let attn = self.attention(&q, l, plan, kv)?;
        let x =
            (x + layer.o.forward(&attn).map_err(ce("o projection"))?).map_err(ce("residual"))?;
        let h = layer.ln2.forward(&x).map_err(ce("mlp norm"))?;
        let gate = layer
            .gate
            .forward(&h)
            .and_then(|g| c.hidden_act.forward(&g))
            .map_err(ce("mlp gate"))?;
        let up = layer.up.forward(&h).map_err(ce("mlp up"))?;
        let mlp = (gate * up)
            .and_then(|m| layer.down.forward(&m))
            .map_err(ce("mlp down"))?;
        (x + mlp).map_err(ce("residual"))
    }

    /// Attention of every query row over its sequence's context; rows in flat order.
    fn attention(&self, q: &Tensor, l: usize, plan: &StepPlan, kv: &KvArena) -> R<Tensor> {
        let mut pieces = Vec::new();
        if !plan.decodes.is_empty() {
            pieces.push(self.decode_attention(q, l, plan, kv)?);
        }
        for &ci in &plan.prefills {
            pieces.push(self.prefill_attention(q, l, &plan.seqs[ci], kv)?);
        }
        let out = Tensor::cat(&pieces, 0).map_err(ce("attention output"))?;
        match &plan.unpermute {
            None => Ok(out),
            Some(inv) => {
                let inv = Tensor::from_slice(inv, inv.len(), &self.device).map_err(ce("order"))?;
                out.index_select(&inv, 0).map_err(ce("attention order"))
            }
        }
    }

    fn gather(&self, kv: &KvArena, rows: &[u32]) -> R<Tensor> {
        let idx = Tensor::from_slice(rows, rows.len(), &self.device).map_err(ce("kv rows"))?;
        kv.rows()
            .index_select(&idx, 0)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(ce("kv gather"))
    }

    fn scale(&self) -> f64 {
        1.0 / (self.cfg.head_dim as f64).sqrt()
    }

    /// One prefill chunk: queries `pos..end` over keys `0..end`, causal.
    fn prefill_attention(&self, q: &Tensor, l: usize, s: &SeqPlan, kv: &KvArena) -> R<Tensor> {
        let c = &self.cfg;
        let (n, e, d) = (s.end - s.pos, s.end, c.head_dim);
        let (kvh, g) = (c.num_kv_heads, c.num_heads / c.num_kv_heads);
        let k = self.gather(kv, &s.context_rows(kv, l, 0))?;
        let v = self.gather(kv, &s.context_rows(kv, l, 1))?;
        let mask = causal_mask(s.pos, n, e, c.sliding_window);
        let mask = Tensor::from_vec(mask, (n, e), &self.device).map_err(ce("mask"))?;
        let run = || -> candle_core::Result<Tensor> {
            let q = q
                .narrow(0, s.offset, n)?
                .to_dtype(DType::F32)?
                .reshape((n, kvh, g, d))?
                .permute((1, 2, 0, 3))?
                .reshape((kvh, g * n, d))?;
            let k = k.reshape((e, kvh, d))?.transpose(0, 1)?.contiguous()?;
            let v = v.reshape((e, kvh, d))?.transpose(0, 1)?.contiguous()?;
            let att = (q.matmul(&k.t()?)? * self.scale())?
                .reshape((kvh, g, n, e))?
                .broadcast_add(&mask)?;
            let att = candle_nn::ops::softmax_last_dim(&att)?.reshape((kvh, g * n, e))?;
            att.matmul(&v)?
                .reshape((kvh, g, n, d))?
                .permute((2, 0, 1, 3))?
                .reshape((n, kvh * g * d))?
                .to_dtype(self.dtype)
        };
        run().map_err(ce("prefill attention"))
    }

    /// On the CPU in f32: every decode token reads its context in place from the arena
    /// ([`cpu_attention`]); `None` elsewhere.
    fn decode_attention_in_place(
        &self,
        q: &Tensor,
        l: usize,
        plan: &StepPlan,
        kv: &KvArena,
    ) -> R<Option<Tensor>> {
        let f32s = kv.dtype() == DType::F32 && q.dtype() == DType::F32;
        if self.generic_decode || !self.device.is_cpu() || !f32s {
            return Ok(None);
        }
        let c = &self.cfg;
        let rows: Vec<u32> = plan
            .decodes
            .iter()
            .map(|&i| plan.seqs[i].offset as u32)
            .collect();
        let idx = Tensor::from_slice(&rows, rows.len(), &self.device).map_err(ce("rows"))?;
        let qd = q
            .index_select(&idx, 0)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(ce("decode queries"))?;
        let seqs: Vec<DecodeSeq> = plan
            .decodes
            .iter()
            .map(|&i| {
                let s = &plan.seqs[i];
                let lo = c.sliding_window.map_or(0, |w| s.end.saturating_sub(w));
                let rows = |which| {
                    (lo..s.end)
                        .map(|p| kv.row(s.blocks[p / s.block_size], l, which, p % s.block_size))
                        .collect()
                };
                DecodeSeq {
                    k_rows: rows(0),
                    v_rows: rows(1),
                }
            })
            .collect();
        let heads = Heads {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            scale: self.scale() as f32,
        };
        let out = {
            let (storage, layout) = kv.rows().storage_and_layout();
            let candle_core::Storage::Cpu(cpu) = &*storage else {
                return Ok(None);
            };
            let all = cpu.as_slice::<f32>().map_err(ce("kv arena"))?;
            cpu_attention::decode(&qd, &seqs, &all[layout.start_offset()..], heads)
        };
        Tensor::from_vec(out, (rows.len(), c.q_width()), &self.device)
            .map(Some)
            .map_err(ce("decode attention"))
    }

    /// Every decode token at once, contexts padded to the longest (padding masked out).
    fn decode_attention(&self, q: &Tensor, l: usize, plan: &StepPlan, kv: &KvArena) -> R<Tensor> {
        if let Some(out) = self.decode_attention_in_place(q, l, plan, kv)? {
            return Ok(out);
        }
        let c = &self.cfg;
        let (d, kvh, g) = (c.head_dim, c.num_kv_heads, c.num_heads / c.num_kv_heads);
        let b = plan.decodes.len();
        let emax = plan
            .decodes
            .iter()
            .map(|&i| plan.seqs[i].end)
            .max()
            .unwrap_or(1);
        let mut k_rows = Vec::with_capacity(b * emax);
        let mut v_rows = Vec::with_capacity(b * emax);
        let mut mask = vec![0f32; b * emax];
        let mut q_rows = Vec::with_capacity(b);
        for (r, &i) in plan.decodes.iter().enumerate() {
            let s = &plan.seqs[i];
            q_rows.push(s.offset as u32);
            let (mut kr, mut vr) = (s.context_rows(kv, l, 0), s.context_rows(kv, l, 1));
            let window = causal_mask(s.pos, 1, s.end, c.sliding_window);
            mask[r * emax..r * emax + s.end].copy_from_slice(&window);
            for j in s.end..emax {
                mask[r * emax + j] = f32::NEG_INFINITY;
            }
            // Padding reads a valid row of the same sequence; its weight is exactly zero.
            kr.resize(emax, kr[0]);
            vr.resize(emax, vr[0]);
            k_rows.extend(kr);
            v_rows.extend(vr);
        }
        let k = self.gather(kv, &k_rows)?;
        let v = self.gather(kv, &v_rows)?;
        let dev = &self.device;
        let mask = Tensor::from_vec(mask, (b, 1, 1, emax), dev).map_err(ce("mask"))?;
        let q_idx = Tensor::from_vec(q_rows, b, dev).map_err(ce("rows"))?;
        let run = || -> candle_core::Result<Tensor> {
            let q = q
                .index_select(&q_idx, 0)?
                .to_dtype(DType::F32)?
                .reshape((b, kvh, g, d))?;
            let k = k
                .reshape((b, emax, kvh, d))?
                .transpose(1, 2)?
                .contiguous()?;
            let v = v
                .reshape((b, emax, kvh, d))?
                .transpose(1, 2)?
                .contiguous()?;
            let att = (q.matmul(&k.transpose(2, 3)?)? * self.scale())?.broadcast_add(&mask)?;
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            att.matmul(&v)?
                .reshape((b, kvh * g * d))?
                .to_dtype(self.dtype)
        };
        run().map_err(ce("decode attention"))
    }
}

/// `cos`/`sin` tables `(max_position_embeddings, head_dim / 2)`, as candle-transformers'
/// Llama computes them.
fn rotary_tables(cfg: &ModelConfig, dtype: DType, dev: &Device) -> R<(Tensor, Tensor)> {
    let inv = cfg.inv_freq();
    let n = cfg.max_position_embeddings;
    let run = || -> candle_core::Result<(Tensor, Tensor)> {
        let inv = Tensor::new(inv.as_slice(), dev)?;
        let t = Tensor::arange(0, n as u32, dev)?
            .to_dtype(DType::F32)?
            .reshape((n, 1))?
            .matmul(&inv.reshape((1, inv.elem_count()))?)?;
        Ok((t.cos()?.to_dtype(dtype)?, t.sin()?.to_dtype(dtype)?))
    };
    run().map_err(ce("rotary tables"))
}

/// Additive mask `(n, e)`: query `i` (position `pos + i`) sees key `j` when `j <= pos + i`
/// (and, with a sliding window `w`, when `j > pos + i - w`).
fn causal_mask(pos: usize, n: usize, e: usize, window: Option<usize>) -> Vec<f32> {
    let mut m = vec![0f32; n * e];
    for i in 0..n {
        let p = pos + i;
        for j in 0..e {
            let too_old = window.is_some_and(|w| j + w <= p);
            if j > p || too_old {
                m[i * e + j] = f32::NEG_INFINITY;
            }
        }
    }
    m
}

/// One sequence of the flat batch.
struct SeqPlan {
    /// First row of its tokens in the flat batch.
    offset: usize,
    pos: usize,
    end: usize,
    blocks: Vec<u32>,
    block_size: usize,
}

impl SeqPlan {
    /// Arena rows of positions `0..end` of layer `l`, K or V.
    fn context_rows(&self, kv: &KvArena, l: usize, which: usize) -> Vec<u32> {
        (0..self.end)
            .map(|p| {
                kv.row(
                    self.blocks[p / self.block_size],
                    l,
                    which,
                    p % self.block_size,
                )
            })
            .collect()
    }
}

/// A step flattened: token ids and positions in batch order, the sequences, which of them
/// decode, and the rows that sample.
struct StepPlan {
    ids: Vec<u32>,
    positions: Vec<u32>,
    seqs: Vec<SeqPlan>,
    decodes: Vec<usize>,
    prefills: Vec<usize>,
    /// Present when the attention pieces (decodes, then prefills) are not in flat order.
    unpermute: Option<Vec<u32>>,
    sample_rows: Vec<u32>,
}

impl StepPlan {
    fn new(chunks: &[SeqChunk<'_>], kv: &KvArena, cfg: &ModelConfig) -> R<StepPlan> {
        let bs = kv.geometry().block_size as usize;
        let mut p = StepPlan {
            ids: Vec::new(),
            positions: Vec::new(),
            seqs: Vec::new(),
            decodes: Vec::new(),
            prefills: Vec::new(),
            unpermute: None,
            sample_rows: Vec::new(),
        };
        for (i, c) in chunks.iter().enumerate() {
            if c.pos >= c.end || c.end > c.tokens.len() {
                return Err(EngineError::Runner(format!(
                    "chunk {i}: positions {}..{} of a {}-token sequence",
                    c.pos,
                    c.end,
                    c.tokens.len()
                )));
            }
            if c.end > cfg.max_position_embeddings {
                return Err(EngineError::Runner(format!(
                    "chunk {i}: position {} is past max_position_embeddings {}",
                    c.end - 1,
                    cfg.max_position_embeddings
                )));
            }
            if c.blocks.len() < c.end.div_ceil(bs) {
                return Err(EngineError::Runner(format!(
                    "chunk {i}: {} blocks cannot hold {} tokens",
                    c.blocks.len(),
                    c.end
                )));
            }
            if let Some(b) = c.blocks.iter().find(|&&b| b >= kv.num_blocks()) {
                return Err(EngineError::Runner(format!(
                    "chunk {i}: block {b} is outside the arena of {} blocks",
                    kv.num_blocks()
                )));
            }
            let offset = p.ids.len();
            p.ids.extend_from_slice(&c.tokens[c.pos..c.end]);
            p.positions.extend(c.pos as u32..c.end as u32);
            if c.all_rows {
                p.sample_rows.extend(offset as u32..p.ids.len() as u32);
            } else if c.sample {
                p.sample_rows.push((p.ids.len() - 1) as u32);
            }
            if c.end - c.pos == 1 {
                p.decodes.push(i);
            } else {
                p.prefills.push(i);
            }
            p.seqs.push(SeqPlan {
                offset,
                pos: c.pos,
                end: c.end,
                blocks: c.blocks.to_vec(),
                block_size: bs,
            });
        }
        let order: Vec<u32> = p
            .decodes
            .iter()
            .chain(&p.prefills)
            .flat_map(|&i| {
                let s = &p.seqs[i];
                (s.offset as u32)..((s.offset + s.end - s.pos) as u32)
            })
            .collect();
        if order.iter().enumerate().any(|(k, &r)| k as u32 != r) {
            let mut inv = vec![0u32; order.len()];
            for (k, &r) in order.iter().enumerate() {
                inv[r as usize] = k as u32;
            }
            p.unpermute = Some(inv);
        }
        Ok(p)
    }

    /// Scatter index `(tokens, width)` of the slots that this step's K (`which == 0`) or V of
    /// layer `l` go to.
    fn write_index(
        &self,
        kv: &KvArena,
        l: usize,
        which: usize,
        width: usize,
        dev: &Device,
    ) -> R<Tensor> {
        let mut idx = Vec::with_capacity(self.ids.len() * width);
        for s in &self.seqs {
            for p in s.pos..s.end {
                let row = kv.row(s.blocks[p / s.block_size], l, which, p % s.block_size);
                idx.extend(std::iter::repeat_n(row, width));
            }
        }
        Tensor::from_vec(idx, (self.ids.len(), width), dev).map_err(ce("kv write index"))
    }
}

#[cfg(test)]
mod tests {
    use super::causal_mask;

    #[test]
    fn causal_mask_from_a_start_position_with_and_without_a_window() {
        let inf = f32::NEG_INFINITY;
        // Queries at positions 2 and 3 over keys 0..4.
        assert_eq!(
            causal_mask(2, 2, 4, None),
            vec![0.0, 0.0, 0.0, inf, 0.0, 0.0, 0.0, 0.0]
        );
        // A window of 2 tokens: position 3 sees 2 and 3 only.
        assert_eq!(
            causal_mask(2, 2, 4, Some(2)),
            vec![inf, 0.0, 0.0, inf, inf, inf, 0.0, 0.0]
        );
    }
}
