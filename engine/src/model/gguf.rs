//! GGUF files (llama.cpp's format) as a model source: the metadata becomes the Hugging Face
//! `config.json` that [`ModelConfig`] reads, and the tensors, dequantized by candle's GGUF
//! reader, become the Hugging Face tensors [`super::weights`] serves, in any compute dtype.
//!
//! llama.cpp's converter permutes the rows of the `llama` q/k projections so that its
//! interleaved rotary embedding matches the half-split one of `transformers`; they are permuted
//! back here (as `transformers` does when it loads a GGUF), so the model code is the one of
//! Hugging Face weights. The tokenizer and chat template of the metadata are
//! [`crate::text`]'s (`text/gguf.rs`); [`import`] writes all of it as a model directory.

mod header;
mod import;
#[cfg(test)]
mod tests;

pub use import::{import, ImportOptions};

use super::config::ModelConfig;
use crate::error::EngineError;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use serde_json::json;
use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// The tensor types whose weights load (every type candle's GGUF reader dequantizes).
pub const SUPPORTED_TYPES: &[GgmlDType] = &[
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q8_1,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::Q8K,
];

/// Whether `path` names a file (a GGUF model) rather than a model directory.
pub fn is_gguf(path: &Path) -> bool {
    path.is_file()
}

/// An open GGUF file: its metadata and tensor index (the tensor data stays on disk until
/// [`GgufFile::tensors`]).
pub struct GgufFile {
    path: PathBuf,
    content: Content,
}

pub(crate) fn gguf_err(path: &Path, msg: impl Into<String>) -> EngineError {
    EngineError::ModelFiles {
        file: path.display().to_string(),
        msg: msg.into(),
    }
}

type R<T> = Result<T, EngineError>;

/// The architectures read, with their Hugging Face class and whether their q/k rows are
/// permuted by llama.cpp's converter.
const ARCHITECTURES: &[(&str, &str, bool)] = &[
    ("llama", "LlamaForCausalLM", true),
    ("qwen2", "Qwen2ForCausalLM", false),
];

