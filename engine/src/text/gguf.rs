//! The tokenizer, special tokens and chat template of a GGUF file's metadata
//! (`tokenizer.ggml.*`, `tokenizer.chat_template`), built with the `tokenizers` crate into
//! the same [`Tokenizer`] a Hugging Face `tokenizer.json` gives.
//!
//! Two kinds (`tokenizer.ggml.model`), built as `transformers` builds them from a GGUF:
//! - `gpt2`: byte-level BPE from the vocabulary and merges. The split before the byte-level
//!   step follows `tokenizer.ggml.pre` where llama.cpp names one of the common families
//!   (`llama-bpe`, `qwen2`, `smollm`, ...); `smollm` splits digits one by one, as llama.cpp and
//!   SmolLM's own `tokenizer.json` do (transformers 5.24 keeps digit runs whole there).
//! - `llama`: SentencePiece BPE (`▁` for spaces, byte fallback), merges from the file or, when
//!   it has none, derived from the scores as `transformers`' `generate_merges` derives them.
//!
//! Tokens typed control (3) become special tokens, user-defined ones (4) added tokens, so both
//! stay whole in text.

#[cfg(test)]
mod tests;

use crate::error::EngineError;
use crate::model::gguf::GgufFile;
use candle_core::quantized::gguf_file::Value;
use serde_json::json;
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

type R<T> = Result<T, EngineError>;

/// What a GGUF file's metadata says about text.
pub struct GgufText {
    pub tokenizer: Tokenizer,
    /// A `tokenizer_config.json` (special tokens, `add_bos_token`, `chat_template`).
    pub tokenizer_config: serde_json::Value,
    /// End-of-generation ids: `eos_token_id`, and `eot_token_id` / `eom_token_id` when set.
    pub eos_ids: Vec<u32>,
    pub bos_id: Option<u32>,
}

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex of a `tokenizer.ggml.pre` name; `None`: GPT-2's own (the byte-level
/// pre-tokenizer's built-in regex).
fn pre_split(pre: &str) -> Option<&'static str> {
    match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" | "dbrx" | "pixtral" => {
            Some(LLAMA3_SPLIT)
        }
        "qwen2" | "deepseek-r1-qwen" => Some(QWEN2_SPLIT),
        _ => None,
    }
}

/// llama.cpp's families that split every digit alone before GPT-2's regex.
const DIGIT_SPLIT_PRE: &[&str] = &["smollm", "starcoder", "refact", "command-r", "codeshell"];

/// GPT-2's map of bytes to printable characters (the byte-level alphabet).
fn bytes_to_unicode() -> HashMap<u8, char> {
    let mut printable: Vec<u8> = (b'!'..=b'~')
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.iter().map(|&b| u32::from(b)).collect();
    let mut n = 0;
    for b in 0..=255u8 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    printable
        .into_iter()
        .zip(chars)
        .map(|(b, c)| {
            (
                b,
                char::from_u32(c).expect("GPT-2's alphabet is below U+0200"),
            )
        })
        .collect()
}

fn strings(file: &GgufFile, key: &str) -> R<Option<Vec<String>>> {
    let Some(a) = file.array(key)? else {
        return Ok(None);
    };
    a.iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(file.err(format!(
                "metadata {key}: expected strings, got {:?}",
                other.value_type()
            ))),
        })
        .collect::<R<Vec<_>>>()
        .map(Some)
}

fn numbers(file: &GgufFile, key: &str) -> R<Option<Vec<f64>>> {
    let Some(a) = file.array(key)? else {
        return Ok(None);
    };
    a.iter()
        .map(|v| match v {
            Value::F32(x) => Ok(f64::from(*x)),
            Value::F64(x) => Ok(*x),
            Value::I32(x) => Ok(f64::from(*x)),
            Value::U32(x) => Ok(f64::from(*x)),
            Value::I8(x) => Ok(f64::from(*x)),
            Value::U8(x) => Ok(f64::from(*x)),
            other => Err(file.err(format!(
                "metadata {key}: expected numbers, got {:?}",
                other.value_type()
            ))),
        })
        .collect::<R<Vec<_>>>()
        .map(Some)
}

fn tok_err(file: &GgufFile, what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::model_files(file.path(), format!("building the tokenizer ({what}): {e}"))
}

/// The special token ids of the metadata.
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    /// `eos`, `eot` and `eom`: every id that ends generation.
    end: Vec<u32>,
}

