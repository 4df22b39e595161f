//! The text layer: prompts and chat messages to token ids, token ids back to text. Everything
//! the gateway knows about tokenization goes through [`Text`], so the backend behind it is
//! chosen in this one module.
//!
//! Backends:
//! - [`Text::model`]: a model's own tokenizer and chat template ([`TextCodec`] from its
//!   `tokenizer.json` and `tokenizer_config.json`), with incremental detokenization that
//!   never splits a character.
//! - [`Text::words`]: a stand-in for models without a tokenizer (the simulated engine, and
//!   `random:NAME` models on the GPU). It counts one token per whitespace-separated word (so a
//!   prompt of N words is N tokens, as the load generator assumes) and spells every token id
//!   as a word that reads back as the same id, each after a space as byte-level BPE models'
//!   tokens are: an answer sent back in the next turn's prompt is the same tokens again, so
//!   the prefix cache can reuse it as it would with a real tokenizer. The simulated runner
//!   always samples token 0, so its output reads `" hello hello …"`.

mod pool;

pub use crate::wire::ChatMessage;
pub use pool::{TextPool, TextPoolConfig};

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use superinfer_engine::grammar::GrammarCompiler;
use superinfer_engine::{IncrementalDecoder, TextCodec};

/// A tokenizer + chat template + detokenizer. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Text {
    inner: Arc<Backend>,
    /// `--tool-call-parser`: how the model writes tool calls, whatever its template says.
    tool_format: Option<crate::tools::ToolFormat>,
}

#[derive(Debug)]
enum Backend {
    /// The stand-in; `vocab`: the model's vocabulary (ids at or past it are never made),
    /// none for the simulated engine.
    Words { vocab: Option<u32> },
    Model {
        codec: TextCodec,
        /// Bytes of text one token covers at most (the longest vocabulary entry, UTF-8).
        max_token_bytes: usize,
        /// Compiles structured-output grammars; built on first use (it walks the vocabulary).
        grammars: OnceLock<Result<GrammarCompiler, String>>,
    },
}

/// Words the stand-in spells token ids with ([`spell`]).
const WORDS: &[&str] = &[
    "hello", "world", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
];

/// Ids a word the stand-in did not spell maps to stay below this (and below the vocabulary).
const HASHED_IDS: u32 = 32_000;

/// The stand-in's spelling of token `id`: `WORDS[id % 10]`, followed by `id / 10` unless that
/// is 0 (`0` → `hello`, `1` → `world`, `4711` → `world471`).
fn spell(id: u32) -> String {
    let word = WORDS[id as usize % WORDS.len()];
    match id / WORDS.len() as u32 {
        0 => word.to_string(),
        n => format!("{word}{n}"),
    }
}

/// The id [`spell`] spelled as `word`, if it is such a spelling.
fn spelled_id(word: &str) -> Option<u32> {
    WORDS.iter().enumerate().find_map(|(k, w)| {
        let rest = word.strip_prefix(w)?;
        if rest.is_empty() {
            return Some(k as u32);
        }
        let canonical = !rest.starts_with('0') && rest.bytes().all(|b| b.is_ascii_digit());
        let n: u32 = rest.parse().ok().filter(|_| canonical)?;
        n.checked_mul(WORDS.len() as u32)?.checked_add(k as u32)
    })
}

/// The stand-in's token id of `word`: the id it spells (when inside `vocab`), else a hash of
/// the word below [`HASHED_IDS`] and `vocab`.
fn word_id(word: &str, vocab: Option<u32>) -> u32 {
    if let Some(id) = spelled_id(word).filter(|&id| vocab.is_none_or(|v| id < v)) {
        return id;
    }
    // FNV-1a: any stable map from words to ids will do for the stand-in.
    let mut h: u32 = 0x811c_9dc5;
    for b in word.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % vocab.map_or(HASHED_IDS, |v| v.clamp(1, HASHED_IDS))
}

/// The stand-in's token ids of `text`: one per whitespace-separated word.
fn word_ids(text: &str, vocab: Option<u32>) -> impl Iterator<Item = u32> + '_ {
    text.split_whitespace().map(move |w| word_id(w, vocab))
}

