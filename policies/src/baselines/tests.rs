use super::*;
use crate::test_support::{cap, ids, rotary, running, waiting};
use crate::types::Slo;

#[test]
fn fcfs_never_preempts_to_admit() {
    // The waiting request lags by 97 s; the running one has run for 100 s. FCFS waits anyway.
    let view = vec![running(1, 0.0, 0.0, 10), waiting(2, 0.0, 10)];
    let plan = Fcfs.plan(100.0, &view, cap(0, 1000));
    assert!(plan.is_empty(), "{plan:?}");
}

#[test]
fn fcfs_preempts_the_newest_running_request_on_a_growth_shortage() {
    // Request 1 needs one more block and none is free.
    let view = vec![
        ReqView {
            held_hbm: 9,
            ..running(1, 1.0, 1.0, 10)
        },
        ReqView {
            unsynced: 2,
            ..running(2, 9.0, 9.0, 10)
        },
        running(3, 5.0, 5.0, 10),
        waiting(4, 0.5, 1),
    ];
    // vLLM V1: the victim is recomputed, never swapped, even with copy budget to spare.
    let plan = Fcfs.plan(100.0, &view, cap(0, 100));
    assert_eq!(ids(&plan.recompute), [2]);
    assert!(plan.rotate_out.is_empty());
    // The 9 blocks left over go to the waiting request, which fits without preemption.
    assert_eq!(ids(&plan.admit), [4]);
    let plan = Fcfs.plan(100.0, &view, cap(0, 0));
    assert_eq!(ids(&plan.recompute), [2]);
    assert!(plan.rotate_out.is_empty());
}

#[test]
fn fcfs_admits_in_arrival_order_while_requests_fit() {
    let view = vec![
        waiting(1, 3.0, 10),
        waiting(2, 1.0, 10),
        waiting(3, 2.0, 30),
        waiting(4, 4.0, 5),
    ];
    let plan = Fcfs.plan(100.0, &view, cap(45, 0));
    // 2 then 3 (40 blocks); 1 does not fit and stops everything behind it, 4 included.
    assert_eq!(ids(&plan.admit), [2, 3]);
}

#[test]
fn fcfs_holds_new_requests_until_every_rotary_request_is_back() {
    // The restore needs 10 blocks copied in and the budget is 5: it waits, and so does the
    // waiting request behind it, although HBM has room for it.
    let view = vec![rotary(1, 0.0, 90.0, 10), waiting(2, 5.0, 5)];
    let plan = Fcfs.plan(100.0, &view, cap(20, 5));
    assert!(plan.is_empty(), "{plan:?}");
}

#[test]
fn sf_resumes_rotary_requests_before_waiting_ones() {
    // Room for one of the two: the rotary request wins although it arrived later.
    let view = vec![waiting(1, 0.0, 5), rotary(2, 10.0, 90.0, 8)];
    let plan = SwappedFirst.plan(100.0, &view, cap(10, 100));
    assert_eq!(ids(&plan.restore), [2]);
    assert!(plan.admit.is_empty());
}

#[test]
fn sf_lets_new_requests_use_the_room_a_blocked_restore_leaves() {
    let view = vec![rotary(1, 0.0, 90.0, 10), waiting(2, 5.0, 5)];
    let plan = SwappedFirst.plan(100.0, &view, cap(20, 5));
    assert!(plan.restore.is_empty());
    assert_eq!(ids(&plan.admit), [2]);
}

#[test]
fn sf_never_preempts_to_admit() {
    let view = vec![
        running(1, 0.0, 0.0, 10),
        rotary(2, 0.0, 1.0, 10),
        waiting(3, 0.0, 10),
    ];
    let plan = SwappedFirst.plan(100.0, &view, cap(0, 1000));
    assert!(plan.is_empty(), "{plan:?}");
}

#[test]
fn wf_preempts_running_requests_to_admit_waiting_ones() {
    let view = vec![
        running(1, 0.0, 0.0, 10),
        running(2, 5.0, 5.0, 10),
        rotary(3, 1.0, 50.0, 10),
        waiting(4, 50.0, 10),
    ];
    let plan = WaitingFirst.plan(100.0, &view, cap(0, 100));
    assert_eq!(ids(&plan.admit), [4]);
    // The newest running request makes room; the rotary request does not get in.
    assert_eq!(ids(&plan.rotate_out), [2]);
    assert!(plan.restore.is_empty());
}

#[test]
fn wf_restores_only_into_free_room_after_every_waiting_request() {
    let view = vec![
        running(1, 0.0, 0.0, 10),
        rotary(2, 1.0, 50.0, 10),
        waiting(3, 50.0, 10),
    ];
    let plan = WaitingFirst.plan(100.0, &view, cap(15, 100));
    assert_eq!(ids(&plan.admit), [3]);
    assert!(plan.restore.is_empty() && plan.rotate_out.is_empty());
    let plan = WaitingFirst.plan(100.0, &view, cap(20, 100));
    assert_eq!(ids(&plan.restore), [2]);
}

#[test]
fn edf_orders_by_deadline() {
    let slo = |ttft_s, tbt_s| Slo { ttft_s, tbt_s };
    let view = vec![
        ReqView {
            slo: slo(20.0, 0.1),
            ..waiting(1, 0.0, 10)
        }, // deadline 20
        ReqView {
            slo: slo(2.0, 0.1),
            ..waiting(2, 1.0, 10)
        }, // deadline 3
        ReqView {
            slo: slo(5.0, 0.1),
            ..rotary(3, 0.0, 4.0, 10)
        }, // deadline 4.1
        ReqView {
            slo: slo(5.0, 0.1),
            ..running(4, 0.0, 9.9, 10)
        }, // deadline 10.0
    ];
    let plan = Edf.plan(10.0, &view, cap(10, 100));
    // 2 fits in free HBM; 3 displaces 4, whose deadline is later; 1 (deadline 20) cannot.
    assert_eq!(ids(&plan.admit), [2]);
    assert_eq!(ids(&plan.restore), [3]);
    assert_eq!(ids(&plan.rotate_out), [4]);
}
