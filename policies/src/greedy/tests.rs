//! The shared machinery, through plain LVF (whose keys are VLT alone).

use crate::test_support::{cap, ids, running, waiting};
use crate::types::{Capacity, Policy, ReqView};
use crate::Lvf;

#[test]
fn a_request_in_prefill_is_not_a_victim() {
    let view = vec![
        ReqView {
            prefilling: true,
            just_started: false,
            ..running(1, 0.0, 10.0, 10)
        },
        running(2, 0.0, 20.0, 10),
        waiting(3, 0.0, 10),
    ];
    let plan = Lvf::default().plan(100.0, &view, cap(0, 100));
    assert_eq!(ids(&plan.rotate_out), [2]);
    assert_eq!(ids(&plan.admit), [3]);
}

#[test]
fn a_request_in_prefill_is_a_victim_of_last_resort_in_a_shortage() {
    // Both need one more block and none is free: one of them must go, prefill or not.
    let view = vec![
        ReqView {
            prefilling: true,
            just_started: false,
            held_hbm: 9,
            ..running(1, 0.0, 10.0, 10)
        },
        ReqView {
            held_hbm: 9,
            ..running(2, 0.0, 20.0, 10)
        },
    ];
    let plan = Lvf::default().plan(100.0, &view, cap(1, 100));
    assert_eq!(ids(&plan.rotate_out), [2]);
    let view = vec![ReqView {
        prefilling: true,
        just_started: false,
        held_hbm: 9,
        ..running(1, 0.0, 10.0, 10)
    }];
    let plan = Lvf::default().plan(100.0, &view, cap(0, 100));
    assert_eq!(ids(&plan.rotate_out), [1]);
}

#[test]
fn a_victim_too_large_to_restore_within_the_budget_is_never_rotated_out() {
    // Request 1 holds 30 blocks, more than the 20-block budget a restore must fit in: rotated
    // out, it could never come back. To admit request 3 only request 2 may rotate; in a
    // shortage request 1 is recomputed instead.
    let view = vec![
        ReqView {
            unsynced: 0,
            ..running(1, 0.0, 10.0, 30)
        },
        running(2, 0.0, 20.0, 10),
        waiting(3, 0.0, 10),
    ];
    let plan = Lvf::default().plan(100.0, &view, cap(0, 20));
    assert_eq!(ids(&plan.rotate_out), [2]);
    assert!(plan.recompute.is_empty());
    // A shortage (it needs one more block, nothing free): recomputed, not rotated.
    let view = vec![ReqView {
        held_hbm: 30,
        ..running(1, 0.0, 10.0, 31)
    }];
    let plan = Lvf::default().plan(100.0, &view, cap(0, 20));
    assert!(plan.rotate_out.is_empty());
    assert_eq!(ids(&plan.recompute), [1]);
}

#[test]
fn a_victim_is_recomputed_when_dram_is_full() {
    let view = vec![
        ReqView {
            unsynced: 4,
            ..running(1, 0.0, 10.0, 10)
        },
        waiting(2, 0.0, 10),
    ];
    let full = Capacity::unlimited_seats(0, 3, 100, u32::MAX);
    let plan = Lvf::default().plan(100.0, &view, full);
    assert_eq!(ids(&plan.recompute), [1]);
    assert!(plan.rotate_out.is_empty());
    assert_eq!(ids(&plan.admit), [2]);
}

#[test]
fn a_victim_whose_copy_exceeds_the_budget_keeps_running() {
    // Request 1 runs longest but its 30 unsynced blocks exceed the 20-block copy-out budget
    // (DRAM has room, so it is not recomputed either): request 2 goes instead.
    let view = vec![
        ReqView {
            unsynced: 30,
            ..running(1, 0.0, 10.0, 10)
        },
        ReqView {
            unsynced: 5,
            ..running(2, 0.0, 20.0, 10)
        },
        waiting(3, 0.0, 10),
    ];
    let plan = Lvf::default().plan(100.0, &view, cap(0, 20));
    assert_eq!(ids(&plan.rotate_out), [2]);
    assert!(plan.recompute.is_empty());
}

#[test]
fn restores_stop_at_the_copy_in_budget() {
    use crate::test_support::rotary;
    // Each restore copies 10 blocks; the budget is 15 per direction.
    let view = vec![rotary(1, 0.0, 90.0, 10), rotary(2, 0.0, 91.0, 10)];
    let plan = Lvf::default().plan(100.0, &view, cap(100, 15));
    assert_eq!(ids(&plan.restore), [1]);
}

#[test]
fn a_shortage_frees_no_more_than_it_needs() {
    // Growth of 1 block with nothing free: the newest-in-period (shortest-running) requests
    // rank highest, so the longest-running one goes, and only one.
    let view = vec![
        ReqView {
            held_hbm: 9,
            ..running(1, 0.0, 10.0, 10)
        },
        running(2, 0.0, 20.0, 10),
        running(3, 0.0, 30.0, 10),
    ];
    let plan = Lvf::default().plan(100.0, &view, cap(0, 100));
    assert_eq!(ids(&plan.rotate_out), [1]);
}
