//! [`Settings`]: every `serve` setting as the flags, the environment and the config file give
//! it, before defaults and checks.

use anyhow::Context;
use clap::Args;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use superinfer_policies::{PolicyKind, WaitCapScope};

use crate::proxy::{ObjectiveSpec, TrustedNet};
use crate::quota::fleet::FailureMode;

/// Every `serve` setting; each is optional so the sources can be layered.
#[derive(Args, Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Address to listen on [default: 127.0.0.1:8000].
    #[arg(long, env = "SUPERINFER_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Serve /metrics on this address instead of the main listener.
    #[arg(long, env = "SUPERINFER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Data directory: the tenant store (and the embedded model, once written)
    /// [default: ./superinfer-data].
    #[arg(long, env = "SUPERINFER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Token for the admin API (/admin/v1); without it the admin API is disabled.
    #[arg(long, env = "SUPERINFER_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A tenants file (TOML, docs/TENANTS.md) applied at start and on SIGHUP; with it no
    /// `default` tenant is created.
    #[arg(long, env = "SUPERINFER_TENANTS_FILE")]
    pub tenants_file: Option<PathBuf>,
    /// With --tenants-file: also delete the tenants the file does not name [default: false].
    #[arg(long, env = "SUPERINFER_TENANTS_PRUNE", num_args = 0..=1, default_missing_value = "true")]
    pub tenants_prune: Option<bool>,
    /// A Hugging Face model directory, or a GGUF file, to serve.
    #[arg(
        long,
        visible_alias = "model",
        env = "SUPERINFER_MODEL_DIR",
        conflicts_with = "sim_profile"
    )]
    pub model_dir: Option<PathBuf>,
    /// Serve the simulated engine at this hardware + model profile (e.g. h200-llama-3-8b), or
    /// `zero` for steps that cost nothing [default: the embedded tiny model on the CPU].
    #[arg(long, env = "SUPERINFER_SIM_PROFILE")]
    pub sim_profile: Option<String>,
    /// Scheduling policy: fcfs, wf, sf, edf, lvf, wlvf [default: wlvf].
    #[arg(long, env = "SUPERINFER_POLICY")]
    pub policy: Option<PolicyKind>,
    /// VLT (LVF and weighted LVF): weight of a paused request's lag against a waiting one's
    /// [default: 3, the paper's].
    #[arg(long, env = "SUPERINFER_ALPHA")]
    pub alpha: Option<f64>,
    /// VLT tolerance window of paused (rotary) requests, as a fraction of the tenant's TBT SLO;
    /// may be negative [default: 0].
    #[arg(long, env = "SUPERINFER_BETA_B", allow_negative_numbers = true)]
    pub beta_b: Option<f64>,
    /// VLT tolerance window of waiting requests, as a fraction of the tenant's TTFT SLO; may
    /// be negative [default: 0.5; 0 admits new requests earlier under saturation, see
    /// docs/BENCHMARKS.md].
    #[arg(long, env = "SUPERINFER_BETA_F", allow_negative_numbers = true)]
    pub beta_f: Option<f64>,
    /// Weighted LVF starvation cap: a waiting or rotary request that has waited this many
    /// seconds is promoted ahead of everything else [default: none].
    #[arg(long, env = "SUPERINFER_MAX_WAIT_S")]
    pub max_wait_s: Option<f64>,
    /// Weighted LVF: what the wait cap promotes an overdue request past: `global` (every
    /// request) or `tenant` (its own tenant's only, so a flooding tenant's overdue requests
    /// use its share and no one else's) [default: global].
    #[arg(long, env = "SUPERINFER_WAIT_CAP_SCOPE")]
    pub wait_cap_scope: Option<WaitCapScope>,
    /// Weighted LVF starvation cap: after this many consecutive rotations (or recomputes)
    /// without progress a request is no longer rotated out (1 stops thrashing: see
    /// docs/BENCHMARKS.md) [default: 1].
    #[arg(long, env = "SUPERINFER_MAX_ROTATIONS")]
    pub max_rotations: Option<u32>,
    /// Weighted LVF rotation cap: tokens a request must produce in one running period before
    /// its consecutive-rotation count resets (larger: less rotation) [default: 80].
    #[arg(long, env = "SUPERINFER_PROGRESS_TOKENS")]
    pub progress_tokens: Option<u32>,
    /// Weighted LVF fairness band, in cost units (prompt tokens) per unit of weight: tenants
    /// this close compete on VLT (docs/SCHEDULING.md §5) [default: 1024].
    #[arg(long, env = "SUPERINFER_FAIRNESS_QUANTUM")]
    pub fairness_quantum: Option<f64>,
    /// Weighted LVF: cost of one generated token in prompt tokens, for the fairness counters
    /// [default: 1].
    #[arg(long, env = "SUPERINFER_DECODE_COST")]
    pub decode_cost: Option<f64>,
    /// Weighted LVF: serve first what can still meet its TTFT SLO (`false`: LVF's order inside
    /// a band) [default: true].
    #[arg(long, env = "SUPERINFER_DEFER_LATE")]
    pub defer_late: Option<bool>,
    /// Weighted LVF: a request may displace running ones to get a seat (max_num_seqs) while
    /// HBM has room, as LVF does (`false`: only for HBM room) [default: false].
    #[arg(long, env = "SUPERINFER_PREEMPT_FOR_SEATS")]
    pub preempt_for_seats: Option<bool>,
    /// Refuse a request at once (503 with Retry-After) when its tenant has requests waiting
    /// and its recent requests waited more than this fraction of their TTFT SLO to start
    /// (docs/SCHEDULING.md, "Overload") [default: off].
    #[arg(long, env = "SUPERINFER_SHED_LATE")]
    pub shed_late: Option<f64>,
    /// Shed a request still waiting for its first admission this many times its tenant's TTFT
    /// target after it arrived (503 with Retry-After; docs/SCHEDULING.md, "Overload"); 0:
    /// never [default: 10].
    #[arg(long, env = "SUPERINFER_QUEUE_DEADLINE_TTFTS")]
    pub queue_deadline_ttfts: Option<f64>,
    /// Keep each engine step's predicted time within this share of the tightest TBT target
    /// of the requests decoding in it, when the runner knows its step cost (the simulated
    /// engine; the GPU runner on an H100, H200 or GH200; docs/SCHEDULING.md, "The step
    /// rule"), in every step with a request decoding; 0: off [default: 0.8].
    #[arg(long, env = "SUPERINFER_STEP_TBT_SHARE")]
    pub step_tbt_share: Option<f64>,
    /// Write one JSON line per engine step (what it ran, its measured and predicted time) to
    /// this file, for fitting the cost model to a GPU (docs/OPERATIONS.md, "Step trace")
    /// [default: none].
    #[arg(long, env = "SUPERINFER_STEP_TRACE")]
    pub step_trace: Option<PathBuf>,
    /// Turn the prefix cache off: every prompt is prefilled from its first token
    /// (docs/OPERATIONS.md, "Prefix cache") [default: the cache is on].
    #[arg(long, env = "SUPERINFER_NO_PREFIX_CACHE", num_args = 0..=1, default_missing_value = "true")]
    pub no_prefix_cache: Option<bool>,
    /// Keep the prefix cache in HBM only (as vLLM's): blocks whose only copy is in DRAM are
    /// not kept as cache entries [default: both tiers].
    #[arg(long, env = "SUPERINFER_PREFIX_CACHE_HBM_ONLY", num_args = 0..=1, default_missing_value = "true")]
    pub prefix_cache_hbm_only: Option<bool>,
    /// How the model writes tool calls: `hermes` (`<tool_call>` JSON) or `llama3_json`
    /// [default: by the chat template].
    #[arg(long, env = "SUPERINFER_TOOL_CALL_PARSER")]
    pub tool_call_parser: Option<String>,
    /// HBM tier size in KV blocks [default: from the model and memory].
    #[arg(long, env = "SUPERINFER_HBM_BLOCKS")]
    pub hbm_blocks: Option<u32>,
    /// DRAM tier size in KV blocks [default: from the model and memory].
    #[arg(long, env = "SUPERINFER_DRAM_BLOCKS")]
    pub dram_blocks: Option<u32>,
    /// Rotation budget: KV blocks moved per iteration per direction [default: automatic, the
    /// copy rate measured at start × the mean iteration time, at least the largest request].
    #[arg(long, env = "SUPERINFER_B_XFER")]
    pub b_xfer: Option<u32>,
    /// Token budget per iteration, shared by decode tokens and prompt chunks [default:
    /// 16384].
    #[arg(long, env = "SUPERINFER_MAX_BATCHED_TOKENS")]
    pub max_batched_tokens: Option<u32>,
    /// Sequences running at once in the engine (its batch) [default: 1024].
    #[arg(long, env = "SUPERINFER_MAX_NUM_SEQS")]
    pub max_num_seqs: Option<u32>,
    /// Requests waiting in the engine beyond this get 503 [default: 1024].
    #[arg(long, env = "SUPERINFER_MAX_QUEUE")]
    pub max_queue: Option<usize>,
    /// Longest prompt + output of one request, tokens [default: the model's context, capped by
    /// what the HBM KV tier holds].
    #[arg(long, env = "SUPERINFER_MAX_MODEL_LEN")]
    pub max_model_len: Option<u32>,
    /// Largest request body, bytes [default: 4194304].
    #[arg(long, env = "SUPERINFER_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// On SIGTERM, let in-flight requests finish for at most this many seconds [default: 30].
    #[arg(long, env = "SUPERINFER_DRAIN_TIMEOUT_S")]
    pub drain_timeout_s: Option<f64>,
    /// When a request's usage record reaches the disk: `answer`, before the answer's last byte
    /// (a crash loses no billed answer; each answer's end waits for a disk write shared with
    /// those ending meanwhile), or `interval`, every second (answers never wait; a crash loses
    /// up to a second) [default: answer].
    #[arg(long, env = "SUPERINFER_LEDGER_SYNC")]
    pub ledger_sync: Option<crate::usage::LedgerSync>,
    /// Close a connection whose request headers are not complete this many seconds after it
    /// opened or after its previous response (also the keep-alive idle time) [default: 10].
    #[arg(long, env = "SUPERINFER_HEADER_TIMEOUT_S")]
    pub header_timeout_s: Option<f64>,
    /// Answer 408 when a request body has not arrived this many seconds after its headers
    /// [default: 60].
    #[arg(long, env = "SUPERINFER_BODY_TIMEOUT_S")]
    pub body_timeout_s: Option<f64>,
    /// Connections open at once, all clients together; more get 503 [default: 4096].
    #[arg(long, env = "SUPERINFER_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Connections open at once from one IP address; more get 429 [default: 256].
    #[arg(long, env = "SUPERINFER_MAX_CONNECTIONS_PER_IP")]
    pub max_connections_per_ip: Option<usize>,
    /// Header fields in one request; more get 431 [default: 64].
    #[arg(long, env = "SUPERINFER_MAX_HEADERS")]
    pub max_headers: Option<usize>,
    /// Events of one stream buffered in the gateway while its client does not read
    /// [default: 64].
    #[arg(long, env = "SUPERINFER_STREAM_BUFFER")]
    pub stream_buffer: Option<usize>,
    /// A stream whose client has read nothing for this many seconds while its buffer is full
    /// is aborted and its connection closed [default: 30].
    #[arg(long, env = "SUPERINFER_STREAM_STALL_TIMEOUT_S")]
    pub stream_stall_timeout_s: Option<f64>,
    /// Threads that parse and tokenize requests at once [default: the number of CPUs].
    #[arg(long, env = "SUPERINFER_TEXT_WORKERS")]
    pub text_workers: Option<usize>,
    /// Requests that may wait for a tokenizer thread; more get 503 [default: 64].
    #[arg(long, env = "SUPERINFER_TEXT_QUEUE")]
    pub text_queue: Option<usize>,
    /// Where the model runs: `cpu` (the default) or `cuda` (a build with `--features cuda`).
    /// On `cuda`, `--model` also takes `random:NAME` (`llama-3-8b`, `llama-3.1-8b`,
    /// `qwen2.5-7b`, `qwen2.5-32b`): random weights at real size, built in GPU memory.
    #[arg(long, env = "SUPERINFER_DEVICE")]
    pub device: Option<ComputeDevice>,
    /// CUDA: fraction of GPU memory for weights + KV + activations [default: 0.9].
    #[arg(long, env = "SUPERINFER_GPU_MEMORY_UTILIZATION")]
    pub gpu_memory_utilization: Option<f64>,
    /// CUDA: HBM KV tier in GB, instead of what the utilization leaves.
    #[arg(long, env = "SUPERINFER_HBM_KV_GB")]
    pub hbm_kv_gb: Option<f64>,
    /// CUDA: DRAM KV tier (pinned host memory) in GB [default: 32].
    #[arg(long, env = "SUPERINFER_DRAM_KV_GB")]
    pub dram_kv_gb: Option<f64>,
    /// CUDA: run decode-only steps through the eager forward pass instead of replaying them
    /// from CUDA graphs (docs/OPERATIONS.md, "CUDA graphs") [default: graphs on].
    #[arg(long, env = "SUPERINFER_NO_CUDA_GRAPHS", num_args = 0..=1, default_missing_value = "true")]
    pub no_cuda_graphs: Option<bool>,
    /// Peers (an IP address or a CIDR network; repeat or separate by commas) that may send
    /// `x-gateway-inference-objective` and `x-gateway-inference-fairness-id`; from any other
    /// peer they are refused with 400 [default: none].
    #[arg(long, env = "SUPERINFER_TRUSTED_PROXY", value_delimiter = ',')]
    pub trusted_proxy: Option<Vec<TrustedNet>>,
    /// An InferenceObjective a trusted proxy may name: `NAME=TTFT_MS:TBT_MS` tightens the
    /// tenant's SLO to at most these (repeat or separate by commas) [default: none].
    #[arg(long, env = "SUPERINFER_OBJECTIVE", value_delimiter = ',')]
    pub objective: Option<Vec<ObjectiveSpec>>,
    /// Share every tenant's request-rate, tokens-per-minute and concurrency limits with the
    /// other nodes through this Redis: `redis://host:port[/db]` (docs/OPERATIONS.md, "Fleet
    /// quotas") [default: none, each node enforces the quotas on its own].
    #[arg(long, env = "SUPERINFER_QUOTA_STORE")]
    pub quota_store: Option<String>,
    /// When the quota store does not answer in time: `open` decides with this node's own
    /// limiter, `closed` refuses with 503 [default: open].
    #[arg(long, env = "SUPERINFER_QUOTA_STORE_FAILURE")]
    pub quota_store_failure: Option<FailureMode>,
    /// The longest one quota store call may take, milliseconds [default: 100].
    #[arg(long, env = "SUPERINFER_QUOTA_STORE_TIMEOUT_MS")]
    pub quota_store_timeout_ms: Option<u64>,
    /// A running request's concurrency lease expires this many milliseconds after its last
    /// heartbeat (one every third of it), so a dead node's slots come back [default: 30000].
    #[arg(long, env = "SUPERINFER_QUOTA_STORE_LEASE_TTL_MS")]
    pub quota_store_lease_ttl_ms: Option<u64>,
}

