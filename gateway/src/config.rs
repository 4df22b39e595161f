//! `superinfer serve` settings from three sources: a TOML file (`--config`), environment
//! variables `SUPERINFER_<NAME>` and flags. Flags override the environment, which overrides
//! the file; what none of them sets has the default listed in docs/OPERATIONS.md.
//!
//! One struct, [`Settings`], is all three: clap reads the flags and (through `env`) the
//! variables, serde reads the file with the same field names, and [`Settings::or`] layers
//! them. [`ServeConfig::resolve`] then fills in defaults and checks the values.

use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use superinfer_policies::{PolicyKind, VltConfig, WaitCapScope, WlvfConfig};

use crate::backend::{gpu_options, EngineOptions, GpuOptions, ModelSource};
use crate::proxy::{ObjectiveSpec, ProxyConfig, TrustedNet};
use crate::quota::fleet::{FailureMode, FleetConfig, KEY_PREFIX};

mod edge;

pub use edge::EdgeConfig;

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
    /// Token budget per iteration [default: 2048 with a model (CPU or GPU), 16384 with
    /// --sim-profile].
    #[arg(long, env = "SUPERINFER_MAX_BATCHED_TOKENS")]
    pub max_batched_tokens: Option<u32>,
    /// Sequences running at once in the engine (its batch) [default: 256 with a model (CPU
    /// or GPU), 1024 with --sim-profile].
    #[arg(long, env = "SUPERINFER_MAX_NUM_SEQS")]
    pub max_num_seqs: Option<u32>,
    /// Requests waiting in the engine beyond this get 503 [default: 1024].
    #[arg(long, env = "SUPERINFER_MAX_QUEUE")]
    pub max_queue: Option<usize>,
    /// Longest prompt + output of one request, tokens [default: 8192].
    #[arg(long, env = "SUPERINFER_MAX_MODEL_LEN")]
    pub max_model_len: Option<u32>,
    /// Largest request body, bytes [default: 4194304].
    #[arg(long, env = "SUPERINFER_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// On SIGTERM, let in-flight requests finish for at most this many seconds [default: 30].
    #[arg(long, env = "SUPERINFER_DRAIN_TIMEOUT_S")]
    pub drain_timeout_s: Option<f64>,
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
    /// On `cuda`, `--model` also takes `random:NAME` (`llama-3-8b`, `qwen2.5-7b`,
    /// `qwen2.5-32b`): random weights at real size, built in GPU memory.
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

/// `--tenants-file` and whether applying it prunes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantsFileConfig {
    pub path: PathBuf,
    pub prune: bool,
}

/// Everything `serve` needs, defaults filled in and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub data_dir: PathBuf,
    pub admin_token: Option<String>,
    /// Applied at start and on SIGHUP.
    pub tenants_file: Option<TenantsFileConfig>,
    pub model: ModelSource,
    pub engine: EngineOptions,
    pub max_body_bytes: usize,
    pub drain_timeout: Duration,
    /// Connection limits and timeouts of the HTTP edge, and the text pool.
    pub edge: EdgeConfig,
    /// Who may send the inference extension's headers, and the objectives they may name.
    pub proxy: ProxyConfig,
    /// Fleet-wide quotas in Redis; `None`: this node's own limiters.
    pub quota_store: Option<FleetConfig>,
}

