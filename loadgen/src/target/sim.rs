//! The simulated target: the real engine (scheduler, KV pool, accounting) on a virtual clock
//! with a simulated GPU from a hardware + model profile. Runs a 120 s workload in well under a
//! second of wall time.

use super::Target;
use crate::record::RequestRecord;
use crate::workload::{RequestSpec, TenantSpec};
use anyhow::Context;
use std::collections::HashMap;
use superinfer_engine::clock::Clock;
use superinfer_engine::kv::whole_blocks;
use superinfer_engine::profile::Profile;
use superinfer_engine::sim::{sim_engine_with, SimEngine};
use superinfer_engine::{EngineConfig, EngineEvent, EngineRequest, SamplingParams};
use superinfer_policies::{PolicyKind, RequestId, Slo, TenantId, WlvfConfig};

/// Tokens per KV block, as in the paper and `superinfer serve`.
pub const BLOCK_SIZE: u32 = 16;

/// Bytes in a GB, the unit of [`SimTargetConfig::hbm_kv_gb`] and [`SimTargetConfig::dram_gb`].
const GB: f64 = 1e9;
/// Bytes in a GiB, the unit of [`SimTargetConfig::dram_gib`].
const GIB: f64 = (1u64 << 30) as f64;

/// How the simulated node is built for every run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimTargetConfig {
    /// Built-in profile name, e.g. `gh200-qwen2.5-32b`.
    pub profile: String,
    /// Rotation budget in blocks per iteration; `None`: automatic (the profile's link rate ×
    /// the mean iteration time).
    pub b_xfer: Option<u32>,
    /// With the automatic budget: the share of an iteration's link capacity planned.
    pub b_xfer_share: f64,
    /// Long-prefill threshold (`EngineConfig::long_prefill_tokens`); `None`: half the budget.
    pub long_prefill_tokens: Option<u32>,
    /// DRAM tier size in GiB (2^30 bytes); ignored when `dram_gb` is set.
    pub dram_gib: f64,
    /// DRAM tier size in GB (10^9 bytes); overrides `dram_gib`.
    pub dram_gb: Option<f64>,
    /// Share of HBM for weights + KV + activation reserve; ignored when `hbm_kv_gb` is set.
    pub gpu_memory_utilization: f64,
    /// HBM KV tier size in GB (10^9 bytes); overrides the size that follows from the HBM
    /// size, the weights and `gpu_memory_utilization`.
    pub hbm_kv_gb: Option<f64>,
    pub max_batched_tokens: u32,
    /// At most this many requests resident (running or restoring) at once.
    pub max_num_seqs: u32,
    /// Tokens of progress that reset a request's consecutive-rotation count.
    pub progress_tokens: u32,
    /// Refuse requests that would wait past their TTFT SLO (`EngineConfig::shed_late`).
    pub shed_late: Option<f64>,
    /// VLT knobs and weighted-LVF caps (used by the policies that have them).
    pub policy: WlvfConfig,
    /// After the last arrival, keep serving for at most this long; requests not served by
    /// then count as misses.
    pub drain_s: f64,
}

impl Default for SimTargetConfig {
    fn default() -> Self {
        SimTargetConfig {
            profile: "gh200-qwen2.5-32b".into(),
            b_xfer: None,
            b_xfer_share: EngineConfig::default().b_xfer_link_share,
            long_prefill_tokens: None,
            dram_gib: 400.0,
            dram_gb: None,
            gpu_memory_utilization: 0.9,
            hbm_kv_gb: None,
            max_batched_tokens: 16384,
            max_num_seqs: EngineConfig::default().max_num_seqs,
            progress_tokens: EngineConfig::default().progress_tokens,
            shed_late: EngineConfig::default().shed_late,
            policy: WlvfConfig::default(),
            drain_s: 60.0,
        }
    }
}

/// Serves workloads with the twin.
#[derive(Clone, Debug)]
pub struct SimTarget {
    cfg: SimTargetConfig,
    profile: Profile,
    engine: EngineConfig,
}

