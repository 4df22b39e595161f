//! A tokenizer that reads special tokens' texts as plain text, and a matcher that finds them:
//! what tokenizing a chat's content as text needs (`chat_encode`).

use aho_corasick::AhoCorasick;
use tokenizers::Tokenizer;

/// What a codec needs to find special tokens in content and to tokenize it as plain text;
/// made on first use.
pub(super) struct PlainText {
    /// The special tokens' texts.
    specials: Option<AhoCorasick>,
    /// The tokenizer with special tokens read as text.
    pub(super) plain: Tokenizer,
}

impl PlainText {
    pub(super) fn new(tokenizer: &Tokenizer) -> PlainText {
        let texts: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        let specials = (!texts.is_empty())
            .then(|| AhoCorasick::new(&texts).ok())
            .flatten();
        let mut plain = tokenizer.clone();
        plain.set_encode_special_tokens(true);
        PlainText { specials, plain }
    }

    /// Whether `text` holds a special token's text.
    pub(super) fn holds_special(&self, text: &str) -> bool {
        self.specials.as_ref().is_some_and(|a| a.is_match(text))
    }
}
