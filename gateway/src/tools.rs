//! Tool calling: a chat's `tools` and `tool_choice` validated once ([`ValidTools`]), the
//! grammar that makes `required` and a named function answer with a valid call, and the
//! model's text parsed into OpenAI tool calls ([`parse`]): the Hermes/Qwen form
//! `<tool_call>{"name": …, "arguments": …}</tool_call>` or the Llama 3.1 JSON form
//! `{"name": …, "parameters": …}`, chosen by the model's chat template ([`ToolFormat::of`]).

mod parse;
mod stream;
#[cfg(test)]
mod tests;

pub use parse::{parse, Parsed, ToolCall};
pub use stream::{ToolStream, ToolStreamEvent};

use serde_json::{json, Value};
use superinfer_engine::grammar::GrammarSpec;

use crate::error::{GatewayError, Result};
use crate::wire::ChatMessage;

/// How the model writes a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>` (Hermes, Qwen 2.5).
    Hermes,
    /// `{"name": "f", "parameters": {…}}`, optionally after `<|python_tag|>` (Llama 3.1).
    Llama3Json,
}

impl ToolFormat {
    /// vLLM's `--tool-call-parser` names.
    pub fn named(name: &str) -> Option<ToolFormat> {
        match name {
            "hermes" => Some(ToolFormat::Hermes),
            "llama3_json" => Some(ToolFormat::Llama3Json),
            _ => None,
        }
    }

    /// The format a chat template writes calls in: Llama 3.1's templates speak of
    /// `ipython` / `<|python_tag|>`; everything else (Hermes, Qwen, and templates without
    /// tool support, for which the tools go into the system message) uses Hermes'.
    pub fn of(template: Option<&str>) -> ToolFormat {
        match template {
            Some(t) if t.contains("<|python_tag|>") || t.contains("ipython") => {
                ToolFormat::Llama3Json
            }
            _ => ToolFormat::Hermes,
        }
    }
}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// JSON schema of its arguments (`{"type": "object"}` when the tool has none).
    pub parameters: Value,
    /// The tool as sent (`{"type": "function", "function": {…}}`), for the chat template.
    pub raw: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A chat's tools, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidTools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// More than one call per answer (`parallel_tool_calls`, default true): at most
    /// [`MAX_PARALLEL_CALLS`] when the grammar constrains the answer.
    pub parallel: bool,
}

/// Calls one constrained answer may hold at most.
pub const MAX_PARALLEL_CALLS: usize = 3;

impl ValidTools {
    /// Whether the answer is parsed for calls.
    pub fn parses(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The tools as the chat template takes them. With `tool_choice: "none"` they are still
    /// rendered, as vLLM does: the model sees them, its text is not parsed.
    pub fn template_tools(&self) -> Vec<Value> {
        self.tools.iter().map(|t| t.raw.clone()).collect()
    }

    /// The grammar of `required` and of a named function: the answer is one call (or, with
    /// `parallel_tool_calls`, up to [`MAX_PARALLEL_CALLS`]) of a listed function with
    /// arguments valid against its schema. `auto` and `none` leave the answer free.
    pub fn grammar(&self, format: ToolFormat) -> Option<GrammarSpec> {
        let listed: Vec<&Tool> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
        };
        let args_key = match format {
            ToolFormat::Hermes => "arguments",
            ToolFormat::Llama3Json => "parameters",
        };
        let any_of: Vec<Value> = listed
            .iter()
            .enumerate()
            .map(|(i, t)| {
                // The schema sits inside the call's: its local `$ref`s point into itself.
                let at = format!("#/anyOf/{i}/properties/{args_key}");
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, args_key: rebased(&t.parameters, &at)},
                    "required": ["name", args_key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = json!({
            "anyOf": any_of,
            "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
        });
        let call = match format {
            ToolFormat::Hermes => "\"<tool_call>\\n\" body \"\\n</tool_call>\"",
            ToolFormat::Llama3Json => "body",
        };
        let sep = match format {
            ToolFormat::Hermes => "\"\\n\"",
            ToolFormat::Llama3Json => "\"; \"",
        };
        let start = if self.parallel {
            format!("start: call ({sep} call){{0,{}}}", MAX_PARALLEL_CALLS - 1)
        } else {
            "start: call".to_string()
        };
        Some(GrammarSpec::Lark(format!(
            "{start}\ncall: {call}\nbody: %json {schema}\n"
        )))
    }
}

/// `schema` with each local `$ref` (`#`, `#/…`) made to point at the same place of the schema
/// when it sits at `at` (a JSON pointer fragment, `#/…`) of a larger one.
fn rebased(schema: &Value, at: &str) -> Value {
    let mut out = schema.clone();
    let mut stack = vec![&mut out];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(a) => stack.extend(a.iter_mut()),
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get_mut("$ref") {
                    if let Some(rest) = r.strip_prefix('#') {
                        *r = format!("{at}{rest}");
                    }
                }
                stack.extend(o.values_mut());
            }
            _ => {}
        }
    }
    out
}

