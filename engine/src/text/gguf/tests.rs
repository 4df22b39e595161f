use crate::model::gguf::GgufFile;
use crate::TextCodec;
use candle_core::quantized::gguf_file::{self, Value as V};

fn s(x: &str) -> V {
    V::String(x.to_owned())
}

fn list(xs: &[&str]) -> V {
    V::Array(xs.iter().map(|x| s(x)).collect())
}

/// A metadata-only GGUF file (no tensors) with `meta`.
fn codec(meta: Vec<(&str, V)>) -> TextCodec {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    let m: Vec<(&str, &V)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut std::fs::File::create(&path).unwrap(), &m, &[]).unwrap();
    TextCodec::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
}

#[test]
fn a_sentencepiece_vocabulary_without_merges_gets_them_from_its_scores() {
    let tokens = [
        "<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁a", "▁ab", "<0x21>",
    ];
    let scores: Vec<V> = [0., 0., 0., -1., -2., -2., -3., -4., -5., 0.]
        .iter()
        .map(|x| V::F32(*x))
        .collect();
    let types: Vec<V> = [2, 3, 3, 1, 1, 1, 1, 1, 1, 6]
        .iter()
        .map(|t| V::I32(*t))
        .collect();
    let c = codec(vec![
        ("tokenizer.ggml.model", s("llama")),
        ("tokenizer.ggml.tokens", list(&tokens)),
        ("tokenizer.ggml.scores", V::Array(scores)),
        ("tokenizer.ggml.token_type", V::Array(types)),
        ("tokenizer.ggml.bos_token_id", V::U32(1)),
        ("tokenizer.ggml.eos_token_id", V::U32(2)),
        ("tokenizer.ggml.unknown_token_id", V::U32(0)),
    ]);
    // BOS by default for SentencePiece; "▁" before the first word; "!" by byte fallback.
    assert_eq!(c.encode("ab ab!", true).unwrap(), vec![1, 8, 8, 9]);
    assert_eq!(c.decode(&[1, 8, 8, 9, 2]), "ab ab!");
    assert_eq!(c.eos_token_ids(), &[2]);
}

#[test]
fn smollm_splits_digits_one_by_one_like_llama_cpp() {
    let meta = |pre: &str| {
        vec![
            ("tokenizer.ggml.model", s("gpt2")),
            ("tokenizer.ggml.pre", s(pre)),
            (
                "tokenizer.ggml.tokens",
                list(&["1", "2", "12", "<|endoftext|>"]),
            ),
            ("tokenizer.ggml.merges", list(&["1 2"])),
            ("tokenizer.ggml.eos_token_id", V::U32(3)),
            ("tokenizer.ggml.eot_token_id", V::U32(3)),
        ]
    };
    assert_eq!(
        codec(meta("smollm")).encode("12", true).unwrap(),
        vec![0, 1]
    );
    assert_eq!(codec(meta("gpt2")).encode("12", true).unwrap(), vec![2]);
    assert_eq!(codec(meta("smollm")).eos_token_ids(), &[3]);
}
