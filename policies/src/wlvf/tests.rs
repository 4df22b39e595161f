use super::*;
use crate::test_support::{cap, ids, rotary, running, waiting};
use crate::types::Service;
use crate::types::Slo;
use crate::Lvf;

fn served(prefill: u64) -> Service {
    Service { prefill, decode: 0 }
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