impl GgufFile {
    /// Reads the header (metadata and tensor index) of `path`.
    pub fn open(path: &Path) -> R<GgufFile> {
        let file =
            std::fs::File::open(path).map_err(|e| gguf_err(path, format!("cannot open: {e}")))?;
        let content = Content::read(&mut BufReader::new(file)).map_err(|e| {
            // candle refuses a tensor type it does not know without naming the tensor.
            match header::unknown_tensor_type(path) {
                Some((name, ty)) => gguf_err(
                    path,
                    format!(
                        "tensor {name}: type {} is not supported (supported: {})",
                        header::type_name(ty),
                        supported_names()
                    ),
                ),
                None => gguf_err(path, format!("not a readable GGUF file: {e}")),
            }
        })?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            content,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    pub(crate) fn err(&self, msg: impl Into<String>) -> EngineError {
        gguf_err(&self.path, msg)
    }

    /// An integer field of any width; `Ok(None)` when absent.
    pub(crate) fn uint(&self, key: &str) -> R<Option<u64>> {
        let Some(v) = self.metadata().get(key) else {
            return Ok(None);
        };
        let n = match v {
            Value::U8(x) => Some(u64::from(*x)),
            Value::U16(x) => Some(u64::from(*x)),
            Value::U32(x) => Some(u64::from(*x)),
            Value::U64(x) => Some(*x),
            Value::I8(x) => u64::try_from(*x).ok(),
            Value::I16(x) => u64::try_from(*x).ok(),
            Value::I32(x) => u64::try_from(*x).ok(),
            Value::I64(x) => u64::try_from(*x).ok(),
            _ => None,
        };
        n.map(Some).ok_or_else(|| {
            self.err(format!(
                "metadata {key}: expected a non-negative integer, got {v:?}"
            ))
        })
    }

    pub(crate) fn float(&self, key: &str) -> R<Option<f64>> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(f64::from(*x))),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(_) => self.uint(key).map(|n| n.map(|n| n as f64)),
        }
    }

    pub(crate) fn string(&self, key: &str) -> R<Option<&str>> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(format!(
                "metadata {key}: expected a string, got {:?}",
                v.value_type()
            ))),
        }
    }

    pub(crate) fn boolean(&self, key: &str) -> R<Option<bool>> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(format!(
                "metadata {key}: expected a bool, got {:?}",
                v.value_type()
            ))),
        }
    }

    pub(crate) fn array(&self, key: &str) -> R<Option<&[Value]>> {
        match self.metadata().get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.err(format!(
                "metadata {key}: expected an array, got {:?}",
                v.value_type()
            ))),
        }
    }

    fn required(&self, key: &str) -> R<u64> {
        self.uint(key)?
            .ok_or_else(|| self.err(format!("metadata {key}: missing")))
    }

    /// `general.architecture`, its Hugging Face class and whether q/k are permuted.
    fn architecture(&self) -> R<(&str, &'static str, bool)> {
        let arch = self
            .string("general.architecture")?
            .ok_or_else(|| self.err("metadata general.architecture: missing"))?;
        let known = ARCHITECTURES
            .iter()
            .find(|(a, _, _)| *a == arch)
            .ok_or_else(|| {
                let names: Vec<&str> = ARCHITECTURES.iter().map(|a| a.0).collect();
                self.err(format!(
                    "general.architecture: {arch} is not supported (supported: {})",
                    names.join(", ")
                ))
            })?;
        Ok((arch, known.1, known.2))
    }

    /// The Hugging Face `config.json` this file describes.
    pub fn config_json(&self) -> R<serde_json::Value> {
        let (arch, class, _) = self.architecture()?;
        let key = |k: &str| format!("{arch}.{k}");
        if let Some(kind) = self.string(&key("rope.scaling.type"))? {
            if kind != "none" {
                return Err(self.err(format!(
                    "metadata {}: rope scaling {kind:?} is not supported",
                    key("rope.scaling.type")
                )));
            }
        }
        if self.content.tensor_infos.contains_key("rope_freqs.weight") {
            return Err(self.err("tensor rope_freqs.weight: rotary frequency factors (Llama 3.1 scaling) are not supported"));
        }
        let hidden = self.required(&key("embedding_length"))?;
        let heads = self.required(&key("attention.head_count"))?;
        let kv_heads = self.uint(&key("attention.head_count_kv"))?.unwrap_or(heads);
        let head_dim = match self.uint(&key("attention.key_length"))? {
            Some(d) => d,
            None => hidden / heads.max(1),
        };
        let tokens = self.array("tokenizer.ggml.tokens")?.map(<[Value]>::len);
        let vocab = match self.uint(&key("vocab_size"))? {
            Some(v) => v,
            None => tokens.ok_or_else(|| {
                self.err(format!(
                    "metadata {}: missing (and no tokenizer.ggml.tokens)",
                    key("vocab_size")
                ))
            })? as u64,
        };
        let mut cfg = json!({
            "architectures": [class],
            "model_type": arch,
            "hidden_size": hidden,
            "intermediate_size": self.required(&key("feed_forward_length"))?,
            "num_hidden_layers": self.required(&key("block_count"))?,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "vocab_size": vocab,
            "rms_norm_eps": self.float(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
            "rope_theta": self.float(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            "max_position_embeddings": self.uint(&key("context_length"))?.unwrap_or(4096),
            "tie_word_embeddings": !self.content.tensor_infos.contains_key("output.weight"),
            "hidden_act": "silu",
            "torch_dtype": "float32",
        });
        for (field, meta) in [
            ("bos_token_id", "bos_token_id"),
            ("eos_token_id", "eos_token_id"),
        ] {
            if let Some(id) = self.uint(&format!("tokenizer.ggml.{meta}"))? {
                cfg[field] = json!(id);
            }
        }
        Ok(cfg)
    }

    /// The model's configuration ([`GgufFile::config_json`] read by [`ModelConfig`]).
    pub fn config(&self) -> R<ModelConfig> {
        let text = self.config_json()?.to_string();
        ModelConfig::from_json(&text, &self.path)
    }

    /// Every tensor under its Hugging Face name, dequantized and converted to `dtype` on
    /// `device`. A tensor of a type outside [`SUPPORTED_TYPES`] or with a name that does not
    /// belong to the architecture is an error naming it.
    pub fn tensors(&self, dtype: DType, device: &Device) -> R<HashMap<String, Tensor>> {
        let (_, _, permuted) = self.architecture()?;
        let cfg = self.config()?;
        let mut names: Vec<&String> = self.content.tensor_infos.keys().collect();
        names.sort();
        let file =
            std::fs::File::open(&self.path).map_err(|e| self.err(format!("cannot open: {e}")))?;
        let mut reader = BufReader::new(file);
        let mut out = HashMap::with_capacity(names.len());
        for name in names {
            let info = &self.content.tensor_infos[name];
            if !SUPPORTED_TYPES.contains(&info.ggml_dtype) {
                return Err(self.err(format!(
                    "tensor {name}: type {} is not supported (supported: {})",
                    header::dtype_name(info.ggml_dtype),
                    supported_names()
                )));
            }
            let hf = hf_name(name).ok_or_else(|| {
                self.err(format!("tensor {name}: not a tensor of this architecture"))
            })?;
            let tensor = self.tensor(&mut reader, name)?;
            let tensor = match (permuted, hf.rsplit('.').nth(1)) {
                (true, Some("q_proj")) => unpermute(&tensor, cfg.num_heads),
                (true, Some("k_proj")) => unpermute(&tensor, cfg.num_kv_heads),
                _ => Ok(tensor),
            };
            let tensor = tensor
                .and_then(|t| t.to_dtype(dtype))
                .and_then(|t| t.to_device(device))
                .map_err(|e| self.err(format!("tensor {name}: {e}")))?;
            out.insert(hf, tensor);
        }
        Ok(out)
    }

    /// One tensor dequantized to f32 on the CPU.
    fn tensor(&self, reader: &mut BufReader<std::fs::File>, name: &str) -> R<Tensor> {
        self.content
            .tensor(reader, name, &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .map_err(|e| self.err(format!("tensor {name}: {e}")))
    }

    /// The number of tensors of each type, for logs and tools.
    pub fn tensor_types(&self) -> Vec<(String, usize)> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for info in self.content.tensor_infos.values() {
            *counts
                .entry(header::dtype_name(info.ggml_dtype).to_owned())
                .or_default() += 1;
        }
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort();
        v
    }
}

fn supported_names() -> String {
    SUPPORTED_TYPES
        .iter()
        .map(|t| header::dtype_name(*t))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Hugging Face name of a llama.cpp tensor name.
fn hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_owned());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// Undoes llama.cpp's q/k row permutation: within each head, rows `(half, pair)` were
/// reordered to `(pair, half)` so that rotary pairs are adjacent; this restores the
/// half-split order of Hugging Face weights (a weight `(out, in)` or a bias `(out,)`).
fn unpermute(t: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let dims = t.dims().to_vec();
    let out = dims[0];
    let rest: usize = dims[1..].iter().product();
    let half = out / heads / 2;
    t.reshape((heads, half, 2, rest))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)
}
