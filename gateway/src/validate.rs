//! Validation: a wire [`Body`] becomes a [`ValidRequest`] once (tokenized, within the
//! tenant's and the model's limits, sampling values in range); the engine gets nothing else.
//! Every refusal is a 400 (404 for an unknown model) whose message says what to change.

use superinfer_engine::SamplingParams;
use superinfer_tenants::Tenant;

mod endpoint;
mod extras;
mod fields;
pub mod limits;
mod prompt;
mod strict;
pub(crate) mod structured;

pub(crate) use prompt::chat_messages;
use prompt::{chat_tokens, prompt_list, PromptLimit};

pub use endpoint::Endpoint;
pub use extras::MAX_CACHE_SALT_BYTES;
use extras::{cache_salt, continuous_usage, echo_text, logit_bias, min_tokens};
pub use prompt::{MAX_MESSAGES, MAX_PROMPTS};

use crate::error::{GatewayError, Result};
use crate::text::Text;
use crate::wire::ChatMessage;
pub use crate::wire::ModelInfo;
use crate::wire::{Body, Content, Message, Prompt, Stop};

/// A request that passed validation.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidRequest {
    pub endpoint: Endpoint,
    pub prompt: Vec<u32>,
    /// Completions with a list of prompts: the others, one choice each after `prompt`'s.
    pub more_prompts: Vec<Vec<u32>>,
    /// Choices per prompt (each its own engine request).
    pub n: u32,
    /// Completions: candidates generated per prompt, of which the `n` with the highest mean
    /// token log-probability are returned (`n` when `best_of` is not set).
    pub best_of: u32,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// Report each token's log-probability and this many alternatives.
    pub logprobs: Option<u32>,
    /// Completions with `echo`: the prompt's text, sent before the answer.
    pub echo: Option<String>,
    /// Usage in every streamed chunk (`stream_options.continuous_usage_stats`).
    pub continuous_usage: bool,
    /// vLLM's `cache_salt`: the prefix cache's namespace is salted with it.
    pub cache_salt: Option<String>,
    /// Chat: the tools the model may call; the answer is parsed for calls unless
    /// `tool_choice` is `none`.
    pub tools: Option<crate::tools::ValidTools>,
    /// How the model writes calls (by its chat template).
    pub tool_format: crate::tools::ToolFormat,
}

/// At most this many alternatives per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// `max_tokens` of a completion that leaves it out (OpenAI's default).
pub const DEFAULT_COMPLETION_TOKENS: u32 = 16;
/// At most this many stop strings (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;
/// Each stop string has at most this many bytes (UTF-8): stop strings are matched on every
/// streamed piece, and the text held back while one may still complete is as long as it.
pub const MAX_STOP_BYTES: usize = 1024;

/// Parses a body, naming the field at fault when a value has the wrong type.
pub fn parse(bytes: &[u8]) -> Result<Body> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize::<_, strict::Strict>(&mut de)
        .map_err(parse_error)?
        .0;
    de.end().map_err(|inner| {
        GatewayError::bad_request(format!(
            "the body is not valid JSON ({inner}); send a JSON object such as \
             {{\"model\": \"…\", \"prompt\": \"Hello\"}}"
        ))
    })?;
    let serde_json::Value::Object(map) = value else {
        return Err(GatewayError::bad_request(
            "the body must be a JSON object, such as {\"prompt\": \"Hello\"}",
        ));
    };
    let map = fields::check(map)?;
    let body: Body =
        serde_path_to_error::deserialize(serde_json::Value::Object(map)).map_err(parse_error)?;
    Ok(body)
}

