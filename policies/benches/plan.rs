//! One `plan()` over 2,000 live requests, per policy (goal: under 200 µs for LVF).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use superinfer_policies::{
    Capacity, Phase, PolicyKind, ReqView, RequestId, Slo, TenantId, WlvfConfig,
};

fn view(n: usize) -> Vec<ReqView> {
    // A deterministic overloaded mix: a third each waiting, running, rotary.
    (0..n)
        .map(|i| {
            let phase = [Phase::Waiting, Phase::Running, Phase::Rotary][i % 3];
            let t_arr = i as f64 * 0.01;
            let blocks = 8 + (i * 37 % 120) as u32;
            ReqView {
                id: RequestId(i as u64),
                tenant: TenantId((i % 3) as u32),
                weight: [1.0, 2.0, 4.0][i % 3],
                slo: Slo::default(),
                phase,
                t_arr,
                t_last: (phase != Phase::Waiting).then_some(t_arr + 1.0),
                t_run: (phase == Phase::Running).then_some(t_arr + 0.5),
                blocks,
                held_hbm: if phase == Phase::Running {
                    blocks - (i % 2) as u32
                } else {
                    0
                },
                copy_in: if phase == Phase::Rotary { blocks } else { 0 },
                unsynced: if phase == Phase::Running { 1 } else { 0 },
                prefilling: false,
                just_started: false,
                consecutive_rotations: (i % 4) as u32,
                prefill: 0,
            }
        })
        .collect()
}

fn bench_plan(c: &mut Criterion) {
    let v = view(2000);
    let cap = Capacity {
        free_hbm: 500,
        free_dram: 1_000_000,
        b_xfer: 2400,
        prefill_tokens: u32::MAX,
    };
    let cfg = WlvfConfig {
        max_wait_s: Some(30.0),
        max_consecutive_rotations: Some(4),
        ..Default::default()
    };
    let mut group = c.benchmark_group("plan_2000");
    for kind in PolicyKind::ALL {
        let mut policy = kind.build(&cfg);
        group.bench_with_input(BenchmarkId::from_parameter(kind), &v, |b, v| {
            b.iter(|| policy.plan(30.0, v, cap))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
