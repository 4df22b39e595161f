//! Text in and out of a model: a Hugging Face `tokenizer.json` (through the `tokenizers`
//! crate), the chat template of `tokenizer_config.json` rendered with minijinja the way
//! `transformers` renders it, the end-of-sequence ids, and incremental detokenization that
//! never emits half of a UTF-8 character, and stop strings matched on the streamed text
//! ([`StopMatcher`]).
//!
//! [`TextCodec`] is cheap to clone (shared, immutable) and `Send + Sync`, so a gateway keeps one
//! and hands clones to its request tasks.

mod chat_encode;
#[cfg(feature = "model")]
pub mod gguf;
mod plain;
mod stop;
#[cfg(all(test, feature = "model"))]
mod tests;

pub use stop::{StopCheck, StopMatcher};

use crate::error::EngineError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use tokenizers::Tokenizer;

/// One message of a chat conversation (`role` is usually `system`, `user` or `assistant`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant's calls, as Hugging Face templates take them: `[{"id", "type",
    /// "function": {"name", "arguments"}}]` with `arguments` an object. Absent (undefined in
    /// the template) when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The participant's name (OpenAI's `name`): templates that know it render it (as
    /// `message.name`); absent (undefined in the template) when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Tokenizer, chat template and end-of-sequence ids of one model.
#[derive(Clone)]
pub struct TextCodec {
    inner: Arc<Inner>,
}

struct Inner {
    tokenizer: Tokenizer,
    /// Holds the template `chat` when the model has one.
    env: Option<minijinja::Environment<'static>>,
    /// The template's source (what it supports, e.g. `tools`, is read from it).
    template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_ids: Vec<u32>,
    vocab_size: usize,
    /// Each token's bytes (`token_bytes`), read from the vocabulary on first use.
    raw_bytes: std::sync::OnceLock<Option<Vec<Vec<u8>>>>,
    /// Special tokens' texts and a tokenizer that reads them as text, made on first use.
    plain: std::sync::OnceLock<plain::PlainText>,
}

impl std::fmt::Debug for TextCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextCodec")
            .field("vocab_size", &self.inner.vocab_size)
            .field("eos_ids", &self.inner.eos_ids)
            .field("chat_template", &self.inner.env.is_some())
            .finish()
    }
}

/// Reads a JSON file; `Ok(None)` when it does not exist.
pub(crate) fn read_json(path: &Path) -> Result<Option<Value>, EngineError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(EngineError::model_files(path, format!("cannot read: {e}"))),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| EngineError::model_files(path, format!("not valid JSON: {e}")))
}

/// A special token in `tokenizer_config.json`: a string, or an object with `content`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `eos_token_id` of `config.json` / `generation_config.json`: a number or a list of them.
fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|n| n as u32))
            .collect(),
        _ => Vec::new(),
    }
}

/// The chat template: `chat_template` of `tokenizer_config.json` (a string, or a list of named
/// templates of which `default` is used), else a `chat_template.jinja` file beside it.
fn chat_template(dir: &Path, cfg: Option<&Value>) -> Result<Option<String>, EngineError> {
    let cfg_path = dir.join("tokenizer_config.json");
    match cfg.and_then(|c| c.get("chat_template")) {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
            };
            return match named("default") {
                Some(t) => Ok(Some(t.to_owned())),
                None => Err(EngineError::model_files(
                    &cfg_path,
                    "field chat_template: a list without a template named \"default\"",
                )),
            };
        }
        Some(Value::Null) | None => {}
        Some(_) => {
            return Err(EngineError::model_files(
                &cfg_path,
                "field chat_template: expected a string or a list of {name, template}",
            ))
        }
    }
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(EngineError::model_files(
            &jinja,
            format!("cannot read: {e}"),
        )),
    }
}

/// A minijinja environment that renders Hugging Face chat templates as `transformers` does:
/// `trim_blocks` and `lstrip_blocks` on, Python string methods (`strip`, `startswith`, ...),
/// `raise_exception(msg)` that fails the render with `msg`.
fn chat_env(template: String) -> Result<minijinja::Environment<'static>, minijinja::Error> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_template_owned("chat", template)?;
    Ok(env)
}

