use super::*;
use crate::test_support::{cap, ids, rotary, running, waiting};
use crate::types::Service;
use crate::types::Slo;
use crate::Lvf;

fn served(prefill: u64) -> Service {
    Service {
        prefill,
        ..Service::default()
    }
}

fn of(tenant: u32, weight: f64, r: ReqView) -> ReqView {
    ReqView {
        tenant: TenantId(tenant),
        weight,
        ..r
    }
}

#[test]
fn prefers_the_under_served_tenant() {
    // Tenant 0 (weight 4) got 4,000 tokens, tenant 1 (weight 1) 2,000. Counters (service per
    // unit of weight): 1,000 and 2,000. Tenant 0 is behind its share although it has more
    // tokens; tenant 1 is a whole band (1,000) ahead.
    let view = vec![
        of(0, 4.0, waiting(1, 50.0, 10)),
        of(1, 1.0, waiting(2, 0.0, 10)),
    ];
    let mut w = Wlvf::new(WlvfConfig {
        fairness_quantum_tokens: 1000.0,
        ..Default::default()
    });
    w.on_service(TenantId(0), 4.0, served(4000));
    w.on_service(TenantId(1), 1.0, served(2000));
    assert_eq!(ids(&w.plan(100.0, &view, cap(10, 0)).admit), [1]);
    // Plain LVF takes the request that lags more (tenant 1's).
    assert_eq!(
        ids(&Lvf::default().plan(100.0, &view, cap(10, 0)).admit),
        [2]
    );
}

#[test]
fn a_tenant_behind_its_share_has_the_first_chunk_band() {
    // Counters 1,000 and 2,500 (weights 4 and 1), bands of 1,000: tenant 1 is one whole band
    // ahead; a tenant the policy has not seen, and a policy without fairness, band 0.
    let mut w = Wlvf::new(WlvfConfig {
        fairness_quantum_tokens: 1000.0,
        ..Default::default()
    });
    w.on_arrival(TenantId(0), 4.0);
    w.on_arrival(TenantId(1), 1.0);
    w.on_service(TenantId(0), 4.0, served(4000));
    w.on_service(TenantId(1), 1.0, served(2500));
    // Bands count from the least active counter as of the last plan (the engine plans every
    // step before it forms the batch).
    let view = vec![
        of(0, 4.0, waiting(1, 0.0, 10)),
        of(1, 1.0, waiting(2, 0.0, 10)),
    ];
    w.plan(1.0, &view, cap(10, 0));
    assert_eq!(w.chunk_band(TenantId(0)), 0);
    assert_eq!(w.chunk_band(TenantId(1)), 1);
    assert_eq!(w.chunk_band(TenantId(7)), 0);
    assert_eq!(Lvf::default().chunk_band(TenantId(1)), 0);
}

#[test]
fn victims_come_from_tenants_ahead() {
    // Tenant 0 is far ahead. Its running request ran for less time than tenant 1's, but it is
    // the one rotated out to admit tenant 1's waiting request.
    let view = vec![
        of(0, 1.0, running(1, 0.0, 80.0, 10)),
        of(1, 1.0, running(2, 0.0, 10.0, 10)),
        of(1, 1.0, waiting(3, 0.0, 10)),
    ];
    let mut w = Wlvf::new(WlvfConfig {
        fairness_quantum_tokens: 100.0,
        ..Default::default()
    });
    w.on_service(TenantId(0), 1.0, served(1_000_000));
    let plan = w.plan(100.0, &view, cap(0, 100));
    assert_eq!(ids(&plan.rotate_out), [1]);
    assert_eq!(ids(&plan.admit), [3]);
    assert_eq!(
        ids(&Lvf::default().plan(100.0, &view, cap(0, 100)).rotate_out),
        [2]
    );
}

#[test]
fn a_tenant_ahead_cannot_displace_one_within_the_band() {
    let view = vec![
        of(0, 1.0, running(1, 0.0, 10.0, 10)),
        of(1, 1.0, waiting(2, 0.0, 10)),
    ];
    let mut w = Wlvf::new(WlvfConfig {
        fairness_quantum_tokens: 100.0,
        ..Default::default()
    });
    w.on_service(TenantId(1), 1.0, served(1_000_000));
    assert!(w.plan(100.0, &view, cap(0, 100)).is_empty());
}

