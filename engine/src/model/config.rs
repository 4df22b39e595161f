//! `config.json` of a Hugging Face model of the Llama family, read into one [`ModelConfig`].
//!
//! Supported architectures: `LlamaForCausalLM` (Llama 2 and 3, with Llama 3's rope scaling),
//! `MistralForCausalLM` (sliding window), `Qwen2ForCausalLM` (Qwen2 and Qwen2.5: biased q/k/v
//! projections). Anything else is refused with an error naming the file and field.

use crate::error::EngineError;
use crate::kv::BlockGeometry;
use candle_transformers::models::llama::{Llama3RopeConfig, Llama3RopeType};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// The architectures this runner implements (`architectures[0]` of `config.json`).
pub const SUPPORTED_ARCHITECTURES: &[&str] =
    &["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"];

/// The fields of `config.json` the model needs, the same for every supported architecture.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3RopeConfig>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections have a bias (Qwen2, or `attention_bias` of Llama).
    pub qkv_bias: bool,
    /// Attend only to the last `sliding_window` positions (Mistral v0.1; Qwen2 when
    /// `use_sliding_window`).
    pub sliding_window: Option<usize>,
    pub hidden_act: candle_nn::Activation,
    pub eos_token_ids: Vec<u32>,
}

/// `config.json` as written by `transformers` (fields of all three architectures).
#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Value,
    /// transformers >= 5 writes `rope_theta` and the scaling here instead.
    #[serde(default)]
    rope_parameters: Value,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    use_sliding_window: Option<bool>,
    #[serde(default = "default_act")]
    hidden_act: candle_nn::Activation,
    #[serde(default)]
    eos_token_id: Value,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_max_pos() -> usize {
    4096
}
fn default_act() -> candle_nn::Activation {
    candle_nn::Activation::Silu
}

impl ModelConfig {
    /// Parses the text of a `config.json`; `path` is used in errors only.
    pub fn from_json(text: &str, path: &Path) -> Result<ModelConfig, EngineError> {
        let raw: RawConfig = serde_json::from_str(text)
            .map_err(|e| EngineError::model_files(path, e.to_string()))?;
        let architecture = raw.architectures.first().cloned().ok_or_else(|| {
            EngineError::model_files(
                path,
                "field architectures: missing or empty (expected e.g. [\"LlamaForCausalLM\"])",
            )
        })?;
        if !SUPPORTED_ARCHITECTURES.contains(&architecture.as_str()) {
            return Err(EngineError::model_files(
                path,
                format!(
                    "field architectures: {architecture} is not supported (supported: {})",
                    SUPPORTED_ARCHITECTURES.join(", ")
                ),
            ));
        }
        let positive = |v: usize, field: &str| {
            if v == 0 {
                Err(EngineError::model_files(
                    path,
                    format!("field {field}: must be positive"),
                ))
            } else {
                Ok(v)
            }
        };
        let num_heads = positive(raw.num_attention_heads, "num_attention_heads")?;
        let num_kv_heads = positive(
            raw.num_key_value_heads.unwrap_or(num_heads),
            "num_key_value_heads",
        )?;
        if num_heads % num_kv_heads != 0 {
            return Err(EngineError::model_files(
                path,
                format!(
                    "field num_key_value_heads: {num_kv_heads} does not divide \
                     num_attention_heads {num_heads}"
                ),
            ));
        }
        let hidden_size = positive(raw.hidden_size, "hidden_size")?;
        let head_dim = positive(raw.head_dim.unwrap_or(hidden_size / num_heads), "head_dim")?;
        if head_dim % 2 != 0 {
            return Err(EngineError::model_files(
                path,
                format!("field head_dim: {head_dim} is odd"),
            ));
        }
        let qwen = architecture == "Qwen2ForCausalLM";
        let sliding_window = match (qwen, raw.use_sliding_window) {
            (true, Some(true)) => raw.sliding_window,
            (true, _) => None,
            (false, _) => raw.sliding_window,
        };
        Ok(ModelConfig {
            hidden_size,
            intermediate_size: positive(raw.intermediate_size, "intermediate_size")?,
            num_layers: positive(raw.num_hidden_layers, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: positive(raw.vocab_size, "vocab_size")?,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta: raw
                .rope_theta
                .or_else(|| {
                    raw.rope_parameters
                        .get("rope_theta")
                        .and_then(Value::as_f64)
                })
                .unwrap_or_else(default_theta),
            rope_scaling: if raw.rope_scaling.is_null() {
                rope_scaling(&raw.rope_parameters, "rope_parameters", path)?
            } else {
                rope_scaling(&raw.rope_scaling, "rope_scaling", path)?
            },
            max_position_embeddings: positive(
                raw.max_position_embeddings,
                "max_position_embeddings",
            )?,
            tie_word_embeddings: raw.tie_word_embeddings,
            qkv_bias: qwen || raw.attention_bias,
            sliding_window,
            hidden_act: raw.hidden_act,
            eos_token_ids: eos_ids(&raw.eos_token_id),
            architecture,
        })
    }

    /// Query width (heads × head dim).
    pub fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// K (or V) width (KV heads × head dim).
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The KV block geometry of this model with blocks of `block_size` tokens in `dtype`.
    pub fn kv_geometry(&self, block_size: u32, dtype: candle_core::DType) -> BlockGeometry {
        BlockGeometry {
            num_layers: self.num_layers as u32,
            block_size,
            kv_heads: self.num_kv_heads as u32,
            head_dim: self.head_dim as u32,
            dtype_bytes: dtype.size_in_bytes() as u32,
        }
    }

    /// Rotary inverse frequencies, with Llama 3's scaling when configured.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f32> = (0..d)
            .step_by(2)
            .map(|i| 1f32 / (self.rope_theta as f32).powf(i as f32 / d as f32))
            .collect();
        let Some(s) = self
            .rope_scaling
            .as_ref()
            .filter(|s| matches!(s.rope_type, Llama3RopeType::Llama3))
        else {
            return base;
        };
        let orig = s.original_max_position_embeddings as f32;
        let low_wavelen = orig / s.low_freq_factor;
        let high_wavelen = orig / s.high_freq_factor;
        base.into_iter()
            .map(|freq| {
                let wavelen = 2. * std::f32::consts::PI / freq;
                if wavelen < high_wavelen {
                    freq
                } else if wavelen > low_wavelen {
                    freq / s.factor
                } else {
                    let smooth = (orig / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1. - smooth) * freq / s.factor + smooth * freq
                }
            })
            .collect()
    }
}

