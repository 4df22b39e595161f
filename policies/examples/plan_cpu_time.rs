//! CPU time of one `plan()` over the 2,000-request view of `benches/plan.rs`, per policy.
//!
//! Criterion measures wall time, which on a shared machine includes the time other processes
//! hold the core. This reads the thread's own CPU time (`/proc/thread-self/schedstat`, Linux),
//! so it is robust to them. Run with `cargo run --profile bench -p superinfer-policies
//! --example plan_cpu_time`.

use std::hint::black_box;
use superinfer_policies::PolicyKind;

#[path = "../benches/support/mix.rs"]
mod mix;

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
    let v = mix::view(2000);
    let cap = mix::capacity();
    let cfg = mix::config();
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