#[test]
fn a_returning_tenant_gets_no_credit_for_idle_time() {
    let quantum = WlvfConfig {
        fairness_quantum_tokens: 100.0,
        ..Default::default()
    };
    let mut w = Wlvf::new(quantum);
    // Tenant 0 is alone for a while and served a million tokens.
    w.plan(10.0, &[of(0, 1.0, waiting(1, 0.0, 10))], cap(100, 0));
    w.on_service(TenantId(0), 1.0, served(1_000_000));
    // Tenant 1 arrives; it catches up to tenant 0 instead of owning the next million tokens,
    // so both are in the band and VLT decides: tenant 0's request lags more.
    let view = vec![
        of(0, 1.0, waiting(2, 0.0, 10)),
        of(1, 1.0, waiting(3, 10.0, 10)),
    ];
    assert_eq!(ids(&w.plan(100.0, &view, cap(10, 0)).admit), [2]);
    // Without the history, tenant 1 would be far behind and win.
    let mut fresh = Wlvf::new(quantum);
    fresh.on_service(TenantId(0), 1.0, served(1_000_000));
    assert_eq!(ids(&fresh.plan(100.0, &view, cap(10, 0)).admit), [3]);
}

#[test]
fn promotes_an_overdue_request() {
    let slo = |ttft_s| Slo { ttft_s, tbt_s: 0.1 };
    let view = vec![
        // Waited 11 s but has a loose TTFT: VLT max(0, 11 - 50) = 0.
        ReqView {
            slo: slo(100.0),
            ..waiting(1, 89.0, 10)
        },
        // Waited 8 s with a tight TTFT: VLT 7.5.
        ReqView {
            slo: slo(1.0),
            ..waiting(2, 92.0, 10)
        },
    ];
    let mut w = Wlvf::new(WlvfConfig {
        max_wait_s: Some(10.0),
        ..Default::default()
    });
    assert_eq!(ids(&w.plan(100.0, &view, cap(10, 0)).admit), [1]);
    assert_eq!(
        ids(&Lvf::default().plan(100.0, &view, cap(10, 0)).admit),
        [2]
    );
}

#[test]
fn an_overdue_request_of_a_tenant_ahead_still_displaces_others() {
    let view = vec![
        of(0, 1.0, running(1, 0.0, 99.0, 10)),
        of(1, 1.0, rotary(2, 0.0, 80.0, 10)), // paused 20 s
    ];
    let mut w = Wlvf::new(WlvfConfig {
        max_wait_s: Some(10.0),
        fairness_quantum_tokens: 100.0,
        ..Default::default()
    });
    w.on_service(TenantId(1), 1.0, served(1_000_000));
    let plan = w.plan(100.0, &view, cap(0, 100));
    assert_eq!(ids(&plan.restore), [2]);
    assert_eq!(ids(&plan.rotate_out), [1]);
}

#[test]
fn the_rotation_cap_shields_a_request_rotated_out_too_often() {
    let view = vec![
        ReqView {
            consecutive_rotations: 3,
            prefill: 0,
            ..running(1, 0.0, 10.0, 10)
        },
        running(2, 0.0, 50.0, 10),
        waiting(3, 0.0, 10),
    ];
    let cfg = WlvfConfig {
        max_consecutive_rotations: Some(3),
        defer_late: false,
        ..Default::default()
    };
    assert_eq!(
        ids(&Wlvf::new(cfg).plan(100.0, &view, cap(0, 100)).rotate_out),
        [2]
    );
    assert_eq!(
        ids(&Lvf::default().plan(100.0, &view, cap(0, 100)).rotate_out),
        [1]
    );
}

#[test]
fn a_tenant_whose_requests_are_all_mid_copy_keeps_its_counter() {
    // Both tenants have live requests; tenant 0's are all in flight (hidden from the view)
    // while tenant 1 is served a million tokens. When tenant 0 reappears it is still owed
    // that service: its fresh request goes first although tenant 1's lags more.
    let cfg = WlvfConfig {
        fairness_quantum_tokens: 100.0,
        defer_late: false,
        ..Default::default()
    };
    let mut w = Wlvf::new(cfg);
    w.on_arrival(TenantId(0), 1.0);
    w.on_arrival(TenantId(1), 1.0);
    w.plan(1.0, &[of(1, 1.0, waiting(2, 0.0, 10))], cap(100, 0));
    w.on_service(TenantId(1), 1.0, served(1_000_000));
    let view = vec![
        of(0, 1.0, rotary(1, 0.0, 99.0, 10)),
        of(1, 1.0, waiting(3, 0.0, 10)),
    ];
    assert_eq!(ids(&w.plan(100.0, &view, cap(10, 100)).order), [1]);
    // A tenant that really had nothing live is lifted to the floor instead: the two tie in the
    // band and VLT decides (tenant 1's request waited 100 s).
    let mut idle = Wlvf::new(cfg);
    idle.on_arrival(TenantId(1), 1.0);
    idle.plan(1.0, &[of(1, 1.0, waiting(2, 0.0, 10))], cap(100, 0));
    idle.on_service(TenantId(1), 1.0, served(1_000_000));
    assert_eq!(ids(&idle.plan(100.0, &view, cap(10, 100)).order), [3]);
}

