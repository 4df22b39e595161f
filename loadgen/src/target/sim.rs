//! The simulated target: the real engine (scheduler, KV pool, accounting) on a virtual clock
//! with a simulated GPU from a hardware + model profile. Runs a 120 s workload in well under a
//! second of wall time.

use super::Target;
use crate::record::RequestRecord;
use crate::workload::{RequestSpec, TenantSpec};
use anyhow::Context;
use std::collections::HashMap;
use superinfer_engine::clock::Clock;
use superinfer_engine::profile::Profile;
use superinfer_engine::sim::{sim_engine, SimEngine, SimSettings};
use superinfer_engine::{EngineEvent, EngineRequest, SamplingParams};
use superinfer_policies::{PolicyKind, RequestId, Slo, TenantId, WlvfConfig};

/// How the simulated node is built for every run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimTargetConfig {
    /// Built-in profile name, e.g. `gh200-qwen2.5-32b`.
    pub profile: String,
    /// Rotation budget in blocks per iteration; `None`: the paper's 2400.
    pub b_xfer: Option<u32>,
    pub dram_gib: f64,
    pub gpu_memory_utilization: f64,
    pub max_batched_tokens: u32,
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
            dram_gib: 400.0,
            gpu_memory_utilization: 0.9,
            max_batched_tokens: 16384,
            policy: WlvfConfig::default(),
            drain_s: 60.0,
        }
    }
}

/// Serves workloads with the twin.
#[derive(Clone, Debug)]
pub struct SimTarget {
    cfg: SimTargetConfig,
    settings: SimSettings,
}

impl SimTarget {
    /// Checks the profile and sizes now, so a bad flag fails before any run.
    pub fn new(cfg: SimTargetConfig) -> anyhow::Result<SimTarget> {
        let settings = SimSettings {
            profile: cfg.profile.clone(),
            gpu_memory_utilization: cfg.gpu_memory_utilization,
            dram_gib: cfg.dram_gib,
            b_xfer: cfg.b_xfer.unwrap_or(SimSettings::default().b_xfer),
            max_batched_tokens: cfg.max_batched_tokens,
            block_size: 16,
        };
        let profile = Profile::builtin(&cfg.profile)?;
        profile
            .kv_blocks(
                settings.block_size,
                settings.gpu_memory_utilization,
                settings.dram_gib,
            )
            .with_context(|| format!("sizing the KV tiers of {}", cfg.profile))?;
        Ok(SimTarget { cfg, settings })
    }

    pub fn config(&self) -> &SimTargetConfig {
        &self.cfg
    }
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
        let mut engine = sim_engine(&self.settings, policy.build(&self.cfg.policy))?;
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
