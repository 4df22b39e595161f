//! The model's text → OpenAI tool calls, whole ([`parse`]) or while it streams
//! ([`ToolStream`]: text before a call streams as content; a call is sent once complete, as
//! one tool-call delta with its id, name and arguments).

use serde_json::Value;

use super::{Tool, ToolFormat};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// One call, as OpenAI sends it (`arguments` is a JSON string).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    fn new(name: &str, arguments: &Value) -> ToolCall {
        ToolCall {
            id: format!(
                "call_{:016x}{:08x}",
                rand::random::<u64>(),
                rand::random::<u32>()
            ),
            name: name.to_string(),
            arguments: arguments.to_string(),
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

fn parse_hermes(text: &str, tools: &[Tool]) -> Parsed {
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

/// What a streamed answer sends next.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolStreamEvent {
    Content(String),
    Call(ToolCall),
}

/// Splits a streamed answer as [`parse`] splits a whole one.
#[derive(Clone, Debug)]
pub struct ToolStream {
    format: ToolFormat,
    tools: Vec<Tool>,
    /// Text not yet sent: a possible start of a call, or a call still open.
    held: String,
    /// Llama form: the answer began as a call, so all of it waits for the end.
    whole: bool,
    started: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat, tools: Vec<Tool>) -> ToolStream {
        ToolStream {
            format,
            tools,
            held: String::new(),
            whole: false,
            started: false,
        }
    }

    /// A whole answer, split ([`parse`] with this stream's format and tools).
    pub fn parse_whole(&self, text: &str) -> Parsed {
        parse(text, self.format, &self.tools)
    }

    /// What `piece` (the next text of the answer) lets out now.
    pub fn push(&mut self, piece: &str) -> Vec<ToolStreamEvent> {
        self.held.push_str(piece);
        match self.format {
            ToolFormat::Llama3Json => self.push_llama(),
            ToolFormat::Hermes => self.push_hermes(),
        }
    }

    fn push_llama(&mut self) -> Vec<ToolStreamEvent> {
        if !self.started {
            let t = self.held.trim_start();
            if t.is_empty() || (PYTHON_TAG.starts_with(t) && t.len() < PYTHON_TAG.len()) {
                return Vec::new();
            }
            self.started = true;
            self.whole = t.starts_with('{') || t.starts_with(PYTHON_TAG);
        }
        if self.whole {
            return Vec::new();
        }
        vec![ToolStreamEvent::Content(std::mem::take(&mut self.held))]
    }

    fn push_hermes(&mut self) -> Vec<ToolStreamEvent> {
        let mut out = Vec::new();
        loop {
            if let Some(start) = self.held.find(OPEN) {
                if start > 0 {
                    out.push(ToolStreamEvent::Content(self.held[..start].to_string()));
                    self.held.drain(..start);
                }
                let Some(end) = self.held.find(CLOSE) else {
                    return out;
                };
                let block: String = self.held.drain(..end + CLOSE.len()).collect();
                let p = parse_hermes(&block, &self.tools);
                match p.calls.into_iter().next() {
                    Some(c) => out.push(ToolStreamEvent::Call(c)),
                    None => out.push(ToolStreamEvent::Content(block)),
                }
                continue;
            }
            // Hold back a tail that could still become `<tool_call>`.
            let keep = (1..OPEN.len())
                .rev()
                .find(|&k| self.held.len() >= k && self.held.ends_with(&OPEN[..k]))
                .unwrap_or(0);
            let send = self.held.len() - keep;
            if send > 0 && self.held.is_char_boundary(send) {
                out.push(ToolStreamEvent::Content(self.held[..send].to_string()));
                self.held.drain(..send);
            }
            return out;
        }
    }

    /// The end of the answer: whatever is held, parsed.
    pub fn finish(&mut self) -> Vec<ToolStreamEvent> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return Vec::new();
        }
        let p = parse(&held, self.format, &self.tools);
        let mut out = Vec::new();
        if !p.content.is_empty() || p.calls.is_empty() {
            // A held tail that was no call goes out as it was.
            out.push(ToolStreamEvent::Content(if p.calls.is_empty() {
                held
            } else {
                p.content
            }));
        }
        out.extend(p.calls.into_iter().map(ToolStreamEvent::Call));
        out
    }
}