impl TextCodec {
    /// Loads `tokenizer.json` (required), `tokenizer_config.json` (chat template, BOS/EOS
    /// tokens), `generation_config.json` and `config.json` (EOS ids) from a Hugging Face model
    /// directory; or, when `dir` is a GGUF file, the same from its metadata ([`gguf`]). A
    /// missing chat template is not an error until a chat is rendered.
    pub fn from_model_dir(dir: &Path) -> Result<TextCodec, EngineError> {
        #[cfg(feature = "model")]
        if crate::model::gguf::is_gguf(dir) {
            let file = crate::model::gguf::GgufFile::open(dir)?;
            return TextCodec::from_gguf(&file);
        }
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(EngineError::model_files(
                &tok_path,
                "not found (a tokenizer is required)",
            ));
        }
        let tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| {
            EngineError::model_files(&tok_path, format!("cannot load the tokenizer: {e}"))
        })?;
        let tok_cfg = read_json(&dir.join("tokenizer_config.json"))?;
        let gen_cfg = read_json(&dir.join("generation_config.json"))?;
        let model_cfg = read_json(&dir.join("config.json"))?;
        let mut eos_ids = ids_of(gen_cfg.as_ref().and_then(|c| c.get("eos_token_id")));
        eos_ids.extend(ids_of(
            model_cfg.as_ref().and_then(|c| c.get("eos_token_id")),
        ));
        let template = chat_template(dir, tok_cfg.as_ref())?;
        let cfg_path = dir.join("tokenizer_config.json");
        TextCodec::from_parts(tokenizer, tok_cfg.as_ref(), eos_ids, template, &cfg_path)
    }

    /// The tokenizer, special tokens and chat template of a GGUF file's metadata.
    #[cfg(feature = "model")]
    pub fn from_gguf(file: &crate::model::gguf::GgufFile) -> Result<TextCodec, EngineError> {
        let text = gguf::from_gguf(file)?;
        let template = text
            .tokenizer_config
            .get("chat_template")
            .and_then(Value::as_str)
            .map(str::to_owned);
        TextCodec::from_parts(
            text.tokenizer,
            Some(&text.tokenizer_config),
            text.eos_ids,
            template,
            file.path(),
        )
    }

    /// `source` names the file of the template in errors.
    fn from_parts(
        tokenizer: Tokenizer,
        tok_cfg: Option<&Value>,
        mut eos_ids: Vec<u32>,
        template: Option<String>,
        source: &Path,
    ) -> Result<TextCodec, EngineError> {
        let bos_token = token_text(tok_cfg.and_then(|c| c.get("bos_token")));
        let eos_token = token_text(tok_cfg.and_then(|c| c.get("eos_token")));
        if let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
            eos_ids.push(id);
        }
        let mut seen = std::collections::BTreeSet::new();
        eos_ids.retain(|id| seen.insert(*id));
        let source_text = template.clone();
        let env = match template {
            Some(t) => Some(chat_env(t).map_err(|e| {
                EngineError::model_files(
                    source,
                    format!("field chat_template: not a valid template: {e:#}"),
                )
            })?),
            None => None,
        };
        let vocab_size = tokenizer.get_vocab_size(true);
        Ok(TextCodec {
            inner: Arc::new(Inner {
                tokenizer,
                env,
                template: source_text,
                bos_token,
                eos_token,
                eos_ids,
                vocab_size,
                raw_bytes: std::sync::OnceLock::new(),
                plain: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Token ids of `text`. `add_special_tokens`: apply the tokenizer's post-processor (e.g.
    /// prepend BOS); use `false` for text rendered by a chat template, which carries its own.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EngineError> {
        self.inner
            .tokenizer
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EngineError::Text(format!("cannot tokenize: {e}")))
    }

    /// `ids` between the special tokens the tokenizer's post-processor adds to a text (BOS
    /// before, EOS after, as `encode(text, true)` places them).
    pub fn with_special_tokens(&self, ids: Vec<u32>) -> Result<Vec<u32>, EngineError> {
        let bare = self.encode("a", false)?;
        let full = self.encode("a", true)?;
        let at = full
            .windows(bare.len().max(1))
            .position(|w| w == bare.as_slice())
            .ok_or_else(|| {
                EngineError::Text("the tokenizer's special tokens cannot be placed".into())
            })?;
        let mut out = full[..at].to_vec();
        out.extend(ids);
        out.extend_from_slice(&full[at + bare.len()..]);
        Ok(out)
    }

    /// The prompt text of a chat, ending with the assistant's turn header
    /// (`add_generation_prompt`).
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        self.render_chat(messages, true)
    }

    /// Renders the chat template with `messages`, `bos_token`, `eos_token` and
    /// `add_generation_prompt`. Errors: the model has no template, or the template raised
    /// (`raise_exception`) or failed.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.render_chat_with_tools(messages, None, add_generation_prompt)
    }

    /// The chat template's source, when the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.template.as_deref()
    }

    /// [`TextCodec::render_chat`] with `tools` (OpenAI's tool objects) passed to the template
    /// as Hugging Face templates take them.
    pub fn render_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        let env = self.inner.env.as_ref().ok_or_else(|| {
            EngineError::Text(
                "the model has no chat template (tokenizer_config.json: chat_template)".into(),
            )
        })?;
        let tmpl = env
            .get_template("chat")
            .map_err(|e| EngineError::Text(format!("chat template: {e}")))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => tools,
            bos_token => self.inner.bos_token.as_deref().unwrap_or(""),
            eos_token => self.inner.eos_token.as_deref().unwrap_or(""),
            add_generation_prompt => add_generation_prompt,
        })
        .map_err(|e| EngineError::Text(format!("chat template: {e}")))
    }

    /// The token ids of a chat prompt: the rendered template, tokenized without adding
    /// special tokens again; special tokens' texts in the messages' content are plain text
    /// (only the template writes control tokens).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        self.encode_chat_content_as_text(messages, None)
    }

    fn plain_text(&self) -> &plain::PlainText {
        self.inner
            .plain
            .get_or_init(|| plain::PlainText::new(&self.inner.tokenizer))
    }

    /// Whether the model has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.inner.env.is_some()
    }

    /// Text of `ids`, special tokens skipped. Ids outside the vocabulary are skipped; an
    /// incomplete UTF-8 sequence at the end becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// The bytes token `id` stands for, where the vocabulary holds them, as OpenAI's
    /// `logprobs.content[].bytes` reports them: a byte-level or byte-fallback token holding
    /// part of a multi-byte character is not valid UTF-8 alone, so its text (U+FFFD) is not
    /// its bytes. `None` for special tokens, ids outside the vocabulary and vocabularies
    /// [`TextCodec::byte_tokenizer`] cannot read: the token's text's bytes are then its bytes.
    /// The table is read on first use.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let table = self
            .inner
            .raw_bytes
            .get_or_init(|| self.byte_tokenizer().ok().map(|t| t.token_bytes()));
        let b = table.as_ref()?.get(id as usize)?;
        // The reader marks a special token by a first byte 0xFF before its name (a lone 0xFF
        // is the byte token for 0xFF).
        let special = b.len() > 1 && b[0] == llguidance::toktrie::TokTrie::SPECIAL_TOKEN_MARKER;
        (!b.is_empty() && !special).then_some(b.as_slice())
    }

    /// llguidance's reader of this tokenizer's vocabulary (each token's bytes, the special
    /// tokens): what structured outputs ([`crate::grammar::GrammarCompiler`]) and
    /// [`TextCodec::token_bytes`] are built on. It panics on tokenizer types it does not know
    /// (neither byte-level nor byte-fallback); that is an error here.
    pub fn byte_tokenizer(&self) -> Result<toktrie_hf_tokenizers::ByteTokenizer, String> {
        let json = self
            .inner
            .tokenizer
            .to_string(false)
            .map_err(|e| format!("serializing the tokenizer: {e}"))?;
        std::panic::catch_unwind(|| {
            toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes())
        })
        .map_err(|_| "reading the tokenizer: a tokenizer type llguidance cannot read".to_string())?
        .map_err(|e| format!("reading the tokenizer: {e}"))
    }

    /// Text of `ids` with special tokens kept (as `transformers`' `decode` by default).
    pub fn decode_with_special(&self, ids: &[u32]) -> String {
        self.inner.tokenizer.decode(ids, false).unwrap_or_default()
    }

    /// Ids that end generation: `generation_config.json` and `config.json` `eos_token_id`,
    /// and the `eos_token` of `tokenizer_config.json`, without duplicates.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// The id of a token string (e.g. a special token), if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.tokenizer.token_to_id(token)
    }

    /// The underlying tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// A detokenizer for one generated stream.
    pub fn incremental_decoder(&self) -> IncrementalDecoder {
        IncrementalDecoder {
            codec: self.clone(),
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }
}