fn special_ids(file: &GgufFile, vocab: usize) -> R<SpecialIds> {
    let id = |key: &str| -> R<Option<u32>> {
        let id = file.uint(&format!("tokenizer.ggml.{key}"))?;
        match id {
            Some(i) if (i as usize) >= vocab => Err(file.err(format!(
                "metadata tokenizer.ggml.{key}: {i} is outside the vocabulary of {vocab}"
            ))),
            _ => Ok(id.map(|i| i as u32)),
        }
    };
    let eos = id("eos_token_id")?;
    let mut end: Vec<u32> = [eos, id("eot_token_id")?, id("eom_token_id")?]
        .into_iter()
        .flatten()
        .collect();
    end.sort_unstable();
    end.dedup();
    Ok(SpecialIds {
        bos: id("bos_token_id")?,
        eos,
        unk: id("unknown_token_id")?,
        pad: id("padding_token_id")?,
        end,
    })
}

/// Builds the text side of `file`.
pub fn from_gguf(file: &GgufFile) -> R<GgufText> {
    let kind = file
        .string("tokenizer.ggml.model")?
        .ok_or_else(|| {
            file.err("metadata tokenizer.ggml.model: missing (the file has no tokenizer)")
        })?
        .to_owned();
    let sentencepiece = match kind.as_str() {
        "gpt2" => false,
        "llama" => true,
        other => {
            return Err(file.err(format!(
                "metadata tokenizer.ggml.model: {other:?} is not supported (supported: gpt2, llama)"
            )))
        }
    };
    let mut tokens = strings(file, "tokenizer.ggml.tokens")?
        .ok_or_else(|| file.err("metadata tokenizer.ggml.tokens: missing"))?;
    let types = numbers(file, "tokenizer.ggml.token_type")?.unwrap_or_default();
    let ids = special_ids(file, tokens.len())?;
    let add_bos = file
        .boolean("tokenizer.ggml.add_bos_token")?
        .unwrap_or(sentencepiece);
    let add_eos = file
        .boolean("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false);
    let mut tokenizer = if sentencepiece {
        spm_from_metadata(file, &tokens, ids.unk)?
    } else {
        let merges = strings(file, "tokenizer.ggml.merges")?
            .ok_or_else(|| file.err("metadata tokenizer.ggml.merges: missing"))?;
        respell_byte_level(&mut tokens);
        let pre = file.string("tokenizer.ggml.pre")?.unwrap_or("default");
        byte_level_tokenizer(file, &tokens, split_merges(file, &merges)?, pre)?
    };
    add_typed_tokens(&mut tokenizer, &tokens, &types, file)?;
    let name = |id: Option<u32>| id.map(|i| tokens[i as usize].clone());
    if let Some(post) = post_processor(
        file,
        name(ids.bos).zip(ids.bos).filter(|_| add_bos),
        name(ids.eos).zip(ids.eos).filter(|_| add_eos),
    )? {
        tokenizer.with_post_processor(Some(post));
    }
    let mut cfg = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": false,
    });
    let arch = file.string("general.architecture")?.unwrap_or("llama");
    if let Some(n) = file.uint(&format!("{arch}.context_length"))? {
        cfg["model_max_length"] = json!(n);
    }
    for (field, id) in [
        ("bos_token", ids.bos),
        ("eos_token", ids.eos),
        ("unk_token", ids.unk),
        ("pad_token", ids.pad),
    ] {
        if let Some(t) = name(id) {
            cfg[field] = json!(t);
        }
    }
    if let Some(t) = file.string("tokenizer.chat_template")? {
        cfg["chat_template"] = json!(t);
    }
    Ok(GgufText {
        tokenizer,
        tokenizer_config: cfg,
        eos_ids: ids.end,
        bos_id: ids.bos,
    })
}

/// A SentencePiece BPE: merges of the file, or derived from its scores.
fn spm_from_metadata(file: &GgufFile, tokens: &[String], unk: Option<u32>) -> R<Tokenizer> {
    let add_space_prefix = file
        .boolean("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
    let merges = match strings(file, "tokenizer.ggml.merges")? {
        Some(m) => split_merges(file, &m)?,
        None => {
            let scores = numbers(file, "tokenizer.ggml.scores")?.ok_or_else(|| {
                file.err("metadata tokenizer.ggml.scores: missing (needed without merges)")
            })?;
            generate_merges(tokens, &scores)
        }
    };
    sentencepiece_tokenizer(file, tokens, merges, unk, add_space_prefix)
}

fn split_merges(file: &GgufFile, merges: &[String]) -> R<Vec<(String, String)>> {
    merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| {
                    file.err(format!(
                        "metadata tokenizer.ggml.merges: {m:?} is not two tokens"
                    ))
                })
        })
        .collect()
}

