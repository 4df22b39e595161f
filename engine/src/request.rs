//! Requests as the engine holds them: what a caller submits ([`EngineRequest`]), the states a
//! request moves through ([`ReqState`]) and its times.

use crate::kv::prefix::chain;
use crate::kv::{BlockHash, CacheScope, PrefixHit};
use crate::sampling::{SamplingParams, TokenLogprobs};
use superinfer_policies::{Phase, RequestId, Slo, TenantId};

/// A validated request: tenant data arrives as plain fields (DESIGN.md: engine → tenants is
/// forbidden).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    pub id: RequestId,
    pub tenant: TenantId,
    pub weight: f64,
    pub slo: Slo,
    /// Prompt token ids (the simulated runner uses only their number).
    pub prompt: Vec<u32>,
    /// Generate at most this many tokens.
    pub max_tokens: u32,
    /// Keep generating past end-of-sequence tokens (benchmarks: lengths set by `max_tokens`).
    pub ignore_eos: bool,
    /// Extra token ids that end the request.
    pub stop_token_ids: Vec<u32>,
    pub sampling: SamplingParams,
    /// Arrival time on the engine clock; `None`: the time of `submit`.
    pub arrival: Option<f64>,
    /// The prefix-cache namespace its blocks are found and shared in; `None`: the tenant's own
    /// ([`CacheScope::tenant`]).
    pub cache: Option<CacheScope>,
    /// Another live request with the same prompt and namespace that this one follows (the
    /// choices of one request with `n` > 1): while that one computes the prompt, this one
    /// waits (for a few iterations at most), then finds the prompt's full blocks cached
    /// instead of computing them a second time. `None`: admitted as any other.
    pub follows: Option<RequestId>,
    /// Seconds after arrival by which it must have been admitted, else it is shed
    /// (`engine/src/engine/deadline.rs`); `None`: `EngineConfig::queue_deadline_ttfts` times
    /// its TTFT target.
    pub queue_deadline_s: Option<f64>,
}

impl EngineRequest {
    /// Request `id` of `tenant` for `max_tokens` tokens after `prompt`, with the defaults
    /// every other field takes: weight 1, the default SLO, greedy sampling, no stop ids, EOS
    /// honoured, arriving at `submit`, in the tenant's own cache namespace, following nobody.
    pub fn new(id: RequestId, tenant: TenantId, prompt: Vec<u32>, max_tokens: u32) -> Self {
        EngineRequest {
            id,
            tenant,
            weight: 1.0,
            slo: Slo::default(),
            prompt,
            max_tokens,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            sampling: SamplingParams::default(),
            arrival: None,
            cache: None,
            follows: None,
            queue_deadline_s: None,
        }
    }
}

/// Why the engine ended a request with `FinishReason::Error` ([`crate::RequestEnd`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCause {
    /// Something of its own: its model step or its grammar failed.
    Request,
    /// It was still waiting for its first admission at its queue deadline
    /// (`EngineRequest::queue_deadline_s`): shed, for overload, not for a fault of its own.
    QueueDeadline,
}

/// Where a request is in its life. `Evicting` and `Restoring` are the in-flight states
/// between `Running` and `Rotary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReqState {
    Waiting,
    Running,
    Evicting,
    Rotary,
    Restoring,
}

/// The allowed request transitions (finishing is allowed from every state).
pub const REQ_TRANSITIONS: &[(ReqState, ReqState)] = &[
    (ReqState::Waiting, ReqState::Running),
    // Admitted with prefix-cache hits found only in DRAM: running once they are copied in.
    (ReqState::Waiting, ReqState::Restoring),
    (ReqState::Running, ReqState::Evicting),
    (ReqState::Running, ReqState::Rotary),
    (ReqState::Evicting, ReqState::Rotary),
    (ReqState::Rotary, ReqState::Restoring),
    (ReqState::Rotary, ReqState::Running),
    (ReqState::Restoring, ReqState::Running),
    // Recompute preemption: the KV is dropped.
    (ReqState::Running, ReqState::Waiting),
    // A copy fault touched its blocks: the KV is dropped wherever the request was.
    (ReqState::Evicting, ReqState::Waiting),
    (ReqState::Rotary, ReqState::Waiting),
    (ReqState::Restoring, ReqState::Waiting),
];

