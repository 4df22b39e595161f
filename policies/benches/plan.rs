//! One `plan()` over 2,000 live requests, per policy (goal: under 200 µs for LVF).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use superinfer_policies::PolicyKind;

#[path = "support/mix.rs"]
mod mix;

fn bench_plan(c: &mut Criterion) {
    let v = mix::view(2000);
    let cap = mix::capacity();
    let cfg = mix::config();
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