#[test]
fn the_wait_cap_lead_comes_from_step_times_not_idle_time() {
    // Request 1 waited 5 s of a 10 s cap; request 2 lags more by VLT. Plans 90 s apart (an
    // idle node) must not make request 1 overdue: the lead is two measured steps (20 ms).
    let slo = |ttft_s| Slo { ttft_s, tbt_s: 0.1 };
    let view = vec![
        ReqView {
            slo: slo(100.0),
            ..waiting(1, 95.0, 10)
        },
        ReqView {
            slo: slo(1.0),
            ..waiting(2, 97.0, 10)
        },
    ];
    let mut w = Wlvf::new(WlvfConfig {
        max_wait_s: Some(10.0),
        defer_late: false,
        ..Default::default()
    });
    w.plan(10.0, &[waiting(9, 0.0, 1)], cap(100, 0));
    w.on_step(0.01);
    assert_eq!(ids(&w.plan(100.0, &view, cap(10, 0)).admit), [2]);
    // Steps of 3 s do make it overdue (5 s + 2 × 3 s >= 10 s).
    w.on_step(3.0);
    assert_eq!(ids(&w.plan(100.0, &view, cap(10, 0)).admit), [1]);
}

#[test]
fn a_light_tenant_is_not_queued_behind_a_flood() {
    // Tenant 0 floods: twelve requests that have waited long (large VLT), 500 prompt tokens
    // each. Tenant 1 sends one fresh request (VLT 0). Both tie at the floor. With a band of
    // 1,024, tenant 0's virtual starts are 0, 500, 1000, 1500, ...: only its first three share
    // the light tenant's band, so the light request is fourth, not thirteenth. (The flood's
    // requests are past their TTFT deadline; `defer_late` would put the light one first.)
    let cfg = WlvfConfig {
        fairness_quantum_tokens: 1024.0,
        defer_late: false,
        ..Default::default()
    };
    let mut view: Vec<ReqView> = (0..12)
        .map(|i| {
            of(
                0,
                1.0,
                ReqView {
                    prefill: 500,
                    ..waiting(i, f64::from(i as u32), 1)
                },
            )
        })
        .collect();
    view.push(of(
        1,
        1.0,
        ReqView {
            prefill: 100,
            ..waiting(100, 99.9, 1)
        },
    ));
    let plan = Wlvf::new(cfg).plan(100.0, &view, cap(4, 0));
    assert_eq!(ids(&plan.order), [0, 1, 2, 100]);
    // Plain LVF serves the flood first.
    assert_eq!(
        ids(&Lvf::default().plan(100.0, &view, cap(4, 0)).admit),
        [0, 1, 2, 3]
    );
}

#[test]
fn requests_that_can_still_meet_their_slo_go_first() {
    // Request 1 arrived 8 s ago (TTFT 5 s: already late, VLT 5.5); request 2 arrived 3 s ago
    // (VLT 0.5) and can still make it. Room for one: weighted LVF serves request 2, LVF the
    // one that lags most.
    let view = vec![waiting(1, 92.0, 10), waiting(2, 97.0, 10)];
    let w = Wlvf::new(WlvfConfig::default()).plan(100.0, &view, cap(10, 0));
    assert_eq!(ids(&w.admit), [2]);
    assert_eq!(
        ids(&Lvf::default().plan(100.0, &view, cap(10, 0)).admit),
        [1]
    );
    // A late request does not displace a running one to start.
    let view = vec![running(3, 0.0, 99.0, 10), waiting(1, 92.0, 10)];
    let plan = Wlvf::new(WlvfConfig::default()).plan(100.0, &view, cap(0, 100));
    assert!(plan.is_empty(), "{plan:?}");
    // With room to spare, late or not, everyone starts (work-conserving).
    let view = vec![waiting(1, 92.0, 10), waiting(2, 97.0, 10)];
    let plan = Wlvf::new(WlvfConfig::default()).plan(100.0, &view, cap(20, 0));
    assert_eq!(plan.admit.len(), 2);
}