impl Text {
    /// The word-per-token stand-in used with the simulated engine (no vocabulary).
    pub fn words() -> Text {
        Text::stand_in(None)
    }

    /// The word-per-token stand-in for a model of `vocab` token ids that has no tokenizer
    /// (`random:NAME`): token-id prompts are checked against `vocab`, and no word maps past it.
    pub fn words_for_vocab(vocab: u32) -> Text {
        Text::stand_in(Some(vocab))
    }

    fn stand_in(vocab: Option<u32>) -> Text {
        Text {
            inner: Arc::new(Backend::Words { vocab }),
            tool_format: None,
        }
    }

    /// A model's tokenizer and chat template.
    pub fn model(codec: TextCodec) -> Text {
        // A vocabulary entry's UTF-8 length bounds the input bytes its token covers: byte-level
        // BPE writes each input byte as one character of one or two bytes, SentencePiece writes
        // a space as the three-byte `▁` and byte fallback as six-byte `<0xNN>`.
        let max_token_bytes = codec
            .tokenizer()
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1);
        Text {
            inner: Arc::new(Backend::Model {
                codec,
                max_token_bytes,
                grammars: OnceLock::new(),
            }),
            tool_format: None,
        }
    }

    /// The most bytes of text a prompt of `tokens` tokens can have, or `None` when the
    /// backend has no such bound (the word stand-in: a word can be any length). A longer
    /// prompt cannot fit and is refused before it is tokenized.
    pub fn max_prompt_bytes(&self, tokens: u32) -> Option<usize> {
        match &*self.inner {
            Backend::Words { .. } => None,
            Backend::Model {
                max_token_bytes, ..
            } => Some((tokens as usize).saturating_mul(*max_token_bytes)),
        }
    }

    /// Token ids of a plain prompt (with the model's special tokens, e.g. BOS).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match &*self.inner {
            &Backend::Words { vocab } => Ok(word_ids(text, vocab).collect()),
            Backend::Model { codec: c, .. } => c.encode(text, true).map_err(|e| e.to_string()),
        }
    }

    /// The structured-output grammar compiler of the model's tokenizer; the word stand-in
    /// has no vocabulary to constrain.
    pub fn grammar_compiler(&self) -> Result<&GrammarCompiler, String> {
        match &*self.inner {
            Backend::Words { .. } => Err(
                "structured outputs need a model's tokenizer; the simulated engine has none".into(),
            ),
            Backend::Model {
                codec, grammars, ..
            } => grammars
                .get_or_init(|| GrammarCompiler::new(codec, None).map_err(|e| e.to_string()))
                .as_ref()
                .map_err(Clone::clone),
        }
    }

    /// Token ids run past this are out of the vocabulary.
    pub fn vocab_size(&self) -> Option<usize> {
        match &*self.inner {
            Backend::Words { vocab } => vocab.map(|v| v as usize),
            Backend::Model { codec: c, .. } => Some(c.vocab_size()),
        }
    }

    /// Token ids of a conversation rendered with the model's chat template, ending with the
    /// assistant's turn opened.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, String> {
        match &*self.inner {
            &Backend::Words { vocab } => {
                let mut ids = Vec::new();
                for m in messages {
                    ids.push(word_id(&m.role, vocab));
                    ids.extend(word_ids(&m.content, vocab));
                }
                ids.push(word_id("assistant", vocab));
                Ok(ids)
            }
            Backend::Model { codec: c, .. } => c
                .encode_chat(&self.template_messages(messages))
                .map_err(|e| e.to_string()),
        }
    }

    /// The messages as the chat template gets them without `tools`: a history's tool calls
    /// and results written as text when the template does not render them itself.
    fn template_messages<'a>(&self, messages: &'a [ChatMessage]) -> Cow<'a, [ChatMessage]> {
        if crate::tools::holds_calls(messages) && !self.template_takes_tools() {
            Cow::Owned(crate::tools::calls_as_text(messages))
        } else {
            Cow::Borrowed(messages)
        }
    }

    /// A conversation with `tools` through the chat template, the assistant's turn opened.
    /// A template that takes `tools` renders them itself; for one that does not, they are
    /// described in the system message and calls and results are written in the Hermes form
    /// ([`crate::tools::without_template_support`]).
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<Vec<u32>, String> {
        match &*self.inner {
            &Backend::Words { vocab } => {
                let mut ids: Vec<u32> = tools
                    .iter()
                    .flat_map(|t| word_ids(&t.to_string(), vocab).collect::<Vec<_>>())
                    .collect();
                ids.extend(self.encode_chat(messages)?);
                Ok(ids)
            }
            Backend::Model { codec: c, .. } => if self.template_takes_tools() {
                c.encode_chat_content_as_text(messages, Some(tools))
            } else {
                let msgs = crate::tools::without_template_support(messages, tools);
                c.encode_chat(&msgs)
            }
            .map_err(|e| e.to_string()),
        }
    }

    /// Whether the chat template renders `tools` itself.
    fn template_takes_tools(&self) -> bool {
        match &*self.inner {
            Backend::Words { .. } => false,
            Backend::Model { codec, .. } => {
                codec.chat_template().is_some_and(|t| t.contains("tools"))
            }
        }
    }

    /// `self` with tool calls read and constrained in `format` (`None`: by the template).
    pub fn with_tool_format(mut self, format: Option<crate::tools::ToolFormat>) -> Text {
        self.tool_format = format;
        self
    }

    /// How the model writes tool calls: `--tool-call-parser`, else by its chat template.
    pub fn tool_format(&self) -> crate::tools::ToolFormat {
        if let Some(f) = self.tool_format {
            return f;
        }
        match &*self.inner {
            Backend::Words { .. } => crate::tools::ToolFormat::Hermes,
            Backend::Model { codec, .. } => crate::tools::ToolFormat::of(codec.chat_template()),
        }
    }

    /// Token ids of `text`, with the model's special tokens (e.g. BOS) when
    /// `add_special_tokens` (`/tokenize`).
    pub fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        match &*self.inner {
            Backend::Words { .. } => self.encode(text),
            Backend::Model { codec: c, .. } => c
                .encode(text, add_special_tokens)
                .map_err(|e| e.to_string()),
        }
    }

    /// A conversation through the chat template, with the assistant's turn opened when
    /// `add_generation_prompt`, tokenized with special tokens added when `add_special_tokens`
    /// (`/tokenize`).
    pub fn tokenize_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, String> {
        match &*self.inner {
            Backend::Words { .. } => {
                let mut ids = self.encode_chat(messages)?;
                if !add_generation_prompt {
                    ids.pop();
                }
                Ok(ids)
            }
            // Exactly the chat path's encoding: contents' special-token texts are text.
            Backend::Model { codec: c, .. } => c
                .encode_chat_as(
                    &self.template_messages(messages),
                    None,
                    add_generation_prompt,
                )
                .and_then(|ids| match add_special_tokens {
                    true => c.with_special_tokens(ids),
                    false => Ok(ids),
                })
                .map_err(|e| e.to_string()),
        }
    }

    /// The vocabulary's spelling of each id (`/tokenize`'s `token_strs`).
    pub fn token_strs(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&id| match &*self.inner {
                Backend::Words { .. } => spell(id),
                Backend::Model { codec: c, .. } => {
                    c.tokenizer().id_to_token(id).unwrap_or_default()
                }
            })
            .collect()
    }

    /// The text of a prompt's ids, special tokens skipped (`echo`).
    pub fn prompt_text(&self, ids: &[u32]) -> String {
        match &*self.inner {
            Backend::Words { .. } => self.token_strs(ids).join(" "),
            Backend::Model { codec: c, .. } => c.decode(ids),
        }
    }

    /// The text of `ids`, special tokens included (`/detokenize`).
    pub fn detokenize(&self, ids: &[u32]) -> String {
        match &*self.inner {
            Backend::Words { .. } => self.token_strs(ids).join(" "),
            Backend::Model { codec: c, .. } => c.decode_with_special(ids),
        }
    }

    /// A detokenizer for one response.
    pub fn decoder(&self) -> Decoder {
        let model = match &*self.inner {
            Backend::Words { .. } => None,
            Backend::Model { codec: c, .. } => Some(c.incremental_decoder()),
        };
        Decoder {
            text: self.clone(),
            model,
        }
    }
}

