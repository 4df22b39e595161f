//! Plan invariants, checked on random views for every policy in `PolicyKind::ALL`.
//!
//! A view mixes waiting, running and rotary requests of up to four tenants; running requests
//! grow by 0 or 1 block, so rotating every running request out always makes room for the rest
//! and a plan can always keep HBM within bounds. Capacities, copy budgets, SLOs, caps and the
//! service history (`on_service` calls and earlier plans) are random too.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

#[path = "properties/scenario.rs"]
mod scenario;
use scenario::*;
use std::collections::{BTreeMap, BTreeSet};
use superinfer_policies::{
    Lvf, Phase, Plan, Policy, PolicyKind, ReqView, RequestId, TenantId, WaitCapScope, Wlvf,
    WlvfConfig,
};

/// The invariants every policy's plan keeps.
fn check_plan(kind: PolicyKind, s: &Scenario, plan: &Plan) -> Result<(), TestCaseError> {
    let (view, cap) = (&s.view, s.cap);
    // Every id at most once, each in the phase its list expects.
    let lists = [
        (&plan.admit, Phase::Waiting),
        (&plan.restore, Phase::Rotary),
        (&plan.rotate_out, Phase::Running),
        (&plan.recompute, Phase::Running),
    ];
    let mut seen = BTreeSet::new();
    for (list, phase) in lists {
        for &id in list.iter() {
            prop_assert!(seen.insert(id), "{id:?} listed twice");
            let r = view.iter().find(|r| r.id == id);
            prop_assert!(r.is_some(), "{id:?} is not in the view");
            prop_assert_eq!(
                r.map(|r| r.phase),
                Some(phase),
                "{:?} in the wrong list",
                id
            );
        }
    }

    // Copy budgets, per direction; DRAM for what is copied out.
    let copy_in: u64 = plan
        .restore
        .iter()
        .map(|&id| u64::from(find(view, id).copy_in))
        .sum();
    prop_assert!(
        copy_in <= u64::from(cap.h2d),
        "copy-in {copy_in} > h2d budget {}",
        cap.h2d
    );
    let copy_out: u64 = plan
        .rotate_out
        .iter()
        .map(|&id| u64::from(find(view, id).unsynced))
        .sum();
    prop_assert!(
        copy_out <= u64::from(cap.d2h),
        "copy-out {copy_out} > d2h budget {}",
        cap.d2h
    );
    prop_assert!(
        copy_out <= u64::from(cap.free_dram),
        "copy-out {copy_out} > free DRAM"
    );
    // Whatever is rotated out can come back: its restore fits one iteration's budget.
    for &id in &plan.rotate_out {
        let held = find(view, id).held_hbm;
        prop_assert!(
            held <= cap.b_xfer,
            "rotated out {id:?} holding {held} blocks > b_xfer {}",
            cap.b_xfer
        );
    }

    // HBM: what stays or becomes resident fits in what is free plus what running requests hold.
    let victims: Vec<RequestId> = plan
        .rotate_out
        .iter()
        .chain(&plan.recompute)
        .copied()
        .collect();
    // Seats: every admission and restore takes one, every victim gives one back.
    let taken_n = plan.admit.len() + plan.restore.len();
    prop_assert!(
        taken_n as u64 <= u64::from(cap.seats) + victims.len() as u64,
        "took {taken_n} with {} seats and {} victims",
        cap.seats,
        victims.len()
    );
    // `order` is exactly admit ∪ restore, each list in its own order.
    let mut merged: Vec<RequestId> = plan.order.clone();
    merged.sort();
    let mut both: Vec<RequestId> = plan.admit.iter().chain(&plan.restore).copied().collect();
    both.sort();
    prop_assert_eq!(merged, both, "order is not admit ∪ restore");
    let staying: i64 = view
        .iter()
        .filter(|r| r.phase == Phase::Running && !victims.contains(&r.id))
        .map(|r| i64::from(r.blocks))
        .sum();
    let taken = blocks(view, &plan.admit) + blocks(view, &plan.restore);
    let held: i64 = view.iter().map(|r| i64::from(r.held_hbm)).sum();
    prop_assert!(
        staying + taken <= i64::from(cap.free_hbm) + held,
        "over-committed HBM: {staying} staying + {taken} taken > {} free + {held} held",
        cap.free_hbm
    );

    // No more freed than the deficit: without the last victim chosen (the last of one of the
    // two lists, both in the order chosen) the victims would not have covered it, in blocks or
    // in seats (each victim gives one back).
    let deficit = taken - (i64::from(cap.free_hbm) - growth(view));
    let seat_deficit = taken_n as i64 - i64::from(cap.seats.min(u32::MAX - 1));
    let freed = blocks(view, &victims);
    if !victims.is_empty() {
        let last = [plan.rotate_out.last(), plan.recompute.last()]
            .into_iter()
            .flatten()
            .map(|&id| i64::from(find(view, id).blocks))
            .max()
            .unwrap_or(0);
        prop_assert!(
            freed - last < deficit || (victims.len() as i64 - 1) < seat_deficit,
            "freed {freed} blocks (last victim {last}) for a deficit of {deficit}, \
             {} victims for a seat deficit of {seat_deficit}",
            victims.len()
        );
    }

    // New prefills fit the iteration's token budget, except that the first may exceed it.
    let prefill: Vec<u64> = plan
        .admit
        .iter()
        .map(|&id| u64::from(find(view, id).prefill))
        .collect();
    let total: u64 = prefill.iter().sum();
    prop_assert!(
        total <= u64::from(cap.prefill_tokens) || (prefill.len() == 1 && cap.prefill_tokens > 0),
        "admitted {prefill:?} prefill tokens with a budget of {}",
        cap.prefill_tokens
    );

    let shortage = i64::from(cap.free_hbm) < growth(view);
    if !shortage {
        for &id in &victims {
            prop_assert!(
                !find(view, id).prefilling && !find(view, id).just_started,
                "{id:?} is in prefill or has not run yet, and is not needed"
            );
        }
        if matches!(kind, PolicyKind::Fcfs | PolicyKind::Sf) {
            prop_assert!(victims.is_empty(), "{kind} preempted without a shortage");
        }
    }

    // LVF step 1: when every candidate fits (HBM, copy-in, seats), all are taken and none
    // pushed out.
    if matches!(kind, PolicyKind::Lvf | PolicyKind::Wlvf) {
        let cands = view.iter().filter(|r| r.phase != Phase::Running);
        let want: i64 = cands.clone().map(|r| i64::from(r.blocks)).sum();
        let want_in: u64 = cands.clone().map(|r| u64::from(r.copy_in)).sum();
        let fits = want <= i64::from(cap.free_hbm) - growth(view)
            && want_in <= u64::from(cap.h2d)
            && cands.clone().count() as u64 <= u64::from(cap.seats);
        if fits {
            // Nobody pushed out; everyone taken unless the prefill token budget binds.
            prop_assert!(victims.is_empty());
            if cap.prefill_tokens == u32::MAX {
                prop_assert_eq!(plan.admit.len() + plan.restore.len(), cands.count());
            }
        }
    }

    if kind == PolicyKind::Wlvf {
        check_caps(s, plan, &victims, shortage)?;
    }
    if kind == PolicyKind::Lvf {
        check_lvf_order(s, plan, &victims, shortage)?;
    }
    Ok(())
}

