//! The model's text → OpenAI tool calls, whole ([`parse`]); `super::stream` splits a
//! streamed answer the same way.

use serde_json::Value;

use super::{Tool, ToolFormat};

pub(super) const OPEN: &str = "<tool_call>";
pub(super) const CLOSE: &str = "</tool_call>";
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";

/// One call, as OpenAI sends it (`arguments` is a JSON string).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    pub(super) fn new(name: &str, arguments: &Value) -> ToolCall {
        ToolCall {
            arguments: arguments.to_string(),
            ..ToolCall::opening(name)
        }
    }

    /// A call of `name` with a fresh id whose arguments are still to come (streamed).
    pub(super) fn opening(name: &str) -> ToolCall {
        ToolCall {
            id: format!(
                "call_{:016x}{:08x}",
                rand::random::<u64>(),
                rand::random::<u32>()
            ),
            name: name.to_string(),
            arguments: String::new(),
        }
    }

    /// OpenAI's `tool_calls[i]` object.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "id": self.id, "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// An answer split into its text and its calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    /// The text outside the calls (trimmed); empty when the answer is only calls.
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// A call's JSON (`{"name", "arguments"}`, or `parameters` in the Llama form; arguments as
/// an object or a string holding one) naming one of `tools`.
fn call_of(v: &Value, tools: &[Tool]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?;
    if !tools.iter().any(|t| t.name == name) {
        return None;
    }
    let args = v.get("arguments").or_else(|| v.get("parameters"))?;
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
        a => a.clone(),
    };
    args.is_object().then(|| ToolCall::new(name, &args))
}

/// Splits a whole answer. Text that does not parse as a call of a listed tool stays text.
pub fn parse(text: &str, format: ToolFormat, tools: &[Tool]) -> Parsed {
    match format {
        ToolFormat::Hermes => parse_hermes(text, tools),
        ToolFormat::Llama3Json => parse_llama(text, tools),
    }
}

pub(super) fn parse_hermes(text: &str, tools: &[Tool]) -> Parsed {
    let mut out = Parsed::default();
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let (body, next) = match after.find(CLOSE) {
            Some(end) => (&after[..end], &after[end + CLOSE.len()..]),
            None => (after, ""),
        };
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| call_of(&v, tools))
        {
            Some(call) => {
                content.push_str(&rest[..start]);
                out.calls.push(call);
            }
            None => content.push_str(&rest[..rest.len() - next.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    out.content = content.trim().to_string();
    out
}

/// Llama 3.1: the whole answer is a call (or calls separated by `;`), optionally after
/// `<|python_tag|>`; anything else is text.
fn parse_llama(text: &str, tools: &[Tool]) -> Parsed {
    let body = text.trim();
    let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim();
    let mut calls = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let mut values = serde_json::Deserializer::from_str(&body[at..]).into_iter::<Value>();
        let Some(Ok(v)) = values.next() else {
            return text_only(text);
        };
        let Some(call) = call_of(&v, tools) else {
            return text_only(text);
        };
        calls.push(call);
        let rest = &body[at + values.byte_offset()..];
        let trimmed = rest.trim_start();
        let after = match trimmed.strip_prefix(';') {
            Some(r) => r.trim_start(),
            None if trimmed.is_empty() => trimmed,
            None => return text_only(text),
        };
        at = body.len() - after.len();
    }
    if calls.is_empty() {
        return text_only(text);
    }
    Parsed {
        content: String::new(),
        calls,
    }
}

fn text_only(text: &str) -> Parsed {
    Parsed {
        content: text.to_string(),
        calls: Vec::new(),
    }
}
