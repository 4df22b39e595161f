//! The vocabulary shared by every policy: what a policy sees and what it decides.

use serde::{Deserialize, Serialize};

/// Engine-wide request identifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId(pub u64);

/// Tenant identifier as the engine knows it (the gateway maps names and keys to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TenantId(pub u32);

/// A latency promise: time to first token and time between tokens, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub ttft_s: f64,
    pub tbt_s: f64,
}

impl Default for Slo {
    /// The paper's SLOs: TTFT 5 s, TBT 100 ms.
    fn default() -> Self {
        Slo {
            ttft_s: 5.0,
            tbt_s: 0.1,
        }
    }
}

/// The three scheduling states of PAPER.md §2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// Arrived, never run (or dropped back by recompute preemption).
    Waiting,
    /// KV resident in HBM and in the batch.
    Running,
    /// Started, KV parked in DRAM, paused.
    Rotary,
}

/// One live request as a policy sees it. Block counts are in KV blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct ReqView {
    pub id: RequestId,
    pub tenant: TenantId,
    /// The tenant's weight (> 0).
    pub weight: f64,
    pub slo: Slo,
    pub phase: Phase,
    /// Arrival time, seconds on the engine clock.
    pub t_arr: f64,
    /// Time of the last emitted token, if any.
    pub t_last: Option<f64>,
    /// Start of the current running period (running requests only).
    pub t_run: Option<f64>,
    /// HBM blocks the request needs resident for its next step (running: held plus growth).
    pub blocks: u32,
    /// HBM blocks it holds now (running only; 0 otherwise).
    pub held_hbm: u32,
    /// Blocks that must be copied host-to-device to restore it (rotary), or to bring in its
    /// cached prefix found only in DRAM (waiting); 0 otherwise.
    pub copy_in: u32,
    /// Tokens it must prefill before its next token if admitted (waiting only; 0 otherwise).
    /// Admissions share the iteration's prefill token budget ([`Capacity::prefill_tokens`]).
    pub prefill: u32,
    /// Blocks without a synced DRAM mirror: the device-to-host copies (and new DRAM blocks)
    /// that rotating it out costs (running only).
    pub unsynced: u32,
    /// Running and still in prefill: not a rotation victim.
    pub prefilling: bool,
    /// Running and has produced no token since it (re)started: not a rotation victim (the
    /// paper rotates out only running requests with VLT < 0, i.e. ones that have run).
    pub just_started: bool,
    /// Rotations out since the request last made sustained progress.
    pub consecutive_rotations: u32,
}

impl ReqView {
    /// When this request's current lag started counting: arrival if it never produced a
    /// token, otherwise its last token.
    pub fn since(&self) -> f64 {
        self.t_last.unwrap_or(self.t_arr)
    }

    /// The request's next deadline (EDF): first token by `t_arr + ttft`, later tokens by
    /// `t_last + tbt`.
    pub fn deadline(&self) -> f64 {
        match self.t_last {
            Some(t) => t + self.slo.tbt_s,
            None => self.t_arr + self.slo.ttft_s,
        }
    }
}

/// What the KV pool can give this iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Free HBM blocks now (not counting the growth running requests need).
    pub free_hbm: u32,
    /// Free DRAM blocks now.
    pub free_dram: u32,
    /// Rotation budget `B_xfer`: blocks one iteration may move per direction, as configured.
    /// A request holding more HBM blocks than this is never rotated out (its restore could
    /// never fit one iteration).
    pub b_xfer: u32,
    /// Host-to-device blocks this iteration may still start (restores): `B_xfer` less the
    /// restores still in flight.
    pub h2d: u32,
    /// Device-to-host blocks this iteration may still start (rotations out): `B_xfer` less the
    /// evictions and eager writebacks still in flight. The engine writes back into what the
    /// plan leaves of it.
    pub d2h: u32,
    /// Requests that may still become resident (running or restoring) this iteration: the
    /// engine's `max_num_seqs` less those resident now. Every admission and restore takes one;
    /// a victim gives one back. `u32::MAX`: no limit.
    pub seats: u32,
    /// Prefill tokens new admissions may start this iteration: the engine's token budget
    /// left after decode tokens and ongoing prefills. The first admission may exceed it (its
    /// prompt is then chunked over later iterations); `u32::MAX`: no limit.
    pub prefill_tokens: u32,
    /// A prompt longer than this is a *long* prefill: it is charged at most this many of the
    /// iteration's prefill tokens (the engine gives it no more while others want tokens, and
    /// the rest when they do not) and needs one of `long_prefill_slots`. `u32::MAX`: no prompt
    /// is long.
    pub long_prefill_tokens: u32,
    /// Long prefills that may still start this iteration (the engine's limit less the long
    /// prefills under way).
    pub long_prefill_slots: u32,
}

