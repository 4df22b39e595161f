//! The prompt of a request: a completion's prompt or list of prompts, or a chat's messages
//! through the template, each bounded by its length in bytes before it is tokenized.

use super::*;

/// At most this many prompts in one completions request (one choice each).
pub const MAX_PROMPTS: usize = 64;
/// At most this many messages in one chat (as OpenAI's API), checked before any is rendered.
pub const MAX_MESSAGES: usize = 2048;

/// Refuses text that cannot fit the tenant's `max_prompt_tokens` by its length in bytes alone,
/// before any of it is tokenized (a token covers at most [`Text::max_prompt_bytes`] bytes).
pub(super) fn check_bytes(
    field: &str,
    bytes: usize,
    text: &Text,
    limit: PromptLimit,
) -> Result<()> {
    let tokens = limit.tokens;
    match text.max_prompt_bytes(tokens) {
        Some(max) if bytes > max => Err(GatewayError::invalid(
            field,
            format!(
                "the prompt is {bytes} bytes long; {} of {tokens} tokens fits at most {max} \
                 bytes of text: shorten the prompt",
                limit.what
            ),
        )),
        _ => Ok(()),
    }
}

/// The most prompt tokens a request may have: the tenant's `max_prompt_tokens`, or less when
/// the model's context leaves less (room for at least one output token).
#[derive(Clone, Copy, Debug)]
pub(super) struct PromptLimit {
    tokens: u32,
    what: &'static str,
}

impl PromptLimit {
    pub(super) fn of(tenant: &Tenant, model: &ModelInfo) -> PromptLimit {
        let own = tenant.quotas.max_prompt_tokens;
        let context = model.max_model_len.saturating_sub(1).max(1);
        if context < own {
            PromptLimit {
                tokens: context,
                what: "the model's context (max_model_len - 1)",
            }
        } else {
            PromptLimit {
                tokens: own,
                what: "this tenant's limit (max_prompt_tokens)",
            }
        }
    }
}

/// The prompts of a completion: one, or a list (one choice each), at most [`MAX_PROMPTS`].
/// Each text prompt must fit `limit` by its length in bytes before it is tokenized.
pub(super) fn prompt_list(
    prompt: Option<Prompt>,
    text: &Text,
    limit: PromptLimit,
) -> Result<Vec<Vec<u32>>> {
    match &prompt {
        Some(Prompt::Text(s)) => check_bytes("prompt", s.len(), text, limit)?,
        Some(Prompt::Texts(v)) => {
            for s in v {
                check_bytes("prompt", s.len(), text, limit)?;
            }
        }
        _ => {}
    }
    let lists = match prompt {
        None => {
            return Err(GatewayError::invalid(
                "prompt",
                "`prompt` is required: the text to complete",
            ))
        }
        Some(Prompt::Text(s)) => vec![encode(text, &s)?],
        Some(Prompt::Texts(v)) if v.is_empty() => vec![Vec::new()],
        Some(Prompt::Texts(v)) => v.iter().map(|s| encode(text, s)).collect::<Result<_>>()?,
        Some(Prompt::Tokens(ids)) => vec![ids],
        Some(Prompt::TokenLists(v)) if v.is_empty() => vec![Vec::new()],
        Some(Prompt::TokenLists(v)) => v,
    };
    if lists.len() > MAX_PROMPTS {
        return Err(GatewayError::invalid(
            "prompt",
            format!(
                "at most {MAX_PROMPTS} prompts per request, got {}",
                lists.len()
            ),
        ));
    }
    lists
        .into_iter()
        .map(|ids| checked_prompt(ids, text))
        .collect()
}

pub(super) fn checked_prompt(ids: Vec<u32>, text: &Text) -> Result<Vec<u32>> {
    if let (Some(vocab), Some(&max)) = (text.vocab_size(), ids.iter().max()) {
        if max as usize >= vocab {
            return Err(GatewayError::invalid(
                "prompt",
                format!("token id {max} is outside the vocabulary (0..{vocab})"),
            ));
        }
    }
    if ids.is_empty() {
        return Err(GatewayError::invalid(
            "prompt",
            "the prompt is empty: send at least one token of text",
        ));
    }
    Ok(ids)
}

pub(super) fn encode(text: &Text, s: &str) -> Result<Vec<u32>> {
    text.encode(s)
        .map_err(|e| GatewayError::invalid("prompt", format!("cannot tokenize the prompt: {e}")))
}

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

pub(super) fn chat_tokens(
    messages: Option<Vec<Message>>,
    tools: Option<&crate::tools::ValidTools>,
    text: &Text,
    limit: PromptLimit,
) -> Result<Vec<u32>> {
    let parsed = chat_messages(messages.unwrap_or_default())?;
    // The template only adds text, so the contents alone must fit.
    let bytes = parsed.iter().map(|m| m.content.len()).sum();
    check_bytes("messages", bytes, text, limit)?;
    let ids = match tools {
        Some(t) => text.encode_chat_with_tools(&parsed, &t.template_tools()),
        None => text.encode_chat(&parsed),
    };
    let ids = ids.map_err(|e| {
        GatewayError::invalid("messages", format!("cannot apply the chat template: {e}"))
    })?;
    if ids.is_empty() {
        return Err(GatewayError::invalid(
            "messages",
            "the conversation has no tokens",
        ));
    }
    Ok(ids)
}

