//! The two-tier paged KV cache: block identities and geometry ([`block`]), the lifecycle of a
//! block and its one transition table ([`lifecycle`]), and the pool that owns both tiers and
//! every request's block table ([`pool`]), and the prefix cache's block identities ([`prefix`]).

pub mod block;
pub mod lifecycle;
pub mod pool;
pub mod prefix;

pub use block::{whole_blocks, BlockGeometry, DramBlock, HbmBlock};
pub use lifecycle::BlockState;
pub use pool::{KvPool, LogicalBlock};
pub use prefix::{BlockHash, CacheScope, PrefixHit};