/// Why a request ended. Every request ends with exactly one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence or stop token.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The caller aborted it (or its client went away).
    Abort,
    /// The engine could not serve it.
    Error,
}

/// A live request inside the engine. Laid out for the per-step walk over thousands of them
/// (`repr(C)`, hot fields first): what a decode step reads and writes of a request (its
/// state, counters, times, the token vector's header and copies of the few [`EngineRequest`]
/// fields it needs) sits in its first 144 bytes, and the submitted request itself is boxed,
/// so a request is 240 bytes instead of 496 (docs/BENCHMARKS.md, "Per-step cost").
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Request {
    /// Prompt followed by generated tokens: the sequence whose KV the cache holds.
    pub tokens: Vec<u32>,
    /// The request as submitted (read-only; the batch hands runners its sampling settings).
    pub spec: Box<EngineRequest>,
    /// The last of `hashes` (`cache_root` while there is none): the parent of the next block's
    /// hash, kept beside the hot fields so that the step that fills a block does not load the
    /// end of `hashes` (a cache and TLB miss per filling block; docs/BENCHMARKS.md "Per-step
    /// cost").
    chain_tip: BlockHash,
    /// `spec.id`, `spec.weight`, `spec.tenant`, `spec.prompt.len()`, `spec.max_tokens`,
    /// `spec.ignore_eos` and whether `spec.stop_token_ids` has any (the spec never changes).
    pub id: RequestId,
    pub weight: f64,
    pub tenant: TenantId,
    pub prompt_len: u32,
    pub max_tokens: u32,
    /// Tokens of `tokens` whose KV is in the cache.
    pub kv_len: u32,
    pub generated: u32,
    /// Tokens produced in the current running period.
    pub run_tokens: u32,
    /// Tokens whose KV it has been charged for (the most it ever had): prefill below this
    /// after a recompute is the scheduler's waste, not new service.
    pub charged_kv: u32,
    pub consecutive_rotations: u32,
    pub state: ReqState,
    pub ignore_eos: bool,
    pub has_stop_ids: bool,
    pub t_first: Option<f64>,
    pub t_last: Option<f64>,
    /// Start of the current running period.
    pub t_run: Option<f64>,
    /// Its first admission (the end of its wait in the queue).
    pub t_admit: Option<f64>,
    /// Steps in a row the time budget left its decode out (`engine/step_budget.rs`).
    pub decode_skips: u32,
    /// Seconds of the steps it ran in that were its share (`engine/gpu_time.rs`).
    pub gpu_s: f64,
    /// Seconds of host CPU its grammar's token masks took (`grammar/mask.rs`).
    pub mask_s: f64,
    /// What its first admission found in the prefix cache.
    pub cached: PrefixHit,
    pub t_arr: f64,
    pub rotations: u32,
    pub recomputes: u32,
    /// Hashes of the full blocks of `tokens`, in its namespace (empty with the prefix cache
    /// off).
    pub hashes: Vec<BlockHash>,
    /// The root of its hash chain (its namespace) and its base namespace's key.
    pub cache_root: BlockHash,
    pub cache_base: u64,
    /// Scores of prompt tokens `1..` so far (`SamplingParams::prompt_logprobs`): entry `i`
    /// is token `i + 1`'s, until they go out with the first token.
    pub prompt_logprobs: Vec<TokenLogprobs>,
}

/// Generated tokens a request's vectors have room for from its admission (or `max_tokens`
/// if fewer): a chat reply fits, so decode steps do not reallocate the token vector, the
/// hashes and the block table of thousands of requests at once (each a copy and fresh pages;
/// a tenth of a decode step's host time at 2,000 requests, docs/BENCHMARKS.md "Per-step
/// cost"). A longer reply grows them as usual. 4 KB a request.
pub const GROWTH_RESERVE: u32 = 1024;