impl Capacity {
    /// Capacity with the whole rotation budget left in both directions and no seat limit.
    pub fn unlimited_seats(
        free_hbm: u32,
        free_dram: u32,
        b_xfer: u32,
        prefill_tokens: u32,
    ) -> Self {
        Capacity {
            free_hbm,
            free_dram,
            b_xfer,
            h2d: b_xfer,
            d2h: b_xfer,
            seats: u32::MAX,
            prefill_tokens,
            long_prefill_tokens: u32::MAX,
            long_prefill_slots: u32::MAX,
        }
    }
}

/// A policy's decision for one iteration. Every id appears at most once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Waiting requests to start (prefill), in order.
    pub admit: Vec<RequestId>,
    /// Rotary requests to copy back into HBM, in order.
    pub restore: Vec<RequestId>,
    /// Running requests to park in DRAM (their unsynced blocks are copied out).
    pub rotate_out: Vec<RequestId>,
    /// Running requests whose KV is dropped; they go back to waiting and prefill again.
    pub recompute: Vec<RequestId>,
    /// `admit` and `restore` merged in the order the policy took them: the engine applies
    /// them in this order, and one that cannot become resident yet (its room is still being
    /// copied out) keeps its claim on that room against those after it.
    pub order: Vec<RequestId>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.admit.is_empty()
            && self.restore.is_empty()
            && self.rotate_out.is_empty()
            && self.recompute.is_empty()
    }
}

/// A scheduling policy. Owns admission order *and* victim choice. Must be deterministic:
/// equal inputs (in any order) give equal plans.
pub trait Policy: Send {
    /// Short name as used on the command line.
    fn name(&self) -> &'static str;
    /// Decide one iteration.
    fn plan(&mut self, now: f64, view: &[ReqView], cap: Capacity) -> Plan;
    /// Service delivered to a tenant in the last step. Policies that track fairness use it;
    /// others ignore it.
    fn on_service(&mut self, _tenant: TenantId, _weight: f64, _service: Service) {}
    /// A request of `tenant` arrived (the engine accepted it).
    fn on_arrival(&mut self, _tenant: TenantId, _weight: f64) {}
    /// A request of `tenant` ended (finished, aborted or failed).
    fn on_departure(&mut self, _tenant: TenantId) {}
    /// One engine iteration took `elapsed_s` seconds: the time from one plan to the next
    /// while the engine had live requests (the batch, copies it waited for, host work), never
    /// time the node sat idle.
    fn on_step(&mut self, _elapsed_s: f64) {}
    /// Where `tenant`'s prompt chunks stand in a step whose time is limited (the engine's step
    /// budget): short prompts take the time before long ones, except the long prompts of a
    /// tenant in a lower band than every short prompt's tenant. A fair policy gives how many
    /// fairness quanta the tenant's service lies above the least active tenant's (as of its
    /// last plan), so a tenant behind its share is not held to the time the others' short
    /// prompts leave; the others: 0 for all.
    fn chunk_band(&self, _tenant: TenantId) -> u32 {
        0
    }
}

/// Work done for one tenant in one step, in tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Service {
    /// Prompt tokens prefilled (the engine reports tokens a request was never charged for:
    /// a recomputed request's prefill is not service again).
    pub prefill: u64,
    /// Tokens generated (likewise, once each).
    pub decode: u64,
    /// Prompt tokens found in the prefix cache at admission (not prefilled; charged at a
    /// discount by fairness counters, once each).
    pub cached: u64,
    /// The attention's KV reads (and a chunk's attention beyond its GEMMs), in prompt-token
    /// equivalents: the time they took as prompt tokens' GEMMs would (`StepCost::
    /// kv_equivalent`; 0 when the runner has no cost model). A decode at 100k tokens of
    /// context is ~150, so an equal-weight tenant with long contexts is charged for the GPU
    /// time it takes, not only its token count.
    pub kv_read: u64,
    /// Host CPU the requests took beside the GPU (their grammars' token masks), in
    /// prompt-token equivalents likewise (`StepCost::seconds_equivalent`; 0 without a cost
    /// model): a tenant whose masks are heavy is charged for the time, not only its tokens.
    pub host: u64,
}
