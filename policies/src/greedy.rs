//! The planning machinery every policy shares: order candidates, take them while capacity
//! lasts, and free the room they need from the other end of the order.
//!
//! A policy supplies one [`Key`] per request (higher = more urgent) and its [`Rules`]; this
//! module guarantees the plan invariants the property tests check: HBM never over-committed,
//! `B_xfer` respected per direction, no more rotated out than the deficit, victims always rank
//! below the candidates they make room for, and a deterministic result.

use crate::types::{Capacity, Phase, Plan, ReqView};

/// Priority of one request: higher `tier` first, then higher `score`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Key {
    pub tier: i32,
    pub score: f64,
}

impl Key {
    pub fn new(tier: i32, score: f64) -> Key {
        // `+ 0.0` turns -0.0 into 0.0: keys compare with `total_cmp`, which would otherwise
        // rank a running request that started just now (VLT -0.0) below a candidate at 0.0.
        Key {
            tier,
            score: score + 0.0,
        }
    }

    /// The key as one integer with the same order (tier, then score by `f64::total_cmp`), so
    /// that sorting 2,000 requests compares integers instead of chasing fields.
    fn rank(&self) -> u128 {
        let tier = u64::from((self.tier as u32) ^ (1 << 31));
        (u128::from(tier) << 64) | u128::from(ordered(self.score))
    }
}

/// `x` as a `u64` that orders as `f64::total_cmp` orders `x`.
fn ordered(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
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
    /// Waiting and rotary candidates form two queues: one that does not fit stops only the
    /// candidates of its own phase (Swapped-First lets new requests use the room a blocked
    /// restore leaves). Without it there is one queue and the first candidate that does not
    /// fit stops all behind it (FCFS: waiting requests wait until every rotary one is back).
    pub per_phase_queues: bool,
    /// Victims drop their KV and prefill again instead of rotating to DRAM (vLLM V1, which
    /// removed swap-based preemption).
    pub recompute_victims: bool,
    /// A waiting candidate left out for lack of prefill tokens also stops the rotary
    /// candidates of lower tiers (restores of its own tier or above still go ahead). Weighted
    /// LVF's tiers are fairness bands: without this a tenant ahead could be restored past a
    /// least-served tenant's admission that waits for compute.
    pub tokens_block_lower_tiers: bool,
    /// Candidates may push lower-ranked running requests out to get a seat (`max_num_seqs`)
    /// when HBM has room. Seats are a compute limit, not a memory one: without this, a
    /// candidate displaces running requests only for HBM room.
    pub preempt_for_seats: bool,
    /// A long prompt waiting for a long-prefill slot does not hold back shorter prompts ranked
    /// below it (they use the tokens the long prefill under way leaves). Without it the waiting
    /// queue stops there (strict order).
    pub long_prompts_yield: bool,
}

struct Budget {
    /// HBM blocks free for candidates (may be negative during a shortage).
    hbm: i64,
    /// Blocks the candidates may take beyond `hbm` (rotation budget for freeing room); 0 when
    /// the policy does not preempt to admit.
    over: i64,
    h2d: u32,
    d2h: u32,
    dram: u32,
    /// Requests that may still become resident.
    seats: u32,
    /// Victims may be chosen to free a seat (`Rules::preempt_for_seats`).
    seat_victims: bool,
    prefill: Prefill,
}

/// The iteration's prefill token budget for new admissions.
struct Prefill {
    left: u64,
    full: u64,
    /// Prompts longer than this are long prefills (charged this much, one slot each).
    long: u64,
    slots: u32,
}

/// Whether a waiting request's prefill may start this iteration.
enum Admit {
    Yes,
    /// Not enough prefill tokens left.
    NoTokens,
    /// A long prompt, and no long-prefill slot free.
    NoLongSlot,
}

impl Prefill {
    fn new(cap: &Capacity) -> Prefill {
        let full = u64::from(cap.prefill_tokens);
        Prefill {
            left: full,
            full,
            long: u64::from(cap.long_prefill_tokens),
            slots: cap.long_prefill_slots,
        }
    }

    /// A waiting request may start when its prompt fits what is left, or when it is the first
    /// admission of the iteration (its prompt is then chunked over later iterations). A long
    /// prompt needs a free slot and any tokens left: it is chunked beside the others.
    fn admits(&self, r: &ReqView) -> Admit {
        let need = u64::from(r.prefill);
        if need == 0 {
            return Admit::Yes;
        }
        if self.left == 0 {
            return Admit::NoTokens;
        }
        if need > self.long {
            return if self.slots > 0 {
                Admit::Yes
            } else {
                Admit::NoLongSlot
            };
        }
        if need <= self.left || self.left == self.full {
            Admit::Yes
        } else {
            Admit::NoTokens
        }
    }

