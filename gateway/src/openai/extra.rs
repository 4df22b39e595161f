//! The endpoints vLLM serves beside OpenAI's, in vLLM's shapes, that clients and benchmark
//! tools probe: `GET /health` (200, empty body, when ready), `GET /version`,
//! `POST /tokenize` and `POST /detokenize` (behind the tenant's key), and OpenAI's
//! `GET /v1/models/{id}`.
//!
//! Request bodies take exactly vLLM's fields: an unknown field, or a vLLM field this server
//! does not implement set to a value that would change the answer, is a 400 naming it.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

use crate::error::{GatewayError, Result};
use crate::registry::TenantCtx;
use crate::state::Shared;
use crate::validate;
use crate::wire::Message;

/// `GET /health`: vLLM's readiness probe, 200 with an empty body while the engine serves;
/// 503 with `Retry-After` while draining (`shutting_down`) or once the engine stopped.
pub async fn health(State(state): State<Shared>) -> Response {
    // A 503 with its reason and Retry-After, logged as a refusal (info), not as a failure.
    if state.is_draining() {
        GatewayError::ShuttingDown.into_response()
    } else if !state.engine.is_running() {
        GatewayError::EngineFailed("the engine has stopped".into()).into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

/// `GET /version`: this server's version, as `{"version": "…"}`.
pub async fn version() -> Response {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") })).into_response()
}

/// The served model as `GET /v1/models` lists it.
pub fn model_card(state: &Shared) -> Value {
    json!({
        "id": state.model.id,
        "object": "model",
        "created": state.started_unix_s,
        "owned_by": "superinfer",
        "max_model_len": state.model.max_model_len,
    })
}

/// `GET /v1/models/{id}`: the model when `id` is the served one, else 404.
pub async fn model(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    if id == state.model.id {
        Json(model_card(&state)).into_response()
    } else {
        GatewayError::ModelNotFound {
            requested: id,
            served: state.model.id.clone(),
        }
        .into_response()
    }
}

/// vLLM's `TokenizeCompletionRequest` and `TokenizeChatRequest` in one (`prompt` or
/// `messages`).
#[derive(Debug, Default, Deserialize)]
struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    return_token_strs: Option<bool>,
}

const TOKENIZE_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "add_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "return_token_strs",
];

/// vLLM's fields of these requests that this server refuses unless null.
const REFUSED: &[(&str, &str)] = &[
    (
        "chat_template",
        "the model's own chat template is always used",
    ),
    (
        "chat_template_kwargs",
        "chat template arguments are not supported",
    ),
    ("tools", "tool calling is not supported"),
    ("mm_processor_kwargs", "the model takes text only"),
];

#[derive(Debug, Default, Deserialize)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<i64>,
}

/// Parses `bytes` into `T`: a JSON object whose keys are all in `fields` (a refused field set
/// to null counts as absent), each of the right type.
fn parse<T: DeserializeOwned>(
    body: std::result::Result<Bytes, BytesRejection>,
    fields: &[&str],
) -> Result<T> {
    let bytes = body.map_err(|e| GatewayError::bad_request(e.body_text()))?;
    let mut map: serde_json::Map<String, Value> = serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::bad_request(format!("the body must be a JSON object ({e})")))?;
    for (field, why) in REFUSED {
        match map.remove(*field) {
            None | Some(Value::Null) => {}
            Some(_) => return Err(GatewayError::invalid(*field, format!("`{field}`: {why}"))),
        }
    }
    if let Some(k) = map.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(GatewayError::invalid(
            k.clone(),
            format!(
                "unknown field `{k}`; this endpoint takes {}",
                fields.join(", ")
            ),
        ));
    }
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        let field = path.split(['.', '[']).next().unwrap_or(&path).to_owned();
        if field.is_empty() {
            // A missing required field: serde's message names it.
            return GatewayError::bad_request(e.into_inner().to_string());
        }
        GatewayError::invalid(
            field,
            format!("`{path}` has the wrong type: {}", e.into_inner()),
        )
    })
}

fn check_model(state: &Shared, model: Option<String>) -> Result<()> {
    match model {
        Some(m) if m != state.model.id => Err(GatewayError::ModelNotFound {
            requested: m,
            served: state.model.id.clone(),
        }),
        _ => Ok(()),
    }
}

/// `POST /tokenize`: `{"count", "max_model_len", "tokens", "token_strs"}`.
pub async fn tokenize(
    State(state): State<Shared>,
    Extension(ctx): Extension<Arc<TenantCtx>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    in_text_pool(state, &ctx, body, tokenize_body).await
}