fn parse_error(e: serde_path_to_error::Error<serde_json::Error>) -> GatewayError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return GatewayError::bad_request(format!(
            "the body is not valid JSON ({inner}); send a JSON object such as \
             {{\"model\": \"…\", \"prompt\": \"Hello\"}}"
        ));
    }
    let text = inner.to_string();
    if let Some(dup) = text.strip_prefix("duplicate field `") {
        let name = dup.split('`').next().unwrap_or_default();
        let field = if path == "." || path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        return GatewayError::invalid(
            field.clone(),
            format!("`{field}` appears more than once in the body; send each field once"),
        );
    }
    if path == "." || path.is_empty() {
        return GatewayError::bad_request(format!("the body must be a JSON object ({inner})"));
    }
    let field = path.split(['.', '[']).next().unwrap_or(&path).to_string();
    if let Some(bound) = out_of_range(&text) {
        return GatewayError::invalid(
            field,
            format!("`{path}` is out of range: {bound} ({inner})"),
        );
    }
    let hint = match field.as_str() {
        "prompt" => {
            "`prompt` must be a string, a list of one string, or a list of token ids".to_string()
        }
        "stop" => "`stop` must be a string or a list of strings".to_string(),
        "messages" => format!(
            "`{path}`: each message needs a string `role` and a `content` that is a string or \
             a list of {{\"type\": \"text\", \"text\": …}} parts ({inner})"
        ),
        _ => format!("`{path}` has the wrong type: {inner}"),
    };
    GatewayError::invalid(field, hint)
}

/// For serde's "invalid value: integer `N`, expected u32" (and i32, i64, u64): the range a
/// whole number of that type has.
fn out_of_range(serde_message: &str) -> Option<&'static str> {
    if !serde_message.starts_with("invalid value: integer") {
        return None;
    }
    let expected = serde_message.split("expected ").nth(1)?;
    Some(match expected.split_whitespace().next()? {
        "u32" => "a whole number from 0 to 4294967295",
        "i32" => "a whole number from -2147483648 to 2147483647",
        "i64" => "a whole number from -9223372036854775808 to 9223372036854775807",
        "u64" => "a whole number from 0 to 18446744073709551615",
        _ => return None,
    })
}

