//! [`UsageCounts`]: what one tenant used in one hour (or any sum of hours), and its encoding
//! as the ledger stores it.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TenantError};

/// Bytes of one encoded [`UsageCounts`]: six big-endian u64 counters.
pub(crate) const VALUE_BYTES: usize = 48;

/// What one tenant used in one hour (or in any sum of hours).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageCounts {
    /// Requests the engine accepted (one per HTTP request, whatever its `n` or prompts).
    pub requests: u64,
    /// Sequences the engine accepted: each choice of each prompt (`n` × prompts, or
    /// `best_of` × prompts), the unit of `max_concurrent` seats and of the SLO series.
    pub sequences: u64,
    pub prompt_tokens: u64,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Accepted requests that ended in an error: a stream's tokens delivered before it are
    /// counted above, a non-streamed error answer's are not (its client received none).
    pub errors: u64,
}

impl UsageCounts {
    pub fn add(&mut self, o: &UsageCounts) {
        self.requests += o.requests;
        self.sequences += o.sequences;
        self.prompt_tokens += o.prompt_tokens;
        self.cached_tokens += o.cached_tokens;
        self.completion_tokens += o.completion_tokens;
        self.errors += o.errors;
    }

    /// Each counter the larger of the two.
    pub(crate) fn field_max(&self, o: &UsageCounts) -> UsageCounts {
        UsageCounts {
            requests: self.requests.max(o.requests),
            sequences: self.sequences.max(o.sequences),
            prompt_tokens: self.prompt_tokens.max(o.prompt_tokens),
            cached_tokens: self.cached_tokens.max(o.cached_tokens),
            completion_tokens: self.completion_tokens.max(o.completion_tokens),
            errors: self.errors.max(o.errors),
        }
    }

    pub(crate) fn encode(&self) -> [u8; VALUE_BYTES] {
        let mut out = [0u8; VALUE_BYTES];
        let fields = [
            self.requests,
            self.sequences,
            self.prompt_tokens,
            self.cached_tokens,
            self.completion_tokens,
            self.errors,
        ];
        for (chunk, v) in out.chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&v.to_be_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<UsageCounts> {
        let [requests, sequences, prompt_tokens, cached_tokens, completion_tokens, errors] =
            be_u64s(bytes).ok_or_else(|| {
                TenantError::Corrupt(format!(
                    "a usage value is {} bytes, not {VALUE_BYTES}",
                    bytes.len()
                ))
            })?;
        Ok(UsageCounts {
            requests,
            sequences,
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            errors,
        })
    }
}

/// `N` big-endian u64s, when `bytes` is exactly that long.
pub(crate) fn be_u64s<const N: usize>(bytes: &[u8]) -> Option<[u64; N]> {
    if bytes.len() != 8 * N {
        return None;
    }
    let mut out = [0u64; N];
    for (v, chunk) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        *v = u64::from_be_bytes(chunk.try_into().expect("8 bytes"));
    }
    Some(out)
}