/// Turns a stream of token ids into text pieces. Each [`push`](Self::push) returns only text
/// that is complete: a character whose bytes span several tokens comes out once its last byte
/// has arrived. The concatenation of every piece and [`finish`](Self::finish) equals
/// [`TextCodec::decode`] of all the ids.
///
/// It decodes a short window (the tokens of the previous piece plus the new ones) and emits
/// the difference, as TGI does, so tokenizers that strip a leading space from a decode
/// (SentencePiece) still get the space between pieces right, and each push costs O(window).
pub struct IncrementalDecoder {
    codec: TextCodec,
    ids: Vec<u32>,
    /// Start of the window: the tokens already emitted that give the next piece its context.
    prefix: usize,
    /// Tokens up to here have been emitted.
    read: usize,
}

impl IncrementalDecoder {
    /// Adds one token; returns the text it completed (often empty for a partial character).
    pub fn push(&mut self, token: u32) -> String {
        self.ids.push(token);
        let before = self.codec.decode(&self.ids[self.prefix..self.read]);
        let now = self.codec.decode(&self.ids[self.prefix..]);
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') {
            if let Some(piece) = now.get(before.len()..).filter(|_| now.starts_with(&before)) {
                let piece = piece.to_owned();
                self.prefix = self.read;
                self.read = self.ids.len();
                return piece;
            }
        }
        String::new()
    }

    /// Text not emitted yet (a trailing incomplete character comes out as U+FFFD).
    pub fn finish(&mut self) -> String {
        let before = self.codec.decode(&self.ids[self.prefix..self.read]);
        let now = self.codec.decode(&self.ids[self.prefix..]);
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        match now.strip_prefix(&before) {
            Some(rest) => rest.to_owned(),
            None => now,
        }
    }

    /// Every token pushed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.ids
    }
}
