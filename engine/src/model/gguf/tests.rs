use super::*;
use crate::text::TextCodec;
use candle_core::quantized::{gguf_file, QTensor};

const HIDDEN: usize = 32;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = HIDDEN / HEADS;
const FF: usize = 64;
const TOKENS: &[&str] = &[
    "a",
    "b",
    "c",
    "ab",
    "Ġ",
    "Ġa",
    "<s>",
    "</s>",
    "<|im_start|>",
];

/// llama.cpp's `permute` of `convert_hf_to_gguf.py`: pairs of rotary halves interleaved.
fn llama_cpp_permute(w: &Tensor, heads: usize) -> Tensor {
    let (out, inp) = w.dims2().unwrap();
    w.reshape((heads, 2, out / heads / 2, inp))
        .and_then(|t| t.transpose(1, 2))
        .and_then(|t| t.contiguous())
        .and_then(|t| t.reshape((out, inp)))
        .unwrap()
}

fn rand(shape: (usize, usize), seed: u64) -> Tensor {
    let n = shape.0 * shape.1;
    let v: Vec<f32> = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 500.0) - 1.0)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

struct Written {
    dir: tempfile::TempDir,
    path: PathBuf,
    q: Tensor,
    k: Tensor,
    up: Tensor,
}

fn meta(arch: &str) -> Vec<(String, gguf_file::Value)> {
    use gguf_file::Value as V;
    let s = |x: &str| V::String(x.to_owned());
    vec![
        ("general.architecture".into(), s(arch)),
        (format!("{arch}.embedding_length"), V::U32(HIDDEN as u32)),
        (format!("{arch}.feed_forward_length"), V::U32(FF as u32)),
        (format!("{arch}.block_count"), V::U32(1)),
        (format!("{arch}.attention.head_count"), V::U32(HEADS as u32)),
        (
            format!("{arch}.attention.head_count_kv"),
            V::U32(KV_HEADS as u32),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            V::F32(1e-5),
        ),
        (format!("{arch}.rope.freq_base"), V::F32(10000.0)),
        (format!("{arch}.context_length"), V::U32(128)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("smollm")),
        (
            "tokenizer.ggml.tokens".into(),
            V::Array(TOKENS.iter().map(|t| s(t)).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            V::Array(vec![s("a b"), s("Ġ a")]),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            V::Array(
                [1, 1, 1, 1, 1, 1, 3, 3, 3]
                    .iter()
                    .map(|t| V::I32(*t))
                    .collect(),
            ),
        ),
        ("tokenizer.ggml.bos_token_id".into(), V::U32(6)),
        ("tokenizer.ggml.eos_token_id".into(), V::U32(7)),
        ("tokenizer.ggml.add_bos_token".into(), V::Bool(true)),
        (
            "tokenizer.chat_template".into(),
            s("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}"),
        ),
    ]
}

/// A one-layer Llama GGUF with q/k permuted as llama.cpp writes them, `up` in Q8_0.
fn write(arch: &str) -> Written {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let (q, k, up) = (
        rand((HIDDEN, HIDDEN), 1),
        rand((KV_HEADS * HEAD_DIM, HIDDEN), 2),
        rand((FF, HIDDEN), 3),
    );
    let f32q = |t: &Tensor| QTensor::quantize(t, GgmlDType::F32).unwrap();
    let norm = Tensor::ones(HIDDEN, DType::F32, &Device::Cpu).unwrap();
    let tensors: Vec<(&str, QTensor)> = vec![
        ("token_embd.weight", f32q(&rand((TOKENS.len(), HIDDEN), 4))),
        ("output_norm.weight", f32q(&norm)),
        ("blk.0.attn_norm.weight", f32q(&norm)),
        ("blk.0.ffn_norm.weight", f32q(&norm)),
        ("blk.0.attn_q.weight", f32q(&llama_cpp_permute(&q, HEADS))),
        (
            "blk.0.attn_k.weight",
            f32q(&llama_cpp_permute(&k, KV_HEADS)),
        ),
        (
            "blk.0.attn_v.weight",
            f32q(&rand((KV_HEADS * HEAD_DIM, HIDDEN), 5)),
        ),
        ("blk.0.attn_output.weight", f32q(&rand((HIDDEN, HIDDEN), 6))),
        ("blk.0.ffn_gate.weight", f32q(&rand((FF, HIDDEN), 7))),
        (
            "blk.0.ffn_up.weight",
            QTensor::quantize(&up, GgmlDType::Q8_0).unwrap(),
        ),
        ("blk.0.ffn_down.weight", f32q(&rand((HIDDEN, FF), 8))),
    ];
    let m = meta(arch);
    let metadata: Vec<(&str, &gguf_file::Value)> = m.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tref: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut f, &metadata, &tref).unwrap();
    Written {
        dir,
        path,
        q,
        k,
        up,
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn a_llama_gguf_reads_as_its_hugging_face_config_and_tensors() {
    let w = write("llama");
    let file = GgufFile::open(&w.path).unwrap();
    let cfg = file.config().unwrap();
    assert_eq!(cfg.architecture, "LlamaForCausalLM");
    assert_eq!(
        (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim
        ),
        (HIDDEN, HEADS, KV_HEADS, HEAD_DIM)
    );
    assert_eq!(
        (cfg.vocab_size, cfg.max_position_embeddings),
        (TOKENS.len(), 128)
    );
    assert!(cfg.tie_word_embeddings, "no output.weight: tied");
    let t = file.tensors(DType::F32, &Device::Cpu).unwrap();
    assert_eq!(t.len(), 11);
    // q/k come back in Hugging Face order: exactly the weights before llama.cpp's permutation.
    assert_eq!(
        max_diff(&t["model.layers.0.self_attn.q_proj.weight"], &w.q),
        0.0
    );
    assert_eq!(
        max_diff(&t["model.layers.0.self_attn.k_proj.weight"], &w.k),
        0.0
    );
    // Q8_0 dequantized by candle: within its step (max |w| / 127).
    assert!(max_diff(&t["model.layers.0.mlp.up_proj.weight"], &w.up) < 1.0 / 127.0);
    let bf = file.tensors(DType::BF16, &Device::Cpu).unwrap();
    assert_eq!(bf["model.norm.weight"].dtype(), DType::BF16);
}

#[test]
fn qwen2_q_and_k_are_not_permuted() {
    let w = write("qwen2");
    let file = GgufFile::open(&w.path).unwrap();
    assert_eq!(file.config().unwrap().architecture, "Qwen2ForCausalLM");
    let t = file.tensors(DType::F32, &Device::Cpu).unwrap();
    let stored = llama_cpp_permute(&w.q, HEADS);
    assert_eq!(
        max_diff(&t["model.layers.0.self_attn.q_proj.weight"], &stored),
        0.0
    );
}

#[test]
fn the_tokenizer_and_template_come_from_the_metadata() {
    let w = write("llama");
    let codec = TextCodec::from_model_dir(&w.path).unwrap();
    assert_eq!(codec.vocab_size(), TOKENS.len());
    // add_bos_token: BOS first; "ab" merged; " a" is one byte-level token.
    assert_eq!(codec.encode("ab a", true).unwrap(), vec![6, 3, 5]);
    assert_eq!(
        codec.encode("<|im_start|>c", false).unwrap(),
        vec![8, 2],
        "control tokens stay whole"
    );
    assert_eq!(
        codec.decode(&[6, 3, 5, 7]),
        "ab a",
        "special tokens are skipped"
    );
    assert_eq!(codec.eos_token_ids(), &[7]);
    let chat = codec
        .apply_chat_template(&[crate::ChatMessage::new("user", "hi")])
        .unwrap();
    assert_eq!(chat, "<|im_start|>hi");
}

#[test]
fn a_tensor_type_candle_cannot_read_is_named_with_its_tensor() {
    let w = write("llama");
    let mut bytes = std::fs::read(&w.path).unwrap();
    let name = b"blk.0.attn_v.weight";
    let at = bytes.windows(name.len()).position(|x| x == name).unwrap() + name.len();
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * dims;
    bytes[ty..ty + 4].copy_from_slice(&16u32.to_le_bytes());
    std::fs::write(&w.path, &bytes).unwrap();
    let e = GgufFile::open(&w.path).err().unwrap().to_string();
    assert!(
        e.contains("blk.0.attn_v.weight") && e.contains("IQ2_XXS") && e.contains("Q4_K"),
        "{e}"
    );
}

#[test]
fn unsupported_architectures_and_names_are_errors_naming_them() {
    let w = write("gpt2");
    let e = GgufFile::open(&w.path)
        .unwrap()
        .config()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("gpt2") && e.contains("llama"), "{e}");
    assert_eq!(
        hf_name("blk.3.ffn_up.weight").as_deref(),
        Some("model.layers.3.mlp.up_proj.weight")
    );
    assert_eq!(
        hf_name("blk.3.attn_q.bias").as_deref(),
        Some("model.layers.3.self_attn.q_proj.bias")
    );
    assert_eq!(hf_name("blk.x.ffn_up.weight"), None);
    assert_eq!(hf_name("rope_freqs.weight"), None);
}

#[test]
fn import_writes_a_directory_the_loaders_read() {
    let w = write("llama");
    let out = w.dir.path().join("hf");
    import(&w.path, &out, ImportOptions::default()).unwrap();
    let cfg = ModelConfig::from_model_dir(&out).unwrap();
    assert_eq!((cfg.hidden_size, cfg.num_layers), (HIDDEN, 1));
    let codec = TextCodec::from_model_dir(&out).unwrap();
    assert_eq!(codec.encode("ab a", true).unwrap(), vec![6, 3, 5]);
    assert_eq!(codec.eos_token_ids(), &[7]);
    assert!(codec.has_chat_template());
    let loaded = crate::model::weights::load(&out, DType::F32, &Device::Cpu).unwrap();
    let q = loaded
        .get(&[HIDDEN, HIDDEN], "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(max_diff(&q, &w.q), 0.0);
}