impl SimTarget {
    /// Checks the profile and sizes now, so a bad flag fails before any run.
    pub fn new(cfg: SimTargetConfig) -> anyhow::Result<SimTarget> {
        let profile = Profile::builtin(&cfg.profile)?;
        cfg.policy
            .vlt
            .validate()
            .map_err(|e| anyhow::anyhow!("{e} (--alpha, --beta-b, --beta-f)"))?;
        let (hbm_blocks, dram_blocks) = kv_blocks(&profile, &cfg)
            .with_context(|| format!("sizing the KV tiers of {}", cfg.profile))?;
        if cfg.max_batched_tokens == 0 || cfg.max_num_seqs == 0 {
            anyhow::bail!(
                "max_batched_tokens ({}) and max_num_seqs ({}) must be positive",
                cfg.max_batched_tokens,
                cfg.max_num_seqs
            );
        }
        let engine = EngineConfig {
            block_size: BLOCK_SIZE,
            max_batched_tokens: cfg.max_batched_tokens,
            max_num_seqs: cfg.max_num_seqs,
            b_xfer: cfg.b_xfer,
            b_xfer_link_share: cfg.b_xfer_share,
            long_prefill_tokens: cfg.long_prefill_tokens,
            hbm_blocks,
            dram_blocks,
            progress_tokens: cfg.progress_tokens,
            shed_late: cfg.shed_late,
            ..EngineConfig::default()
        };
        Ok(SimTarget {
            cfg,
            profile,
            engine,
        })
    }

    pub fn config(&self) -> &SimTargetConfig {
        &self.cfg
    }

    /// The engine settings every run uses (tier sizes in blocks, budgets).
    pub fn engine_config(&self) -> &EngineConfig {
        &self.engine
    }

    /// Bytes of one KV block of the profile's model.
    pub fn block_bytes(&self) -> u64 {
        self.profile.model.geometry(BLOCK_SIZE).block_bytes()
    }

    fn build(&self, policy: PolicyKind) -> anyhow::Result<SimEngine> {
        Ok(sim_engine_with(
            self.profile.clone(),
            self.engine.clone(),
            policy.build(&self.cfg.policy),
        )?)
    }
}

/// The HBM and DRAM tier sizes in blocks. The HBM tier is `hbm_kv_gb` when set (it must hold a
/// block, and fit in HBM next to the weights and the activation reserve), otherwise what
/// vLLM's rule leaves: HBM × `gpu_memory_utilization` − weights − activation reserve. The
/// DRAM tier is `dram_gb` GB when set, otherwise `dram_gib` GiB.
pub fn kv_blocks(profile: &Profile, cfg: &SimTargetConfig) -> anyhow::Result<(u32, u32)> {
    let block_bytes = profile.model.geometry(BLOCK_SIZE).block_bytes();
    let block = block_bytes as f64;
    let blocks = |bytes: f64| whole_blocks(bytes, block_bytes);
    let hbm = match cfg.hbm_kv_gb {
        None => {
            profile
                .kv_blocks(BLOCK_SIZE, cfg.gpu_memory_utilization, cfg.dram_gib)?
                .0
        }
        Some(gb) => {
            if !(gb.is_finite() && gb > 0.0) {
                anyhow::bail!(
                    "the HBM KV tier (--hbm-kv-gb) must be positive and finite, got {gb}"
                );
            }
            let weights = profile.model.weight_bytes() / GB;
            let reserve = profile.hw.activation_reserve_gb;
            if gb + weights + reserve > profile.hw.hbm_gb {
                anyhow::bail!(
                    "an HBM KV tier of {gb} GB (--hbm-kv-gb) does not fit: with {weights:.2} GB \
                     of weights and {reserve} GB of activation reserve it exceeds the {} GB of \
                     HBM (at most {:.2} GB of KV)",
                    profile.hw.hbm_gb,
                    profile.hw.hbm_gb - weights - reserve
                );
            }
            let n = blocks(gb * GB);
            if n == 0 {
                anyhow::bail!(
                    "an HBM KV tier of {gb} GB (--hbm-kv-gb) holds no KV block: one block \
                     ({BLOCK_SIZE} tokens) of this model is {:.3} GB",
                    block / GB
                );
            }
            n
        }
    };
    let dram = match cfg.dram_gb {
        Some(gb) if !(gb.is_finite() && gb >= 0.0) => {
            anyhow::bail!("the DRAM tier (--dram-gb) must be >= 0 and finite, got {gb}")
        }
        Some(gb) => blocks(gb * GB),
        None => blocks(cfg.dram_gib.max(0.0) * GIB),
    };
    Ok((hbm, dram))
}

fn engine_request(spec: &RequestSpec, tenant: &TenantSpec) -> EngineRequest {
    EngineRequest {
        id: RequestId(spec.id),
        tenant: TenantId(spec.tenant as u32),
        weight: tenant.weight,
        slo: Slo {
            ttft_s: tenant.ttft_slo_s,
            tbt_s: tenant.tbt_slo_s,
        },
        prompt: vec![0; spec.prompt_tokens as usize],
        max_tokens: spec.output_tokens,
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        sampling: SamplingParams::default(),
        arrival: Some(spec.arrival_s),
        cache: None,
    }
}

