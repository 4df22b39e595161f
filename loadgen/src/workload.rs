//! Workloads: tenants, each with an arrival process and a length distribution, turned into
//! one deterministic list of requests.
//!
//! - [`arrivals`]: Poisson, Gamma, Hawkes, on/off bursts, trace replay.
//! - [`lengths`]: ShareGPT-like and LMSYS-like fits, fixed, lognormal, trace.
//! - [`tenants`]: the tenant spec and its TOML file.
//! - [`conversation`]: multi-turn conversations, system prompts, and the content that
//!   repeats across them.
//! - [`trace`] and [`replay`]: production traces in their publishers' formats, replayed row by
//!   row; [`prefix_ideal`]: the prefix-cache hits their content allows.

pub mod arrivals;
pub mod conversation;
pub mod file;
pub mod lengths;
pub mod prefix_ideal;
pub mod replay;
pub mod request;
pub mod tenants;
pub mod trace;

pub use arrivals::ArrivalSpec;
pub use conversation::{ConversationSpec, Turn};
pub use file::{load_tenants, load_workload, parse_tenants, parse_workload, WorkloadFile};
pub use lengths::{LengthLimits, LengthSampler, LengthSpec, TokenLognormal};
pub use request::{RequestSpec, TraceBlocks};
pub use tenants::{validate_tenants, TenantSpec};

use crate::error::Error;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// ChaCha stream for a tenant's arrival times.
const ARRIVAL_STREAM: u64 = 0;
/// ChaCha stream for a tenant's lengths, so that changing a dataset never moves arrivals.
const LENGTH_STREAM: u64 = 1;
/// ChaCha stream for turns and think times.
const TURN_STREAM: u64 = 2;
/// ChaCha stream for the content seeds of messages.
const CONTENT_STREAM: u64 = 3;

/// All requests of a run of `duration_s` seconds, sorted by `arrival_s` (ties: tenant order),
/// with ids 0.. in that order. A tenant with a `conversation` sends one conversation per
/// arrival: its turns follow one another (see [`RequestSpec::arrival_s`]); a tenant without
/// one sends one request per arrival.
///
/// Deterministic for a seed. Each tenant draws from its own ChaCha8 generator seeded from
/// `seed` and a hash of the tenant's *name*, so adding, removing or reordering other tenants
/// does not change its requests.
pub fn generate(
    tenants: &[TenantSpec],
    duration_s: f64,
    seed: u64,
) -> Result<Vec<RequestSpec>, Error> {
    validate_tenants(tenants)?;
    if !(duration_s.is_finite() && duration_s > 0.0) {
        return Err(Error::Duration(duration_s));
    }
    let mut requests = Vec::new();
    let mut conversations = 0u64;
    for (index, t) in tenants.iter().enumerate() {
        let tenant_seed = tenant_seed(seed, &t.name);
        let stream = |s| {
            let mut rng = ChaCha8Rng::seed_from_u64(tenant_seed);
            rng.set_stream(s);
            rng
        };
        let times = t
            .arrivals
            .generate(duration_s, &mut stream(ARRIVAL_STREAM))
            .map_err(|e| e.in_tenant(&t.name))?;
        let sampler = t
            .dataset
            .sampler(t.limits())
            .map_err(|e| e.in_tenant(&t.name))?;
        let mut gen = TenantGen {
            index,
            tenant: t,
            sampler,
            lengths: stream(LENGTH_STREAM),
            turns: stream(TURN_STREAM),
            content: stream(CONTENT_STREAM),
        };
        for arrival_s in times {
            match &t.conversation {
                None => requests.push(gen.single(arrival_s)),
                Some(c) => {
                    gen.conversation(c, conversations, arrival_s, &mut requests);
                    conversations += 1;
                }
            }
        }
    }
    // Stable: equal times keep tenant order, then each tenant's own order (a conversation's
    // turns have increasing times, or equal ones without think time).
    requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    for (id, r) in requests.iter_mut().enumerate() {
        r.id = id as u64;
    }
    link_turns(&mut requests);
    Ok(requests)
}

/// One tenant's generators.
struct TenantGen<'a> {
    index: usize,
    tenant: &'a TenantSpec,
    sampler: LengthSampler,
    lengths: ChaCha8Rng,
    turns: ChaCha8Rng,
    content: ChaCha8Rng,
}

impl TenantGen<'_> {
    /// A message and an output length; the message leaves room for the system prompt.
    fn lengths(&mut self) -> (u32, u32) {
        let (p, o) = self.sampler.sample(&mut self.lengths);
        let room = self.tenant.max_prompt_tokens - self.tenant.system_prompt_tokens;
        (p.min(room), o)
    }

    fn request(&mut self, arrival_s: f64, prompt: u32, msg: u32, out: u32) -> RequestSpec {
        RequestSpec {
            id: 0,
            tenant: self.index,
            arrival_s,
            prompt_tokens: prompt,
            output_tokens: out,
            system_tokens: self.tenant.system_prompt_tokens,
            message_tokens: msg,
            content_seed: self.content.random(),
            turn: None,
            blocks: None,
        }
    }

    fn single(&mut self, arrival_s: f64) -> RequestSpec {
        let (msg, out) = self.lengths();
        let prompt = self.tenant.system_prompt_tokens + msg;
        self.request(arrival_s, prompt, msg, out)
    }

    /// The turns of one conversation, ending early where the prompt would pass
    /// `max_prompt_tokens` (the context limit).
    fn conversation(
        &mut self,
        spec: &ConversationSpec,
        conversation: u64,
        start_s: f64,
        out: &mut Vec<RequestSpec>,
    ) {
        let turns = spec.sample_turns(&mut self.turns);
        let mut at = start_s;
        let mut history = self.tenant.system_prompt_tokens;
        for index in 0..turns {
            let think_s = if index == 0 {
                0.0
            } else {
                spec.sample_think_s(&mut self.turns)
            };
            let (msg, answer) = self.lengths();
            let prompt = history + msg;
            if index > 0 && prompt > self.tenant.max_prompt_tokens {
                break;
            }
            at += think_s;
            let mut r = self.request(at, prompt, msg, answer);
            r.turn = Some(Turn {
                conversation,
                index,
                think_s,
                after: None,
            });
            out.push(r);
            history = prompt + answer;
        }
    }
}

/// Points every follow-up turn at the id of the turn before it.
fn link_turns(requests: &mut [RequestSpec]) {
    let mut last: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for r in requests.iter_mut() {
        if let Some(turn) = &mut r.turn {
            turn.after = last.insert(turn.conversation, r.id);
        }
    }
}

/// SplitMix64 of the run seed combined with FNV-1a of the tenant name.
fn tenant_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = seed ^ h;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
