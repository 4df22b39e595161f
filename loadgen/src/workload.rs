//! Workloads: tenants, each with an arrival process and a length distribution, turned into
//! one deterministic, time-ordered list of requests.
//!
//! - [`arrivals`]: Poisson, Gamma, Hawkes, on/off bursts, trace replay.
//! - [`lengths`]: ShareGPT-like and LMSYS-like fits, fixed, lognormal, trace.
//! - [`tenants`]: the tenant spec and its TOML file.

pub mod arrivals;
pub mod lengths;
pub mod tenants;

pub use arrivals::ArrivalSpec;
pub use lengths::{LengthLimits, LengthSampler, LengthSpec, TokenLognormal};
pub use tenants::{load_tenants, parse_tenants, validate_tenants, TenantSpec};

use crate::error::Error;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// One request to send: who, when, how long.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// 0.. in arrival order.
    pub id: u64,
    /// Index into the tenants slice.
    pub tenant: usize,
    pub arrival_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// ChaCha stream for a tenant's arrival times.
const ARRIVAL_STREAM: u64 = 0;
/// ChaCha stream for a tenant's lengths, so that changing a dataset never moves arrivals.
const LENGTH_STREAM: u64 = 1;

/// All requests of a run of `duration_s` seconds, sorted by arrival (ties: tenant order),
/// with ids 0.. in that order.
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
    for (index, t) in tenants.iter().enumerate() {
        let tenant_seed = tenant_seed(seed, &t.name);
        let mut rng = ChaCha8Rng::seed_from_u64(tenant_seed);
        rng.set_stream(ARRIVAL_STREAM);
        let times = t
            .arrivals
            .generate(duration_s, &mut rng)
            .map_err(|e| e.in_tenant(&t.name))?;
        let sampler = t
            .dataset
            .sampler(t.limits())
            .map_err(|e| e.in_tenant(&t.name))?;
        let mut rng = ChaCha8Rng::seed_from_u64(tenant_seed);
        rng.set_stream(LENGTH_STREAM);
        requests.extend(times.into_iter().map(|arrival_s| {
            let (prompt_tokens, output_tokens) = sampler.sample(&mut rng);
            RequestSpec {
                id: 0,
                tenant: index,
                arrival_s,
                prompt_tokens,
                output_tokens,
            }
        }));
    }
    // Stable: equal times keep tenant order, then each tenant's own order.
    requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    for (id, r) in requests.iter_mut().enumerate() {
        r.id = id as u64;
    }
    Ok(requests)
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
