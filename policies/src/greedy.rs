//! The planning machinery every policy shares: order candidates, take them while capacity
//! lasts, and free the room they need from the other end of the order.
//!
//! A policy supplies one [`Key`] per request (higher = more urgent) and its [`Rules`]; this
//! module guarantees the plan invariants the property tests check: HBM never over-committed,
//! `B_xfer` respected per direction, no more rotated out than the deficit, victims always rank
//! below the candidates they make room for, and a deterministic result.

use crate::types::{Capacity, Phase, Plan, ReqView};
use std::cmp::Ordering;

/// Priority of one request: higher `tier` first, then higher `score`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Key {
    pub tier: i32,
    pub score: f64,
}

impl Key {
    pub fn new(tier: i32, score: f64) -> Key {
        Key { tier, score }
    }

    fn cmp(&self, other: &Key) -> Ordering {
        self.tier
            .cmp(&other.tier)
            .then(self.score.total_cmp(&other.score))
    }
}

/// How a policy uses the machinery.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Candidates may push lower-ranked running requests out (proactive rotation, bounded by
    /// `B_xfer`). Without it, running requests leave only to cover a shortage.
    pub preempt_for_admission: bool,
    /// A running request rotated out this many times in a row is not a victim, except to cover
    /// a shortage that nothing else can.
    pub max_consecutive_rotations: Option<u32>,
    /// Waiting requests are admitted only once no rotary request is left behind (vLLM).
    pub waiting_behind_rotary: bool,
}

struct Budget {
    /// HBM blocks free for candidates (may be negative during a shortage).
    hbm: i64,
    /// Blocks the candidates may take beyond `hbm` (rotation budget for freeing room).
    over: i64,
    h2d: u32,
    d2h: u32,
    dram: u32,
}

/// Plans one iteration from per-request keys (`keys[i]` belongs to `view[i]`).
pub fn plan_greedy(view: &[ReqView], cap: Capacity, keys: &[Key], rules: Rules) -> Plan {
    debug_assert_eq!(view.len(), keys.len());
    let growth: i64 = view
        .iter()
        .filter(|r| r.phase == Phase::Running)
        .map(|r| i64::from(r.blocks.saturating_sub(r.held_hbm)))
        .sum();
    let mut budget = Budget {
        hbm: i64::from(cap.free_hbm) - growth,
        over: if rules.preempt_for_admission { i64::from(cap.b_xfer) } else { 0 },
        h2d: cap.b_xfer,
        d2h: cap.b_xfer,
        dram: cap.free_dram,
    };
    let mut plan = Plan::default();
    let mut victims = Victims::new(view, keys, rules);
    if budget.hbm < 0 {
        let need = -budget.hbm;
        let freed = victims.free(view, need, None, &mut budget, &mut plan, true);
        budget.hbm += freed;
    }
    take_candidates(view, keys, rules, &mut budget, &mut victims, &mut plan);
    plan
}

fn take_candidates(
    view: &[ReqView],
    keys: &[Key],
    rules: Rules,
    budget: &mut Budget,
    victims: &mut Victims,
    plan: &mut Plan,
) {
    let mut cands: Vec<usize> = (0..view.len())
        .filter(|&i| view[i].phase != Phase::Running)
        .collect();
    cands.sort_by(|&a, &b| {
        keys[b]
            .cmp(&keys[a])
            .then(view[a].t_arr.total_cmp(&view[b].t_arr))
            .then(view[a].id.cmp(&view[b].id))
    });
    let rotary_total = cands.iter().filter(|&&i| view[i].phase == Phase::Rotary).count();
    let mut rotary_taken = 0;
    let mut over_used: i64 = 0;
    for i in cands {
        let r = &view[i];
        if r.phase == Phase::Waiting && rules.waiting_behind_rotary && rotary_taken < rotary_total {
            break;
        }
        let need = i64::from(r.blocks);
        if r.phase == Phase::Rotary && r.copy_in > budget.h2d {
            break;
        }
        let short = need - budget.hbm;
        if short > 0 {
            if over_used + short > budget.over {
                break;
            }
            let freed = victims.free(view, short, Some(keys[i]), budget, plan, false);
            if freed < short {
                break;
            }
            over_used += short;
            budget.hbm += freed;
        }
        budget.hbm -= need;
        match r.phase {
            Phase::Waiting => plan.admit.push(r.id),
            Phase::Rotary => {
                budget.h2d -= r.copy_in;
                rotary_taken += 1;
                plan.restore.push(r.id);
            }
            Phase::Running => unreachable!("candidates exclude running requests"),
        }
    }
}