impl ServeConfig {
    /// Defaults for everything: what `superinfer serve` with no arguments runs.
    pub fn resolve(s: Settings) -> anyhow::Result<ServeConfig> {
        let d = EngineOptions::default();
        let vlt = vlt_config(&s)?;
        let edge = EdgeConfig::resolve(&s)?;
        let quota_store = quota_store(&s)?;
        let proxy = ProxyConfig::new(
            s.trusted_proxy.clone().unwrap_or_default(),
            s.objective.clone().unwrap_or_default(),
        )?;
        let data_dir = s
            .data_dir
            .unwrap_or_else(|| PathBuf::from("superinfer-data"));
        let device = s.device.unwrap_or_default();
        let model = match (s.model_dir, s.sim_profile, device) {
            (Some(_), Some(_), _) => bail!("set either model_dir or sim_profile, not both"),
            (_, Some(_), ComputeDevice::Cuda) => {
                bail!("sim_profile runs the simulated engine; it takes no device")
            }
            (Some(m), None, ComputeDevice::Cuda) => ModelSource::Gpu {
                model: m.to_string_lossy().into_owned(),
                gpu: GpuOptions {
                    cuda_graphs: !s.no_cuda_graphs.unwrap_or(false),
                    ..gpu_options(s.gpu_memory_utilization, s.hbm_kv_gb, s.dram_kv_gb)?
                },
            },
            (None, None, ComputeDevice::Cuda) => {
                bail!("device cuda needs a model: a directory or random:NAME (--model)")
            }
            (Some(dir), None, ComputeDevice::Cpu) => {
                if dir.to_string_lossy().starts_with("random:") {
                    bail!("random:NAME models are built on the GPU; add --device cuda");
                }
                ModelSource::Dir(dir)
            }
            (None, Some(p), ComputeDevice::Cpu) => ModelSource::Sim(p),
            (None, None, ComputeDevice::Cpu) => ModelSource::Tiny(data_dir.join("model")),
        };
        let gpu_only = [
            ("gpu_memory_utilization", s.gpu_memory_utilization.is_some()),
            ("hbm_kv_gb", s.hbm_kv_gb.is_some()),
            ("dram_kv_gb", s.dram_kv_gb.is_some()),
            ("no_cuda_graphs", s.no_cuda_graphs.is_some()),
        ];
        if device == ComputeDevice::Cpu {
            if let Some((name, _)) = gpu_only.iter().find(|(_, set)| *set) {
                bail!("{name} is a GPU setting; it needs device cuda");
            }
        }
        let prefix_cache = !s.no_prefix_cache.unwrap_or(false);
        let hbm_only = s.prefix_cache_hbm_only.unwrap_or(false);
        if !prefix_cache && hbm_only {
            bail!("prefix_cache_hbm_only chooses the tiers of the prefix cache; no_prefix_cache turns it off: set one of them");
        }
        let drain = s.drain_timeout_s.unwrap_or(30.0);
        if !(drain.is_finite() && drain >= 0.0) {
            bail!("drain_timeout_s must be a number of seconds >= 0, got {drain}");
        }
        let tenants_file = match (s.tenants_file, s.tenants_prune) {
            (Some(path), prune) => Some(TenantsFileConfig {
                path,
                prune: prune.unwrap_or(false),
            }),
            (None, Some(true)) => {
                bail!("tenants_prune prunes what tenants_file does not name; set tenants_file too")
            }
            (None, _) => None,
        };
        if s.admin_token.as_deref().is_some_and(|t| t.len() < 16) {
            bail!("the admin token must be at least 16 characters long");
        }
        let positive = |name: &str, v: Option<u32>| match v {
            Some(0) => bail!("{name} must be at least 1"),
            _ => Ok(v),
        };
        let dw = WlvfConfig::default();
        let wlvf = WlvfConfig {
            vlt,
            max_wait_s: match s.max_wait_s {
                Some(w) if !(w.is_finite() && w > 0.0) => {
                    bail!("max_wait_s must be a number of seconds above 0, got {w}")
                }
                w => w,
            },
            max_consecutive_rotations: positive("max_rotations", s.max_rotations)?
                .or(dw.max_consecutive_rotations),
            fairness_quantum_tokens: s.fairness_quantum.unwrap_or(dw.fairness_quantum_tokens),
            decode_cost: s.decode_cost.unwrap_or(dw.decode_cost),
            cached_cost: dw.cached_cost,
            defer_late: s.defer_late.unwrap_or(dw.defer_late),
            preempt_for_seats: s.preempt_for_seats.unwrap_or(dw.preempt_for_seats),
            wait_cap_scope: s.wait_cap_scope.unwrap_or(dw.wait_cap_scope),
        };
        if let Err(e) = wlvf.validate() {
            bail!(
                "{}",
                e.replace("fairness_quantum_tokens", "fairness_quantum")
            );
        }
        Ok(ServeConfig {
            listen: s
                .listen
                .unwrap_or_else(|| "127.0.0.1:8000".parse().expect("a valid address")),
            metrics_listen: s.metrics_listen,
            data_dir,
            admin_token: s.admin_token,
            tenants_file,
            model,
            engine: EngineOptions {
                policy: s.policy.unwrap_or(d.policy),
                wlvf,
                hbm_blocks: positive("hbm_blocks", s.hbm_blocks)?,
                dram_blocks: s.dram_blocks,
                b_xfer: positive("b_xfer", s.b_xfer)?,
                max_batched_tokens: positive("max_batched_tokens", s.max_batched_tokens)?,
                max_num_seqs: positive("max_num_seqs", s.max_num_seqs)?,
                progress_tokens: positive("progress_tokens", s.progress_tokens)?,
                shed_late: match s.shed_late {
                    Some(f) if !(f.is_finite() && f > 0.0) => {
                        bail!("shed_late must be a fraction of the TTFT SLO above 0, got {f}")
                    }
                    f => f,
                },
                max_queue: match s.max_queue {
                    Some(0) => bail!(
                        "max_queue must be at least 1 (0 would refuse every request with 503)"
                    ),
                    q => q.unwrap_or(d.max_queue),
                },
                max_model_len: positive("max_model_len", s.max_model_len)?
                    .unwrap_or(d.max_model_len),
                prefix_cache,
                prefix_cache_dram: !hbm_only,
                tool_call_parser: match s.tool_call_parser.as_deref() {
                    None => None,
                    Some(name) => Some(crate::tools::ToolFormat::named(name).ok_or_else(|| {
                        anyhow::anyhow!(
                            "tool_call_parser must be `hermes` or `llama3_json`, got {name:?}"
                        )
                    })?),
                },
            },
            max_body_bytes: s.max_body_bytes.unwrap_or(4 << 20),
            drain_timeout: Duration::from_secs_f64(drain),
            edge,
            proxy,
            quota_store,
        })
    }
}

