//! The embedded default model: a deterministic random-weight Llama-architecture model of a few
//! MB, written as an ordinary Hugging Face model directory (`config.json`, `model.safetensors`
//! in f32, `tokenizer.json`, `tokenizer_config.json` with a chat template,
//! `generation_config.json`), so serving and tests exercise the real loading code with no
//! download.
//!
//! **Its text is meaningless.** The weights are random numbers; only the tokenizer is real: a
//! byte-level BPE trained with the `tokenizers` crate on text shipped in `engine/assets/corpus/`
//! (the King James Version of Genesis, public domain, and a snapshot of this project's docs).
//! Point the server at a real model directory (e.g. a Llama 3 or Qwen2.5 checkpoint) for real
//! text.

use crate::error::EngineError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::path::Path;
use std::sync::OnceLock;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, TokenizerBuilder};

/// Text the tokenizer is trained on (see `engine/assets/corpus/README.md`).
const CORPUS: &[&str] = &[
    include_str!("../../assets/corpus/kjv-genesis.txt"),
    include_str!("../../assets/corpus/project-docs.md"),
];

/// Special tokens, in id order from 0.
pub const BOS: &str = "<|begin_of_text|>";
pub const EOS: &str = "<|end_of_text|>";
pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";
const SPECIALS: [&str; 4] = [BOS, EOS, IM_START, IM_END];

/// Vocabulary of the trained tokenizer (special tokens and the 256 byte symbols included).
pub const TOKENIZER_VOCAB: usize = 2048;