/// Where the model runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ComputeDevice {
    #[default]
    Cpu,
    Cuda,
}

impl Settings {
    /// `self` where set, otherwise `lower`.
    pub fn or(self, lower: Settings) -> Settings {
        Settings {
            listen: self.listen.or(lower.listen),
            metrics_listen: self.metrics_listen.or(lower.metrics_listen),
            data_dir: self.data_dir.or(lower.data_dir),
            admin_token: self.admin_token.or(lower.admin_token),
            tenants_file: self.tenants_file.or(lower.tenants_file),
            tenants_prune: self.tenants_prune.or(lower.tenants_prune),
            model_dir: self.model_dir.or(lower.model_dir),
            sim_profile: self.sim_profile.or(lower.sim_profile),
            policy: self.policy.or(lower.policy),
            alpha: self.alpha.or(lower.alpha),
            beta_b: self.beta_b.or(lower.beta_b),
            beta_f: self.beta_f.or(lower.beta_f),
            max_wait_s: self.max_wait_s.or(lower.max_wait_s),
            wait_cap_scope: self.wait_cap_scope.or(lower.wait_cap_scope),
            max_rotations: self.max_rotations.or(lower.max_rotations),
            progress_tokens: self.progress_tokens.or(lower.progress_tokens),
            shed_late: self.shed_late.or(lower.shed_late),
            queue_deadline_ttfts: self.queue_deadline_ttfts.or(lower.queue_deadline_ttfts),
            step_tbt_share: self.step_tbt_share.or(lower.step_tbt_share),
            step_trace: self.step_trace.or(lower.step_trace),
            fairness_quantum: self.fairness_quantum.or(lower.fairness_quantum),
            decode_cost: self.decode_cost.or(lower.decode_cost),
            defer_late: self.defer_late.or(lower.defer_late),
            preempt_for_seats: self.preempt_for_seats.or(lower.preempt_for_seats),
            no_prefix_cache: self.no_prefix_cache.or(lower.no_prefix_cache),
            prefix_cache_hbm_only: self.prefix_cache_hbm_only.or(lower.prefix_cache_hbm_only),
            tool_call_parser: self.tool_call_parser.or(lower.tool_call_parser),
            hbm_blocks: self.hbm_blocks.or(lower.hbm_blocks),
            dram_blocks: self.dram_blocks.or(lower.dram_blocks),
            b_xfer: self.b_xfer.or(lower.b_xfer),
            max_batched_tokens: self.max_batched_tokens.or(lower.max_batched_tokens),
            max_num_seqs: self.max_num_seqs.or(lower.max_num_seqs),
            max_queue: self.max_queue.or(lower.max_queue),
            max_model_len: self.max_model_len.or(lower.max_model_len),
            max_body_bytes: self.max_body_bytes.or(lower.max_body_bytes),
            drain_timeout_s: self.drain_timeout_s.or(lower.drain_timeout_s),
            ledger_sync: self.ledger_sync.or(lower.ledger_sync),
            header_timeout_s: self.header_timeout_s.or(lower.header_timeout_s),
            body_timeout_s: self.body_timeout_s.or(lower.body_timeout_s),
            max_connections: self.max_connections.or(lower.max_connections),
            max_connections_per_ip: self.max_connections_per_ip.or(lower.max_connections_per_ip),
            max_headers: self.max_headers.or(lower.max_headers),
            stream_buffer: self.stream_buffer.or(lower.stream_buffer),
            stream_stall_timeout_s: self.stream_stall_timeout_s.or(lower.stream_stall_timeout_s),
            text_workers: self.text_workers.or(lower.text_workers),
            text_queue: self.text_queue.or(lower.text_queue),
            device: self.device.or(lower.device),
            gpu_memory_utilization: self.gpu_memory_utilization.or(lower.gpu_memory_utilization),
            hbm_kv_gb: self.hbm_kv_gb.or(lower.hbm_kv_gb),
            dram_kv_gb: self.dram_kv_gb.or(lower.dram_kv_gb),
            no_cuda_graphs: self.no_cuda_graphs.or(lower.no_cuda_graphs),
            trusted_proxy: self.trusted_proxy.or(lower.trusted_proxy),
            objective: self.objective.or(lower.objective),
            quota_store: self.quota_store.or(lower.quota_store),
            quota_store_failure: self.quota_store_failure.or(lower.quota_store_failure),
            quota_store_timeout_ms: self.quota_store_timeout_ms.or(lower.quota_store_timeout_ms),
            quota_store_lease_ttl_ms: self
                .quota_store_lease_ttl_ms
                .or(lower.quota_store_lease_ttl_ms),
        }
    }

    /// The settings of a TOML file (same names as the flags, with `_` for `-`).
    pub fn from_file(path: &Path) -> anyhow::Result<Settings> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
    }
}