/// LVF's order, from VLT computed here: candidates are taken highest VLT first (ties by
/// arrival, then id); a candidate left out ranks no higher than one taken after it, unless it
/// waits for prefill tokens and the one taken is a restore; outside a shortage every victim
/// ranks strictly below the highest candidate taken.
fn check_lvf_order(
    s: &Scenario,
    plan: &Plan,
    victims: &[RequestId],
    shortage: bool,
) -> Result<(), TestCaseError> {
    let vlt = |id: RequestId| s.cfg.vlt.vlt(find(&s.view, id), NOW);
    // Everything fit: arrival order (step 1), not VLT order.
    if plan.order.len() == s.view.iter().filter(|r| r.phase != Phase::Running).count() {
        return Ok(());
    }
    let rank = |id: RequestId| {
        let r = find(&s.view, id);
        (-vlt(id), r.t_arr, id)
    };
    for w in plan.order.windows(2) {
        prop_assert!(
            rank(w[0]) <= rank(w[1]),
            "{:?} (VLT {}) taken before {:?} (VLT {})",
            w[0],
            vlt(w[0]),
            w[1],
            vlt(w[1])
        );
    }
    for left in s.view.iter().filter(|r| r.phase != Phase::Running) {
        if plan.order.contains(&left.id) {
            continue;
        }
        for &id in &plan.order {
            let taken = find(&s.view, id);
            let excused = left.phase == Phase::Waiting && taken.phase == Phase::Rotary;
            prop_assert!(
                excused || rank(left.id) > rank(id),
                "{:?} (VLT {}) left out while {:?} (VLT {}) was taken",
                left.id,
                vlt(left.id),
                id,
                vlt(id)
            );
        }
    }
    if !shortage && !victims.is_empty() {
        let best = plan
            .order
            .iter()
            .map(|&id| vlt(id))
            .fold(f64::MIN, f64::max);
        for &v in victims {
            prop_assert!(
                vlt(v) < best,
                "victim {v:?} (VLT {}) does not rank below the best candidate taken ({best})",
                vlt(v)
            );
        }
    }
    Ok(())
}

