//! Builders for the unit tests: one request per phase, with the fields a scenario usually
//! leaves alone set to neutral values (one tenant, default SLO, nothing to copy).

use crate::types::{Capacity, Phase, ReqView, RequestId, Slo, TenantId};

fn base(id: u64, phase: Phase, t_arr: f64, blocks: u32) -> ReqView {
    ReqView {
        id: RequestId(id),
        tenant: TenantId(0),
        weight: 1.0,
        slo: Slo::default(),
        phase,
        t_arr,
        t_last: None,
        t_run: None,
        blocks,
        held_hbm: 0,
        copy_in: 0,
        unsynced: 0,
        prefilling: false,
        just_started: false,
        consecutive_rotations: 0,
        prefill: 0,
    }
}

/// A waiting request that arrived at `t_arr` and needs `blocks` to start.
pub fn waiting(id: u64, t_arr: f64, blocks: u32) -> ReqView {
    base(id, Phase::Waiting, t_arr, blocks)
}

/// A running request in its current period since `t_run`, holding all `blocks` it needs
/// (no growth) with its last token at `t_run` and every block mirrored in DRAM.
pub fn running(id: u64, t_arr: f64, t_run: f64, blocks: u32) -> ReqView {
    ReqView {
        t_last: Some(t_run),
        t_run: Some(t_run),
        held_hbm: blocks,
        ..base(id, Phase::Running, t_arr, blocks)
    }
}

/// A rotary request paused since its last token at `t_last`; restoring it copies all
/// `blocks` back.
pub fn rotary(id: u64, t_arr: f64, t_last: f64, blocks: u32) -> ReqView {
    ReqView {
        t_last: Some(t_last),
        copy_in: blocks,
        ..base(id, Phase::Rotary, t_arr, blocks)
    }
}

/// Capacity with `free_hbm` blocks free, ample DRAM and a rotation budget of `b_xfer`.
pub fn cap(free_hbm: u32, b_xfer: u32) -> Capacity {
    Capacity::unlimited_seats(free_hbm, 1_000_000, b_xfer, u32::MAX)
}

/// Ids as plain numbers, for short assertions.
pub fn ids(list: &[RequestId]) -> Vec<u64> {
    list.iter().map(|id| id.0).collect()
}