impl Request {
    pub fn new(spec: EngineRequest, now: f64) -> Request {
        let spec = Box::new(spec);
        let t_arr = spec.arrival.unwrap_or(now);
        let mut tokens =
            Vec::with_capacity(spec.prompt.len() + spec.max_tokens.min(GROWTH_RESERVE) as usize);
        tokens.extend_from_slice(&spec.prompt);
        Request {
            tokens,
            chain_tip: BlockHash(0),
            id: spec.id,
            weight: spec.weight,
            tenant: spec.tenant,
            prompt_len: spec.prompt.len() as u32,
            max_tokens: spec.max_tokens,
            kv_len: 0,
            generated: 0,
            run_tokens: 0,
            charged_kv: 0,
            consecutive_rotations: 0,
            state: ReqState::Waiting,
            ignore_eos: spec.ignore_eos,
            has_stop_ids: !spec.stop_token_ids.is_empty(),
            t_first: None,
            t_last: None,
            t_run: None,
            t_admit: None,
            decode_skips: 0,
            gpu_s: 0.0,
            mask_s: 0.0,
            cached: PrefixHit::default(),
            t_arr,
            rotations: 0,
            recomputes: 0,
            hashes: Vec::new(),
            cache_root: BlockHash(0),
            cache_base: 0,
            prompt_logprobs: Vec::new(),
            spec,
        }
    }

    /// Starts its hash chain at `root` (its namespace) with the full blocks of its tokens.
    pub fn start_chain(&mut self, root: BlockHash, block_size: u32) {
        self.cache_root = root;
        self.hashes.clear();
        self.hashes.reserve(self.expected_blocks(block_size));
        self.chain_tip = root;
        self.extend_chain(self.tokens.len(), block_size);
    }

    /// Names the full blocks of `tokens[..upto]` not named yet.
    pub fn extend_chain(&mut self, upto: usize, block_size: u32) {
        let bs = block_size.max(1) as usize;
        while (self.hashes.len() + 1) * bs <= upto {
            let i = self.hashes.len();
            self.chain_tip = chain(self.chain_tip, &self.tokens[i * bs..(i + 1) * bs]);
            self.hashes.push(self.chain_tip);
        }
        debug_assert_eq!(
            self.chain_tip,
            self.hashes.last().copied().unwrap_or(self.cache_root)
        );
    }

    /// Blocks its tokens fill once it has generated what its vectors have room for
    /// ([`GROWTH_RESERVE`]): the capacity its hashes and block table start with.
    pub fn expected_blocks(&self, block_size: u32) -> usize {
        let tokens = self.prompt_len + self.max_tokens.min(GROWTH_RESERVE);
        tokens.div_ceil(block_size.max(1)) as usize
    }

    /// Moves to `to`, checking the transition table in debug builds.
    pub fn set_state(&mut self, to: ReqState) {
        debug_assert!(
            REQ_TRANSITIONS.contains(&(self.state, to)),
            "illegal request transition {:?} -> {to:?}",
            self.state
        );
        self.state = to;
    }

    /// Tokens still to run before the next token can be sampled (1 when decoding).
    pub fn remaining(&self) -> u32 {
        self.tokens.len() as u32 - self.kv_len
    }

    /// In prefill (more than one token to run before the next sample).
    pub fn prefilling(&self) -> bool {
        self.remaining() > 1
    }

    /// Decoding with its blocks exactly full: its next token needs a new block.
    pub fn next_token_needs_block(&self, block_size: u32) -> bool {
        !self.prefilling() && self.kv_len.is_multiple_of(block_size)
    }

    /// The phase a policy sees, or `None` while a copy is in flight.
    pub fn phase(&self) -> Option<Phase> {
        match self.state {
            ReqState::Waiting => Some(Phase::Waiting),
            ReqState::Running => Some(Phase::Running),
            ReqState::Rotary => Some(Phase::Rotary),
            ReqState::Evicting | ReqState::Restoring => None,
        }
    }
}
