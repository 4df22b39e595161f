use super::*;
use crate::test_support::{cap, ids, running, waiting};
use crate::types::Slo;

/// Three waiting requests whose VLT order (2, 3, 1) differs from their arrival order (1, 2, 3):
/// request 2 has a tight TTFT, request 1 a loose one. Ten blocks each; now = 100.
fn three_waiting() -> Vec<ReqView> {
    let slo = |ttft_s| Slo { ttft_s, tbt_s: 0.1 };
    vec![
        ReqView {
            slo: slo(20.0),
            ..waiting(1, 90.0, 10)
        }, // VLT max(0, 10 - 10)   = 0
        ReqView {
            slo: slo(0.2),
            ..waiting(2, 95.0, 10)
        }, // VLT max(0, 5 - 0.1)   = 4.9
        ReqView {
            slo: slo(5.0),
            ..waiting(3, 97.0, 10)
        }, // VLT max(0, 3 - 2.5)   = 0.5
    ]
}

#[test]
fn everything_fits_falls_back_to_fcfs_arrival_order() {
    let plan = Lvf::default().plan(100.0, &three_waiting(), cap(30, 0));
    assert_eq!(ids(&plan.admit), [1, 2, 3]);
    assert!(plan.rotate_out.is_empty() && plan.recompute.is_empty());
}

#[test]
fn when_not_everything_fits_it_takes_largest_vlt_first() {
    let plan = Lvf::default().plan(100.0, &three_waiting(), cap(25, 0));
    assert_eq!(ids(&plan.admit), [2, 3]);
}

#[test]
fn rotates_out_the_longest_running_request_first() {
    let view = vec![
        running(1, 0.0, 50.0, 10),
        running(2, 1.0, 10.0, 10), // running longest: VLT -90
        running(3, 2.0, 90.0, 10),
        waiting(4, 0.0, 10),  // VLT 97.5
        waiting(5, 20.0, 15), // VLT 77.5
    ];
    let plan = Lvf::default().plan(100.0, &view, cap(0, 100));
    assert_eq!(ids(&plan.admit), [4, 5]);
    // 4 takes request 2's room; 5 needs 15 and gets 1's and 3's, longest-running first.
    assert_eq!(ids(&plan.rotate_out), [2, 1, 3]);
}

#[test]
fn rotation_is_bounded_by_the_transfer_budget() {
    let view = vec![
        running(1, 0.0, 10.0, 10),
        running(2, 0.0, 20.0, 10),
        waiting(3, 0.0, 10),
        waiting(4, 1.0, 10),
    ];
    // Only 10 blocks may be taken beyond free HBM this iteration.
    let plan = Lvf::default().plan(100.0, &view, cap(0, 10));
    assert_eq!(ids(&plan.admit), [3]);
    assert_eq!(ids(&plan.rotate_out), [1]);
}

#[test]
fn a_candidate_does_not_displace_a_request_that_ranks_as_high() {
    // The waiting request is within its TTFT tolerance (VLT 0); the running one started now
    // (VLT 0): no strict priority, no rotation.
    let view = vec![running(1, 0.0, 100.0, 10), waiting(2, 99.0, 10)];
    let plan = Lvf::default().plan(100.0, &view, cap(0, 100));
    assert!(plan.is_empty(), "{plan:?}");
}
