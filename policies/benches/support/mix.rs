//! The 2,000-request overloaded view that `benches/plan.rs` and `examples/plan_cpu_time.rs`
//! both measure (included by path, so both measure exactly the same input).

use superinfer_policies::{Capacity, Phase, ReqView, RequestId, Slo, TenantId, WlvfConfig};

/// A deterministic overloaded mix: a third each waiting, running, rotary; three tenants.
pub fn view(n: usize) -> Vec<ReqView> {
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

/// HBM nearly full, DRAM plentiful, the paper's rotation budget.
pub fn capacity() -> Capacity {
    Capacity::unlimited_seats(500, 1_000_000, 2400, u32::MAX)
}

/// Weighted LVF with both caps on, so its slowest path is measured.
pub fn config() -> WlvfConfig {
    WlvfConfig {
        max_wait_s: Some(30.0),
        max_consecutive_rotations: Some(4),
        ..Default::default()
    }
}
