//! OpenAI's request bodies as they arrive, before validation. Every field of OpenAI's and
//! vLLM's that is not read here is refused unless null or its default, and any other field is
//! refused as unknown (`validate/fields.rs`); a known field of the wrong type is a 400 naming
//! the field.
//!
//! vLLM's extensions are read: `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`,
//! `stop_token_ids`, `min_tokens`, `stream_options.continuous_usage_stats`, `cache_salt`,
//! `structured_outputs` and the `guided_*` fields. `priority` is
//! read and has no effect: a tenant's priority comes only from its weight and SLO, never from
//! the body (DESIGN.md); `user` is OpenAI's end-user tag and has none either.
//!
//! Also the plain types that requests are checked against and turned into, shared by the
//! layers without depending on any of them: the served model ([`ModelInfo`]) and a chat
//! message after parsing ([`ChatMessage`]).

use serde::Deserialize;

/// The body of `POST /v1/completions` and `POST /v1/chat/completions`: one struct for both
/// (the handler requires `prompt` or `messages`), which keeps parsing a single pass.
#[derive(Debug, Default, Deserialize)]
pub struct Body {
    pub model: Option<String>,
    /// Completions only.
    pub prompt: Option<Prompt>,
    /// Chat only.
    pub messages: Option<Vec<Message>>,
    pub max_tokens: Option<u32>,
    /// Chat: the newer name of `max_tokens`.
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub stop: Option<Stop>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u32>,
    pub best_of: Option<u32>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    /// Completions: the number of alternatives per token; chat: a bool.
    pub logprobs: Option<serde_json::Value>,
    /// Chat: alternatives per token with `logprobs: true`.
    pub top_logprobs: Option<u32>,
    /// Chat: functions the model may call (`tools.rs`), and how it may.
    pub tools: Option<Vec<serde_json::Value>>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    pub user: Option<String>,
    /// No effect (DESIGN.md: a client cannot raise its own priority).
    pub priority: Option<i64>,
    /// Token id (as a string) → bias added to its logit, -100..=100.
    pub logit_bias: Option<std::collections::HashMap<String, f32>>,
    /// vLLM's: no end of sequence before this many tokens.
    pub min_tokens: Option<u32>,
    /// vLLM's: a salt of the prefix cache's namespace; only requests with the same salt (and
    /// the same tenant or shared namespace) share cached blocks.
    pub cache_salt: Option<String>,
    /// Structured outputs (`validate/structured.rs`): OpenAI's `response_format`, vLLM's
    /// `structured_outputs` and its older `guided_*` names.
    pub response_format: Option<serde_json::Value>,
    pub structured_outputs: Option<serde_json::Value>,
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub guided_whitespace_pattern: Option<String>,
    pub guided_decoding_backend: Option<String>,
}

/// A prompt: text, a list of one text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    /// vLLM's: usage in every chunk (with `include_usage`).
    pub continuous_usage_stats: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant's earlier calls, fed back through the chat template.
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// The participant's name (`[A-Za-z0-9_-]{1,64}`), passed to the chat template.
    pub name: Option<String>,
    /// An assistant's earlier refusal (the openai SDK echoes `null`): its text is what the
    /// assistant said, so it is taken as the content.
    pub refusal: Option<String>,
    /// An earlier answer's audio: only `null` (the model produces text only).
    pub audio: Option<serde_json::Value>,
    /// The legacy form of one call (`{"name", "arguments"}`), taken as one `tool_calls` entry.
    pub function_call: Option<serde_json::Value>,
    /// An earlier answer's citations: only `null` or `[]` (this server makes none, and a
    /// chat template has no place for them).
    pub annotations: Option<Vec<serde_json::Value>>,
}

/// Message content: text, or a list of parts of which only `text` parts are supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// The served model as validation needs it.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The `id` of `GET /v1/models`; requests naming another model get 404.
    pub id: String,
    /// Prompt plus output tokens of one request, at most.
    pub max_model_len: u32,
    /// The backend scores prompt tokens (`echo` with `logprobs`): the CPU model path does;
    /// the simulated engine and the GPU path do not.
    pub prompt_logprobs: bool,
}

/// One chat message after parsing: role, text, an assistant's calls, the call a `tool`
/// message answers, the participant's name. The engine's type, so that the chat template
/// takes the parsed conversation as it is.
pub use superinfer_engine::ChatMessage;