    fn take(&mut self, r: &ReqView) {
        let need = u64::from(r.prefill);
        self.left = self.left.saturating_sub(need.min(self.long));
        if need > self.long {
            self.slots = self.slots.saturating_sub(1);
        }
    }
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
        over: if rules.preempt_for_admission {
            i64::from(cap.b_xfer)
        } else {
            0
        },
        h2d: cap.h2d,
        d2h: cap.d2h,
        dram: cap.free_dram,
        seats: cap.seats,
        seat_victims: rules.preempt_for_seats,
        prefill: Prefill::new(&cap),
    };
    let mut plan = Plan::default();
    let mut victims = Victims::new(view, keys, rules, cap.b_xfer);
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
    // Highest key first, then earliest arrival, then lowest id: a total order (ids are unique),
    // so the unstable sort is deterministic.
    let mut cands: Vec<(u128, u64, u64, usize)> = (0..view.len())
        .filter(|&i| view[i].phase != Phase::Running)
        .map(|i| (!keys[i].rank(), ordered(view[i].t_arr), view[i].id.0, i))
        .collect();
    cands.sort_unstable();
    // Per phase (waiting, rotary): its queue is blocked by a candidate that did not fit.
    let mut blocked = [false; 2];
    let queue = |p: Phase| usize::from(p == Phase::Rotary);
    let mut over_used: i64 = 0;
    // With `tokens_block_lower_tiers`: the tier of the first admission left out for tokens.
    let mut token_tier: Option<i32> = None;
    for (_, _, _, i) in cands {
        let r = &view[i];
        if blocked[queue(r.phase)] || token_tier.is_some_and(|t| keys[i].tier < t) {
            continue;
        }
        match take_one(r, keys[i], budget, &mut over_used, victims, view, plan) {
            Take::Taken => continue,
            // Out of prefill tokens: only new admissions wait (a restore needs no prefill).
            Take::NoTokens => {
                blocked[queue(r.phase)] = true;
                if rules.tokens_block_lower_tiers {
                    token_tier = Some(keys[i].tier);
                }
            }
            // Out of seats: nobody else can become resident.
            Take::NoSeat => break,
            // A long prompt waits for the long prefill under way; shorter prompts behind it
            // still start (`long_prompts_yield`), or wait too (strict order).
            Take::NoLongSlot if rules.long_prompts_yield => continue,
            Take::NoLongSlot => blocked[queue(r.phase)] = true,
            Take::NoRoom | Take::NoCopy if rules.per_phase_queues => blocked[queue(r.phase)] = true,
            Take::NoRoom | Take::NoCopy => break,
        }
        if blocked.iter().all(|&b| b) {
            break;
        }
    }
}

/// Whether a candidate was taken, or what it lacked.
enum Take {
    Taken,
    /// HBM room (free, or freeable below it within the rotation budget).
    NoRoom,
    /// Prefill tokens of this iteration (waiting requests).
    NoTokens,
    /// Host-to-device copy budget (rotary requests).
    NoCopy,
    /// Seats (`max_num_seqs`).
    NoSeat,
    /// A long prompt without a free long-prefill slot (waiting requests).
    NoLongSlot,
}

/// Takes candidate `r` if it fits, freeing room below its key within the rotation budget.
/// A candidate that is not taken changes nothing.
fn take_one(
    r: &ReqView,
    key: Key,
    budget: &mut Budget,
    over_used: &mut i64,
    victims: &mut Victims,
    view: &[ReqView],
    plan: &mut Plan,
) -> Take {
    let need = i64::from(r.blocks);
    // Restores, and admissions whose cached prefix is only in DRAM, copy in within the
    // iteration's host-to-device budget.
    if r.copy_in > budget.h2d {
        return Take::NoCopy;
    }
    if r.phase == Phase::Waiting {
        match budget.prefill.admits(r) {
            Admit::Yes => {}
            Admit::NoTokens => return Take::NoTokens,
            Admit::NoLongSlot => return Take::NoLongSlot,
        }
    }
    let no_seat = budget.seats == 0;
    if no_seat && (budget.over == 0 || !budget.seat_victims) {
        return Take::NoSeat;
    }
    let short = need - budget.hbm;
    if short > 0 || no_seat {
        if *over_used + short.max(0) > budget.over {
            return Take::NoRoom;
        }
        // Victims ranked below it make its room and, being one or more, give back a seat.
        let want = short.max(1);
        let freed = victims.free(view, want, Some(key), budget, plan, false);
        if freed < want {
            return if no_seat { Take::NoSeat } else { Take::NoRoom };
        }
        *over_used += short.max(0);
        budget.hbm += freed;
    }
    budget.hbm -= need;
    budget.seats -= 1;
    plan.order.push(r.id);
    match r.phase {
        Phase::Waiting => {
            budget.prefill.take(r);
            budget.h2d -= r.copy_in;
            plan.admit.push(r.id);
        }
        Phase::Rotary => {
            budget.h2d -= r.copy_in;
            plan.restore.push(r.id);
        }
        Phase::Running => unreachable!("candidates exclude running requests"),
    }
    Take::Taken
}

