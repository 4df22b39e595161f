//! Scheduling half of a step: finished copies move requests along, the policy plans, and the
//! plan is applied to the KV pool; then running requests grow and full blocks are written
//! back eagerly.

use super::Engine;
use crate::clock::Clock;
use crate::kv::pool::HitCost;
use crate::kv::PrefixHit;
use crate::request::{ReqState, Request};
use crate::runner::ModelRunner;
use crate::transfer::{CopyBatch, Transfer};
use superinfer_policies::{Capacity, Phase, Plan, ReqView, RequestId, Service};

/// The leader's decode steps a follower waits at most for the prompt's blocks to be cached.
pub(super) const FOLLOW_STEPS: u32 = 4;

impl<R: ModelRunner, T: Transfer, C: Clock> Engine<R, T, C> {
    /// Copies that landed: evicted requests become rotary, restored ones running. Then the
    /// faults: what landed is taken in first, so a batch that completed is never judged late.
    pub(super) fn ingest_copies(&mut self, now: f64) {
        let done = self.transfer.poll(now);
        for &t in &done {
            self.outstanding.remove(&t);
            self.pool.complete(t);
        }
        self.ingest_faults(now);
        if done.is_empty() {
            return;
        }
        let transit: Vec<RequestId> = self.transit.iter().copied().collect();
        for id in transit {
            if self.pool.any_in_flight(id) {
                continue;
            }
            self.transit.remove(&id);
            match self.requests[&id].state {
                ReqState::Evicting => self.move_req(id, ReqState::Rotary),
                ReqState::Restoring => {
                    self.move_req(id, ReqState::Running);
                    self.requests.get_mut(&id).expect("live").t_run = Some(now);
                    self.grow_due.push(id);
                }
                s => debug_assert!(false, "request in transit in state {s:?}"),
            }
        }
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.cfg.block_size)
    }

    /// The cached run a waiting request would start with, and its cost: full blocks only, and
    /// never the block of the last token (its logits are computed, so it is written).
    fn hit_of(&self, r: &Request) -> HitCost {
        if r.spec.sampling.prompt_logprobs.is_some() {
            // Every prompt token must be computed to be scored.
            return HitCost::default();
        }
        let limit = (r.tokens.len() as u32).saturating_sub(1) / self.cfg.block_size;
        let limit = (limit as usize).min(r.hashes.len());
        self.pool.hit_cost(&r.hashes[..limit])
    }

    /// Whether a waiting request (`r`, whose cached run is `hit`) stays out of the plan for
    /// prompt blocks another request is making into cache entries: admitted now, it would
    /// compute them a second time; a step or a few later it finds them cached. Two makers count:
    /// the leader it follows with the same prompt (`EngineRequest::follows`) while that leader
    /// waits or prefills, and any running request of `makers` whose hash chain reaches the
    /// next uncached block too (the two prompts agree up to it). It waits at most for the
    /// maker's prefill and [`FOLLOW_STEPS`] of its decode steps (the writebacks that make the
    /// entries); never when the maker is gone or rotated out, or the cache is off; a request
    /// scoring its prompt (`prompt_logprobs`) waits only for its leader.
    fn awaits_blocks(&self, r: &Request, hit: HitCost, makers: &[&Request]) -> bool {
        if !self.cfg.prefix_cache || r.state != ReqState::Waiting {
            return false;
        }
        let shareable = (r.tokens.len() as u32).saturating_sub(1) / self.cfg.block_size;
        let shareable = (shareable as usize).min(r.hashes.len());
        let next = hit.blocks as usize;
        if next >= shareable {
            return false;
        }
        let leader_busy = r
            .spec
            .follows
            .and_then(|l| self.requests.get(&l))
            .is_some_and(|leader| match leader.state {
                ReqState::Waiting => true,
                ReqState::Running => leader.generated < FOLLOW_STEPS,
                _ => false,
            });
        leader_busy
            || (r.spec.sampling.prompt_logprobs.is_none()
                && makers
                    .iter()
                    .any(|m| m.id != r.id && m.hashes.get(next) == Some(&r.hashes[next])))
    }

    /// Running requests that may still be making prompt blocks into cache entries: prefilling,
    /// or within [`FOLLOW_STEPS`] decode steps of their prefill (its last writebacks).
    fn prefix_makers(&self) -> Vec<&Request> {
        if !self.cfg.prefix_cache {
            return Vec::new();
        }
        self.requests
            .values()
            .filter(|r| r.state == ReqState::Running)
            .filter(|r| r.prefilling() || r.generated < FOLLOW_STEPS)
            .collect()
    }

    /// Blocks a waiting request takes from what is available, and the copies of its DRAM hits.
    fn admission_cost(&self, r: &Request) -> (u32, HitCost) {
        self.admission_cost_with(r, self.hit_of(r))
    }

    /// [`Self::admission_cost`] with its cached run `hit` already looked up.
    fn admission_cost_with(&self, r: &Request, hit: HitCost) -> (u32, HitCost) {
        let total = self.blocks_for(r.tokens.len() as u32);
        (total - hit.blocks + hit.slots, hit)
    }

    /// The policy's view of `r`; `hit`: a waiting request's cached run, looked up once.
    fn view_of(&self, r: &Request, phase: Phase, hit: HitCost) -> ReqView {
        let id = r.id;
        let b = self.pool.summary(id);
        let growth = self.blocks_for(r.kv_len + 1).saturating_sub(b.len);
        let (mut copy_in, mut prefill) = (0, 0);
        let blocks = match phase {
            Phase::Waiting => {
                let (need, hit) = self.admission_cost_with(r, hit);
                copy_in = hit.copies;
                prefill = r.remaining() - hit.blocks * self.cfg.block_size;
                need
            }
            Phase::Running => b.held_hbm + growth,
            Phase::Rotary => {
                let c = self.pool.restore_cost(id);
                copy_in = c.copies;
                c.slots + growth
            }
        };
        let running = phase == Phase::Running;
        ReqView {
            id,
            tenant: r.tenant,
            weight: r.weight,
            slo: r.spec.slo,
            phase,
            t_arr: r.t_arr,
            t_last: r.t_last,
            t_run: r.t_run,
            blocks,
            held_hbm: if running { b.held_hbm } else { 0 },
            copy_in,
            unsynced: if running { b.dirty } else { 0 },
            prefill,
            prefilling: running && r.prefilling(),
            just_started: running && r.run_tokens == 0,
            consecutive_rotations: r.consecutive_rotations,
        }
    }

    /// Blocks one direction may still start this iteration: `B_xfer` less the blocks in
    /// flight (including eager writebacks) and those already queued in `queued`.
    fn xfer_left(&self, in_flight: u32, queued: usize) -> u32 {
        self.xfer
            .last()
            .saturating_sub(in_flight)
            .saturating_sub(queued as u32)
    }

    /// Asks the policy for a plan and applies it, adding the copies it needs to `copies`.
    /// Returns whether a plan was applied (and with it the running requests' growth).
    pub(super) fn schedule(&mut self, now: f64, copies: &mut CopyBatch) -> bool {
        if self.nothing_to_plan() {
            return false;
        }
        let makers = self.prefix_makers();
        let mut view: Vec<ReqView> = Vec::with_capacity(self.requests.len());
        view.extend(self.requests.values().filter_map(|r| {
            let phase = r.phase()?;
            let hit = if phase == Phase::Waiting {
                self.hit_of(r)
            } else {
                HitCost::default()
            };
            let held = phase == Phase::Waiting && self.awaits_blocks(r, hit, &makers);
            (!held).then(|| self.view_of(r, phase, hit))
        }));
        if view.is_empty() {
            return false;
        }
        // The largest request's blocks, and the largest parked request's copy back.
        let (largest, largest_copy_in) = view.iter().fold((0, 0), |(b, c), r| {
            let parked = if r.phase == Phase::Rotary {
                r.copy_in
            } else {
                0
            };
            (b.max(r.blocks), c.max(parked))
        });
        let b_xfer = self.xfer.budget(largest, largest_copy_in);
        // Blocks held by evictions in flight are free as soon as their copy lands: count them,
        // so the policy does not pick more victims for room already on its way. Copies still
        // in flight use up the rotation budget of their direction: B_xfer is what the link
        // moves per iteration, and a budget the link cannot drain only queues copies.
        let landing: u32 = self
            .transit
            .iter()
            .filter(|id| self.requests[*id].state == ReqState::Evicting)
            .map(|id| self.pool.held_hbm(*id))
            .sum();
        let (h2d, d2h) = self.pool.blocks_in_flight();
        let max_seqs = self.cfg.max_num_seqs as usize;
        let (prefill_tokens, long_prefill_slots) = self.prefill_room();
        let cap = Capacity {
            free_hbm: self.pool.hbm_available() + landing,
            free_dram: self.pool.dram_available(),
            b_xfer,
            h2d: self.xfer_left(h2d, copies.h2d.len()),
            d2h: self.xfer_left(d2h, copies.d2h.len()),
            prefill_tokens,
            long_prefill_tokens: self.cfg.long_prefill(),
            long_prefill_slots,
            seats: max_seqs.saturating_sub(self.resident()) as u32,
        };
        let plan = self.policy.plan(now, &view, cap);
        self.apply(plan, now, copies);
        true
    }

    /// A decode-only step: nothing waits or is parked, and HBM has the block each running
    /// request may need next (one at most: prompts hold their blocks from admission). Every
    /// policy's plan is then empty (no candidates, no shortage), so the view is not built.
    /// Weighted LVF's counters lose nothing: they are charged per step through `on_service`,
    /// and its monotone floor, raised at the next plan, ends where raising it every step
    /// would have (counters only grow).
    fn nothing_to_plan(&self) -> bool {
        let running = self.census.count(ReqState::Running);
        self.census.count(ReqState::Waiting) == 0
            && self.census.count(ReqState::Rotary) == 0
            && self.pool.hbm_available() as usize >= running
    }

    /// In one pass over the running requests: the tokens of this step's budget left for new
    /// prefills (decode tokens and the prefills already under way come first, the batch is
    /// built in that order; a long prefill counts as at most the threshold), and the long
    /// prefills that may still start (the limit less those under way).
    fn prefill_room(&self) -> (u32, u32) {
        let long = self.cfg.long_prefill();
        let (mut busy, mut long_under_way) = (0u32, 0u32);
        for r in self
            .requests
            .values()
            .filter(|r| r.state == ReqState::Running)
        {
            busy = busy.saturating_add(r.remaining().min(long));
            long_under_way += u32::from(r.remaining() > long);
        }
        (
            self.cfg.max_batched_tokens.saturating_sub(busy),
            self.cfg.max_long_prefills.saturating_sub(long_under_way),
        )
    }

    fn state_of(&self, id: RequestId) -> Option<ReqState> {
        self.requests.get(&id).map(|r| r.state)
    }

    /// Requests holding a seat: running or restoring.
    fn resident(&self) -> usize {
        self.census.count(ReqState::Running) + self.census.count(ReqState::Restoring)
    }

    /// Applies a plan: victims first, then growth of the running requests, then admissions and
    /// restores in the policy's order. Entries naming unknown requests or requests in another
    /// state are ignored. One without room yet (its room is still being copied out) keeps a
    /// claim on the blocks it needs: requests after it start only in what is left, so nobody
    /// ranked lower takes its room (it is planned again next iteration). Nothing starts beyond
    /// `max_num_seqs`.
    fn apply(&mut self, plan: Plan, now: f64, copies: &mut CopyBatch) {
        for id in plan.recompute {
            if self.state_of(id) == Some(ReqState::Running) {
                self.recompute(id);
            }
        }
        for id in plan.rotate_out {
            if self.state_of(id) == Some(ReqState::Running) {
                self.rotate_out(id, copies);
            }
        }
        // Requests already running get the block their next token needs before anyone new
        // takes the free blocks.
        self.grow_running();
        let order = if plan.order.is_empty() {
            plan.restore.into_iter().chain(plan.admit).collect()
        } else {
            plan.order
        };
        let max = self.cfg.max_num_seqs as usize;
        // Blocks promised to requests whose room is still being copied out: nobody ranked
        // lower may take them, but lower-ranked requests that fit in the rest still start.
        let mut reserved: u32 = 0;
        for id in order {
            if self.resident() >= max {
                break;
            }
            let restore = match self.state_of(id) {
                Some(ReqState::Rotary) => true,
                Some(ReqState::Waiting) => false,
                _ => continue,
            };
            let (need, hit) = if restore {
                (self.pool.restore_cost(id).slots, HitCost::default())
            } else {
                self.admission_cost(&self.requests[&id])
            };
            if self.pool.hbm_available() < reserved + need {
                reserved += need;
                continue;
            }
            if restore {
                self.take_restore(id, now, copies);
            } else {
                self.take_admission(id, now, hit, copies);
            }
        }
    }

    /// Restores a rotary request whose parked blocks fit the free HBM blocks.
    fn take_restore(&mut self, id: RequestId, now: f64, copies: &mut CopyBatch) {
        if !self.pool.restore(id, &mut copies.h2d) {
            debug_assert!(false, "{id:?} fit the free blocks but was not restored");
            return;
        }
        self.counters.restores += 1;
        if self.pool.any_in_flight(id) {
            self.move_req(id, ReqState::Restoring);
            self.transit.insert(id);
        } else {
            self.move_req(id, ReqState::Running);
            let req = self.requests.get_mut(&id).expect("live");
            req.t_run = Some(now);
            // The block its next token needs, as its view counted (when HBM has it).
            let next = (req.kv_len + 1).div_ceil(self.cfg.block_size) as usize;
            if !self.pool.grow_to(id, next) {
                self.grow_due.push(id);
            }
        }
    }

    /// Admits a waiting request whose blocks fit the available HBM: its cached prefix is used
    /// in place or copied in (then it is restoring until the copies land), the rest prefilled.
    /// `hit` is its cached run as the room check found it (nothing changed since).
    fn take_admission(&mut self, id: RequestId, now: f64, hit: HitCost, copies: &mut CopyBatch) {
        let r = &self.requests[&id];
        let total = self.blocks_for(r.tokens.len() as u32) as usize;
        let expected = r.expected_blocks(self.cfg.block_size);
        let hashes = &r.hashes[..hit.blocks as usize];
        let Some((in_hbm, from_dram)) =
            self.pool
                .admit(id, hashes, (total, expected), r.cache_base, &mut copies.h2d)
        else {
            debug_assert!(false, "{id:?} fit the free blocks but was not admitted");
            return;
        };
        self.counters.admitted += 1;
        let in_flight = self.pool.any_in_flight(id);
        if in_flight {
            self.move_req(id, ReqState::Restoring);
            self.transit.insert(id);
        } else {
            self.move_req(id, ReqState::Running);
        }
        let bs = self.cfg.block_size;
        let req = self.requests.get_mut(&id).expect("live");
        req.kv_len = (in_hbm + from_dram) * bs;
        let first = req.recomputes == 0 && req.t_first.is_none();
        if first {
            let ratio = (now - req.t_arr) / req.spec.slo.ttft_s;
            self.late.admitted(req.tenant, ratio);
            req.cached = PrefixHit {
                hbm: in_hbm * bs,
                dram: from_dram * bs,
            };
            if self.cfg.prefix_cache {
                self.counters.prefix_query_tokens += req.spec.prompt.len() as u64;
                self.counters.prefix_hit_hbm_tokens += u64::from(in_hbm * bs);
                self.counters.prefix_hit_dram_tokens += u64::from(from_dram * bs);
            }
        }
        req.t_run = Some(now);
        req.t_admit.get_or_insert(now);
        req.run_tokens = 0;
        // Cached tokens are service at a discount, charged once (like any prefill).
        let cached = u64::from(req.kv_len.saturating_sub(req.charged_kv));
        req.charged_kv = req.charged_kv.max(req.kv_len);
        if cached > 0 {
            let (tenant, weight) = (req.tenant, req.weight);
            let service = Service {
                cached,
                ..Service::default()
            };
            self.policy.on_service(tenant, weight, service);
        }
    }

    /// Drops a running request's KV; it waits to prefill its whole sequence again.
    /// A recompute is a rotation for the consecutive-rotation cap: without that, a request
    /// under a full DRAM could be recomputed again and again without bound.
    fn recompute(&mut self, id: RequestId) {
        self.pool.free(id);
        self.requeue(id);
        let req = self.requests.get_mut(&id).expect("caller checked");
        req.consecutive_rotations += 1;
    }

    /// A request whose blocks were just released waits to prefill its whole sequence again.
    pub(super) fn requeue(&mut self, id: RequestId) {
        self.counters.recomputes += 1;
        self.transit.remove(&id);
        self.writeback_due.remove(&id);
        self.move_req(id, ReqState::Waiting);
        let req = self.requests.get_mut(&id).expect("caller checked");
        if self.cfg.prefix_cache {
            // Its generated tokens' full blocks too: the cache may hold them now.
            let upto = req.tokens.len();
            req.extend_chain(upto, self.cfg.block_size);
        }
        req.kv_len = 0;
        req.t_run = None;
        req.recomputes += 1;
        req.run_tokens = 0;
    }

    /// Parks a running request in DRAM, or recomputes it when DRAM cannot hold it.
    pub(super) fn rotate_out(&mut self, id: RequestId, copies: &mut CopyBatch) {
        if !self.pool.evict(id, &mut copies.d2h) {
            self.recompute(id);
            return;
        }
        self.counters.rotations_out += 1;
        let in_flight = self.pool.any_in_flight(id);
        let req = self.requests.get_mut(&id).expect("caller checked");
        req.rotations += 1;
        req.consecutive_rotations += 1;
        req.run_tokens = 0;
        req.t_run = None;
        if in_flight {
            self.move_req(id, ReqState::Evicting);
            self.transit.insert(id);
        } else {
            self.move_req(id, ReqState::Rotary);
        }
    }

    /// Running requests that decode next get the block their next token needs, or sit this
    /// step out when there is none (the policy sees the shortage next iteration). Only a
    /// request whose blocks are exactly full needs one, and only the requests of
    /// `grow_due` can be such (the step that filled their last block, or a restore, put them
    /// there), so no step scans every request; one that finds no block stays due.
    fn grow_running(&mut self) {
        let bs = self.cfg.block_size;
        let mut due = std::mem::take(&mut self.grow_due);
        // In request order, as a scan of every request would grow them (who gets the last
        // free blocks when HBM runs short does not depend on how they became due).
        due.sort_unstable();
        due.dedup();
        due.retain(|id| {
            let Some(r) = self.requests.get(id) else {
                return false;
            };
            if r.state != ReqState::Running || !r.next_token_needs_block(bs) {
                return false;
            }
            !self.pool.grow_to(*id, (r.kv_len + 1).div_ceil(bs) as usize)
        });
        self.grow_due = due;
    }

    /// Growth when no plan ran (`grown` false), then eager writeback of
    /// the full dirty blocks of the running requests, within what the plan's rotations left of
    /// the device-to-host budget (oldest requests first; the rest wait for a later iteration).
    pub(super) fn grow_and_write_back(&mut self, grown: bool, copies: &mut CopyBatch) {
        if !grown {
            self.grow_running();
        }
        if !self.cfg.eager_writeback {
            return;
        }
        let mut budget = self.xfer_left(self.pool.blocks_in_flight().1, copies.d2h.len());
        let bs = self.cfg.block_size;
        let due: Vec<RequestId> = self.writeback_due.iter().copied().collect();
        for id in due {
            if budget == 0 {
                break;
            }
            let kv_len = match self.requests.get(&id) {
                Some(r) if r.state == ReqState::Running => r.kv_len,
                // Finished, or its blocks left HBM (evicted or dropped): nothing to write back.
                _ => {
                    self.writeback_due.remove(&id);
                    continue;
                }
            };
            let done =
                self.pool
                    .writeback(id, (kv_len / bs) as usize, &mut copies.d2h, &mut budget);
            if done {
                self.writeback_due.remove(&id);
            }
        }
    }
}