/// Tokens of a byte-level vocabulary that llama.cpp stored as plain text (outside the
/// byte-level alphabet) are spelled in it, as `transformers` does.
fn respell_byte_level(tokens: &mut [String]) {
    let map = bytes_to_unicode();
    let alphabet: std::collections::HashSet<char> = map.values().copied().collect();
    for t in tokens.iter_mut() {
        if !t.chars().all(|c| alphabet.contains(&c)) {
            *t = t.bytes().map(|b| map[&b]).collect();
        }
    }
}

fn vocab(tokens: &[String]) -> Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect()
}

fn byte_level_tokenizer(
    file: &GgufFile,
    tokens: &[String],
    merges: Vec<(String, String)>,
    pre: &str,
) -> R<Tokenizer> {
    let bpe = BPE::builder()
        .vocab_and_merges(vocab(tokens), merges)
        .build()
        .map_err(|e| tok_err(file, "BPE", e))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let pre_tok: PreTokenizerWrapper = match (pre_split(pre), DIGIT_SPLIT_PRE.contains(&pre)) {
        (Some(regex), _) => {
            let split = Split::new(
                SplitPattern::Regex(regex.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| tok_err(file, "split regex", e))?;
            PreSequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into()
        }
        (None, true) => PreSequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        (None, false) => ByteLevel::new(false, true, true).into(),
    };
    tokenizer.with_pre_tokenizer(Some(pre_tok));
    tokenizer.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    Ok(tokenizer)
}

fn sentencepiece_tokenizer(
    file: &GgufFile,
    tokens: &[String],
    merges: Vec<(String, String)>,
    unk: Option<u32>,
    add_space_prefix: bool,
) -> R<Tokenizer> {
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab(tokens), merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(u) = unk {
        builder = builder.unk_token(tokens[u as usize].clone());
    }
    let bpe = builder.build().map_err(|e| tok_err(file, "BPE", e))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let scheme = if add_space_prefix {
        PrependScheme::First
    } else {
        PrependScheme::Never
    };
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', scheme, false)));
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new("▁", " ")
            .map_err(|e| tok_err(file, "decoder", e))?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Merges implied by a SentencePiece vocabulary and its scores: every split of a token into
/// two tokens of the vocabulary, best score first (`transformers`' `generate_merges`).
fn generate_merges(tokens: &[String], scores: &[f64]) -> Vec<(String, String)> {
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(usize, usize, f64)> = Vec::new();
    for (t, &score) in tokens.iter().zip(scores) {
        let mut local: Vec<(usize, usize, f64)> = t
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| Some((*index.get(&t[..at])?, *index.get(&t[at..])?, score)))
            .collect();
        local.sort_by_key(|&(l, r, _)| (l, r));
        merges.extend(local);
    }
    // Stable sort, best score first; ties by the pieces' lengths, longest first (Python's
    // `sorted(..., key=(score, len(l), len(r)), reverse=True)`).
    let len = |i: usize| tokens[i].chars().count();
    merges.sort_by(|a, b| {
        (b.2, len(b.0), len(b.1))
            .partial_cmp(&(a.2, len(a.0), len(a.1)))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    merges
        .into_iter()
        .map(|(l, r, _)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}

/// Control tokens (type 3) as special tokens, user-defined ones (type 4) as added tokens.
fn add_typed_tokens(
    tokenizer: &mut Tokenizer,
    tokens: &[String],
    types: &[f64],
    file: &GgufFile,
) -> R<()> {
    let of = |ty: f64| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(types)
            .filter(|(_, t)| **t == ty)
            .map(|(tok, _)| AddedToken::from(tok.clone(), ty == 3.0).normalized(false))
            .collect()
    };
    tokenizer
        .add_special_tokens(of(3.0))
        .map_err(|e| tok_err(file, "control tokens", e))?;
    tokenizer
        .add_tokens(of(4.0))
        .map_err(|e| tok_err(file, "user-defined tokens", e))?;
    Ok(())
}

/// BOS (and EOS) around every encoded text, when the metadata asks for them.
fn post_processor(
    file: &GgufFile,
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
) -> R<Option<TemplateProcessing>> {
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let mut single: Vec<String> = Vec::new();
    let mut specials: Vec<(String, u32)> = Vec::new();
    if let Some(b) = bos {
        single.push(b.0.clone());
        specials.push(b);
    }
    single.push("$A".into());
    if let Some(e) = eos {
        single.push(e.0.clone());
        specials.push(e);
    }
    let mut pair = single.clone();
    pair.extend(single.iter().map(|p| {
        if p == "$A" {
            "$B:1".to_owned()
        } else {
            format!("{p}:1")
        }
    }));
    TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair))
        .map_err(|e| tok_err(file, "template", e))?
        .special_tokens(specials)
        .build()
        .map(Some)
        .map_err(|e| tok_err(file, "template", e))
}