/// Running requests in victim order: lowest key first, newest first among equals; requests
/// protected by a cap or mid-prefill come last and serve only to cover a shortage.
struct Victims {
    /// (index into the view, its key's rank), in victim order.
    order: Vec<(usize, u128)>,
    /// How many of `order` are ordinary victims (the rest are last resorts).
    ordinary: usize,
    next: usize,
    recompute: bool,
    /// The per-iteration copy budget: a victim holding more blocks could never be restored
    /// (a restore copies all its blocks in one iteration), so it is never rotated out.
    b_xfer: u32,
}

impl Victims {
    fn new(view: &[ReqView], keys: &[Key], rules: Rules, b_xfer: u32) -> Victims {
        let protected = |r: &ReqView| {
            r.prefilling
                || r.just_started
                || rules
                    .max_consecutive_rotations
                    .is_some_and(|m| r.consecutive_rotations >= m)
        };
        // Unprotected first, then lowest key, then latest arrival, then highest id.
        let mut ranked: Vec<(bool, u128, u64, u64, usize)> = (0..view.len())
            .filter(|&i| view[i].phase == Phase::Running)
            .map(|i| {
                let r = &view[i];
                (protected(r), keys[i].rank(), !ordered(r.t_arr), !r.id.0, i)
            })
            .collect();
        ranked.sort_unstable();
        let ordinary = ranked.iter().take_while(|v| !v.0).count();
        let order = ranked
            .into_iter()
            .map(|(_, rank, _, _, i)| (i, rank))
            .collect();
        Victims {
            order,
            ordinary,
            next: 0,
            recompute: rules.recompute_victims,
            b_xfer,
        }
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
        let limit = if must {
            self.order.len()
        } else {
            self.ordinary
        };
        let (mut d2h, mut dram) = (budget.d2h, budget.dram);
        let mut picks: Vec<(usize, bool)> = Vec::new();
        let mut freed = 0;
        let mut next = self.next;
        while freed < need && next < limit {
            let (i, rank) = self.order[next];
            if above.is_some_and(|k| rank >= k.rank()) {
                break;
            }
            next += 1;
            let v = &view[i];
            let restorable = v.held_hbm <= self.b_xfer;
            let rotate = !self.recompute && restorable && v.unsynced <= d2h && v.unsynced <= dram;
            if rotate {
                d2h -= v.unsynced;
                dram -= v.unsynced;
            } else if !must && !restorable && !self.recompute {
                // Rotated out it would never come back (its restore exceeds B_xfer): only a
                // shortage takes it, by recompute.
                continue;
            } else if !(must || self.recompute || v.unsynced > dram) {
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
        budget.seats = budget.seats.saturating_add(picks.len() as u32);
        for (i, rotate) in picks {
            let list = if rotate {
                &mut plan.rotate_out
            } else {
                &mut plan.recompute
            };
            list.push(view[i].id);
        }
        freed
    }
}

/// PAPER.md §4 step 1: when every waiting and rotary request fits in free HBM (after the
/// running requests' growth), the restores fit the copy budget and the admissions fit the
/// prefill token budget, admit them all in arrival order. Returns `None` otherwise (then the
/// policy's own order decides who goes first).
pub fn all_fit(view: &[ReqView], cap: Capacity) -> Option<Plan> {
    let mut growth: i64 = 0;
    let mut want: i64 = 0;
    let mut copy_in: u64 = 0;
    let mut prefill: u64 = 0;
    let mut admissions = 0;
    let mut longs: u64 = 0;
    let long = u64::from(cap.long_prefill_tokens);
    let mut cands: Vec<&ReqView> = Vec::new();
    for r in view {
        match r.phase {
            Phase::Running => growth += i64::from(r.blocks.saturating_sub(r.held_hbm)),
            Phase::Waiting | Phase::Rotary => {
                want += i64::from(r.blocks);
                copy_in += u64::from(r.copy_in);
                if r.phase == Phase::Waiting && r.prefill > 0 {
                    let need = u64::from(r.prefill);
                    prefill += need.min(long);
                    longs += u64::from(need > long);
                    admissions += 1;
                }
                cands.push(r);
            }
        }
    }
    let budget = u64::from(cap.prefill_tokens);
    let prefill_fits = prefill <= budget || (admissions == 1 && budget > 0);
    if want > i64::from(cap.free_hbm) - growth
        || copy_in > u64::from(cap.h2d)
        || !prefill_fits
        || longs > u64::from(cap.long_prefill_slots)
        || cands.len() as u64 > u64::from(cap.seats)
    {
        return None;
    }
    cands.sort_unstable_by_key(|r| (ordered(r.t_arr), r.id));
    let mut plan = Plan::default();
    for r in cands {
        plan.order.push(r.id);
        match r.phase {
            Phase::Waiting => plan.admit.push(r.id),
            _ => plan.restore.push(r.id),
        }
    }
    Some(plan)
}

#[cfg(test)]
mod tests;
