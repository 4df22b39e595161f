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
        let plain = self.plain_text();
        if !messages.iter().any(|m| plain.holds_special(&m.content)) {
            let text = self.render_chat_with_tools(messages, tools, true)?;
            return self.encode(&text, false);
        }
        let nonce: u64 = rand::random();
        let marker = |i: usize| format!("\u{E000}{nonce:016x}:{i}\u{E001}");
        let marked: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage {
                content: marker(i),
                ..m.clone()
            })
            .collect();
        let rendered = self.render_chat_with_tools(&marked, tools, true)?;
        let mut ids = Vec::new();
        let mut rest = rendered.as_str();
        loop {
            let next = (0..messages.len())
                .filter_map(|i| rest.find(&marker(i)).map(|at| (at, i)))
                .min();
            let Some((at, i)) = next else { break };
            ids.extend(self.encode(&rest[..at], false)?);
            let content = &messages[i].content;
            let enc = plain
                .plain
                .encode(content.as_str(), false)
                .map_err(|e| EngineError::Text(format!("cannot tokenize: {e}")))?;
            ids.extend_from_slice(enc.get_ids());
            rest = &rest[at + marker(i).len()..];
        }
        // Every content that holds a special token must have been placed as plain text; a
        // template that transforms content (and so loses the marker) cannot keep it so.
        let placed =
            |i: usize| !rendered.contains(&marker(i)) && plain.holds_special(&messages[i].content);
        if (0..messages.len()).any(placed) {
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