/// Running requests in victim order: lowest key first, newest first among equals; requests
/// protected by a cap or mid-prefill come last and serve only to cover a shortage.
struct Victims {
    /// (index into the view, its key), in victim order.
    order: Vec<(usize, Key)>,
    /// How many of `order` are ordinary victims (the rest are last resorts).
    ordinary: usize,
    next: usize,
}

impl Victims {
    fn new(view: &[ReqView], keys: &[Key], rules: Rules) -> Victims {
        let protected = |r: &ReqView| {
            r.prefilling
                || rules
                    .max_consecutive_rotations
                    .is_some_and(|m| r.consecutive_rotations >= m)
        };
        let mut order: Vec<(usize, Key)> = (0..view.len())
            .filter(|&i| view[i].phase == Phase::Running)
            .map(|i| (i, keys[i]))
            .collect();
        order.sort_by(|&(a, ka), &(b, kb)| {
            protected(&view[a])
                .cmp(&protected(&view[b]))
                .then(ka.cmp(&kb))
                .then(view[b].t_arr.total_cmp(&view[a].t_arr))
                .then(view[b].id.cmp(&view[a].id))
        });
        let ordinary = order.iter().take_while(|&&(i, _)| !protected(&view[i])).count();
        Victims { order, ordinary, next: 0 }
    }

    /// Frees at least `need` blocks, taking victims in order, or frees nothing if it cannot.
    /// With `above`, only victims ranked strictly below that key qualify. In a shortage
    /// (`must`), last-resort victims qualify too, a victim that cannot be copied out is
    /// recomputed, and whatever could be freed is kept. Returns the blocks freed; stops as soon
    /// as `need` is covered, so it never frees more than the deficit plus one victim.
    fn free(
        &mut self,
        view: &[ReqView],
        need: i64,
        above: Option<Key>,
        budget: &mut Budget,
        plan: &mut Plan,
        must: bool,
    ) -> i64 {
        let limit = if must { self.order.len() } else { self.ordinary };
        let (mut d2h, mut dram) = (budget.d2h, budget.dram);
        let mut picks: Vec<(usize, bool)> = Vec::new();
        let mut freed = 0;
        let mut next = self.next;
        while freed < need && next < limit {
            let (i, key) = self.order[next];
            if above.is_some_and(|k| key.cmp(&k) != Ordering::Less) {
                break;
            }
            next += 1;
            let v = &view[i];
            let rotate = v.unsynced <= d2h && v.unsynced <= dram;
            if rotate {
                d2h -= v.unsynced;
                dram -= v.unsynced;
            } else if !(must || v.unsynced > dram) {
                // Out of copy budget this iteration: it keeps running.
                continue;
            }
            // Otherwise DRAM is full (or a shortage must be covered now): recompute it.
            picks.push((i, rotate));
            freed += i64::from(view[i].blocks);
        }
        if freed < need && !must {
            return 0;
        }
        self.next = next;
        budget.d2h = d2h;
        budget.dram = dram;
        for (i, rotate) in picks {
            let list = if rotate { &mut plan.rotate_out } else { &mut plan.recompute };
            list.push(view[i].id);
        }
        freed
    }
}

/// PAPER.md §4 step 1: when every waiting and rotary request fits in free HBM (after the
/// running requests' growth) and the restores fit the copy budget, admit them all in arrival
/// order. Returns `None` when they do not all fit.
pub fn all_fit(view: &[ReqView], cap: Capacity) -> Option<Plan> {
    let mut growth: i64 = 0;
    let mut want: i64 = 0;
    let mut copy_in: u64 = 0;
    let mut cands: Vec<&ReqView> = Vec::new();
    for r in view {
        match r.phase {
            Phase::Running => growth += i64::from(r.blocks.saturating_sub(r.held_hbm)),
            Phase::Waiting | Phase::Rotary => {
                want += i64::from(r.blocks);
                copy_in += u64::from(r.copy_in);
                cands.push(r);
            }
        }
    }
    if want > i64::from(cap.free_hbm) - growth || copy_in > u64::from(cap.b_xfer) {
        return None;
    }
    cands.sort_by(|a, b| a.t_arr.total_cmp(&b.t_arr).then(a.id.cmp(&b.id)));
    let mut plan = Plan::default();
    for r in cands {
        match r.phase {
            Phase::Waiting => plan.admit.push(r.id),
            _ => plan.restore.push(r.id),
        }
    }
    Some(plan)
}