#[test]
fn a_tenants_late_requests_do_not_take_its_earliest_virtual_starts() {
    // Tenant 0 has two late prompts (arrived 8 s ago, TTFT 5 s) of 600 tokens each and a
    // fresh one of 10; tenant 1 a fresh one of 10. Bands of 1,000 tokens, equal counters.
    // Ranked by VLT alone, tenant 0's late prompts would take its virtual starts 0 and 600
    // (band 0) and push its fresh prompt to 1,200 (band -1), behind its own late ones. Room
    // for two: both fresh prompts start, the late ones wait behind them.
    let prompt = |r: ReqView, prefill: u32| ReqView { prefill, ..r };
    let view = vec![
        of(0, 1.0, prompt(waiting(1, 92.0, 10), 600)),
        of(0, 1.0, prompt(waiting(2, 92.5, 10), 600)),
        of(0, 1.0, prompt(waiting(3, 99.0, 10), 10)),
        of(1, 1.0, prompt(waiting(4, 99.0, 10), 10)),
    ];
    let cfg = WlvfConfig {
        fairness_quantum_tokens: 1000.0,
        ..Default::default()
    };
    let plan = Wlvf::new(cfg).plan(100.0, &view, cap(20, 0));
    assert_eq!(ids(&plan.admit), [3, 4]);
    // Without the deferral the tenant's own order is LVF's: its late prompts take band 0 and,
    // lagging most, start first.
    let plain = WlvfConfig {
        defer_late: false,
        ..cfg
    };
    assert_eq!(
        ids(&Wlvf::new(plain).plan(100.0, &view, cap(20, 0)).admit),
        [1, 2]
    );
}

#[test]
fn running_requests_are_displaced_for_room_but_not_for_a_seat_unless_asked() {
    // HBM has room for the first waiting request (not for both, so LVF ranks them rather
    // than admitting all as FCFS); what is short is a seat (max_num_seqs).
    let view = vec![
        running(1, 0.0, 99.99, 10),
        // Waiting 3 s of a 5 s TTFT SLO: lagging (LVF takes it) but not yet late.
        waiting(2, 97.0, 10),
        waiting(3, 99.0, 10),
    ];
    let no_seat = Capacity {
        seats: 0,
        ..cap(15, 100)
    };
    let lvf = Lvf::default().plan(100.0, &view, no_seat);
    assert_eq!((ids(&lvf.rotate_out), ids(&lvf.admit)), (vec![1], vec![2]));
    let mut w = Wlvf::new(WlvfConfig::default());
    let plan = w.plan(100.0, &view, no_seat);
    assert!(
        plan.rotate_out.is_empty() && plan.admit.is_empty(),
        "{plan:?}"
    );
    let mut seats = Wlvf::new(WlvfConfig {
        preempt_for_seats: true,
        ..Default::default()
    });
    let plan = seats.plan(100.0, &view, no_seat);
    assert_eq!(
        (ids(&plan.rotate_out), ids(&plan.admit)),
        (vec![1], vec![2])
    );
    // Short of HBM room (not of seats), the default still displaces.
    let room = Capacity {
        seats: 1,
        ..cap(0, 100)
    };
    let plan = w.plan(100.0, &view, room);
    assert_eq!(
        (ids(&plan.rotate_out), ids(&plan.admit)),
        (vec![1], vec![2])
    );
}

/// Host CPU a tenant's requests took (their grammars' masks, in prompt-token equivalents) is
/// service like its tokens: two tenants served the same tokens, one with heavy masks, end
/// with that much between their counters.
#[test]
fn host_work_is_charged_like_tokens() {
    let mut w = Wlvf::new(WlvfConfig::default());
    w.on_arrival(TenantId(0), 1.0);
    w.on_arrival(TenantId(1), 1.0);
    w.on_service(TenantId(0), 1.0, served(100));
    let heavy = Service {
        host: 5_000,
        ..served(100)
    };
    w.on_service(TenantId(1), 1.0, heavy);
    let (a, b) = (
        w.counter(TenantId(0)).unwrap(),
        w.counter(TenantId(1)).unwrap(),
    );
    assert!((b - a - 5_000.0).abs() < 1e-6, "{a} {b}");
}
