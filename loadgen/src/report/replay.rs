//! What a trace replay's report adds: the trace (file, checksum, what was left out) and the
//! prefix-cache hits its content allows beside those the server reported.

use super::CacheSummary;
use crate::workload::prefix_ideal::IdealHits;
use crate::workload::replay::ReplayInfo;
use serde::{Deserialize, Serialize};

/// The replay part of a run's summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplaySummary {
    pub trace: ReplayInfo,
    pub ideal: IdealHits,
    /// Ideal hit rate with a cache that never evicts.
    pub ideal_infinite_hit_rate: f64,
    /// Ideal hit rate with an LRU cache of the target's KV capacity; `None`: unknown.
    pub ideal_capacity_hit_rate: Option<f64>,
    /// The hit rate the server reported (over the requests that say).
    pub achieved_hit_rate: Option<f64>,
}

impl ReplaySummary {
    pub fn new(trace: &ReplayInfo, ideal: IdealHits, cache: &CacheSummary) -> ReplaySummary {
        ReplaySummary {
            trace: trace.clone(),
            ideal_infinite_hit_rate: ideal.infinite_rate(),
            ideal_capacity_hit_rate: ideal.bounded_rate(),
            ideal,
            achieved_hit_rate: cache.hit_rate,
        }
    }

    /// Lines for the report's Markdown.
    pub fn markdown(&self) -> String {
        let t = &self.trace;
        let pct =
            |r: Option<f64>| r.map_or("unknown".to_string(), |r| format!("{:.1}%", 100.0 * r));
        let cap = t
            .max_prompt_tokens
            .map_or("none".to_string(), |c| format!("{c} tokens"));
        let mut s = format!(
            "- trace `{}` ({}, sha256 `{}`): {} rows, {} in the window of {:.1} s, replayed in \
             {:.1} s (time scale {}, rate scale {}); tenants {}\n",
            t.path,
            t.format,
            t.sha256,
            t.rows_in_file,
            t.rows_in_window,
            t.window_s,
            t.run_s,
            t.time_scale,
            t.rate_scale,
            t.assign,
        );
        s += &format!(
            "- left out: {} rows above the prompt cap ({cap}; longest {}), {} rows without \
             prompt or output; {} rows that shared a timestamp spread over {} s\n",
            t.over_cap, t.longest_over_cap, t.empty, t.spread, t.resolution_s
        );
        s += &format!(
            "- prefix cache hit rate: ideal {} (infinite cache), {} (LRU of the target's {} \
             KV blocks); achieved {}\n",
            pct(Some(self.ideal_infinite_hit_rate)),
            pct(self.ideal_capacity_hit_rate),
            self.ideal
                .capacity_blocks
                .map_or("unknown".to_string(), |b| b.to_string()),
            pct(self.achieved_hit_rate),
        );
        s
    }
}
