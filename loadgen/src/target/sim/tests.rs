use super::*;
use crate::workload::arrivals::ArrivalSpec;
use crate::workload::lengths::LengthSpec;
use std::collections::HashMap;

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
            engine: EngineConfig {
                max_num_seqs,
                ..EngineConfig::default()
            },
            ..h200_8b(Some(4.0))
        };
        let mut target = SimTarget::new(cfg).unwrap();
        target.run(PolicyKind::Fcfs, &tenants, &reqs, 10.0).unwrap()
    };
    assert_eq!(most_in_one_step(&run(3)), 3);
    assert!(most_in_one_step(&run(256)) > 3);
    let cfg = SimTargetConfig {
        engine: EngineConfig {
            max_num_seqs: 0,
            ..EngineConfig::default()
        },
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

fn chat_tenant(name: &str, rps: f64, system: u32, think_s: f64) -> TenantSpec {
    TenantSpec {
        system_prompt_tokens: system,
        conversation: Some(crate::workload::ConversationSpec::new(4.0, think_s)),
        ..TenantSpec::new(name, LengthSpec::Lmsys, ArrivalSpec::Poisson { rps })
    }
}

fn chat_run(cfg: SimTargetConfig, tenants: &[TenantSpec], d: f64) -> (Vec<RequestRecord>, RunLog) {
    let reqs = crate::workload::generate(tenants, d, 11).unwrap();
    let mut target = SimTarget::new(cfg).unwrap();
    target.keep_prompts(true);
    let recs = target.run(PolicyKind::Wlvf, tenants, &reqs, d).unwrap();
    (recs, target.last_prompts().unwrap().clone())
}

#[test]
fn each_turn_repeats_the_previous_prompt_and_answer_and_waits_for_it() {
    let tenants = vec![chat_tenant("t", 2.0, 256, 3.0)];
    let reqs = crate::workload::generate(&tenants, 40.0, 11).unwrap();
    let (recs, log) = chat_run(h200_8b(Some(4.0)), &tenants, 40.0);
    let by_id: HashMap<u64, &RequestRecord> = recs.iter().map(|r| (r.id, r)).collect();
    let mut follow_ups = 0;
    for spec in &reqs {
        let Some(rec) = by_id.get(&spec.id) else {
            continue;
        };
        let prompt = &log.prompts[&spec.id];
        assert_eq!(prompt.len() as u32, rec.prompt_tokens);
        assert_eq!(
            prompt[..256],
            crate::workload::conversation::token_ids(tenants[0].system_seed(), 256)[..]
        );
        let Some(prev) = spec.turn.and_then(|t| t.after) else {
            continue;
        };
        follow_ups += 1;
        let (before, answer) = (&log.prompts[&prev], &log.answers[&prev]);
        assert_eq!(answer.len() as u32, by_id[&prev].generated_tokens);
        assert_eq!(prompt[..before.len()], before[..], "request {}", spec.id);
        assert_eq!(
            prompt[before.len()..before.len() + answer.len()],
            answer[..]
        );
        assert_eq!(
            prompt.len(),
            before.len() + answer.len() + spec.message_tokens as usize
        );
        // Never in flight together: sent the think time after the previous one finished.
        let finished = by_id[&prev]
            .finish_s
            .expect("a follow-up waits for a finish");
        let think = spec.turn.unwrap().think_s;
        assert!(
            (rec.arrival_s - (finished + think)).abs() < 1e-9,
            "{} sent at {}, previous finished at {finished}, think {think}",
            spec.id,
            rec.arrival_s
        );
    }
    assert!(follow_ups > 20, "{follow_ups}");
}

fn cache_cfg(prefix_cache: bool, prefix_cache_dram: bool) -> SimTargetConfig {
    SimTargetConfig {
        hbm_kv_gb: Some(2.0),
        dram_gb: Some(48.0),
        engine: EngineConfig {
            max_batched_tokens: 2048,
            max_num_seqs: 256,
            prefix_cache,
            prefix_cache_dram,
            ..EngineConfig::default()
        },
        ..h200_8b(None)
    }
}

#[test]
fn the_cache_hits_on_conversations_and_cuts_prefill() {
    let tenants = vec![
        chat_tenant("a", 1.0, 512, 15.0),
        chat_tenant("b", 1.0, 512, 15.0),
    ];
    let d = 60.0;
    let summarize = |cfg| {
        let (recs, log) = chat_run(cfg, &tenants, d);
        let hits = crate::report::CacheSummary::of(recs.iter());
        let mean_ttft = recs
            .iter()
            .filter_map(|r| r.first_token_s.map(|t| t - r.arrival_s))
            .sum::<f64>()
            / recs.len() as f64;
        (
            hits,
            log.stats.prefill_tokens_computed,
            mean_ttft,
            recs.len(),
        )
    };
    let (two, two_prefill, two_ttft, two_n) = summarize(cache_cfg(true, true));
    let (hbm, _, _, _) = summarize(cache_cfg(true, false));
    let (off, off_prefill, off_ttft, off_n) = summarize(cache_cfg(false, true));
    let rate = two.hit_rate.unwrap();
    assert!(rate > 0.5, "{two:?}");
    assert_eq!(off.cached_tokens, 0, "{off:?}");
    assert!(two_n > 100 && off_n > 100, "{two_n} {off_n}");
    // Computed prefill per prompt token sent falls by at least the hit rate (recomputes
    // may add a little back); without the cache nearly every prompt token is computed.
    let frac =
        |prefill: u64, c: &crate::report::CacheSummary| prefill as f64 / c.prompt_tokens as f64;
    assert!(
        frac(two_prefill, &two) <= (1.0 - rate) * 1.05,
        "{two_prefill} of {} at hit rate {rate}",
        two.prompt_tokens
    );
    assert!(
        frac(off_prefill, &off) >= 0.95,
        "{off_prefill} of {}",
        off.prompt_tokens
    );
    assert!(two_ttft < off_ttft, "{two_ttft} vs {off_ttft}");
    assert!(hbm.hit_rate.unwrap() <= rate, "{hbm:?} vs {two:?}");
    assert_eq!(hbm.cached_dram_tokens, Some(0));
    assert!(two.cached_dram_tokens.unwrap() > 0, "{two:?}");
}

#[test]
fn identical_system_prompts_do_not_hit_across_tenants() {
    let mut tenants = vec![
        chat_tenant("a", 1.0, 320, 1.0),
        chat_tenant("b", 1.0, 320, 1.0),
    ];
    for t in &mut tenants {
        t.system_prompt_key = Some("shared".into());
    }
    let (recs, log) = chat_run(cache_cfg(true, true), &tenants, 30.0);
    for tenant in 0..2 {
        let mine: Vec<&RequestRecord> = recs.iter().filter(|r| r.tenant == tenant).collect();
        let first = mine
            .iter()
            .min_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s))
            .unwrap();
        assert_eq!(first.cached_tokens, Some(0), "tenant {tenant}: {first:?}");
        assert!(mine.iter().any(|r| r.cached_tokens.unwrap_or(0) >= 320));
    }
    let first_a = recs.iter().find(|r| r.tenant == 0).unwrap();
    let first_b = recs.iter().find(|r| r.tenant == 1).unwrap();
    assert_eq!(
        log.prompts[&first_a.id][..320],
        log.prompts[&first_b.id][..320],
        "the same system prompt"
    );
}