/// `quota_store` and its settings, checked; the settings alone are an error (they would
/// change nothing).
fn quota_store(s: &Settings) -> anyhow::Result<Option<FleetConfig>> {
    let Some(url) = s.quota_store.clone() else {
        let set = [
            ("quota_store_failure", s.quota_store_failure.is_some()),
            ("quota_store_timeout_ms", s.quota_store_timeout_ms.is_some()),
            (
                "quota_store_lease_ttl_ms",
                s.quota_store_lease_ttl_ms.is_some(),
            ),
        ];
        if let Some((name, _)) = set.iter().find(|(_, set)| *set) {
            bail!("{name} configures the fleet's quota store; set quota_store too");
        }
        return Ok(None);
    };
    if !url.starts_with("redis://") {
        // Not echoed: the URL may hold a password.
        bail!("quota_store must be a redis://host:port[/db] URL (TLS is not built in)");
    }
    redis::IntoConnectionInfo::into_connection_info(url.as_str())
        .map_err(|e| anyhow::anyhow!("quota_store: {e}"))?;
    let timeout_ms = s.quota_store_timeout_ms.unwrap_or(100);
    if !(1..=10_000).contains(&timeout_ms) {
        bail!("quota_store_timeout_ms must be 1 to 10000 milliseconds, got {timeout_ms}");
    }
    let ttl_ms = s.quota_store_lease_ttl_ms.unwrap_or(30_000);
    if ttl_ms < 4 * timeout_ms {
        bail!(
            "quota_store_lease_ttl_ms ({ttl_ms}) must be at least 4 x quota_store_timeout_ms \
             ({timeout_ms}), so a heartbeat (every third of it) can land before it expires"
        );
    }
    Ok(Some(FleetConfig {
        url,
        failure: s.quota_store_failure.unwrap_or_default(),
        timeout: Duration::from_millis(timeout_ms),
        lease_ttl: Duration::from_millis(ttl_ms),
        key_prefix: KEY_PREFIX.into(),
    }))
}

/// The VLT knobs from the settings (the paper's defaults where unset), validated.
fn vlt_config(s: &Settings) -> anyhow::Result<VltConfig> {
    let d = VltConfig::default();
    let c = VltConfig {
        alpha: s.alpha.unwrap_or(d.alpha),
        beta_b: s.beta_b.unwrap_or(d.beta_b),
        beta_f: s.beta_f.unwrap_or(d.beta_f),
    };
    c.validate().map_err(anyhow::Error::msg)?;
    Ok(c)
}

#[cfg(test)]
mod tests;
