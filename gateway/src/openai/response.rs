//! The JSON that OpenAI clients expect back: full bodies, stream chunks and `usage`.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::generate::{Generation, Outcome, TokenLogprob};
use crate::tools::{ToolCall, ToolStream};
use crate::validate::Endpoint;

/// OpenAI's `usage`, with `prompt_tokens_details.cached_tokens`: the prompt tokens found in
/// the prefix cache (0 when none were, or before the request was admitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }

    /// The usage of a finished request.
    pub fn of(o: &Outcome) -> Usage {
        Usage::new(o.prompt_tokens, o.completion_tokens, o.cached.tokens())
    }

    /// The usage so far of a running request (continuous usage statistics).
    pub fn live(g: &Generation) -> Usage {
        Usage::new(g.prompt_tokens(), g.completion_tokens(), g.cached_tokens())
    }

    /// The usage of one choice of `n` > 1 or `best_of` > 1: as OpenAI counts it, a prompt's
    /// tokens (and its cached tokens) once, with its first choice; each choice's own
    /// completion tokens.
    pub fn of_choice(o: &Outcome, first_of_prompt: bool) -> Usage {
        if first_of_prompt {
            Usage::of(o)
        } else {
            Usage::of(o).without_prompt()
        }
    }

    /// Only the completion tokens (a later choice of a prompt already counted).
    pub fn without_prompt(self) -> Usage {
        Usage::new(0, self.completion_tokens, 0)
    }

    /// The usage of two choices together (`n` > 1, lists of prompts).
    pub fn sum(self, other: Usage) -> Usage {
        Usage::new(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.prompt_tokens_details.cached_tokens + other.prompt_tokens_details.cached_tokens,
        )
    }
}

/// What every body and chunk of one response shares.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// Usage in every text chunk too (`continuous_usage_stats`).
    pub continuous_usage: bool,
    /// Completions with `echo`: the prompt's text, sent first.
    pub echo: Option<String>,
    /// Completions with `echo` and `logprobs`: the prompt's first token's text, whose entry
    /// (log-probability `null`) leads the `logprobs`; the prompt's other tokens follow, then
    /// the answer's.
    pub echo_first: Option<String>,
    /// The request asked for log-probabilities.
    pub logprobs: bool,
    /// Characters of completion text reported so far (`text_offset` of completions).
    offset: Cell<usize>,
    /// Chat with tools: the answer's text is split into content and tool calls.
    pub tools: Option<RefCell<ToolStream>>,
    /// Tool calls sent so far in the stream (the next one's `index`).
    calls_sent: Cell<u32>,
    /// Streamed chat with tools: log-probability entries of tokens whose text the tool parser
    /// holds back or turned into a call; they go with the next content, or before the finish.
    pub held_logprobs: RefCell<Vec<crate::generate::TokenLogprob>>,
}

#[derive(Serialize)]
struct Full<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    /// `[choice; 1]`, or a list.
    choices: C,
    usage: Usage,
}

#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<Value>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    message: ChatMessageOut<'a>,
    logprobs: Option<Value>,
    finish_reason: &'a str,
}

#[derive(Serialize)]
struct ChatMessageOut<'a> {
    role: &'static str,
    /// `null` when the answer is only tool calls.
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<Value>>,
}

#[derive(Serialize)]
struct Chunk<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize)]
struct DeltaChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<Value>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<Value>>,
}