/// Runs `job` over the body in the text pool (tokenizing a long prompt, or detokenizing a
/// long list of ids, is CPU work that must not run on the reactor), with the tenant's share
/// of the pool, as the generating endpoints do.
async fn in_text_pool(
    state: Shared,
    ctx: &TenantCtx,
    body: std::result::Result<Bytes, BytesRejection>,
    job: fn(&Shared, std::result::Result<Bytes, BytesRejection>) -> Result<Value>,
) -> Response {
    let size = body.as_ref().map_or(0, Bytes::len);
    let s = state.clone();
    // The answer is serialized in the pool too: 250,000 token ids are megabytes of JSON.
    let answer = state
        .text_pool
        .run_sized(ctx.tenant.id.0, size, move || {
            let t = std::time::Instant::now();
            let out = job(&s, body).and_then(|v| {
                serde_json::to_vec(&v).map_err(|e| GatewayError::Internal(e.to_string()))
            });
            (out, t.elapsed().as_secs_f64())
        })
        .await
        .and_then(|(r, seconds)| {
            ctx.metrics.host_seconds[0].record(seconds);
            r
        });
    if let Err(e) = &answer {
        if e.status() == StatusCode::SERVICE_UNAVAILABLE {
            state.metrics.shed("text_pool");
        }
    }
    answer
        .map(|json| ([(header::CONTENT_TYPE, "application/json")], json).into_response())
        .unwrap_or_else(IntoResponse::into_response)
}

fn tokenize_body(
    state: &Shared,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Value> {
    let b: TokenizeBody = parse(body, TOKENIZE_FIELDS)?;
    check_model(state, b.model)?;
    let text = &state.text;
    let tokens = match (b.prompt, b.messages) {
        (Some(_), Some(_)) => {
            return Err(GatewayError::invalid(
                "messages",
                "send `prompt` or `messages`, not both",
            ))
        }
        (None, None) => {
            return Err(GatewayError::invalid(
                "prompt",
                "send `prompt` (a string) or `messages`",
            ))
        }
        (Some(p), None) => {
            if b.add_generation_prompt.is_some() || b.continue_final_message.is_some() {
                return Err(GatewayError::invalid(
                    "add_generation_prompt",
                    "`add_generation_prompt` and `continue_final_message` go with `messages`",
                ));
            }
            fits_context(state, "prompt", p.len())?;
            text.encode_with(&p, b.add_special_tokens.unwrap_or(true))
                .map_err(|e| GatewayError::invalid("prompt", e))?
        }
        (None, Some(messages)) => {
            if b.continue_final_message == Some(true) {
                return Err(GatewayError::invalid(
                    "continue_final_message",
                    "`continue_final_message` is not supported; leave it out or false",
                ));
            }
            let parsed = validate::chat_messages(messages)?;
            fits_context(
                state,
                "messages",
                parsed.iter().map(|m| m.content.len()).sum(),
            )?;
            let add_generation_prompt = b.add_generation_prompt.unwrap_or(true);
            text.tokenize_chat(
                &parsed,
                add_generation_prompt,
                b.add_special_tokens.unwrap_or(false),
            )
            .map_err(|e| {
                GatewayError::invalid("messages", format!("cannot apply the chat template: {e}"))
            })?
        }
    };
    let token_strs = b
        .return_token_strs
        .unwrap_or(false)
        .then(|| text.token_strs(&tokens));
    Ok(json!({
        "count": tokens.len(),
        "max_model_len": state.model.max_model_len,
        "tokens": tokens,
        "token_strs": token_strs,
    }))
}

/// Refuses text that cannot fit the model's context by its length in bytes alone, before it
/// is tokenized (a token covers at most [`crate::text::Text::max_prompt_bytes`] bytes).
fn fits_context(state: &Shared, field: &str, bytes: usize) -> Result<()> {
    let tokens = state.model.max_model_len;
    match state.text.max_prompt_bytes(tokens) {
        Some(max) if bytes > max => Err(GatewayError::invalid(
            field,
            format!(
                "the text is {bytes} bytes long; the model's context of {tokens} tokens \
                 (max_model_len) fits at most {max} bytes: it cannot fit"
            ),
        )),
        _ => Ok(()),
    }
}

/// `POST /detokenize`: `{"prompt": text}` of `tokens` (special tokens included, as vLLM).
pub async fn detokenize(
    State(state): State<Shared>,
    Extension(ctx): Extension<Arc<TenantCtx>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    in_text_pool(state, &ctx, body, detokenize_body).await
}

fn detokenize_body(
    state: &Shared,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Value> {
    let b: DetokenizeBody = parse(body, &["model", "tokens"])?;
    check_model(state, b.model)?;
    let vocab = state.text.vocab_size().map_or(u32::MAX as usize, |v| v);
    let mut ids = Vec::with_capacity(b.tokens.len());
    for (i, t) in b.tokens.iter().enumerate() {
        match u32::try_from(*t) {
            Ok(id) if (id as usize) < vocab => ids.push(id),
            _ => {
                return Err(GatewayError::invalid(
                    format!("tokens[{i}]"),
                    format!("token id {t} is outside the vocabulary (0 ..< {vocab})"),
                ))
            }
        }
    }
    Ok(json!({ "prompt": state.text.detokenize(&ids) }))
}
