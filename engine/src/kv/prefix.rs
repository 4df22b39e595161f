//! Prefix-cache identity: a full, immutable KV block is named by a hash chained from its
//! parent block's hash and its token ids, rooted in a namespace. The namespace is the tenant
//! by default (no tenant can hit, or time, another's cache); a request may narrow it with a
//! salt (vLLM's `cache_salt`); an operator may put tenants in a named shared namespace.
//! Only full blocks have a hash: the partial tail is always private.
//!
//! The hash is SHA-256 truncated to 128 bits, so a crafted prompt cannot collide with another
//! one's blocks in practice; a block's hash covers every token before it through the chain.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use superinfer_policies::TenantId;

/// The identity of a full block's content in one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

fn digest(parts: &[&[u8]]) -> u128 {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let out = h.finalize();
    u128::from_le_bytes(out[..16].try_into().expect("sha-256 has 32 bytes"))
}

/// Where a request's blocks may be found and shared: `base` is the tenant's own namespace
/// ([`CacheScope::tenant`]) or an operator-named shared one ([`CacheScope::shared`]); a `salt`
/// narrows it to the requests that give the same salt.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheScope {
    pub base: String,
    pub salt: Option<String>,
}

impl CacheScope {
    /// The tenant's own namespace (the default of a request without a scope).
    pub fn tenant(tenant: TenantId) -> CacheScope {
        CacheScope {
            base: CacheScope::tenant_base(tenant),
            salt: None,
        }
    }

    /// The base name of a tenant's own namespace.
    pub fn tenant_base(tenant: TenantId) -> String {
        format!("tenant:{}", tenant.0)
    }

    /// A namespace an operator shares between tenants on purpose.
    pub fn shared(name: &str) -> CacheScope {
        CacheScope {
            base: CacheScope::shared_base(name),
            salt: None,
        }
    }

    /// The base name of a shared namespace.
    pub fn shared_base(name: &str) -> String {
        format!("shared:{name}")
    }

    /// The same scope narrowed by `salt`.
    pub fn salted(mut self, salt: Option<String>) -> CacheScope {
        self.salt = salt;
        self
    }

    /// The hash a base name is known by (what dropping a namespace's cache matches).
    pub fn base_key(base: &str) -> u64 {
        digest(&[b"base", base.as_bytes()]) as u64
    }

    /// The root of the hash chain: the parent of a request's first block.
    pub fn root(&self) -> BlockHash {
        let salt = self.salt.as_deref().unwrap_or("");
        let salted = [u8::from(self.salt.is_some())];
        BlockHash(digest(&[
            b"root",
            self.base.as_bytes(),
            &salted,
            salt.as_bytes(),
        ]))
    }
}

/// The hash of a full block holding `tokens`, after the block (or root) `parent`: the same
/// framing as [`digest`] of the parent's 16 bytes and the tokens' little-endian bytes, fed to
/// the hasher without a copy (it runs for every block that fills).
pub fn chain(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(16u64.to_le_bytes());
    h.update(parent.0.to_le_bytes());
    h.update((tokens.len() as u64 * 4).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let out = h.finalize();
    BlockHash(u128::from_le_bytes(
        out[..16].try_into().expect("sha-256 has 32 bytes"),
    ))
}

/// Extends `hashes` (the chain of `tokens`' full blocks so far) over every full block of
/// `tokens` of `block_size` tokens.
pub fn extend_chain(hashes: &mut Vec<BlockHash>, root: BlockHash, tokens: &[u32], block_size: u32) {
    let bs = block_size.max(1) as usize;
    while (hashes.len() + 1) * bs <= tokens.len() {
        let i = hashes.len();
        let parent = hashes.last().copied().unwrap_or(root);
        hashes.push(chain(parent, &tokens[i * bs..(i + 1) * bs]));
    }
}

/// Prompt tokens a request found cached at its first admission, by the tier they came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixHit {
    /// Tokens of blocks already in HBM (reused in place).
    pub hbm: u32,
    /// Tokens of blocks found only in DRAM (copied in through the copy engine).
    pub dram: u32,
}

impl PrefixHit {
    /// Cached prompt tokens in all (OpenAI's `usage.prompt_tokens_details.cached_tokens`).
    pub fn tokens(&self) -> u32 {
        self.hbm + self.dram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_differ_by_namespace_salt_parent_and_tokens() {
        let a = CacheScope::tenant(TenantId(1));
        let b = CacheScope::tenant(TenantId(2));
        let salted = a.clone().salted(Some("s".into()));
        let empty_salt = a.clone().salted(Some(String::new()));
        let roots = [a.root(), b.root(), salted.root(), empty_salt.root()];
        for i in 0..roots.len() {
            for j in i + 1..roots.len() {
                assert_ne!(roots[i], roots[j], "{i} {j}");
            }
        }
        let t = [1u32, 2, 3, 4];
        assert_eq!(chain(a.root(), &t), chain(a.root(), &t));
        // The same bytes as the framed digest of the parent and the tokens, at any length.
        for n in [0usize, 4, 16, 64, 65, 200] {
            let t: Vec<u32> = (0..n as u32)
                .map(|x| x.wrapping_mul(2_654_435_761))
                .collect();
            let bytes: Vec<u8> = t.iter().flat_map(|x| x.to_le_bytes()).collect();
            let framed = BlockHash(digest(&[&a.root().0.to_le_bytes(), &bytes]));
            assert_eq!(chain(a.root(), &t), framed, "{n} tokens");
        }
        assert_ne!(chain(a.root(), &t), chain(b.root(), &t));
        assert_ne!(chain(a.root(), &t), chain(a.root(), &[1, 2, 3, 5]));
        assert_eq!(
            CacheScope::shared("x").root(),
            CacheScope::shared("x").root()
        );
    }

    #[test]
    fn extend_chain_covers_full_blocks_only_and_resumes() {
        let root = CacheScope::tenant(TenantId(0)).root();
        let tokens: Vec<u32> = (0..37).collect();
        let mut h = Vec::new();
        extend_chain(&mut h, root, &tokens[..20], 16);
        assert_eq!(h.len(), 1);
        extend_chain(&mut h, root, &tokens, 16);
        assert_eq!(h.len(), 2);
        let mut again = Vec::new();
        extend_chain(&mut again, root, &tokens, 16);
        assert_eq!(h, again);
        assert_eq!(h[1], chain(h[0], &tokens[16..32]));
    }
}
