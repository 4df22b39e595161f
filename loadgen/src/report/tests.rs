use super::*;
use crate::workload::{ArrivalSpec, LengthSpec};

fn tenant(name: &str, weight: f64, ttft: f64, tbt: f64) -> TenantSpec {
    TenantSpec {
        weight,
        ttft_slo_s: ttft,
        tbt_slo_s: tbt,
        ..TenantSpec::new(
            name,
            LengthSpec::Sharegpt,
            ArrivalSpec::Poisson { rps: 1.0 },
        )
    }
}

fn rec(
    id: u64,
    tenant: usize,
    arrival: f64,
    prompt: u32,
    tokens: &[f64],
    output: u32,
) -> RequestRecord {
    let finished = tokens.len() as u32 == output;
    RequestRecord {
        id,
        tenant,
        arrival_s: arrival,
        first_token_s: tokens.first().copied(),
        token_times_s: tokens.to_vec(),
        finish_s: if finished {
            tokens.last().copied()
        } else {
            None
        },
        prompt_tokens: prompt,
        output_tokens: output,
        generated_tokens: tokens.len() as u32,
        preemptions: id as u32,
        cached_tokens: None,
        cached_dram_tokens: None,
        conversation: None,
        turn: None,
        refused: None,
        gpu_s: None,
        queued_s: None,
    }
}

fn tenants() -> Vec<TenantSpec> {
    vec![tenant("a", 2.0, 5.0, 0.1), tenant("b", 1.0, 2.0, 0.2)]
}

/// Two tenants: a hit, a late first token with a slow gap, a hit under B's looser TBT SLO,
/// and a request never served.
fn records() -> Vec<RequestRecord> {
    vec![
        rec(0, 0, 0.0, 100, &[1.0, 1.05, 1.10], 3),
        rec(1, 0, 1.0, 100, &[7.0, 7.5], 2),
        rec(2, 1, 2.0, 50, &[3.0, 3.1, 3.3], 3),
        rec(3, 1, 4.0, 50, &[], 5),
    ]
}

