//! The engine's settings and their defaults.

use serde::{Deserialize, Serialize};

/// Engine settings (deserializable; defaults as in the paper's runs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: u32,
    /// Token budget per iteration, shared by decode tokens and prefill chunks.
    pub max_batched_tokens: u32,
    /// At most this many requests resident (running or restoring) at once.
    pub max_num_seqs: u32,
    /// Rotation budget `B_xfer`: blocks moved per iteration per direction. `None` (the
    /// default): derived every iteration from the link's rate and the recent iteration time
    /// (`engine/src/engine/xfer.rs`).
    pub b_xfer: Option<u32>,
    /// With the automatic `B_xfer`: the share of one iteration's link capacity the scheduler
    /// may plan.
    pub b_xfer_link_share: f64,
    /// HBM tier size in blocks.
    pub hbm_blocks: u32,
    /// DRAM tier size in blocks.
    pub dram_blocks: u32,
    /// At most this many requests waiting for admission; `submit` refuses more.
    pub max_queue: usize,
    /// Write full blocks back to their DRAM mirror right away (DuplexKV).
    pub eager_writeback: bool,
    /// Refuse a new request (`EngineError::WouldMissSlo`) when its tenant has requests waiting
    /// and its recent requests waited more than this fraction of their TTFT SLO to be
    /// admitted (`engine/src/engine/shed.rs`). `None`: never (the default).
    pub shed_late: Option<f64>,
    /// Tokens a request must produce in one running period before its consecutive-rotation
    /// count resets. 80: with weighted LVF's default cap of 1, a restored request runs at least
    /// this long; 1.81 rotations per request in burst recovery against 3.19 with 32, the
    /// flood beside the steady tenants no worse (docs/BENCHMARKS.md, "Tenant isolation
    /// (twin)").
    pub progress_tokens: u32,
    /// A prompt with more than this many tokens left to prefill is a *long* prefill: while
    /// other prefills want tokens it gets at most this many per iteration (the rest of the
    /// budget when they do not), and at most `max_long_prefills` run at once, so short prompts
    /// are never stuck behind long ones (docs/SCHEDULING.md, "Long prompts"). `None`: half of
    /// `max_batched_tokens`.
    pub long_prefill_tokens: Option<u32>,
    /// Long prefills under way at once.
    pub max_long_prefills: u32,
    /// Keep full blocks as a prefix cache across both tiers, per namespace
    /// (docs/PREFIX_CACHE.md). Off: every prompt is prefilled from its first token.
    pub prefix_cache: bool,
    /// Let the prefix cache keep blocks whose only copy is in DRAM (and copy them in on a
    /// hit). Off: an HBM-only prefix cache, as vLLM's, over the same rotation machinery.
    pub prefix_cache_dram: bool,
    /// Seconds a copy batch may take before the engine gives up on it as a fault: the
    /// requests it touches are recomputed and its slots stay quarantined until it lands.
    /// Only time the engine could see it land counts: a model step longer than this is no
    /// fault of the copies issued before it (`engine/copy_fault.rs`).
    pub copy_timeout_s: f64,
    /// A request still waiting for its first admission this many times its TTFT target after
    /// arriving is shed (`engine/src/engine/deadline.rs`), unless it names its own deadline
    /// (`EngineRequest::queue_deadline_s`). `None`: only requests with their own deadline.
    pub queue_deadline_ttfts: Option<f64>,
    /// With a runner that knows its step cost (`ModelRunner::step_cost`), keep each step's
    /// predicted time within this share of the tightest TBT target of the requests decoding
    /// in it: long-context decodes that do not fit skip steps in turn, prompt chunks get the
    /// time left (`engine/src/engine/step_budget.rs`); in every step with a request decoding.
    /// `None`: steps are bounded by tokens only. Default [`DEFAULT_STEP_TBT_SHARE`].
    pub step_tbt_share: Option<f64>,
    /// Write one JSON line per step (what it ran, its measured and predicted time) to this
    /// file (`engine/src/engine/step_trace.rs`); `None`: no trace (the default).
    pub step_trace: Option<std::path::PathBuf>,
}

impl EngineConfig {
    /// `queue_deadline_ttfts` from a command-line or file setting: unset, the default; 0,
    /// off; otherwise that many TTFT targets (finite and positive).
    pub fn queue_deadline_setting(v: Option<f64>) -> Result<Option<f64>, String> {
        off_or_positive(
            v,
            Some(DEFAULT_QUEUE_DEADLINE_TTFTS),
            "queue_deadline_ttfts",
            "number of TTFT targets",
        )
    }

    /// `step_tbt_share` from a command-line or file setting: unset, the default; 0, off;
    /// otherwise that share (finite and positive).
    pub fn step_tbt_share_setting(v: Option<f64>) -> Result<Option<f64>, String> {
        off_or_positive(
            v,
            Some(DEFAULT_STEP_TBT_SHARE),
            "step_tbt_share",
            "share of the TBT target",
        )
    }

    /// The long-prefill threshold in effect.
    pub fn long_prefill(&self) -> u32 {
        self.long_prefill_tokens
            .unwrap_or(self.max_batched_tokens / 2)
            .max(1)
    }
}

/// The default queue deadline, in TTFT targets: past ten times its target a first token is
/// worth little to an interactive client, and most client timeouts have given up.
pub const DEFAULT_QUEUE_DEADLINE_TTFTS: f64 = 10.0;

/// The default step time budget, as a share of the tightest running TBT target: 0.8 leaves
/// room for the host's work between steps and the cost model's error (learned by the
/// calibration). It binds in every step with a request decoding, whatever its context, so a
/// flood of prompts cannot stretch another tenant's gaps (docs/SCHEDULING.md, "The step
/// rule").
pub const DEFAULT_STEP_TBT_SHARE: f64 = 0.8;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            max_batched_tokens: 16384,
            max_num_seqs: 1024,
            b_xfer: None,
            b_xfer_link_share: 1.0,
            hbm_blocks: 4096,
            dram_blocks: 16384,
            max_queue: 100_000,
            eager_writeback: true,
            progress_tokens: 80,
            shed_late: None,
            long_prefill_tokens: None,
            max_long_prefills: 1,
            prefix_cache: true,
            prefix_cache_dram: true,
            copy_timeout_s: 10.0,
            queue_deadline_ttfts: Some(DEFAULT_QUEUE_DEADLINE_TTFTS),
            step_tbt_share: Some(DEFAULT_STEP_TBT_SHARE),
            step_trace: None,
        }
    }
}

/// A setting that 0 turns off: unset, `default`; 0, `None`; else the value if finite and
/// positive.
fn off_or_positive(
    v: Option<f64>,
    default: Option<f64>,
    name: &str,
    what: &str,
) -> Result<Option<f64>, String> {
    match v {
        None => Ok(default),
        Some(0.0) => Ok(None),
        Some(k) if k.is_finite() && k > 0.0 => Ok(Some(k)),
        Some(k) => Err(format!(
            "{name} must be a positive {what} (0: off), got {k}"
        )),
    }
}
