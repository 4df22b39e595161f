//! CPU time of one `plan()` over the 2,000-request view of `benches/plan.rs`, per policy.
//!
//! Criterion measures wall time, which on a shared machine includes the time other processes
//! hold the core. This reads the thread's own CPU time (`/proc/thread-self/schedstat`, Linux),
//! so it is robust to them. Run with `cargo run --profile bench -p superinfer-policies
//! --example plan_cpu_time`.

use std::hint::black_box;
use superinfer_policies::{
    Capacity, Phase, PolicyKind, ReqView, RequestId, Slo, TenantId, WlvfConfig,
};

/// The same deterministic overloaded mix as `benches/plan.rs`.
fn view(n: usize) -> Vec<ReqView> {
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
                unsynced: u32::from(phase == Phase::Running),
                prefilling: false,
                just_started: false,
                consecutive_rotations: (i % 4) as u32,
                prefill: 0,
            }
        })
        .collect()
}

/// Nanoseconds this thread has run on a CPU.
fn cpu_ns() -> std::io::Result<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    stat.split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| std::io::Error::other("unexpected /proc/thread-self/schedstat"))
}

fn main() -> std::io::Result<()> {
    const PLANS: u64 = 500;
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
    let mut policies: Vec<_> = PolicyKind::ALL.map(|kind| (kind, kind.build(&cfg))).into();
    // Warm every policy (and the allocator) before measuring any: the first policy measured
    // otherwise pays for the process's first few thousand plans.
    for (_, policy) in &mut policies {
        for _ in 0..PLANS {
            black_box(policy.plan(30.0, black_box(&v), cap));
        }
    }
    for (kind, policy) in &mut policies {
        let mut best = u64::MAX;
        for _ in 0..20 {
            let t0 = cpu_ns()?;
            for _ in 0..PLANS {
                black_box(policy.plan(30.0, black_box(&v), cap));
            }
            best = best.min((cpu_ns()? - t0) / PLANS);
        }
        println!(
            "{kind:>5}: {:6.1} µs CPU per plan (best of 20 runs of {PLANS})",
            best as f64 / 1e3
        );
    }
    Ok(())
}