/// A ChatML template, as Qwen's; unknown roles raise.
const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if message['role'] not in ['system', 'user', 'assistant'] %}\
{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Shape of a random Llama-architecture model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandomLlama {
    /// `LlamaForCausalLM`, or `Qwen2ForCausalLM` (adds q/k/v biases).
    pub architecture: &'static str,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// Llama 3.1's RoPE scaling (`rope_type` llama3: factor 8, low/high frequency factors 1
    /// and 4, over an original context of 8,192), which stretches it to 131,072 positions.
    pub llama3_rope_scaling: bool,
}

impl RandomLlama {
    /// The embedded default: 4 layers, hidden 128, 4 query heads over 2 KV heads (GQA) of
    /// dimension 32; about 1.3 M parameters (5 MB in f32).
    pub const TINY: RandomLlama = RandomLlama {
        architecture: "LlamaForCausalLM",
        hidden_size: 128,
        intermediate_size: 384,
        num_layers: 4,
        num_heads: 4,
        num_kv_heads: 2,
        max_position_embeddings: 4096,
        rope_theta: 10000.0,
        tie_word_embeddings: false,
        llama3_rope_scaling: false,
    };

    /// A ~100 M-parameter Llama-shaped model for benchmarks: 16 layers, hidden 768, 12 heads
    /// over 4 KV heads of dimension 64, MLP 2048.
    pub const SMALL_100M: RandomLlama = RandomLlama {
        architecture: "LlamaForCausalLM",
        hidden_size: 768,
        intermediate_size: 2048,
        num_layers: 16,
        num_heads: 12,
        num_kv_heads: 4,
        max_position_embeddings: 4096,
        rope_theta: 10000.0,
        tie_word_embeddings: false,
        llama3_rope_scaling: false,
    };

    /// Llama-3-8B's shape (32 layers, hidden 4096, 32 heads over 8 KV heads, MLP 14336,
    /// vocabulary 128256): for `random:llama-3-8b`.
    pub const LLAMA_3_8B: RandomLlama = RandomLlama {
        architecture: "LlamaForCausalLM",
        hidden_size: 4096,
        intermediate_size: 14336,
        num_layers: 32,
        num_heads: 32,
        num_kv_heads: 8,
        max_position_embeddings: 8192,
        rope_theta: 500_000.0,
        tie_word_embeddings: false,
        llama3_rope_scaling: false,
    };

    /// Llama-3.1-8B's shape: Llama-3-8B's with a 131,072-token context through Llama 3's RoPE
    /// scaling: for `random:llama-3.1-8b`, the long-context shape.
    pub const LLAMA_3_1_8B: RandomLlama = RandomLlama {
        max_position_embeddings: 131_072,
        llama3_rope_scaling: true,
        ..RandomLlama::LLAMA_3_8B
    };

    /// Qwen2.5-7B's shape (28 layers, hidden 3584, 28 heads over 4 KV heads, MLP 18944, q/k/v
    /// biases, vocabulary 152064).
    pub const QWEN2_5_7B: RandomLlama = RandomLlama {
        architecture: "Qwen2ForCausalLM",
        hidden_size: 3584,
        intermediate_size: 18944,
        num_layers: 28,
        num_heads: 28,
        num_kv_heads: 4,
        max_position_embeddings: 32768,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: false,
        llama3_rope_scaling: false,
    };

    /// Qwen2.5-32B's shape (64 layers, hidden 5120, 40 heads over 8 KV heads, MLP 27648).
    pub const QWEN2_5_32B: RandomLlama = RandomLlama {
        architecture: "Qwen2ForCausalLM",
        hidden_size: 5120,
        intermediate_size: 27648,
        num_layers: 64,
        num_heads: 40,
        num_kv_heads: 8,
        max_position_embeddings: 32768,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: false,
        llama3_rope_scaling: false,
    };

    /// The built-in real-size shapes `random:NAME` accepts, with their vocabulary sizes.
    pub const NAMED: [(&'static str, RandomLlama, usize); 5] = [
        ("llama-3-8b", RandomLlama::LLAMA_3_8B, 128_256),
        ("llama-3.1-8b", RandomLlama::LLAMA_3_1_8B, 128_256),
        ("qwen2.5-7b", RandomLlama::QWEN2_5_7B, 152_064),
        ("qwen2.5-32b", RandomLlama::QWEN2_5_32B, 152_064),
        ("tiny", RandomLlama::TINY, TOKENIZER_VOCAB),
    ];

    /// The shape and vocabulary of `random:NAME`; the error lists the names.
    pub fn named(name: &str) -> Result<(RandomLlama, usize), EngineError> {
        RandomLlama::NAMED
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, spec, vocab)| (*spec, *vocab))
            .ok_or_else(|| {
                let names: Vec<&str> = RandomLlama::NAMED.iter().map(|(n, _, _)| *n).collect();
                EngineError::Config(format!(
                    "unknown random model {name:?}; built in: {}",
                    names.join(", ")
                ))
            })
    }

    /// The model's `config.json` as [`ModelConfig`](crate::model::ModelConfig).
    pub fn model_config(&self, vocab: usize) -> Result<crate::model::ModelConfig, EngineError> {
        let text = self.config_json(vocab).to_string();
        crate::model::ModelConfig::from_json(&text, Path::new("<built-in random model>"))
    }

    /// Every tensor's name, shape, and the centre and half-width of its uniform values (the
    /// same distribution [`write_random_llama`] writes), for building weights in place.
    pub fn uniform_tensors(&self, vocab: usize) -> Vec<(String, Vec<usize>, f32, f32)> {
        self.tensors(vocab)
            .into_iter()
            .map(|t| (t.name, t.shape, t.mean, t.std * 3f32.sqrt()))
            .collect()
    }

    fn qwen2(&self) -> bool {
        self.architecture == "Qwen2ForCausalLM"
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Parameters with the tokenizer's vocabulary.
    pub fn params(&self) -> usize {
        self.tensors(TOKENIZER_VOCAB)
            .iter()
            .map(|t| t.shape.iter().product::<usize>())
            .sum()
    }

    /// Every tensor, with HF names, shapes and the spread of its random values.
    fn tensors(&self, vocab: usize) -> Vec<TensorSpec> {
        let (h, i, hd) = (self.hidden_size, self.intermediate_size, self.head_dim());
        let (q, kv) = (self.num_heads * hd, self.num_kv_heads * hd);
        // Larger q/k spread than a trained init, so attention is far from uniform and a wrong
        // block mapping changes the logits clearly; the lm_head spread gives logits of a few
        // units, so sampling settings matter and greedy ties are rare.
        let mut t = vec![TensorSpec::new(
            "model.embed_tokens.weight",
            &[vocab, h],
            1.0,
            0.0,
        )];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            t.extend([
                TensorSpec::new(&format!("{p}.input_layernorm.weight"), &[h], 0.1, 1.0),
                TensorSpec::new(&format!("{p}.self_attn.q_proj.weight"), &[q, h], 0.12, 0.0),
                TensorSpec::new(&format!("{p}.self_attn.k_proj.weight"), &[kv, h], 0.12, 0.0),
                TensorSpec::new(&format!("{p}.self_attn.v_proj.weight"), &[kv, h], 0.08, 0.0),
                TensorSpec::new(&format!("{p}.self_attn.o_proj.weight"), &[h, q], 0.05, 0.0),
                TensorSpec::new(
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[h],
                    0.1,
                    1.0,
                ),
                TensorSpec::new(&format!("{p}.mlp.gate_proj.weight"), &[i, h], 0.08, 0.0),
                TensorSpec::new(&format!("{p}.mlp.up_proj.weight"), &[i, h], 0.08, 0.0),
                TensorSpec::new(&format!("{p}.mlp.down_proj.weight"), &[h, i], 0.05, 0.0),
            ]);
        }
        if self.qwen2() {
            for l in 0..self.num_layers {
                let p = format!("model.layers.{l}.self_attn");
                t.extend([
                    TensorSpec::new(&format!("{p}.q_proj.bias"), &[q], 0.1, 0.0),
                    TensorSpec::new(&format!("{p}.k_proj.bias"), &[kv], 0.1, 0.0),
                    TensorSpec::new(&format!("{p}.v_proj.bias"), &[kv], 0.1, 0.0),
                ]);
            }
        }
        t.push(TensorSpec::new("model.norm.weight", &[h], 0.1, 1.0));
        if !self.tie_word_embeddings {
            let std = 2.0 / (h as f32).sqrt();
            t.push(TensorSpec::new("lm_head.weight", &[vocab, h], std, 0.0));
        }
        t
    }

    fn config_json(&self, vocab: usize) -> serde_json::Value {
        let mut c = json!({
            "architectures": [self.architecture],
            "model_type": if self.qwen2() { "qwen2" } else { "llama" },
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim(),
            "vocab_size": vocab,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "rope_theta": self.rope_theta,
            "hidden_act": "silu",
            "bos_token_id": 0,
            "eos_token_id": [1, 3],
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "float32",
            "_comment": "Random weights from superinfer-engine: the text this model writes is meaningless."
        });
        if self.llama3_rope_scaling {
            c["rope_scaling"] = json!({
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192
            });
        }
        if self.qwen2() {
            c["sliding_window"] = json!(self.max_position_embeddings);
            c["max_window_layers"] = json!(self.num_layers);
            c["use_sliding_window"] = json!(false);
        }
        c
    }
}

struct TensorSpec {
    name: String,
    shape: Vec<usize>,
    /// Standard deviation of the uniform noise.
    std: f32,
    mean: f32,
}

impl TensorSpec {
    fn new(name: &str, shape: &[usize], std: f32, mean: f32) -> TensorSpec {
        TensorSpec {
            name: name.to_owned(),
            shape: shape.to_vec(),
            std,
            mean,
        }
    }

    /// Little-endian f32 bytes, from a generator seeded by `seed` and the tensor's name (so
    /// one tensor does not depend on the others).
    fn bytes(&self, seed: u64) -> Vec<u8> {
        let name_hash = self.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ name_hash);
        let n: usize = self.shape.iter().product();
        let half_width = self.std * 3f32.sqrt();
        let mut out = Vec::with_capacity(n * 4);
        for _ in 0..n {
            let x = self.mean + rng.random_range(-half_width..=half_width);
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::ModelFiles {
        file: path.display().to_string(),
        msg: format!("cannot write: {e}"),
    }
}

/// The trained `tokenizer.json`, trained once per process (training is deterministic).
fn tokenizer_json() -> Result<&'static str, EngineError> {
    static JSON: OnceLock<Result<String, String>> = OnceLock::new();
    JSON.get_or_init(|| train_tokenizer().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| EngineError::Text(format!("training the tiny tokenizer: {e}")))
}

fn train_tokenizer() -> tokenizers::Result<String> {
    let specials: Vec<AddedToken> = SPECIALS
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(TOKENIZER_VOCAB)
        .min_frequency(2)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let post = TemplateProcessing::builder()
        .try_single(format!("{BOS} $A"))?
        .try_pair(format!("{BOS} $A {BOS} $B:1"))?
        .special_tokens(vec![(BOS, 0)])
        .build()?;
    let byte_level = ByteLevel::new(false, true, true);
    let mut tok =
        TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, TemplateProcessing, ByteLevel>::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(byte_level))
            .with_post_processor(Some(post))
            .with_decoder(Some(byte_level))
            .build()?;
    let lines = CORPUS
        .iter()
        .flat_map(|text| text.lines())
        .filter(|l| !l.trim().is_empty());
    tok.train(&mut trainer, lines)?;
    tok.to_string(false)
}

