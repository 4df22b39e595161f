//! The prefix-cache hits a trace allows: with an infinite cache, and with an LRU cache of a
//! given number of KV blocks. Computed from the requests' content as the engine caches it:
//! full blocks of `block_size` tokens, keyed by the whole prefix up to them, at most
//! `(prompt - 1) / block_size` blocks a request (one prompt token is always computed).

use super::RequestSpec;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Ideal cached prompt tokens over a list of requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IdealHits {
    pub prompt_tokens: u64,
    /// With a cache that never evicts.
    pub infinite_tokens: u64,
    /// With an LRU cache of `capacity_blocks` blocks; `None` when the capacity is unknown.
    pub bounded_tokens: Option<u64>,
    pub capacity_blocks: Option<u64>,
}

impl IdealHits {
    pub fn infinite_rate(&self) -> f64 {
        rate(self.infinite_tokens, self.prompt_tokens)
    }
    pub fn bounded_rate(&self) -> Option<f64> {
        self.bounded_tokens.map(|b| rate(b, self.prompt_tokens))
    }
}

fn rate(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The requests in arrival order (as [`super::generate`] and the replay give them).
pub fn ideal_hits(
    requests: &[RequestSpec],
    block_size: u32,
    capacity_blocks: Option<u64>,
) -> IdealHits {
    let mut out = IdealHits {
        capacity_blocks,
        bounded_tokens: capacity_blocks.map(|_| 0),
        ..IdealHits::default()
    };
    let mut seen: std::collections::HashSet<u64> = Default::default();
    let mut lru = Lru::default();
    for r in requests {
        out.prompt_tokens += u64::from(r.prompt_tokens);
        let keys = block_keys(r, block_size);
        let hits = keys.iter().take_while(|k| seen.contains(k)).count() as u64;
        out.infinite_tokens += hits * u64::from(block_size);
        seen.extend(keys.iter().copied());
        if let (Some(cap), Some(bounded)) = (capacity_blocks, out.bounded_tokens.as_mut()) {
            let hits = keys.iter().take_while(|k| lru.contains(**k)).count() as u64;
            *bounded += hits * u64::from(block_size);
            for &k in &keys {
                lru.touch(k, cap);
            }
        }
    }
    out
}

/// One key per cacheable block of the request's prompt: equal keys, equal content up to and
/// including that block.
fn block_keys(r: &RequestSpec, block_size: u32) -> Vec<u64> {
    let n = r.prompt_tokens.saturating_sub(1) / block_size;
    let mut keys = Vec::with_capacity(n as usize);
    let unique = |j: u32| {
        mix(
            mix(0x5eed_0000_0000_0000 ^ r.id, u64::from(j)),
            r.content_seed,
        )
    };
    let Some(b) = &r.blocks else {
        keys.extend((0..n).map(unique));
        return keys;
    };
    let per = (b.block_tokens / block_size).max(1);
    let mut chain = 0u64;
    for j in 0..n {
        let tb = (j * block_size / b.block_tokens) as usize;
        match b.hash_ids.get(tb) {
            Some(&id) => {
                if j % per == 0 {
                    chain = mix(chain, id);
                }
                keys.push(mix(chain, u64::from(j % per)));
            }
            None => keys.push(unique(j)),
        }
    }
    keys
}

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Least-recently-used set of block keys.
#[derive(Default)]
struct Lru {
    tick: u64,
    at: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    fn contains(&self, k: u64) -> bool {
        self.at.contains_key(&k)
    }

    fn touch(&mut self, k: u64, capacity: u64) {
        self.tick += 1;
        if let Some(old) = self.at.insert(k, self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, k);
        while self.at.len() as u64 > capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.at.remove(&oldest);
        }
    }
}
