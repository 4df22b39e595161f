//! Scheduling half of a step: finished copies move requests along, the policy plans, and the
//! plan is applied to the KV pool; then running requests grow and full blocks are written
//! back eagerly.

use super::Engine;
use crate::clock::Clock;
use crate::request::{ReqState, Request};
use crate::runner::ModelRunner;
use crate::transfer::{CopyBatch, Transfer};
use superinfer_policies::{Capacity, Phase, Plan, ReqView, RequestId};

impl<R: ModelRunner, T: Transfer, C: Clock> Engine<R, T, C> {
    /// Copies that landed: evicted requests become rotary, restored ones running.
    pub(super) fn ingest_copies(&mut self, now: f64) {
        let done = self.transfer.poll(now);
        if done.is_empty() {
            return;
        }
        for t in done {
            self.pool.complete(t);
        }
        let transit: Vec<RequestId> = self.transit.iter().copied().collect();
        for id in transit {
            if self.pool.any_in_flight(id) {
                continue;
            }
            self.transit.remove(&id);
            let req = self.requests.get_mut(&id).expect("transit ids are live");
            match req.state {
                ReqState::Evicting => req.set_state(ReqState::Rotary),
                ReqState::Restoring => {
                    req.set_state(ReqState::Running);
                    req.t_run = Some(now);
                }
                s => debug_assert!(false, "request in transit in state {s:?}"),
            }
        }
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.cfg.block_size)
    }

    fn view_of(&self, r: &Request, phase: Phase) -> ReqView {
        let id = r.spec.id;
        let table = self.pool.table(id).len() as u32;
        let blocks = match phase {
            Phase::Waiting => self.blocks_for(r.tokens.len() as u32),
            _ => table.max(self.blocks_for(r.kv_len + 1)),
        };
        ReqView {
            id,
            tenant: r.spec.tenant,
            weight: r.spec.weight,
            slo: r.spec.slo,
            phase,
            t_arr: r.t_arr,
            t_last: r.t_last,
            t_run: r.t_run,
            blocks,
            held_hbm: if phase == Phase::Running {
                self.pool.held_hbm(id)
            } else {
                0
            },
            copy_in: if phase == Phase::Rotary {
                self.pool.parked(id)
            } else {
                0
            },
            unsynced: if phase == Phase::Running {
                self.pool.unsynced(id)
            } else {
                0
            },
            prefill: if phase == Phase::Waiting {
                r.remaining()
            } else {
                0
            },
            prefilling: phase == Phase::Running && r.prefilling(),
            just_started: phase == Phase::Running && r.run_tokens == 0,
            consecutive_rotations: r.consecutive_rotations,
        }
    }

    /// Asks the policy for a plan and applies it, adding the copies it needs to `copies`.
    pub(super) fn schedule(&mut self, now: f64, copies: &mut CopyBatch) {
        let view: Vec<ReqView> = self
            .requests
            .values()
            .filter_map(|r| r.phase().map(|p| self.view_of(r, p)))
            .collect();
        if view.is_empty() {
            return;
        }
        // Blocks held by evictions in flight are free as soon as their copy lands: count them,
        // so the policy does not pick more victims for room already on its way. Copies still
        // in flight use up the rotation budget: B_xfer is what the link moves per iteration,
        // and a budget the link cannot keep up with only queues copies behind each other.
        let (mut landing, mut h2d, mut d2h) = (0, 0, 0);
        for id in &self.transit {
            let (h, d) = self.pool.in_flight_blocks(*id);
            h2d += h;
            d2h += d;
            if self.requests[id].state == ReqState::Evicting {
                landing += self.pool.held_hbm(*id);
            }
        }
        let cap = Capacity {
            free_hbm: self.pool.hbm_free() + landing,
            free_dram: self.pool.dram_free(),
            b_xfer: self.cfg.b_xfer.saturating_sub(h2d.max(d2h)),
            prefill_tokens: self.prefill_budget(),
        };
        let plan = self.policy.plan(now, &view, cap);
        self.apply(plan, now, copies);
    }

    /// Tokens of this step's budget left for new prefills: decode tokens and the prefills
    /// already under way come first (the batch is built in that order).
    fn prefill_budget(&self) -> u32 {
        let busy: u32 = self
            .requests
            .values()
            .filter(|r| r.state == ReqState::Running)
            .map(|r| r.remaining())
            .sum();
        self.cfg.max_batched_tokens.saturating_sub(busy)
    }

    fn state_of(&self, id: RequestId) -> Option<ReqState> {
        self.requests.get(&id).map(|r| r.state)
    }

    fn resident(&self) -> usize {
        self.requests
            .values()
            .filter(|r| matches!(r.state, ReqState::Running | ReqState::Restoring))
            .count()
    }

    /// Applies a plan. Entries naming unknown requests or requests in another state are
    /// ignored; admissions and restores without room (or over `max_num_seqs`) wait.
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
        let mut resident = self.resident();
        let max = self.cfg.max_num_seqs as usize;
        for id in plan.restore {
            if resident >= max || self.state_of(id) != Some(ReqState::Rotary) {
                continue;
            }
            if self.pool.restore(id, &mut copies.h2d) {
                resident += 1;
                self.counters.restores += 1;
                let req = self.requests.get_mut(&id).expect("checked live");
                if self.pool.any_in_flight(id) {
                    req.set_state(ReqState::Restoring);
                    self.transit.insert(id);
                } else {
                    req.set_state(ReqState::Running);
                    req.t_run = Some(now);
                }
            }
        }
        for id in plan.admit {
            if resident >= max || self.state_of(id) != Some(ReqState::Waiting) {
                continue;
            }
            let need = self.blocks_for(self.requests[&id].tokens.len() as u32) as usize;
            if self.pool.grow_to(id, need) {
                resident += 1;
                self.counters.admitted += 1;
                let req = self.requests.get_mut(&id).expect("checked live");
                req.set_state(ReqState::Running);
                req.t_run = Some(now);
                req.run_tokens = 0;
            }
        }
    }

    /// Drops a running request's KV; it waits to prefill its whole sequence again.
    fn recompute(&mut self, id: RequestId) {
        self.pool.free(id);
        self.counters.recomputes += 1;
        let req = self.requests.get_mut(&id).expect("caller checked");
        req.set_state(ReqState::Waiting);
        req.kv_len = 0;
        req.t_run = None;
        req.recomputes += 1;
    }

    /// Parks a running request in DRAM, or recomputes it when DRAM cannot hold it.
    fn rotate_out(&mut self, id: RequestId, copies: &mut CopyBatch) {
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
            req.set_state(ReqState::Evicting);
            self.transit.insert(id);
        } else {
            req.set_state(ReqState::Rotary);
        }
    }

    /// Running requests that decode next get the block their next token needs, or sit this
    /// step out when there is none (the policy sees the shortage next iteration).
    fn grow_running(&mut self) {
        let bs = self.cfg.block_size;
        let growing: Vec<(RequestId, u32)> = self
            .requests
            .values()
            .filter(|r| r.state == ReqState::Running && !r.prefilling())
            .map(|r| (r.spec.id, r.kv_len))
            .collect();
        for (id, kv_len) in growing {
            self.pool.grow_to(id, (kv_len + 1).div_ceil(bs) as usize);
        }
    }

    /// Growth for requests that were not planned for (no plan ran), then eager writeback of
    /// every full dirty block of the running requests.
    pub(super) fn grow_and_write_back(&mut self, copies: &mut CopyBatch) {
        self.grow_running();
        if !self.cfg.eager_writeback {
            return;
        }
        let bs = self.cfg.block_size;
        let running: Vec<(RequestId, u32)> = self
            .requests
            .values()
            .filter(|r| r.state == ReqState::Running)
            .map(|r| (r.spec.id, r.kv_len))
            .collect();
        for (id, kv_len) in running {
            self.pool
                .writeback(id, (kv_len / bs) as usize, &mut copies.d2h);
        }
    }
}