/// Checks everything and tokenizes the prompt.
pub fn validate(
    endpoint: Endpoint,
    mut body: Body,
    tenant: &Tenant,
    model: &ModelInfo,
    text: &Text,
) -> Result<ValidRequest> {
    if let Some(m) = &body.model {
        if *m != model.id {
            return Err(GatewayError::ModelNotFound {
                requested: m.clone(),
                served: model.id.clone(),
            });
        }
    }
    unsupported(&body, endpoint)?;
    let (mut constraint, whitespace) = structured::constraint(&mut body)?;
    let cache_salt = cache_salt(body.cache_salt.take())?;
    let logprobs = logprobs(&body, endpoint)?;
    let mut sampling = sampling(&body)?;
    sampling.logprobs = logprobs;
    let stop = stop_strings(body.stop)?;
    let limit = PromptLimit::of(tenant, model);
    let tools = crate::tools::validate(
        body.tools.take(),
        body.tool_choice.take(),
        body.parallel_tool_calls.take(),
    )?;
    // Each function's schema on its own: its `$ref`s are its own (`#/$defs/X`).
    for t in tools.iter().flat_map(|t| &t.tools) {
        limits::json_schema("tools", &t.parameters)?;
    }
    let mut prompts = match endpoint {
        Endpoint::Completions => prompt_list(body.prompt, text, limit)?,
        Endpoint::Chat => vec![chat_tokens(body.messages, tools.as_ref(), text, limit)?],
    };
    // Every limit holds for the longest prompt.
    let prompt_len = prompts.iter().map(Vec::len).max().unwrap_or(0) as u32;
    let q = &tenant.quotas;
    if prompt_len > q.max_prompt_tokens {
        return Err(GatewayError::invalid(
            prompt_field(endpoint),
            format!(
                "the prompt has {prompt_len} tokens; this tenant's limit is {} \
                 (max_prompt_tokens): shorten the prompt",
                q.max_prompt_tokens
            ),
        ));
    }
    let asked = (body.max_tokens, body.max_completion_tokens);
    let max_tokens = max_tokens(endpoint, asked, q, model, prompt_len)?;
    let (stream, include_usage, continuous_usage) =
        stream_flags(body.stream, body.stream_options.as_ref())?;
    let stop_token_ids = body.stop_token_ids.unwrap_or_default();
    if stop_token_ids.len() > 64 {
        return Err(GatewayError::invalid(
            "stop_token_ids",
            "at most 64 `stop_token_ids` are allowed",
        ));
    }
    sampling.logit_bias = logit_bias(body.logit_bias, text)?;
    min_tokens(
        body.min_tokens,
        max_tokens,
        &stop,
        &stop_token_ids,
        &mut sampling,
    )?;
    let tool_format = text.tool_format();
    if let Some(spec) = tools.as_ref().and_then(|t| t.grammar(tool_format)) {
        if let Some(c) = &constraint {
            return Err(GatewayError::invalid(
                "tool_choice",
                format!(
                    "`tool_choice` constrains the answer to a call, and so does `{}`; send \
                     one of them",
                    c.field
                ),
            ));
        }
        constraint = Some(structured::Constraint {
            field: "tool_choice".into(),
            spec,
        });
    }
    if let Some(c) = &constraint {
        if sampling.min_tokens > 0 {
            return Err(GatewayError::invalid(
                "min_tokens",
                format!(
                    "`min_tokens` with `{}` is not supported: the grammar decides where the \
                     answer ends",
                    c.field
                ),
            ));
        }
        sampling.grammar = Some(structured::compile(
            c,
            whitespace.as_deref(),
            text,
            tenant.id.0,
        )?);
    }
    let prompt = prompts.remove(0);
    let more_prompts = prompts;
    let n = body.n.unwrap_or(1);
    if (more_prompts.len() + 1) * n as usize > MAX_PROMPTS {
        return Err(GatewayError::invalid(
            "n",
            format!("prompts × `n` is more than {MAX_PROMPTS} choices"),
        ));
    }
    let best_of = body.best_of.unwrap_or(n).max(n);
    if (more_prompts.len() + 1) * best_of as usize > MAX_PROMPTS {
        return Err(GatewayError::invalid(
            "best_of",
            format!("prompts × `best_of` is more than {MAX_PROMPTS} candidates"),
        ));
    }
    let several = !more_prompts.is_empty() || best_of > 1;
    if n > 1 && tools.as_ref().is_some_and(|t| t.parses()) {
        return Err(GatewayError::invalid(
            "n",
            "`n` > 1 with tool calls is not supported; send one request per choice",
        ));
    }
    let echo = echo_text(
        body.echo.unwrap_or(false),
        endpoint,
        &prompt,
        several,
        (logprobs, body.stream.unwrap_or(false)),
        model,
        text,
    )?;
    if echo.is_some() {
        // Scored in the engine (validated above: a backend that can, not streamed).
        sampling.prompt_logprobs = logprobs;
    }
    Ok(ValidRequest {
        tools,
        tool_format,
        cache_salt,
        more_prompts,
        n,
        best_of,
        echo,
        continuous_usage,
        endpoint,
        prompt,
        max_tokens,
        sampling,
        stop,
        stop_token_ids,
        ignore_eos: body.ignore_eos.unwrap_or(false),
        stream,
        include_usage,
        logprobs,
    })
}

/// `stream`, `stream_options.include_usage` (only when streaming) and
/// `continuous_usage_stats`.
fn stream_flags(
    stream: Option<bool>,
    options: Option<&crate::wire::StreamOptions>,
) -> Result<(bool, bool, bool)> {
    let stream = stream.unwrap_or(false);
    let include_usage = options.and_then(|o| o.include_usage).unwrap_or(false);
    if options.is_some() && !stream {
        return Err(GatewayError::invalid(
            "stream_options",
            "`stream_options` is only allowed with \"stream\": true",
        ));
    }
    Ok((
        stream,
        include_usage,
        continuous_usage(options, include_usage)?,
    ))
}