/// Writes a random Llama model of shape `spec` with the embedded tokenizer into `dir`
/// (created if missing). Same `spec` and `seed`, same bytes.
pub fn write_random_llama(dir: &Path, spec: &RandomLlama, seed: u64) -> Result<(), EngineError> {
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let tokenizer = tokenizer_json()?;
    let tok_path = dir.join("tokenizer.json");
    std::fs::write(&tok_path, tokenizer).map_err(|e| io_err(&tok_path, e))?;
    let vocab = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| io_err(&tok_path, e))?
        .get_vocab_size(true);

    let write_json = |name: &str, v: serde_json::Value| -> Result<(), EngineError> {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(&v).map_err(|e| io_err(&path, e))?;
        std::fs::write(&path, text).map_err(|e| io_err(&path, e))
    };
    write_json("config.json", spec.config_json(vocab))?;
    write_json(
        "generation_config.json",
        json!({"bos_token_id": 0, "eos_token_id": [1, 3], "do_sample": false}),
    )?;
    write_json(
        "tokenizer_config.json",
        json!({
            "bos_token": BOS,
            "eos_token": IM_END,
            "pad_token": EOS,
            "model_max_length": spec.max_position_embeddings,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": CHAT_TEMPLATE,
        }),
    )?;

    let specs = spec.tensors(vocab);
    let data: Vec<(String, Vec<u8>)> = specs
        .iter()
        .map(|t| (t.name.clone(), t.bytes(seed)))
        .collect();
    let views = specs
        .iter()
        .zip(&data)
        .map(|(t, (name, bytes))| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.shape.clone(), bytes)
                .map(|v| (name.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io_err(dir, e))?;
    let meta = std::collections::HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let path = dir.join("model.safetensors");
    safetensors::tensor::serialize_to_file(views, Some(meta), &path)
        .map_err(|e| io_err(&path, e))?;
    Ok(())
}