/// Records events into per-request records.
struct Recorder {
    records: Vec<RequestRecord>,
    index: HashMap<u64, usize>,
}

impl Recorder {
    fn new(requests: &[RequestSpec]) -> Recorder {
        let records: Vec<RequestRecord> = requests.iter().map(RequestRecord::unserved).collect();
        let index = requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id, i))
            .collect();
        Recorder { records, index }
    }

    fn record(&mut self, events: Vec<EngineEvent>) {
        for ev in events {
            match ev {
                EngineEvent::Token { id, t, .. } => {
                    let r = &mut self.records[self.index[&id.0]];
                    r.first_token_s.get_or_insert(t);
                    r.token_times_s.push(t);
                    r.generated_tokens += 1;
                }
                EngineEvent::Finished {
                    id, t, preemptions, ..
                } => {
                    let r = &mut self.records[self.index[&id.0]];
                    r.finish_s = Some(t);
                    r.preemptions = preemptions;
                }
            }
        }
    }

    /// Requests still live at the end keep their partial record, with their preemptions.
    fn finish(mut self, engine: &SimEngine) -> Vec<RequestRecord> {
        for r in &mut self.records {
            if let Some(req) = engine.request(RequestId(r.id)) {
                r.preemptions = req.rotations + req.recomputes;
            }
        }
        self.records
    }
}