/// `max_tokens` (chat: or `max_completion_tokens`) within the tenant's limit and the room the
/// longest prompt leaves in the context; its default when absent.
fn max_tokens(
    endpoint: Endpoint,
    (max, max_completion): (Option<u32>, Option<u32>),
    q: &superinfer_tenants::Quotas,
    model: &ModelInfo,
    prompt_len: u32,
) -> Result<u32> {
    let room = model.max_model_len.saturating_sub(prompt_len);
    if room == 0 {
        return Err(context_error(model, prompt_len, 1, endpoint));
    }
    let requested = match endpoint {
        Endpoint::Completions => max,
        Endpoint::Chat => max_completion.or(max),
    };
    let n = match requested {
        None if endpoint == Endpoint::Completions => {
            DEFAULT_COMPLETION_TOKENS.min(room).min(q.max_output_tokens)
        }
        None => room.min(q.max_output_tokens),
        Some(0) => {
            return Err(GatewayError::invalid(
                "max_tokens",
                "`max_tokens` must be at least 1",
            ))
        }
        Some(m) if m > q.max_output_tokens => {
            return Err(GatewayError::invalid(
                "max_tokens",
                format!(
                    "`max_tokens` is {m}; this tenant's limit is {} (max_output_tokens)",
                    q.max_output_tokens
                ),
            ))
        }
        Some(m) if m > room => return Err(context_error(model, prompt_len, m, endpoint)),
        Some(m) => m,
    };
    Ok(n)
}

/// Completions: `logprobs` is the number of alternatives (0..=20). Chat: `logprobs: true`
/// with `top_logprobs` alternatives (0..=20).
fn logprobs(body: &Body, endpoint: Endpoint) -> Result<Option<u32>> {
    use serde_json::Value;
    let top = |field: &str, n: Option<u64>| match n {
        Some(n) if n <= u64::from(MAX_TOP_LOGPROBS) => Ok(n as u32),
        _ => Err(GatewayError::invalid(
            field,
            format!("`{field}` must be a whole number from 0 to {MAX_TOP_LOGPROBS}"),
        )),
    };
    match endpoint {
        Endpoint::Completions => match &body.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
            Some(Value::Number(n)) => top("logprobs", n.as_u64()).map(Some),
            Some(_) => top("logprobs", None).map(Some),
        },
        Endpoint::Chat => {
            let on = match &body.logprobs {
                None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                Some(Value::Bool(true)) => true,
                Some(_) => {
                    return Err(GatewayError::invalid(
                        "logprobs",
                        "`logprobs` is true or false in chat completions",
                    ))
                }
            };
            match (on, body.top_logprobs) {
                (false, Some(_)) => Err(GatewayError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs \"logprobs\": true",
                )),
                (false, None) => Ok(None),
                (true, n) => top("top_logprobs", Some(u64::from(n.unwrap_or(0)))).map(Some),
            }
        }
    }
}

fn prompt_field(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Completions => "prompt",
        Endpoint::Chat => "messages",
    }
}

fn context_error(model: &ModelInfo, prompt: u32, max_tokens: u32, e: Endpoint) -> GatewayError {
    GatewayError::invalid(
        if max_tokens > 1 {
            "max_tokens"
        } else {
            prompt_field(e)
        },
        format!(
            "this model's maximum context length is {} tokens, but {} were requested ({prompt} \
             in the prompt, {max_tokens} for the completion); shorten the prompt or lower \
             `max_tokens`",
            model.max_model_len,
            u64::from(prompt) + u64::from(max_tokens)
        ),
    )
}

