//! The scenarios the plan properties run on: random views, capacities, knobs and service
//! histories, and the helpers that replay them on a policy and read their views.

use proptest::prelude::*;
use superinfer_policies::{
    Capacity, Phase, Plan, PolicyKind, ReqView, RequestId, Service, Slo, TenantId, VltConfig,
    WaitCapScope, WlvfConfig,
};

pub(crate) const NOW: f64 = 100.0;

/// One request, before ids and tenant weights are filled in.
pub(crate) fn request() -> impl Strategy<Value = ReqView> {
    (
        (
            0..3u8,
            0..4u32,
            0..=100u32,
            0..=4u32,
            0..=4u32,
            any::<bool>(),
        ),
        (
            1..=32u32,
            0..=1u32,
            0..=32u32,
            0..=16u32,
            prop::bool::weighted(0.2),
            0..5u32,
        ),
        (
            prop::sample::select(vec![1.0, 5.0, 20.0]),
            prop::sample::select(vec![0.05, 0.1, 1.0]),
        ),
    )
        .prop_map(
            |(
                (phase, tenant, t_arr, f_last, f_run, recomputed),
                (blocks, growth, copy_in, unsynced, prefilling, rotations),
                (ttft_s, tbt_s),
            )| {
                let phase = [Phase::Waiting, Phase::Running, Phase::Rotary][usize::from(phase)];
                // Times on a quarter grid so that ties happen; all at or before NOW.
                let t_arr = f64::from(t_arr);
                let at = |f: u32| t_arr + (NOW - t_arr) * f64::from(f) / 4.0;
                let running = phase == Phase::Running;
                ReqView {
                    id: RequestId(0),
                    tenant: TenantId(tenant),
                    weight: 1.0,
                    slo: Slo { ttft_s, tbt_s },
                    phase,
                    t_arr,
                    // A waiting request with a last token was recomputed.
                    t_last: (phase != Phase::Waiting || recomputed).then(|| at(f_last)),
                    t_run: running.then(|| at(f_run)),
                    blocks,
                    held_hbm: if running {
                        blocks - growth.min(blocks)
                    } else {
                        0
                    },
                    copy_in: if phase == Phase::Rotary {
                        copy_in.min(blocks)
                    } else {
                        0
                    },
                    unsynced: if running { unsynced } else { 0 },
                    prefilling: running && prefilling,
                    just_started: running && !prefilling && f_run == 4,
                    consecutive_rotations: if running { rotations } else { 0 },
                    prefill: if phase == Phase::Waiting {
                        blocks * 12
                    } else {
                        0
                    },
                }
            },
        )
}

/// A view of up to 40 requests over `tenants` tenants with the given weights.
pub(crate) fn view(tenants: u32) -> impl Strategy<Value = Vec<ReqView>> {
    (
        prop::collection::vec(request(), 0..40),
        prop::collection::vec(1..=4u32, 4),
    )
        .prop_map(move |(mut reqs, weights)| {
            for (i, r) in reqs.iter_mut().enumerate() {
                r.id = RequestId(i as u64 * 7 + 3);
                r.tenant = TenantId(r.tenant.0 % tenants);
                r.weight = f64::from(weights[r.tenant.0 as usize]);
            }
            reqs
        })
}

pub(crate) fn capacity() -> impl Strategy<Value = Capacity> {
    // Free HBM is often nearly gone, so that growth alone can cause a shortage.
    let free_hbm = prop_oneof![0..=8u32, 0..=200u32];
    let prefill = prop::sample::select(vec![u32::MAX, 0, 100, 400]);
    // Copies in flight take part of each direction's budget; seats are often unlimited.
    let seats = prop_oneof![Just(u32::MAX), 0..=6u32];
    (
        (free_hbm, 0..=200u32, 0..=120u32, prefill),
        (0.0..=1.0f64, 0.0..=1.0f64, seats),
    )
        .prop_map(
            |((free_hbm, free_dram, b_xfer, prefill_tokens), (h, d, seats))| Capacity {
                free_hbm,
                free_dram,
                b_xfer,
                h2d: (f64::from(b_xfer) * h) as u32,
                d2h: (f64::from(b_xfer) * d) as u32,
                prefill_tokens,
                long_prefill_tokens: u32::MAX,
                long_prefill_slots: u32::MAX,
                seats,
            },
        )
}

