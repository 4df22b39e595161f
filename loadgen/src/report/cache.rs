//! Prefix-cache statistics of a run: prompt tokens, the tokens the server found cached (by
//! tier where it says), and the hit rate, over the requests whose cached count is known.

use crate::record::RequestRecord;
use serde::{Deserialize, Serialize};

/// Prefix-cache totals over a set of requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheSummary {
    /// Prompt tokens of every request sent.
    pub prompt_tokens: u64,
    /// Requests whose cached count is known (the twin: those that finished; HTTP: responses
    /// with `usage.prompt_tokens_details.cached_tokens`).
    pub known_requests: u64,
    /// Prompt tokens of those requests.
    pub known_prompt_tokens: u64,
    /// Prompt tokens of those requests found in the cache: prefill tokens saved.
    pub cached_tokens: u64,
    /// Of `cached_tokens`, those found in HBM and those copied in from DRAM, when every known
    /// request says which tier (the twin does; OpenAI's usage does not).
    pub cached_hbm_tokens: Option<u64>,
    pub cached_dram_tokens: Option<u64>,
    /// `cached_tokens / known_prompt_tokens`; `None` when no count is known.
    pub hit_rate: Option<f64>,
}

impl CacheSummary {
    pub fn of<'a>(records: impl Iterator<Item = &'a RequestRecord>) -> CacheSummary {
        let mut s = CacheSummary::default();
        let mut dram = Some(0u64);
        for r in records {
            s.prompt_tokens += u64::from(r.prompt_tokens);
            let Some(cached) = r.cached_tokens else {
                continue;
            };
            s.known_requests += 1;
            s.known_prompt_tokens += u64::from(r.prompt_tokens);
            s.cached_tokens += u64::from(cached);
            dram = dram
                .zip(r.cached_dram_tokens)
                .map(|(a, b)| a + u64::from(b));
        }
        if s.known_requests > 0 {
            s.cached_dram_tokens = dram;
            s.cached_hbm_tokens = dram.map(|d| s.cached_tokens - d);
            s.hit_rate = Some(if s.known_prompt_tokens > 0 {
                s.cached_tokens as f64 / s.known_prompt_tokens as f64
            } else {
                0.0
            });
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::RequestSpec;

    fn rec(prompt: u32, cached: Option<(u32, Option<u32>)>) -> RequestRecord {
        let spec = RequestSpec {
            id: 0,
            tenant: 0,
            arrival_s: 0.0,
            prompt_tokens: prompt,
            output_tokens: 1,
            system_tokens: 0,
            message_tokens: prompt,
            content_seed: 0,
            turn: None,
            blocks: None,
        };
        RequestRecord {
            cached_tokens: cached.map(|c| c.0),
            cached_dram_tokens: cached.and_then(|c| c.1),
            ..RequestRecord::unserved(&spec)
        }
    }

    #[test]
    fn hit_rate_counts_only_requests_with_a_known_count() {
        let rs = [
            rec(100, Some((64, Some(16)))),
            rec(300, Some((0, Some(0)))),
            rec(50, None),
        ];
        let s = CacheSummary::of(rs.iter());
        assert_eq!(s.prompt_tokens, 450);
        assert_eq!(s.known_requests, 2);
        assert_eq!(s.known_prompt_tokens, 400);
        assert_eq!(s.cached_tokens, 64);
        assert_eq!(s.cached_dram_tokens, Some(16));
        assert_eq!(s.cached_hbm_tokens, Some(48));
        assert_eq!(s.hit_rate, Some(0.16));
    }

    #[test]
    fn tiers_are_unknown_when_one_request_does_not_say() {
        let rs = [rec(100, Some((32, Some(0)))), rec(100, Some((32, None)))];
        let s = CacheSummary::of(rs.iter());
        assert_eq!(s.cached_tokens, 64);
        assert_eq!(s.cached_dram_tokens, None);
        assert_eq!(s.cached_hbm_tokens, None);
        let none = CacheSummary::of([rec(10, None)].iter());
        assert_eq!(none.hit_rate, None);
    }
}