/// Function names: OpenAI's rule.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request. No tools and no
/// choice (or `"none"` without tools): `None`.
pub fn validate(
    tools: Option<Vec<Value>>,
    choice: Option<Value>,
    parallel: Option<bool>,
) -> Result<Option<ValidTools>> {
    let tools = tools.unwrap_or_default();
    let bad = |field: &str, msg: String| GatewayError::invalid(field, msg);
    let mut out: Vec<Tool> = Vec::with_capacity(tools.len());
    for (i, raw) in tools.into_iter().enumerate() {
        let here = format!("tools[{i}]");
        if raw.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("tools", format!("`{here}.type` must be \"function\"")));
        }
        let f = raw
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("tools", format!("`{here}.function` must be an object")))?;
        if let Some(k) = f
            .keys()
            .find(|k| !["name", "description", "parameters", "strict"].contains(&k.as_str()))
        {
            return Err(bad(
                "tools",
                format!("`{here}.function.{k}` is not supported"),
            ));
        }
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        if !valid_name(name) {
            return Err(bad(
                "tools",
                format!(
                    "`{here}.function.name` must be 1–64 letters, digits, `_` or `-`, got {name:?}"
                ),
            ));
        }
        if out.iter().any(|t| t.name == name) {
            return Err(bad("tools", format!("two tools are named {name:?}")));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(bad(
                    "tools",
                    format!("`{here}.function.parameters` must be a JSON schema object"),
                ))
            }
        };
        out.push(Tool {
            name: name.to_string(),
            parameters,
            raw,
        });
    }
    let choice = match choice {
        None | Some(Value::Null) if out.is_empty() => ToolChoice::None,
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => {
                return Err(bad(
                    "tool_choice",
                    format!(
                        "`tool_choice` {s:?} is not one of \"none\", \"auto\", \"required\" or \
                         {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                    ),
                ))
            }
        },
        Some(v) => {
            let name = (v.get("type").and_then(Value::as_str) == Some("function"))
                .then(|| v.pointer("/function/name").and_then(Value::as_str))
                .flatten()
                .ok_or_else(|| {
                    bad(
                        "tool_choice",
                        "`tool_choice` must be a string or {\"type\": \"function\", \
                         \"function\": {\"name\": …}}"
                            .into(),
                    )
                })?;
            if !out.iter().any(|t| t.name == name) {
                return Err(bad(
                    "tool_choice",
                    format!("`tool_choice` names {name:?}, which is not in `tools`"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
    };
    if out.is_empty() {
        if choice != ToolChoice::None {
            return Err(bad("tool_choice", "`tool_choice` needs `tools`".into()));
        }
        if parallel.is_some() {
            return Err(bad(
                "parallel_tool_calls",
                "`parallel_tool_calls` needs `tools`".into(),
            ));
        }
        return Ok(None);
    }
    Ok(Some(ValidTools {
        tools: out,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

/// The conversation for a chat template that does not render `tools`: the tools are
/// described in the system message (added first when there is none), an assistant's calls
/// become `<tool_call>` blocks of its text and a tool's result a `<tool_response>` block, so
/// the model sees them in the Hermes form that [`parse`] reads back.
pub fn without_template_support(messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    let listing: Vec<String> = tools
        .iter()
        .map(|t| t.get("function").unwrap_or(t).to_string())
        .collect();
    let guide = format!(
        "You can call functions to help with the user's request. The functions, as JSON \
         signatures, are:\n<tools>\n{}\n</tools>\nTo call one, answer with a JSON object \
         holding its name and arguments between tags, like this:\n<tool_call>\n{{\"name\": \
         \"function_name\", \"arguments\": {{\"argument\": \"value\"}}}}\n</tool_call>",
        listing.join("\n")
    );
    let mut out = Vec::with_capacity(messages.len() + 1);
    let rest = match messages.split_first() {
        Some((m, rest)) if m.role == "system" || m.role == "developer" => {
            let mut m = m.clone();
            m.content = format!("{}\n\n{guide}", m.content);
            out.push(m);
            rest
        }
        _ => {
            out.push(ChatMessage::new("system", &guide));
            messages
        }
    };
    out.extend(calls_as_text(rest));
    out
}

/// Whether a conversation holds tool calls or results (a history sent back without `tools`).
pub fn holds_calls(messages: &[ChatMessage]) -> bool {
    messages
        .iter()
        .any(|m| m.tool_calls.is_some() || m.role == "tool")
}

/// The conversation with an assistant's calls written as `<tool_call>` blocks of its text and
/// a tool's result as a `<tool_response>` block: how a template that does not render calls
/// sees them (with `tools` or without: a history's calls are never dropped).
pub fn calls_as_text(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let mut m = m.clone();
        if let Some(Value::Array(calls)) = m.tool_calls.take() {
            for c in calls {
                let f = &c["function"];
                let call = json!({"name": f["name"], "arguments": f["arguments"]});
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                m.content
                    .push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
            }
        }
        if m.role == "tool" {
            m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
            m.tool_call_id = None;
        }
        out.push(m);
    }
    out
}
