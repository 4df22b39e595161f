//! Which body fields exist: every field of OpenAI's chat and completions requests and every
//! extra field vLLM documents is either read (honoured, in [`crate::wire::Body`]) or refused
//! here with a 400 naming it unless it is null or its default; any other field is refused as
//! unknown. Nothing is accepted and ignored. `docs/API.md` carries the same table, and a test
//! walks it.

use serde_json::{Map, Value};

use crate::error::{GatewayError, Result};

/// The fields [`crate::wire::Body`] reads.
pub const READ: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "stream",
    "stream_options",
    "n",
    "best_of",
    "echo",
    "suffix",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "priority",
    "logit_bias",
    "min_tokens",
    "cache_salt",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "guided_decoding_backend",
];

/// Fields this server does not implement, with the value that means "off" (accepted), and
/// why they are refused otherwise.
const REFUSED: &[(&str, Option<&str>, &str)] = &[
    ("functions", None, "the older function calling; use `tools`"),
    (
        "function_call",
        Some(r#""none""#),
        "the older function calling; use `tool_choice`",
    ),
    ("audio", None, "the model produces text only"),
    (
        "modalities",
        Some(r#"["text"]"#),
        "the model produces text only",
    ),
    ("prediction", None, "predicted outputs are not supported"),
    ("reasoning_effort", None, "the model does not reason"),
    ("web_search_options", None, "web search is not supported"),
    ("store", Some("false"), "responses are not stored"),
    (
        "metadata",
        None,
        "responses are not stored, so they carry no metadata",
    ),
    (
        "service_tier",
        Some(r#""auto""#),
        "a tenant's service comes from its key",
    ),
    (
        "use_beam_search",
        Some("false"),
        "beam search is not supported",
    ),
    (
        "length_penalty",
        Some("1.0"),
        "beam search is not supported",
    ),
    (
        "prompt_logprobs",
        None,
        "prompt log-probabilities are not computed",
    ),
    ("allowed_token_ids", None, "use `logit_bias`"),
    ("bad_words", Some("[]"), "use `logit_bias`"),
    (
        "truncate_prompt_tokens",
        None,
        "prompts are never truncated; shorten the prompt",
    ),
    (
        "include_stop_str_in_output",
        Some("false"),
        "the stop string is never sent",
    ),
    (
        "skip_special_tokens",
        Some("true"),
        "special tokens are always skipped",
    ),
    (
        "spaces_between_special_tokens",
        Some("true"),
        "special tokens are always skipped",
    ),
    (
        "add_special_tokens",
        None,
        "the prompt is tokenized as the endpoint's default",
    ),
    (
        "add_generation_prompt",
        Some("true"),
        "the assistant's turn is always opened",
    ),
    (
        "continue_final_message",
        Some("false"),
        "the assistant's turn is always opened",
    ),
    (
        "chat_template",
        None,
        "the model's own chat template is always used",
    ),
    (
        "chat_template_kwargs",
        None,
        "chat template arguments are not supported",
    ),
    ("documents", None, "documents are not supported"),
    ("mm_processor_kwargs", None, "the model takes text only"),
    (
        "return_tokens_as_token_ids",
        Some("false"),
        "tokens are returned as text",
    ),
    (
        "return_token_ids",
        Some("false"),
        "tokens are returned as text",
    ),
    ("request_id", None, "the server sets `x-request-id`"),
    ("kv_transfer_params", None, "KV transfer is not supported"),
    ("vllm_xargs", None, "extra arguments are not supported"),
    (
        "logits_processors",
        None,
        "custom logits processors are not supported",
    ),
];

/// Checks every key of a body object; returns the object without the refused fields that
/// carried their "off" value (or null).
pub fn check(mut body: Map<String, Value>) -> Result<Map<String, Value>> {
    for (field, off, why) in REFUSED {
        let Some(v) = body.remove(*field) else {
            continue;
        };
        let is_off = v.is_null()
            || off.is_some_and(|o| serde_json::from_str::<Value>(o).is_ok_and(|o| same(&o, &v)));
        if !is_off {
            let hint = match off {
                Some(o) => format!("; leave it out or send {o}"),
                None => "; leave it out".into(),
            };
            return Err(GatewayError::invalid(
                *field,
                format!("`{field}` is not supported: {why}{hint}"),
            ));
        }
    }
    if let Some(k) = body.keys().find(|k| !READ.contains(&k.as_str())) {
        return Err(GatewayError::invalid(
            k.clone(),
            format!("unknown field `{k}`; docs/API.md lists the fields this server takes"),
        ));
    }
    Ok(body)
}

/// Equal JSON values, numbers compared as numbers (`1` and `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}
