//! Speed of the twin: replay 120 s of ShareGPT-like Poisson load at 20 RPS on
//! gh200-qwen2.5-32b under four policies (goal: under 10 s of wall time for all four).

use criterion::{criterion_group, criterion_main, Criterion};
use std::time::Duration;
use superinfer_loadgen::target::sim::{SimTarget, SimTargetConfig};
use superinfer_loadgen::target::Target;
use superinfer_loadgen::workload::arrivals::ArrivalSpec;
use superinfer_loadgen::workload::lengths::LengthSpec;
use superinfer_loadgen::workload::{generate, TenantSpec};
use superinfer_policies::PolicyKind;

fn replay_four_policies(c: &mut Criterion) {
    let tenants = [TenantSpec::new(
        "default",
        LengthSpec::Sharegpt,
        ArrivalSpec::Poisson { rps: 20.0 },
    )];
    let requests = generate(&tenants, 120.0, 42).expect("a valid workload");
    let mut target = SimTarget::new(SimTargetConfig::default()).expect("a built-in profile");
    let mut group = c.benchmark_group("twin");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(30));
    group.bench_function("120s_20rps_fcfs_wf_sf_lvf", |b| {
        b.iter(|| {
            for policy in [
                PolicyKind::Fcfs,
                PolicyKind::Wf,
                PolicyKind::Sf,
                PolicyKind::Lvf,
            ] {
                let records = target
                    .run(policy, &tenants, &requests, 120.0)
                    .expect("the run completes");
                assert_eq!(records.len(), requests.len());
            }
        })
    });
    group.finish();
}

criterion_group!(benches, replay_four_policies);
criterion_main!(benches);