/// The messages of a body as the chat template takes them: known roles, text content.
pub(crate) fn chat_messages(messages: Vec<Message>) -> Result<Vec<ChatMessage>> {
    if messages.is_empty() {
        return Err(GatewayError::invalid(
            "messages",
            "`messages` must hold at least one message, e.g. [{\"role\": \"user\", \"content\": \"Hi\"}]",
        ));
    }
    if messages.len() > MAX_MESSAGES {
        return Err(GatewayError::invalid(
            "messages",
            format!(
                "{} messages, more than the limit of {MAX_MESSAGES} (max messages); send a \
                 shorter conversation",
                messages.len()
            ),
        ));
    }
    let mut parsed = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(GatewayError::invalid(
                format!("messages[{i}].role"),
                format!("unknown role `{}`; use one of {}", m.role, ROLES.join(", ")),
            ));
        }
        let name = match m.name {
            Some(n) if !valid_name(&n) => {
                return Err(GatewayError::invalid(
                    format!("messages[{i}].name"),
                    "a name is 1 to 64 of the characters A-Z, a-z, 0-9, `_` and `-`",
                ))
            }
            n => n,
        };
        if m.annotations.as_ref().is_some_and(|a| !a.is_empty()) {
            return Err(GatewayError::invalid(
                format!("messages[{i}].annotations"),
                "citations cannot be given back to the model: send only their text, as `content`",
            ));
        }
        if m.audio.is_some() {
            return Err(GatewayError::invalid(
                format!("messages[{i}].audio"),
                "the model produces text only: send the answer's transcript as `content`",
            ));
        }
        let content = match (m.content, m.refusal) {
            (content, Some(refusal)) => {
                if m.role != "assistant" {
                    return Err(GatewayError::invalid(
                        format!("messages[{i}].refusal"),
                        "only assistant messages carry `refusal`",
                    ));
                }
                if content_is_empty(content.as_ref()) {
                    Some(Content::Text(refusal))
                } else {
                    return Err(GatewayError::invalid(
                        format!("messages[{i}].refusal"),
                        "a message holds either `content` or a `refusal`, not both",
                    ));
                }
            }
            (content, None) => content,
        };
        let content = match content {
            None => String::new(),
            Some(Content::Text(s)) => s,
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => s.push_str(&t),
                        _ => return Err(GatewayError::invalid(
                            format!("messages[{i}].content"),
                            "only {\"type\": \"text\", \"text\": …} content parts are supported",
                        )),
                    }
                }
                s
            }
        };
        let calls = match (m.tool_calls, m.function_call) {
            (Some(_), Some(_)) => {
                return Err(GatewayError::invalid(
                    format!("messages[{i}].function_call"),
                    "a message holds `tool_calls` or the legacy `function_call`, not both",
                ))
            }
            // The legacy form names no call id: it gets the message's place as one.
            (None, Some(f)) => Some(vec![serde_json::json!({
                "id": format!("call_{i}"), "type": "function", "function": f,
            })]),
            (calls, None) => calls,
        };
        let tool_calls = match calls {
            Some(calls) if m.role == "assistant" => Some(template_calls(i, calls)?),
            Some(_) => {
                return Err(GatewayError::invalid(
                    format!("messages[{i}]"),
                    "only assistant messages carry `tool_calls`",
                ))
            }
            None => None,
        };
        if m.role == "tool" && m.tool_call_id.is_none() {
            return Err(GatewayError::invalid(
                format!("messages[{i}]"),
                "a `tool` message needs the `tool_call_id` of the call it answers",
            ));
        }
        if m.role != "tool" && m.tool_call_id.is_some() {
            return Err(GatewayError::invalid(
                format!("messages[{i}]"),
                "only `tool` messages carry `tool_call_id`",
            ));
        }
        parsed.push(ChatMessage {
            role: m.role,
            content,
            tool_calls,
            tool_call_id: m.tool_call_id,
            name,
        });
    }
    Ok(parsed)
}

/// OpenAI's rule for a participant's name; it also keeps template control text out of it
/// (a name is rendered by the chat template as it is).
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// No content, an empty string or an empty list of parts.
fn content_is_empty(c: Option<&Content>) -> bool {
    match c {
        None => true,
        Some(Content::Text(s)) => s.is_empty(),
        Some(Content::Parts(p)) => p.is_empty(),
    }
}

/// An assistant's `tool_calls` as chat templates take them: each `{"id", "type": "function",
/// "function": {"name", "arguments"}}` with the arguments' JSON string parsed to an object.
fn template_calls(i: usize, calls: Vec<serde_json::Value>) -> Result<serde_json::Value> {
    let bad = |msg: String| GatewayError::invalid(format!("messages[{i}]"), msg);
    let mut out = Vec::with_capacity(calls.len());
    for (j, c) in calls.into_iter().enumerate() {
        let here = format!("messages[{i}].tool_calls[{j}]");
        let name = c.pointer("/function/name").and_then(|v| v.as_str());
        let args = c.pointer("/function/arguments");
        let (Some(name), Some(args)) = (name, args) else {
            return Err(bad(format!(
                "`{here}` needs `function.name` and `function.arguments`"
            )));
        };
        let args = match args {
            serde_json::Value::String(s) => serde_json::from_str(s)
                .map_err(|e| bad(format!("`{here}.function.arguments` is not JSON: {e}")))?,
            v => v.clone(),
        };
        out.push(serde_json::json!({
            "id": c.get("id").cloned().unwrap_or(serde_json::Value::Null),
            "type": "function",
            "function": {"name": name, "arguments": args},
        }));
    }
    Ok(serde_json::Value::Array(out))
}