pub(crate) fn vlt_config() -> impl Strategy<Value = VltConfig> {
    (0.5..5.0f64, -1.0..1.0f64, -1.0..1.0f64).prop_map(|(alpha, beta_b, beta_f)| VltConfig {
        alpha,
        beta_b,
        beta_f,
    })
}

pub(crate) fn wlvf_config() -> impl Strategy<Value = WlvfConfig> {
    (
        vlt_config(),
        prop::option::of(1..=60u32),
        prop::option::of(1..=4u32),
        prop::sample::select(vec![0.0, 10.0, 100.0, 1000.0, 1e9]),
        prop::sample::select(vec![WaitCapScope::Global, WaitCapScope::Tenant]),
    )
        .prop_map(|(vlt, wait, rotations, quantum, scope)| WlvfConfig {
            vlt,
            max_wait_s: wait.map(f64::from),
            max_consecutive_rotations: rotations,
            fairness_quantum_tokens: quantum,
            wait_cap_scope: scope,
            ..WlvfConfig::default()
        })
}

/// What a policy went through before the plan under test.
#[derive(Clone, Debug)]
pub(crate) enum Step {
    Service {
        tenant: u32,
        tokens: u64,
    },
    /// A plan over the requests of the view whose bit (by position mod 64) is set.
    Plan(u64),
}

pub(crate) fn history() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => (0..5u32, 0..20_000u64).prop_map(|(tenant, tokens)| Step::Service { tenant, tokens }),
        1 => any::<u64>().prop_map(Step::Plan),
    ];
    prop::collection::vec(step, 0..8)
}

#[derive(Clone, Debug)]
pub(crate) struct Scenario {
    pub(crate) view: Vec<ReqView>,
    pub(crate) cap: Capacity,
    pub(crate) cfg: WlvfConfig,
    pub(crate) history: Vec<Step>,
    pub(crate) shuffle_seed: u64,
}

pub(crate) fn scenario() -> impl Strategy<Value = Scenario> {
    (1..=4u32)
        .prop_flat_map(|tenants| {
            (
                view(tenants),
                capacity(),
                wlvf_config(),
                history(),
                any::<u64>(),
            )
        })
        .prop_map(|(view, cap, cfg, history, shuffle_seed)| Scenario {
            view,
            cap,
            cfg,
            history,
            shuffle_seed,
        })
}

pub(crate) fn prefill(tokens: u64) -> Service {
    Service {
        prefill: tokens,
        ..Service::default()
    }
}

/// Replays the history on a fresh policy and plans the view.
pub(crate) fn run(kind: PolicyKind, s: &Scenario, view: &[ReqView]) -> Plan {
    let mut policy = kind.build(&s.cfg);
    for step in &s.history {
        match *step {
            Step::Service { tenant, tokens } => {
                policy.on_service(TenantId(tenant), f64::from(tenant + 1), prefill(tokens))
            }
            Step::Plan(mask) => {
                let part: Vec<ReqView> = s
                    .view
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask >> (i % 64) & 1 == 1)
                    .map(|(_, r)| r.clone())
                    .collect();
                policy.plan(NOW - 1.0, &part, s.cap);
            }
        }
    }
    policy.plan(NOW, view, s.cap)
}

/// A permutation of `view` (Fisher-Yates on a splitmix64 stream).
pub(crate) fn shuffled(view: &[ReqView], mut seed: u64) -> Vec<ReqView> {
    let mut next = || {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut v = view.to_vec();
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

pub(crate) fn growth(view: &[ReqView]) -> i64 {
    view.iter()
        .filter(|r| r.phase == Phase::Running)
        .map(|r| i64::from(r.blocks - r.held_hbm))
        .sum()
}

pub(crate) fn blocks(view: &[ReqView], ids: &[RequestId]) -> i64 {
    ids.iter().map(|id| i64::from(find(view, *id).blocks)).sum()
}

pub(crate) fn find(view: &[ReqView], id: RequestId) -> &ReqView {
    view.iter()
        .find(|r| r.id == id)
        .expect("checked: every planned id is in the view")
}