fn run(tenants: &[TenantSpec], records: &[RequestRecord]) -> RunSummary {
    summarize(
        &RunInput {
            policy: "lvf",
            rps: 20.0,
            tenants,
            records,
            duration_s: 10.0,
            target: None,
            tenant_gpu_s: None,
            replay: None,
        },
        &ReportConfig::default(),
    )
    .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn every_statistic_on_hand_made_records() {
    let s = run(&tenants(), &records());
    assert_eq!((s.submitted, s.finished, s.unserved), (4, 3, 1));
    assert!(close(s.ttft_attainment, 0.5), "unserved counts as a miss");
    assert!(close(s.tbt_attainment, 0.8), "4 of 5 pooled gaps");
    assert!(close(s.throughput_tokens_per_s, 0.8));
    assert!(close(s.goodput_rps, 0.2));
    assert!(close(s.max_wait_s, 6.0));
    assert!(close(s.max_stall_s, 0.5));
    assert_eq!(s.preemptions, 6);
    // TTFTs 1, 6, 1 and the unserved request at end - arrival = 10 - 4.
    assert!(close(s.p50_ttft_s, 3.5));
    assert!(close(s.p99_ttft_s, 6.0));
    assert!((s.p50_tbt_s - 0.1).abs() < 1e-6);
    assert!((s.p99_tbt_s - 0.5).abs() < 0.02);
    let (a, b) = (&s.tenants[0], &s.tenants[1]);
    assert_eq!((a.served_tokens, b.served_tokens), (205, 53));
    assert!(close(a.share, 205.0 / 258.0) && close(b.share, 53.0 / 258.0));
    assert!(close(a.weight_share, 2.0 / 3.0));
    assert!(close(a.ttft_attainment, 0.5) && close(b.ttft_attainment, 0.5));
    assert!(close(a.tbt_attainment, 2.0 / 3.0) && close(b.tbt_attainment, 1.0));
    let x: [f64; 2] = [205.0 / 2.0, 53.0];
    let want = (x[0] + x[1]).powi(2) / (2.0 * (x[0] * x[0] + x[1] * x[1]));
    assert!(close(s.jain, want));
    assert!(close(s.jain_attainment, 1.0));
    assert!(s.ttft_attainment_ci95.lo <= 0.5 && 0.5 <= s.ttft_attainment_ci95.hi);
}

#[test]
fn jain_is_one_when_service_follows_the_weights_and_half_for_a_monopoly() {
    let t = tenants();
    // A (weight 2) gets 200 tokens, B (weight 1) gets 100.
    let fair = vec![
        rec(0, 0, 0.0, 190, &[1.0; 10], 10),
        rec(1, 1, 0.0, 90, &[1.0; 10], 10),
    ];
    assert!(close(run(&t, &fair).jain, 1.0));
    let monopoly = vec![
        rec(0, 0, 0.0, 190, &[1.0; 10], 10),
        rec(1, 1, 0.0, 90, &[], 10),
    ];
    let s = run(&t, &monopoly);
    assert!(close(s.jain, 0.5));
    assert!(close(s.tenants[0].share, 1.0));
    assert!(close(s.jain_attainment, 0.5), "attainments 1 and 0");
}

#[test]
fn one_tenant_is_perfectly_fair_and_idle_tenants_do_not_count() {
    let one = vec![tenant("solo", 3.0, 5.0, 0.1)];
    let recs = vec![rec(0, 0, 0.0, 10, &[1.0, 1.05], 2)];
    assert!(close(run(&one, &recs).jain, 1.0));
    let mut t = tenants();
    t.push(tenant("idle", 5.0, 5.0, 0.1));
    let s = run(&t, &records());
    assert!(close(s.jain, run(&tenants(), &records()).jain));
    assert_eq!(s.tenants[2].submitted, 0);
    assert_eq!(s.tenants[2].weight_share, 0.0);
    assert!(close(s.tenants[0].weight_share, 2.0 / 3.0));
}

#[test]
fn the_end_of_run_extends_to_the_last_event() {
    let t = tenants();
    let recs = vec![
        rec(0, 0, 0.0, 10, &[12.0, 12.05], 2),
        rec(1, 0, 9.0, 10, &[], 2),
    ];
    let s = run(&t, &recs);
    assert!(
        close(s.max_wait_s, 12.0),
        "12.05 - 9 is shorter than the served TTFT"
    );
    assert!(close(s.p99_ttft_s, 12.0 - 0.01 * (12.0 - 3.05)));
}

#[test]
fn summary_json_has_the_checked_field_names() {
    let s = Summary {
        runs: vec![run(&tenants(), &records())],
    };
    let v: serde_json::Value = serde_json::to_value(&s).unwrap();
    let r = &v["runs"][0];
    assert_eq!(r["policy"], "lvf");
    assert_eq!(r["rps"], 20.0);
    for k in [
        "ttft_attainment",
        "tbt_attainment",
        "p99_ttft_s",
        "p99_tbt_s",
        "throughput_tokens_per_s",
        "jain",
        "max_wait_s",
    ] {
        assert!(r[k].is_number(), "{k}");
    }
    let t = &r["tenants"][0];
    assert_eq!(t["name"], "a");
    for k in [
        "weight",
        "ttft_attainment",
        "tbt_attainment",
        "served_tokens",
        "share",
    ] {
        assert!(t[k].is_number(), "tenant {k}");
    }
}

#[test]
fn records_of_unknown_tenants_are_rejected() {
    let recs = vec![rec(0, 7, 0.0, 10, &[], 2)];
    let err = summarize(
        &RunInput {
            policy: "fcfs",
            rps: 1.0,
            tenants: &tenants(),
            records: &recs,
            duration_s: 10.0,
            target: None,
            tenant_gpu_s: None,
            replay: None,
        },
        &ReportConfig::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("tenant index 7"), "{err}");
}

#[test]
fn the_writer_produces_every_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = ReportWriter::create(dir.path(), ReportConfig::default()).unwrap();
    let t = tenants();
    let recs = records();
    for (policy, rps) in [("fcfs", 5.0), ("fcfs", 20.0), ("lvf", 5.0), ("lvf", 20.0)] {
        w.add_run(&RunInput {
            policy,
            rps,
            tenants: &t,
            records: &recs,
            duration_s: 10.0,
            target: None,
            tenant_gpu_s: None,
            replay: None,
        })
        .unwrap();
    }
    let meta = ReportMeta {
        command: "superinfer-loadgen sim --rps 5,20".into(),
        context: vec![("seed".into(), "42".into())],
    };
    let summary = w.finish(&meta).unwrap();
    assert_eq!(summary.runs.len(), 4);
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    let json: Summary = serde_json::from_str(&read(writer::SUMMARY_JSON)).unwrap();
    // serde_json's default float parsing may differ in the last bit: compare structure.
    assert_eq!(json.runs.len(), 4);
    assert_eq!(
        (json.runs[3].policy.as_str(), json.runs[3].rps),
        ("lvf", 20.0)
    );
    assert_eq!(
        json.runs[3].ttft_attainment,
        summary.runs[3].ttft_attainment
    );
    let lines: Vec<serde_json::Value> = read(writer::REQUESTS_JSONL)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 16);
    assert_eq!(lines[4]["policy"], "fcfs");
    assert_eq!(lines[4]["rps"], 20.0);
    assert_eq!(lines[4]["id"], 0);
    assert_eq!(lines[7]["first_token_s"], serde_json::Value::Null);
    assert_eq!(lines[7]["ttft_met"], false);
    let md = read(writer::SUMMARY_MD);
    assert!(md.contains("superinfer-loadgen sim --rps 5,20"));
    assert!(md.contains("| lvf | 20.00 | 50.0%"), "{md}");
    assert_eq!(md.matches(": tenants").count(), 4);
    for svg in [writer::ATTAINMENT_SVG, writer::TTFT_CDF_SVG] {
        let text = read(svg);
        assert!(text.starts_with("<svg") && text.contains("lvf"), "{svg}");
    }
    assert!(read(writer::TTFT_CDF_SVG).contains("20.00 requests/s"));
}