/// One stream event: text (possibly empty, for the chat's opening role chunk), the finish, or
/// the usage-only chunk.
pub enum ChunkKind<'a> {
    Open,
    /// Text and the log-probabilities of its tokens (empty unless requested).
    Text(&'a str, &'a [TokenLogprob]),
    Finish(&'a str),
    Usage(Usage),
    /// Chat: one whole tool call, as one tool-call delta.
    Call(&'a ToolCall),
    /// Chat: a tool call opens (index, id, name; empty arguments).
    CallStart(&'a ToolCall),
    /// Chat: the next piece of the open tool call's arguments.
    CallArgs(&'a str),
}

impl ResponseMeta {
    pub fn new(
        endpoint: Endpoint,
        model: &str,
        include_usage: bool,
        logprobs: bool,
    ) -> ResponseMeta {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        ResponseMeta {
            endpoint,
            id: response_id(prefix),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: model.to_string(),
            include_usage,
            continuous_usage: false,
            echo: None,
            echo_first: None,
            logprobs,
            offset: Cell::new(0),
            tools: None,
            calls_sent: Cell::new(0),
            held_logprobs: RefCell::new(Vec::new()),
        }
    }

    /// Whether the stream has sent a tool call (its finish reason is then `tool_calls`).
    pub fn called(&self) -> bool {
        self.calls_sent.get() > 0
    }

    /// The `logprobs` value of a choice: `null` unless requested.
    fn logprobs_value(&self, entries: &[TokenLogprob]) -> Option<Value> {
        if !self.logprobs {
            return None;
        }
        Some(match self.endpoint {
            Endpoint::Completions => {
                let mut offsets = Vec::with_capacity(entries.len() + 1);
                let mut tokens = Vec::with_capacity(entries.len() + 1);
                let mut token_logprobs = Vec::with_capacity(entries.len() + 1);
                let mut top_logprobs = Vec::with_capacity(entries.len() + 1);
                if let Some(first) = &self.echo_first {
                    // The prompt's first token has nothing before it to be scored by.
                    tokens.push(first.as_str());
                    token_logprobs.push(Value::Null);
                    top_logprobs.push(Value::Null);
                    offsets.push(self.offset.get());
                    self.offset.set(self.offset.get() + first.chars().count());
                }
                for e in entries {
                    offsets.push(self.offset.get());
                    self.offset
                        .set(self.offset.get() + e.token.text.chars().count());
                    tokens.push(&e.token.text);
                    token_logprobs.push(json!(e.logprob));
                    top_logprobs.push(Value::Object(
                        e.top
                            .iter()
                            .map(|(t, p)| (t.text.clone(), json!(p)))
                            .collect(),
                    ));
                }
                json!({
                    "tokens": tokens,
                    "token_logprobs": token_logprobs,
                    "top_logprobs": top_logprobs,
                    "text_offset": offsets,
                })
            }
            Endpoint::Chat => {
                // `bytes`: what the token stands for, also where it holds only part of a
                // multi-byte character (its `token` text is then U+FFFD).
                let item = |t: &crate::generate::TokenText, p: f32| json!({"token": t.text, "logprob": p, "bytes": t.bytes});
                json!({"content": entries.iter().map(|e| {
                    let mut v = item(&e.token, e.logprob);
                    v["top_logprobs"] = e.top.iter().map(|(t, p)| item(t, *p)).collect();
                    v
                }).collect::<Vec<_>>()})
            }
        })
    }

    /// The non-streamed body; `logprobs` holds every token's entry when requested.
    pub fn full_body(
        &self,
        text: &str,
        finish_reason: &str,
        usage: Usage,
        logprobs: &[TokenLogprob],
    ) -> Response {
        let logprobs = self.logprobs_value(logprobs);
        let bytes = match self.endpoint {
            Endpoint::Completions => serde_json::to_vec(&Full {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                choices: [TextChoice {
                    index: 0,
                    text,
                    logprobs,
                    finish_reason: Some(finish_reason),
                }],
                usage,
            }),
            Endpoint::Chat => {
                let parsed = self.tools.as_ref().map(|t| t.borrow().parse_whole(text));
                let (content, calls) = match &parsed {
                    Some(p) if !p.calls.is_empty() => (
                        (!p.content.is_empty()).then_some(p.content.as_str()),
                        Some(p.calls.iter().map(ToolCall::to_json).collect()),
                    ),
                    _ => (Some(text), None),
                };
                let finish_reason = if calls.is_some() {
                    "tool_calls"
                } else {
                    finish_reason
                };
                serde_json::to_vec(&Full {
                    id: &self.id,
                    object: "chat.completion",
                    created: self.created,
                    model: &self.model,
                    choices: [ChatChoice {
                        index: 0,
                        message: ChatMessageOut {
                            role: "assistant",
                            content,
                            tool_calls: calls,
                        },
                        logprobs,
                        finish_reason,
                    }],
                    usage,
                })
            }
        };
        let mut resp = bytes.unwrap_or_default().into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }

    /// The non-streamed body of several choices (a completion with several prompts or `n` >
    /// 1, a chat with `n` > 1): `(text, finish_reason)` in order, and the usage of all.
    pub fn full_body_many(&self, choices: &[(String, &str)], usage: Usage) -> Response {
        let bytes = match self.endpoint {
            Endpoint::Completions => serde_json::to_vec(&Full {
                id: &self.id,
                object: "text_completion",
                created: self.created,
                model: &self.model,
                choices: choices
                    .iter()
                    .enumerate()
                    .map(|(i, (text, finish))| text_choice(i as u32, text, None, Some(finish)))
                    .collect::<Vec<_>>(),
                usage,
            }),
            Endpoint::Chat => serde_json::to_vec(&Full {
                id: &self.id,
                object: "chat.completion",
                created: self.created,
                model: &self.model,
                choices: choices
                    .iter()
                    .enumerate()
                    .map(|(i, (text, finish))| ChatChoice {
                        index: i as u32,
                        message: ChatMessageOut {
                            role: "assistant",
                            content: Some(text),
                            tool_calls: None,
                        },
                        logprobs: None,
                        finish_reason: finish,
                    })
                    .collect::<Vec<_>>(),
                usage,
            }),
        };
        let mut resp = bytes.unwrap_or_default().into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }

    /// One `data: …\n\n` event of the stream.
    pub fn chunk(&self, kind: ChunkKind<'_>) -> Bytes {
        self.chunk_with(kind, None)
    }

    /// [`ResponseMeta::chunk`] carrying `usage` (continuous usage statistics).
    pub fn chunk_with(&self, kind: ChunkKind<'_>, live: Option<Usage>) -> Bytes {
        self.chunk_for(0, kind, live)
    }

    /// A chunk of choice `index` (completions with a list of prompts).
    pub fn chunk_for(&self, index: u32, kind: ChunkKind<'_>, live: Option<Usage>) -> Bytes {
        let json = match self.endpoint {
            Endpoint::Completions => {
                let (choices, usage) = match kind {
                    ChunkKind::Open => (vec![], None),
                    ChunkKind::Text(t, lp) => (
                        vec![text_choice(index, t, self.logprobs_value(lp), None)],
                        None,
                    ),
                    ChunkKind::Finish(r) => (vec![text_choice(index, "", None, Some(r))], None),
                    ChunkKind::Usage(u) => (vec![], Some(u)),
                    ChunkKind::Call(_) | ChunkKind::CallStart(_) | ChunkKind::CallArgs(_) => {
                        (vec![], None)
                    }
                };
                serde_json::to_vec(&self.wrap("text_completion", choices, usage.or(live)))
            }
            Endpoint::Chat => {
                let (choices, usage) = match kind {
                    ChunkKind::Open => (
                        vec![delta(
                            index,
                            Delta {
                                role: Some("assistant"),
                                content: Some(""),
                                tool_calls: None,
                            },
                            None,
                        )],
                        None,
                    ),
                    ChunkKind::Text(t, lp) => {
                        let content = Delta {
                            role: None,
                            content: Some(t),
                            tool_calls: None,
                        };
                        let mut d = delta(index, content, None);
                        d.logprobs = self.logprobs_value(lp);
                        (vec![d], None)
                    }
                    ChunkKind::Finish(r) => (vec![delta(index, Delta::default(), Some(r))], None),
                    ChunkKind::Usage(u) => (vec![], Some(u)),
                    ChunkKind::Call(c) | ChunkKind::CallStart(c) => {
                        let i = self.calls_sent.get();
                        self.calls_sent.set(i + 1);
                        let mut call = c.to_json();
                        call["index"] = json!(i);
                        (vec![delta(index, calls_delta(call), None)], None)
                    }
                    ChunkKind::CallArgs(piece) => {
                        // The call opened last (`CallStart`) has index `calls_sent - 1`.
                        let i = self.calls_sent.get().saturating_sub(1);
                        let call = json!({"index": i, "function": {"arguments": piece}});
                        (vec![delta(index, calls_delta(call), None)], None)
                    }
                };
                serde_json::to_vec(&self.wrap("chat.completion.chunk", choices, usage.or(live)))
            }
        };
        event(&json.unwrap_or_default())
    }

    fn wrap<'a, C>(
        &'a self,
        object: &'static str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> Chunk<'a, C> {
        Chunk {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices,
            usage,
        }
    }
}

fn text_choice<'a>(
    index: u32,
    text: &'a str,
    logprobs: Option<Value>,
    finish_reason: Option<&'a str>,
) -> TextChoice<'a> {
    TextChoice {
        index,
        text,
        logprobs,
        finish_reason,
    }
}

fn delta<'a>(index: u32, delta: Delta<'a>, finish_reason: Option<&'a str>) -> DeltaChoice<'a> {
    DeltaChoice {
        index,
        delta,
        logprobs: None,
        finish_reason,
    }
}

/// `data: <json>\n\n`.
pub fn event(json: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(json.len() + 8);
    b.extend_from_slice(b"data: ");
    b.extend_from_slice(json);
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// A chat delta carrying one tool-call object.
fn calls_delta<'a>(call: Value) -> Delta<'a> {
    Delta {
        tool_calls: Some(vec![call]),
        ..Delta::default()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A response id: unique within this process, not guessable across restarts.
fn response_id(prefix: &str) -> String {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let salt = *SALT.get_or_init(rand::random::<u32>);
    format!("{prefix}-{salt:08x}{n:012x}")
}

static SALT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