/// Writes the embedded default model ([`RandomLlama::TINY`]) into `dir`. Its text is
/// meaningless (random weights); see the module docs.
pub fn write_tiny_model(dir: &Path, seed: u64) -> Result<(), EngineError> {
    write_random_llama(dir, &RandomLlama::TINY, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_training_is_deterministic_and_fills_the_vocabulary() {
        let a = train_tokenizer().unwrap();
        let b = train_tokenizer().unwrap();
        assert!(a == b, "two trainings differ");
        let tok: tokenizers::Tokenizer = a.parse().unwrap();
        assert_eq!(tok.get_vocab_size(true), TOKENIZER_VOCAB);
        for (id, s) in SPECIALS.iter().enumerate() {
            assert_eq!(tok.token_to_id(s), Some(id as u32));
        }
    }

    #[test]
    fn shapes_give_the_advertised_sizes() {
        let tiny = RandomLlama::TINY.params();
        assert!((1_000_000..2_000_000).contains(&tiny), "{tiny}");
        let small = RandomLlama::SMALL_100M.params();
        assert!((90_000_000..130_000_000).contains(&small), "{small}");
    }

    #[test]
    fn llama_3_1_8b_is_llama_3_8b_with_a_131k_context_through_rope_scaling() {
        let (long, vocab) = RandomLlama::named("llama-3.1-8b").unwrap();
        let (short, _) = RandomLlama::named("llama-3-8b").unwrap();
        assert_eq!(long.params(), short.params());
        let (cl, cs) = (
            long.model_config(vocab).unwrap(),
            short.model_config(vocab).unwrap(),
        );
        assert_eq!(cl.max_position_embeddings, 131_072);
        let s = cl.rope_scaling.as_ref().expect("llama3 scaling");
        assert_eq!((s.factor, s.original_max_position_embeddings), (8.0, 8192));
        assert!(cs.rope_scaling.is_none());
        // High frequencies are kept, the lowest divided by the factor.
        let (fl, fs) = (cl.inv_freq(), cs.inv_freq());
        assert_eq!(fl[0], fs[0]);
        let last = fl.len() - 1;
        assert!(
            (fl[last] * 8.0 - fs[last]).abs() <= 1e-6 * fs[last],
            "{} {}",
            fl[last],
            fs[last]
        );
        // The twin has the shape on every hardware profile.
        for hw in ["h100", "h200", "gh200"] {
            crate::profile::Profile::builtin(&format!("{hw}-llama-3.1-8b")).unwrap();
        }
    }
}