fn rope_scaling(
    v: &Value,
    field: &str,
    path: &Path,
) -> Result<Option<Llama3RopeConfig>, EngineError> {
    if v.is_null() {
        return Ok(None);
    }
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    match kind {
        "llama3" => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| EngineError::model_files(path, format!("field {field}: {e}"))),
        // transformers >= 5 writes `rope_parameters` for every model, with the type "default".
        "default" | "" if field == "rope_parameters" => Ok(None),
        "default" => Ok(None),
        other => Err(EngineError::model_files(
            path,
            format!("field {field}: rope type {other:?} is not supported (only llama3)"),
        )),
    }
}

fn eos_ids(v: &Value) -> Vec<u32> {
    match v {
        Value::Number(n) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|n| n as u32))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<ModelConfig, EngineError> {
        let text = format!(
            r#"{{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "vocab_size": 100, {extra}}}"#
        );
        ModelConfig::from_json(&text, Path::new("m/config.json"))
    }

    #[test]
    fn the_kv_geometry_is_the_models_kv_heads_and_layers() {
        let m =
            parse(r#""architectures": ["LlamaForCausalLM"], "num_key_value_heads": 2"#).unwrap();
        let g = m.kv_geometry(16, candle_core::DType::BF16);
        assert_eq!((g.num_layers, g.kv_heads, g.head_dim), (2, 2, 16));
        // 16 tokens x (K, V) x 2 layers x (2 heads x 16) x 2 bytes.
        assert_eq!(g.block_bytes(), 16 * 2 * 2 * 32 * 2);
    }

    #[test]
    fn family_members_parse_with_their_quirks() {
        let m = parse(r#""architectures": ["MistralForCausalLM"], "num_key_value_heads": 2, "sliding_window": 4096"#).unwrap();
        assert_eq!(
            (m.num_kv_heads, m.head_dim, m.sliding_window),
            (2, 16, Some(4096))
        );
        assert!(!m.qkv_bias);
        let q = parse(r#""architectures": ["Qwen2ForCausalLM"], "sliding_window": 32, "use_sliding_window": false, "tie_word_embeddings": true"#).unwrap();
        assert!(q.qkv_bias && q.tie_word_embeddings);
        assert_eq!(q.sliding_window, None);
        let l = parse(
            r#""architectures": ["LlamaForCausalLM"], "rope_theta": 500000.0, "eos_token_id": [7, 9],
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        assert_eq!(l.eos_token_ids, vec![7, 9]);
        let plain = ModelConfig {
            rope_scaling: None,
            ..l.clone()
        };
        let (scaled, base) = (l.inv_freq(), plain.inv_freq());
        assert_eq!(scaled[0], base[0], "high frequencies are kept");
        assert!(
            (scaled[7] - base[7] / 8.0).abs() < 1e-9,
            "low frequencies are divided"
        );
    }

    #[test]
    fn transformers_5_rope_parameters_are_read() {
        let m = parse(
            r#""architectures": ["LlamaForCausalLM"],
               "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}"#,
        )
        .unwrap();
        assert_eq!(m.rope_theta, 500_000.0);
        assert!(m.rope_scaling.is_none());
        let l = parse(
            r#""architectures": ["LlamaForCausalLM"],
               "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        assert!(l.rope_scaling.is_some());
        let plain = parse(r#""architectures": ["LlamaForCausalLM"]"#).unwrap();
        assert_eq!(plain.rope_theta, 10_000.0);
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let e = parse(r#""architectures": ["BertModel"]"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m/config.json") && e.contains("architectures") && e.contains("BertModel"),
            "{e}"
        );
        let e = parse(r#""architectures": ["LlamaForCausalLM"], "num_key_value_heads": 3"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_key_value_heads"), "{e}");
        let e = parse(r#""architectures": ["LlamaForCausalLM"], "rope_scaling": {"type": "yarn", "factor": 4.0}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rope_scaling") && e.contains("yarn"), "{e}");
        let e = parse(r#""num_key_value_heads": 4"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("architectures"), "{e}");
    }
}