/// Weighted LVF's starvation caps.
fn check_caps(
    s: &Scenario,
    plan: &Plan,
    victims: &[RequestId],
    shortage: bool,
) -> Result<(), TestCaseError> {
    if let (Some(m), false) = (s.cfg.max_consecutive_rotations, shortage) {
        for &id in victims {
            let r = find(&s.view, id);
            prop_assert!(
                r.consecutive_rotations < m,
                "{id:?} rotated {} >= {m} times",
                r.consecutive_rotations
            );
        }
    }
    if let Some(c) = s.cfg.max_wait_s {
        // Overdue: waited `c` since arrival (or since its last token, if it had one and was
        // recomputed) or paused `c` since its last token.
        let overdue = |r: &ReqView| r.phase != Phase::Running && NOW - r.since() >= c;
        let taken: Vec<RequestId> = plan.admit.iter().chain(&plan.restore).copied().collect();
        let left_out = s.view.iter().find(|r| overdue(r) && !taken.contains(&r.id));
        // Scoped to the tenant, an overdue request outranks its own tenant's requests only.
        let scoped = s.cfg.wait_cap_scope == WaitCapScope::Tenant;
        if let Some(late) = left_out {
            let rival = |id: RequestId| !scoped || find(&s.view, id).tenant == late.tenant;
            for &id in taken.iter().filter(|&&id| rival(id)) {
                // An overdue admission may lack prefill tokens, which a restore does not need.
                if late.phase == Phase::Waiting && find(&s.view, id).phase == Phase::Rotary {
                    continue;
                }
                prop_assert!(
                    overdue(find(&s.view, id)),
                    "{id:?} is not overdue but was taken while overdue {:?} was left out",
                    late.id
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 2048, ..Config::default() })]

    #[test]
    fn every_policy_keeps_the_plan_invariants(s in scenario()) {
        for kind in PolicyKind::ALL {
            let plan = run(kind, &s, &s.view);
            check_plan(kind, &s, &plan)?;
        }
    }

    #[test]
    fn plans_are_deterministic(s in scenario()) {
        let other = shuffled(&s.view, s.shuffle_seed);
        for kind in PolicyKind::ALL {
            let plan = run(kind, &s, &s.view);
            prop_assert_eq!(&plan, &run(kind, &s, &s.view), "{} differs between instances", kind);
            prop_assert_eq!(&plan, &run(kind, &s, &other), "{} depends on the view's order", kind);
        }
    }

    #[test]
    fn weighted_lvf_never_takes_a_later_band_past_a_left_out_candidate(mut s in scenario()) {
        s.history.retain(|step| matches!(step, Step::Service { .. }));
        let tenants: BTreeSet<TenantId> = s.view.iter().map(|r| r.tenant).collect();
        if tenants.len() < 2 {
            return Ok(());
        }
        let band = bands(&s);
        let overdue = |r: &ReqView| {
            s.cfg.wait_cap_scope == WaitCapScope::Global
                && s.cfg.max_wait_s.is_some_and(|c| r.phase != Phase::Running && NOW - r.since() >= c)
        };
        let plan = run(PolicyKind::Wlvf, &s, &s.view);
        let all = s.view.iter().filter(|r| r.phase != Phase::Running).count();
        if plan.order.len() == all {
            return Ok(()); // everything fit: arrival order
        }
        for left in s.view.iter().filter(|r| r.phase != Phase::Running) {
            if plan.order.contains(&left.id) || overdue(left) {
                continue;
            }
            for &id in &plan.order {
                let r = find(&s.view, id);
                prop_assert!(
                    overdue(r) || band[&id] >= band[&left.id],
                    "{id:?} (band {}) was taken while {:?} (band {}) was left out",
                    band[&id],
                    left.id,
                    band[&left.id]
                );
            }
        }
    }

    #[test]
    fn weighted_lvf_with_one_tenant_is_lvf(
        vlt in vlt_config(),
        quantum in prop::sample::select(vec![-1.0, 0.0, 10.0, 1e9]),
        rounds in prop::collection::vec(
            (view(1), capacity(), prop::collection::vec((0..3u32, 0..50_000u64), 0..4)),
            1..5,
        ),
    ) {
        let mut lvf = Lvf { vlt };
        let mut wlvf = Wlvf::new(WlvfConfig {
            vlt,
            max_wait_s: None,
            max_consecutive_rotations: None,
            fairness_quantum_tokens: quantum,
            defer_late: false,
            preempt_for_seats: true,
            ..WlvfConfig::default()
        });
        for (round, (view, cap, service)) in rounds.into_iter().enumerate() {
            for (tenant, tokens) in service {
                lvf.on_service(TenantId(tenant), 1.0, prefill(tokens));
                wlvf.on_service(TenantId(tenant), 1.0, prefill(tokens));
            }
            let now = NOW + round as f64;
            prop_assert_eq!(wlvf.plan(now, &view, cap), lvf.plan(now, &view, cap));
        }
    }
}

/// Weighted LVF's band of every candidate, computed here from the definition
/// (docs/SCHEDULING.md §5) for a policy whose only history is `on_service` calls: counters
/// are Σ tokens / weight of each call; a tenant's candidates in its own order (with
/// `defer_late`, those that can still meet their TTFT first; then LVF's) start at its
/// counter plus the prefill of those before it over the tenant's weight in the view; the band
/// is `-floor((start - least counter) / Q)`, capped at -1,000,000.
fn bands(s: &Scenario) -> BTreeMap<RequestId, i64> {
    let mut counter: BTreeMap<TenantId, f64> = BTreeMap::new();
    for step in &s.history {
        if let Step::Service { tenant, tokens } = *step {
            *counter.entry(TenantId(tenant)).or_default() += tokens as f64 / f64::from(tenant + 1);
        }
    }
    let mut weight: BTreeMap<TenantId, f64> = BTreeMap::new();
    for r in &s.view {
        let w = weight.entry(r.tenant).or_insert(f64::MIN_POSITIVE);
        *w = w.max(r.weight);
    }
    let c = |t: TenantId| counter.get(&t).copied().unwrap_or(0.0);
    let v0 = weight.keys().map(|&t| c(t)).fold(f64::INFINITY, f64::min);
    let q = s.cfg.fairness_quantum_tokens;
    let band = |start: f64| (-((start - v0) / q).floor()).clamp(-1e6, 0.0) as i64;
    let mut out = BTreeMap::new();
    for (&t, &w) in &weight {
        let mut cands: Vec<&ReqView> = s
            .view
            .iter()
            .filter(|r| r.tenant == t && r.phase != Phase::Running)
            .collect();
        // A tenant's own order: past a tenant-scoped wait cap first; then, with `defer_late`,
        // the rest before waiting requests past their TTFT deadline. (The policy promotes
        // requests twice its longest recent step early; this property keeps no step history,
        // so that lead is 0 here.)
        let class = |r: &ReqView| {
            let overdue = s.cfg.wait_cap_scope == WaitCapScope::Tenant
                && s.cfg
                    .max_wait_s
                    .is_some_and(|c| r.phase != Phase::Running && NOW - r.since() >= c);
            let late = s.cfg.defer_late
                && r.phase == Phase::Waiting
                && r.t_last.is_none()
                && NOW > r.t_arr + r.slo.ttft_s;
            match (overdue, late) {
                (true, _) => 0,
                (false, false) => 1,
                (false, true) => 2,
            }
        };
        cands.sort_by(|a, b| {
            let (va, vb) = (s.cfg.vlt.vlt(a, NOW), s.cfg.vlt.vlt(b, NOW));
            let since = |r: &ReqView| if class(r) == 0 { r.since() } else { 0.0 };
            class(a)
                .cmp(&class(b))
                .then(since(a).total_cmp(&since(b)))
                .then(vb.total_cmp(&va))
                .then(a.t_arr.total_cmp(&b.t_arr))
                .then(a.id.cmp(&b.id))
        });
        let mut start = c(t);
        for r in cands {
            out.insert(r.id, band(start));
            start += f64::from(r.prefill) / w;
        }
    }
    out
}

/// The generator reaches the interesting cases: without this, the properties could pass on
/// views where nothing is ever rotated.
#[test]
fn the_generator_exercises_rotation() {
    let mut runner = TestRunner::deterministic();
    let strategy = scenario();
    let (mut cases, mut rotated, mut recomputed, mut restored, mut shortages) = (0, 0, 0, 0, 0);
    for _ in 0..500 {
        let s = strategy
            .new_tree(&mut runner)
            .expect("the strategy always generates")
            .current();
        let plan = run(PolicyKind::Lvf, &s, &s.view);
        cases += 1;
        rotated += usize::from(!plan.rotate_out.is_empty());
        recomputed += usize::from(!plan.recompute.is_empty());
        restored += usize::from(!plan.restore.is_empty());
        shortages += usize::from(i64::from(s.cap.free_hbm) < growth(&s.view));
    }
    eprintln!("{cases} cases: {rotated} rotate, {recomputed} recompute, {restored} restore, {shortages} shortage");
    for (what, n) in [
        ("rotation", rotated),
        ("recompute", recomputed),
        ("restore", restored),
        ("shortage", shortages),
    ] {
        assert!(
            n * 20 >= cases,
            "only {n} of {cases} LVF plans had a {what}"
        );
    }
}
