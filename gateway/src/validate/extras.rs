//! The fields honoured since the rule "no field accepted and ignored": `logit_bias`,
//! `min_tokens`, `echo`, `stream_options.continuous_usage_stats`, `cache_salt`.

use superinfer_engine::SamplingParams;

use super::endpoint::Endpoint;
use crate::error::{GatewayError, Result};
use crate::text::Text;
use crate::wire::ModelInfo;

#[cfg(test)]
mod tests;

/// vLLM's `min_tokens`: at most `max_tokens`, not with stop strings; it holds back the
/// request's `stop_token_ids` too.
pub(super) fn min_tokens(
    min: Option<u32>,
    max_tokens: u32,
    stop: &[String],
    stop_token_ids: &[u32],
    sampling: &mut SamplingParams,
) -> Result<()> {
    let Some(min) = min else {
        return Ok(());
    };
    if min > max_tokens {
        return Err(GatewayError::invalid(
            "min_tokens",
            format!("`min_tokens` ({min}) is more than `max_tokens` ({max_tokens})"),
        ));
    }
    if min > 0 && !stop.is_empty() {
        return Err(GatewayError::invalid(
            "min_tokens",
            "`min_tokens` with `stop` strings is not supported; use `stop_token_ids`",
        ));
    }
    sampling.min_tokens = min;
    sampling.min_tokens_stops = stop_token_ids.to_vec();
    Ok(())
}

/// `stream_options.continuous_usage_stats`: only with `include_usage`.
pub(super) fn continuous_usage(
    o: Option<&crate::wire::StreamOptions>,
    include_usage: bool,
) -> Result<bool> {
    let on = o.and_then(|o| o.continuous_usage_stats).unwrap_or(false);
    if on && !include_usage {
        return Err(GatewayError::invalid(
            "stream_options",
            "`continuous_usage_stats` needs \"include_usage\": true",
        ));
    }
    Ok(on)
}

/// At most this many `logit_bias` entries. OpenAI documents no cap and vLLM has none; every
/// entry is applied at every sampling step of the request, so the map is bounded like `stop`.
pub const MAX_LOGIT_BIAS_ENTRIES: usize = 1024;

/// `logit_bias`: at most [`MAX_LOGIT_BIAS_ENTRIES`] token ids of the vocabulary, each written
/// as a plain decimal number, to biases in [-100, 100]. Only that one spelling per id is
/// accepted ("01", "+1" or " 1" would name the same token as "1" and add its bias twice).
pub(super) fn logit_bias(
    bias: Option<std::collections::HashMap<String, f32>>,
    text: &Text,
) -> Result<Vec<(u32, f32)>> {
    let bias = bias.unwrap_or_default();
    if bias.len() > MAX_LOGIT_BIAS_ENTRIES {
        return Err(GatewayError::invalid(
            "logit_bias",
            format!(
                "`logit_bias` has {} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are allowed",
                bias.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(bias.len());
    for (k, b) in bias {
        let id = token_id(&k).ok_or_else(|| {
            GatewayError::invalid(
                "logit_bias",
                format!(
                    "`logit_bias` key {k:?} is not a token id: write ids as decimal numbers \
                     without sign, spaces or leading zeros, e.g. \"42\""
                ),
            )
        })?;
        if text.vocab_size().is_some_and(|v| id as usize >= v) {
            return Err(GatewayError::invalid(
                "logit_bias",
                format!("`logit_bias`: token id {id} is outside the vocabulary"),
            ));
        }
        if !(-100.0..=100.0).contains(&b) {
            return Err(GatewayError::invalid(
                "logit_bias",
                format!("`logit_bias` values must be in [-100, 100], got {b}"),
            ));
        }
        out.push((id, b));
    }
    out.sort_by_key(|&(id, _)| id);
    Ok(out)
}

/// A token id in its one canonical spelling: ASCII digits, no leading zero but in "0", that
/// fit a `u32`.
fn token_id(key: &str) -> Option<u32> {
    let digits = !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit());
    let canonical = digits && (key == "0" || !key.starts_with('0'));
    canonical.then(|| key.parse().ok()).flatten()
}

/// `echo` on completions: the prompt's text before the answer (not with a list of prompts).
/// With `logprobs` the prompt's tokens are scored too, on a backend that can
/// (`ModelInfo::prompt_logprobs`), in a response that is not streamed.
pub(super) fn echo_text(
    on: bool,
    endpoint: Endpoint,
    prompt: &[u32],
    several: bool,
    (logprobs, stream): (Option<u32>, bool),
    model: &ModelInfo,
    text: &Text,
) -> Result<Option<String>> {
    if several && (on || logprobs.is_some()) {
        let field = if logprobs.is_some() {
            "logprobs"
        } else {
            "echo"
        };
        return Err(GatewayError::invalid(
            field,
            format!("`{field}` with a list of prompts or `n` > 1 is not supported"),
        ));
    }
    if !on {
        return Ok(None);
    }
    let refuse = |msg: &str| Err(GatewayError::invalid("echo", msg));
    if endpoint == Endpoint::Chat {
        return refuse("`echo` is not supported in chat completions");
    }
    if logprobs.is_some() && !model.prompt_logprobs {
        return refuse(
            "`echo` with `logprobs` is not supported by this backend (it reports no prompt \
             log-probabilities; the CPU model path does)",
        );
    }
    if logprobs.is_some() && stream {
        return refuse(
            "`echo` with `logprobs` is not supported when streaming; leave out `stream`",
        );
    }
    Ok(Some(text.prompt_text(prompt)))
}

/// At most this many bytes of `cache_salt` (it is hashed into the cache's namespace, so its
/// length buys nothing; vLLM's salts are short random strings).
pub const MAX_CACHE_SALT_BYTES: usize = 256;

/// vLLM's `cache_salt`: a non-empty string of at most [`MAX_CACHE_SALT_BYTES`] bytes.
pub(super) fn cache_salt(salt: Option<String>) -> Result<Option<String>> {
    match salt {
        Some(s) if s.is_empty() => Err(GatewayError::invalid(
            "cache_salt",
            "`cache_salt` must not be empty; leave it out to use the tenant's namespace",
        )),
        Some(s) if s.len() > MAX_CACHE_SALT_BYTES => Err(GatewayError::invalid(
            "cache_salt",
            format!(
                "`cache_salt` has {} bytes; at most {MAX_CACHE_SALT_BYTES} are allowed",
                s.len()
            ),
        )),
        s => Ok(s),
    }
}