impl Target for SimTarget {
    fn run(
        &mut self,
        policy: PolicyKind,
        tenants: &[TenantSpec],
        requests: &[RequestSpec],
        duration_s: f64,
    ) -> anyhow::Result<Vec<RequestRecord>> {
        let mut engine = self.build(policy)?;
        let mut rec = Recorder::new(requests);
        let end = duration_s + self.cfg.drain_s.max(0.0);
        let mut next = 0;
        loop {
            let now = engine.clock().now();
            while next < requests.len() && requests[next].arrival_s <= now {
                let spec = &requests[next];
                // A request the node can never hold stays unserved (a miss), as a server
                // would refuse it.
                let _ = engine.submit(engine_request(spec, &tenants[spec.tenant]));
                next += 1;
            }
            if now >= end {
                break;
            }
            let upcoming = requests.get(next).map(|r| r.arrival_s);
            if engine.is_empty() {
                match upcoming {
                    Some(t) => engine.clock_mut().skip_to(t),
                    None => break,
                }
                continue;
            }
            let report = engine.step()?;
            rec.record(engine.take_events());
            if !report.ran {
                // Nothing could run: wait for the next copy or arrival, or let a little time
                // pass so time-based priorities move.
                let wake = [report.idle_until, upcoming]
                    .into_iter()
                    .flatten()
                    .reduce(f64::min);
                let t = wake.unwrap_or(now + 1e-3).min(end).max(now + 1e-6);
                engine.clock_mut().skip_to(t);
            }
        }
        Ok(rec.finish(&engine))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::arrivals::ArrivalSpec;
    use crate::workload::lengths::LengthSpec;

    fn tenant(rps: f64) -> TenantSpec {
        TenantSpec::new(
            "t",
            LengthSpec::Fixed {
                prompt: 200,
                output: 50,
            },
            ArrivalSpec::Poisson { rps },
        )
    }

    #[test]
    fn light_load_serves_every_request_within_its_slo() {
        let tenants = vec![tenant(2.0)];
        let reqs = crate::workload::generate(&tenants, 20.0, 7).unwrap();
        let mut target = SimTarget::new(SimTargetConfig::default()).unwrap();
        let recs = target.run(PolicyKind::Lvf, &tenants, &reqs, 20.0).unwrap();
        assert_eq!(recs.len(), reqs.len());
        for r in &recs {
            assert_eq!(r.generated_tokens, 50);
            assert!(r.first_token_s.unwrap() - r.arrival_s < 1.0, "{r:?}");
            assert!(r.finish_s.is_some());
        }
    }

    #[test]
    fn runs_are_deterministic() {
        let tenants = vec![tenant(5.0)];
        let reqs = crate::workload::generate(&tenants, 10.0, 3).unwrap();
        let mut target = SimTarget::new(SimTargetConfig::default()).unwrap();
        let a = target.run(PolicyKind::Wlvf, &tenants, &reqs, 10.0).unwrap();
        let b = target.run(PolicyKind::Wlvf, &tenants, &reqs, 10.0).unwrap();
        assert_eq!(a, b);
    }

    fn h200_8b(hbm_kv_gb: Option<f64>) -> SimTargetConfig {
        SimTargetConfig {
            profile: "h200-llama-3-8b".into(),
            hbm_kv_gb,
            ..Default::default()
        }
    }

    #[test]
    fn hbm_kv_gb_sizes_the_hbm_tier_in_decimal_gb() {
        // Llama-3-8B: 32 layers × K,V × 16 tokens × 8 heads × 128 × 2 bytes = 2 MiB per block.
        let t = SimTarget::new(h200_8b(Some(4.0))).unwrap();
        assert_eq!(t.block_bytes(), 2 << 20);
        let e = t.engine_config();
        assert_eq!(e.hbm_blocks, 1907, "floor(4e9 / 2^21)");
        assert_eq!(e.dram_blocks, 400 * 512, "400 GiB of 2 MiB blocks");
        let auto = SimTarget::new(h200_8b(None)).unwrap();
        // 143 GB × 0.9 − 16.06 GB − 4 GB = 108.64 GB.
        assert_eq!(auto.engine_config().hbm_blocks, 51_803);
        // The override ignores the utilization.
        let cfg = SimTargetConfig {
            gpu_memory_utilization: 0.1,
            ..h200_8b(Some(8.0))
        };
        assert_eq!(
            SimTarget::new(cfg).unwrap().engine_config().hbm_blocks,
            3814
        );
    }

    #[test]
    fn dram_gb_overrides_dram_gib() {
        let cfg = SimTargetConfig {
            dram_gb: Some(32.0),
            ..h200_8b(Some(4.0))
        };
        assert_eq!(
            SimTarget::new(cfg).unwrap().engine_config().dram_blocks,
            15_258,
            "floor(32e9 / 2^21)"
        );
        let cfg = SimTargetConfig {
            dram_gib: 32.0,
            ..h200_8b(Some(4.0))
        };
        assert_eq!(
            SimTarget::new(cfg).unwrap().engine_config().dram_blocks,
            16_384
        );
    }

    #[test]
    fn bad_hbm_kv_sizes_are_clear_errors() {
        let cases: [(f64, &str); 5] = [
            (0.001, "holds no KV block"),
            (200.0, "does not fit"),
            (0.0, "must be positive"),
            (-4.0, "must be positive"),
            (f64::NAN, "must be positive"),
        ];
        for (gb, want) in cases {
            let e = format!("{:#}", SimTarget::new(h200_8b(Some(gb))).unwrap_err());
            assert!(e.contains(want) && e.contains("--hbm-kv-gb"), "{gb}: {e}");
        }
        // The largest tier that fits: 143 − 16.06 − 4 GB.
        assert!(SimTarget::new(h200_8b(Some(122.9))).is_ok());
        let cfg = SimTargetConfig {
            dram_gb: Some(-1.0),
            ..h200_8b(Some(4.0))
        };
        let e = format!("{:#}", SimTarget::new(cfg).unwrap_err());
        assert!(e.contains("--dram-gb"), "{e}");
    }

    /// Most distinct requests that got a token in the same step (same engine time).
    fn most_in_one_step(recs: &[RequestRecord]) -> usize {
        let mut per_t: HashMap<u64, usize> = HashMap::new();
        for r in recs {
            for t in &r.token_times_s {
                *per_t.entry(t.to_bits()).or_default() += 1;
            }
        }
        per_t.into_values().max().unwrap_or(0)
    }

    #[test]
    fn max_num_seqs_bounds_the_batch() {
        let tenants = vec![tenant(40.0)];
        let reqs = crate::workload::generate(&tenants, 10.0, 5).unwrap();
        let run = |max_num_seqs| {
            let cfg = SimTargetConfig {
                max_num_seqs,
                ..h200_8b(Some(4.0))
            };
            let mut target = SimTarget::new(cfg).unwrap();
            target.run(PolicyKind::Fcfs, &tenants, &reqs, 10.0).unwrap()
        };
        assert_eq!(most_in_one_step(&run(3)), 3);
        assert!(most_in_one_step(&run(256)) > 3);
        let cfg = SimTargetConfig {
            max_num_seqs: 0,
            ..h200_8b(None)
        };
        assert!(SimTarget::new(cfg).is_err());
    }

    #[test]
    fn unknown_profile_is_a_clear_error() {
        let cfg = SimTargetConfig {
            profile: "a100-gpt5".into(),
            ..Default::default()
        };
        let e = SimTarget::new(cfg).unwrap_err().to_string();
        assert!(e.contains("unknown profile"), "{e}");
    }
}
