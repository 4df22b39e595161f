//! `superinfer serve` settings from three sources: a TOML file (`--config`), environment
//! variables `SUPERINFER_<NAME>` and flags. Flags override the environment, which overrides
//! the file; what none of them sets has the default listed in docs/OPERATIONS.md.
//!
//! One struct, [`Settings`], is all three: clap reads the flags and (through `env`) the
//! variables, serde reads the file with the same field names, and [`Settings::or`] layers
//! them. [`ServeConfig::resolve`] then fills in defaults and checks the values.

use anyhow::bail;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use superinfer_engine::EngineConfig;
use superinfer_policies::{VltConfig, WlvfConfig};

use crate::backend::{gpu_options, EngineOptions, GpuOptions, ModelSource};
use crate::proxy::ProxyConfig;
use crate::quota::fleet::{FleetConfig, KEY_PREFIX};

mod edge;
mod settings;

pub use edge::{EdgeConfig, StreamLimits};
pub use settings::{ComputeDevice, Settings};

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
    /// When usage records reach the disk.
    pub ledger_sync: crate::usage::LedgerSync,
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
                config: EngineConfig {
                    b_xfer: positive("b_xfer", s.b_xfer)?,
                    max_batched_tokens: positive("max_batched_tokens", s.max_batched_tokens)?
                        .unwrap_or(d.config.max_batched_tokens),
                    max_num_seqs: positive("max_num_seqs", s.max_num_seqs)?
                        .unwrap_or(d.config.max_num_seqs),
                    progress_tokens: positive("progress_tokens", s.progress_tokens)?
                        .unwrap_or(d.config.progress_tokens),
                    shed_late: match s.shed_late {
                        Some(f) if !(f.is_finite() && f > 0.0) => {
                            bail!("shed_late must be a fraction of the TTFT SLO above 0, got {f}")
                        }
                        f => f,
                    },
                    queue_deadline_ttfts: EngineConfig::queue_deadline_setting(
                        s.queue_deadline_ttfts,
                    )
                    .map_err(anyhow::Error::msg)?,
                    step_tbt_share: EngineConfig::step_tbt_share_setting(s.step_tbt_share)
                        .map_err(anyhow::Error::msg)?,
                    step_trace: s.step_trace,
                    prefix_cache,
                    prefix_cache_dram: !hbm_only,
                    ..d.config.clone()
                },
                max_queue: match s.max_queue {
                    Some(0) => bail!(
                        "max_queue must be at least 1 (0 would refuse every request with 503)"
                    ),
                    q => q.unwrap_or(d.max_queue),
                },
                max_model_len: positive("max_model_len", s.max_model_len)?.or(d.max_model_len),
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
            ledger_sync: s.ledger_sync.unwrap_or_default(),
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