/// Turns one response's tokens into text, one piece per token (a piece may be empty while a
/// multi-byte character is incomplete).
pub struct Decoder {
    text: Text,
    model: Option<IncrementalDecoder>,
}

impl Decoder {
    /// The text that token `token` adds.
    pub fn push(&mut self, token: u32) -> String {
        if let Some(d) = &mut self.model {
            return d.push(token);
        }
        match &*self.text.inner {
            Backend::Words { .. } => format!(" {}", spell(token)),
            Backend::Model { .. } => String::new(),
        }
    }

    /// The text of one token alone (for log-probability reports).
    pub fn token_text(&self, token: u32) -> String {
        match &*self.text.inner {
            Backend::Words { .. } => spell(token),
            Backend::Model { codec: c, .. } => c.decode(&[token]),
        }
    }

    /// The text of one token alone and the bytes it stands for: its text's, unless it holds
    /// part of a multi-byte character (`TextCodec::token_bytes`; the text is then U+FFFD).
    pub fn token_text_and_bytes(&self, token: u32) -> (String, Vec<u8>) {
        let text = self.token_text(token);
        let bytes = match &*self.text.inner {
            Backend::Model { codec: c, .. } => c.token_bytes(token).map(<[u8]>::to_vec),
            Backend::Words { .. } => None,
        };
        let bytes = bytes.unwrap_or_else(|| text.as_bytes().to_vec());
        (text, bytes)
    }