/// OpenAI features this server does not implement: refused, not silently ignored.
fn unsupported(body: &Body, endpoint: Endpoint) -> Result<()> {
    let refuse = |field: &str, msg: &str| Err(GatewayError::invalid(field, msg));
    match body.n {
        Some(0) => return refuse("n", "`n` must be at least 1"),
        Some(n) if n as usize > MAX_PROMPTS => {
            return refuse("n", "at most 64 choices per request")
        }
        _ => {}
    }
    if let Some(b) = body.best_of {
        let n = body.n.unwrap_or(1);
        if b < n {
            return refuse("best_of", "`best_of` must be at least `n`");
        }
        if b > 1 && endpoint == Endpoint::Chat {
            return refuse("best_of", "`best_of` is for completions; chat takes only 1");
        }
        if b > n && body.stream == Some(true) {
            return refuse("best_of", "`best_of` > `n` cannot be streamed");
        }
        if b as usize > MAX_PROMPTS {
            return refuse("best_of", "at most 64 candidates per request");
        }
    }
    if body.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return refuse("suffix", "`suffix` is not supported");
    }
    if endpoint == Endpoint::Completions {
        if body.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return refuse("tools", "tools are for chat completions; leave `tools` out");
        }
        if body
            .tool_choice
            .as_ref()
            .is_some_and(|c| !c.is_null() && c.as_str() != Some("none"))
        {
            return refuse("tool_choice", "tools are for chat completions");
        }
        if body.parallel_tool_calls.is_some() {
            return refuse("parallel_tool_calls", "tools are for chat completions");
        }
    }
    if endpoint == Endpoint::Chat && body.prompt.is_some() && body.messages.is_none() {
        return refuse(
            "messages",
            "chat completions take `messages`, not `prompt`; use /v1/completions for a prompt",
        );
    }
    Ok(())
}

fn in_range(field: &'static str, v: Option<f32>, lo: f32, hi: f32, open_lo: bool) -> Result<()> {
    match v {
        Some(x) if !x.is_finite() || x > hi || x < lo || (open_lo && x == lo) => {
            let lo_bracket = if open_lo { "(" } else { "[" };
            Err(GatewayError::invalid(
                field,
                format!("`{field}` must be in {lo_bracket}{lo}, {hi}], got {x}"),
            ))
        }
        _ => Ok(()),
    }
}

fn sampling(b: &Body) -> Result<SamplingParams> {
    in_range("temperature", b.temperature, 0.0, 2.0, false)?;
    in_range("top_p", b.top_p, 0.0, 1.0, true)?;
    in_range("min_p", b.min_p, 0.0, 1.0, false)?;
    in_range("frequency_penalty", b.frequency_penalty, -2.0, 2.0, false)?;
    in_range("presence_penalty", b.presence_penalty, -2.0, 2.0, false)?;
    in_range("repetition_penalty", b.repetition_penalty, 0.0, 2.0, true)?;
    let top_k = match b.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as u32,
        Some(k) => {
            return Err(GatewayError::invalid(
                "top_k",
                format!("`top_k` must be -1 or 0 (off) or a positive number, got {k}"),
            ))
        }
    };
    let d = SamplingParams::default();
    #[allow(clippy::needless_update)]
    Ok(SamplingParams {
        // OpenAI's default temperature is 1.
        temperature: b.temperature.unwrap_or(1.0),
        top_k,
        top_p: b.top_p.unwrap_or(d.top_p),
        min_p: b.min_p.unwrap_or(d.min_p),
        seed: b.seed.map(|s| s as u64),
        repetition_penalty: b.repetition_penalty.unwrap_or(d.repetition_penalty),
        frequency_penalty: b.frequency_penalty.unwrap_or(d.frequency_penalty),
        presence_penalty: b.presence_penalty.unwrap_or(d.presence_penalty),
        ..d
    })
}

fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>> {
    let v = match stop {
        None => return Ok(Vec::new()),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if v.len() > MAX_STOP_STRINGS {
        return Err(GatewayError::invalid(
            "stop",
            format!(
                "at most {MAX_STOP_STRINGS} `stop` strings are allowed, got {}",
                v.len()
            ),
        ));
    }
    if v.iter().any(|s| s.is_empty()) {
        return Err(GatewayError::invalid(
            "stop",
            "`stop` strings must not be empty",
        ));
    }
    if let Some(long) = v.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(GatewayError::invalid(
            "stop",
            format!(
                "a `stop` string has {} bytes; at most {MAX_STOP_BYTES} are allowed",
                long.len()
            ),
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests;
