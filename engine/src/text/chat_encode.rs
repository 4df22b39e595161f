//! Tokenizing a rendered chat so that only the chat template writes control tokens.
//!
//! A tokenizer turns the text of a special token (`<|im_start|>`, `<|eot_id|>`) into that
//! token wherever it appears, so a user who writes `<|im_start|>system …` in a message would
//! open a system turn of their own. Here a message's content is tokenized with special
//! tokens as plain text: the chat is rendered with a marker in place of each content (the
//! marker carries a random nonce, so content cannot forge one), the template's own text
//! between markers is tokenized as usual, and each content with special tokens disabled.
//! Chats whose content holds no special token's text (nearly all) are tokenized whole, as
//! before, so their ids are exactly those of the model's reference tokenizer.

use super::{ChatMessage, TextCodec};
use crate::error::EngineError;

impl TextCodec {
    /// Token ids of the chat `messages` (with `tools` for templates that render them),
    /// ending with the assistant's turn header. Special tokens' texts in the messages'
    /// content are tokenized as plain text.
    pub fn encode_chat_content_as_text(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
    ) -> Result<Vec<u32>, EngineError> {
        self.encode_chat_as(messages, tools, true)
    }

    /// [`TextCodec::encode_chat_content_as_text`] with the assistant's turn header only when
    /// `add_generation_prompt` (`/tokenize` encodes exactly as the chat path does). Linear in
    /// the rendered text: one pass finds every marker.
    pub fn encode_chat_as(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, EngineError> {
        let plain = self.plain_text();
        if !messages.iter().any(|m| plain.holds_special(&m.content)) {
            let text = self.render_chat_with_tools(messages, tools, add_generation_prompt)?;
            return self.encode(&text, false);
        }
        let nonce: u64 = rand::random();
        let open = format!("\u{E000}{nonce:016x}:");
        let marked: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage {
                content: format!("{open}{i}\u{E001}"),
                ..m.clone()
            })
            .collect();
        let rendered = self.render_chat_with_tools(&marked, tools, add_generation_prompt)?;
        let mut ids = Vec::new();
        let mut placed = vec![false; messages.len()];
        let mut rest = rendered.as_str();
        while let Some(at) = rest.find(&open) {
            let after = &rest[at + open.len()..];
            // The nonce is random, so only the template's copy of a marker carries it.
            let Some((i, len)) = marker_index(after).filter(|&(i, _)| i < messages.len()) else {
                ids.extend(self.encode(&rest[..at + open.len()], false)?);
                rest = after;
                continue;
            };
            ids.extend(self.encode(&rest[..at], false)?);
            let enc = plain
                .plain
                .encode(messages[i].content.as_str(), false)
                .map_err(|e| EngineError::Text(format!("cannot tokenize: {e}")))?;
            ids.extend_from_slice(enc.get_ids());
            placed[i] = true;
            rest = &after[len..];
        }
        // Every content that holds a special token must have been placed as plain text; a
        // template that transforms content (and so loses the marker) cannot keep it so.
        if (0..messages.len()).any(|i| !placed[i] && plain.holds_special(&messages[i].content)) {
            return Err(EngineError::Text(
                "a message's content holds a special token's text (such as <|im_start|>), \
                 which this model's chat template cannot keep as plain text; remove it"
                    .into(),
            ));
        }
        ids.extend(self.encode(rest, false)?);
        Ok(ids)
    }
}

/// The message index of a marker's tail (`12\u{E001}…`) and the tail's length in bytes.
fn marker_index(tail: &str) -> Option<(usize, usize)> {
    let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
    let close = tail[digits..].strip_prefix('\u{E001}')?;
    let i = tail[..digits].parse().ok()?;
    Some((i, tail.len() - close.len()))
}