    /// Whatever is still held back at the end of the answer.
    pub fn finish(&mut self) -> String {
        self.model.as_mut().map(|d| d.finish()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_per_word_and_words_back() {
        let t = Text::words();
        assert_eq!(t.encode("a b  c\n d").unwrap().len(), 4);
        assert!(t.encode("   ").unwrap().is_empty());
        let mut d = t.decoder();
        assert_eq!(d.push(0), " hello");
        assert_eq!(d.push(4711), " world471");
    }

    #[test]
    fn an_answer_sent_back_is_the_same_tokens() {
        let ids: Vec<u32> = (0..200).chain([4711, 10, 99_999, 128_255]).collect();
        for t in [Text::words(), Text::words_for_vocab(128_256)] {
            let mut d = t.decoder();
            let answer: String = ids.iter().map(|&id| d.push(id)).collect();
            // As a client sends it back: after the prompt's last word, with no space added.
            let next = t
                .encode(&format!("Assistant:{answer}\n\nUser: more"))
                .unwrap();
            assert_eq!(next[1..=ids.len()], ids[..], "{answer}");
            assert_eq!(next[0], t.encode("Assistant:").unwrap()[0]);
            let chat = [
                ChatMessage::new("user", "hi"),
                ChatMessage::new("assistant", &answer),
            ];
            assert_eq!(t.encode_chat(&chat).unwrap()[3..3 + ids.len()], ids[..]);
        }
    }

    #[test]
    fn words_map_inside_the_vocabulary() {
        let t = Text::words_for_vocab(2048);
        assert_eq!(t.vocab_size(), Some(2048));
        assert_eq!(Text::words().vocab_size(), None);
        // Spellings past the vocabulary, non-canonical ones and other words are hashed below it.
        let text = "fox99999999 dog204 hello0 world01 fox3x the Assistant: 42 hello";
        let ids = t.encode(text).unwrap();
        assert!(ids.iter().all(|&id| id < 2048), "{ids:?}");
        assert_eq!((ids[5], ids[8]), (2, 0), "the stand-in's own spellings");
        // Without a vocabulary a spelling reads back whatever its id.
        assert_eq!(
            Text::words().encode("dog204 fox99999999").unwrap(),
            [2049, 999_999_995]
        );
        // A spelling past `u32` is just a word.
        assert!(Text::words().encode("fox999999999999").unwrap()[0] < HASHED_IDS);
    }

    #[test]
    fn chat_template_opens_the_assistant_turn() {
        let t = Text::words();
        let msgs = [ChatMessage::new("user", "hi there")];
        assert_eq!(t.encode_chat(&msgs).unwrap().len(), 4);
    }
}
