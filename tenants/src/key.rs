//! API keys: made from the operating system's CSPRNG, handed out once, kept only as SHA-256
//! hashes, compared in constant time.
//!
//! A key is `sk-si-` followed by 64 lowercase hex digits (32 random bytes, 256 bits). Because
//! keys carry full entropy, one unsalted SHA-256 is the right hash: there is nothing to
//! brute-force that a slow, salted hash would protect, and lookups stay a single index read.

use rand::rngs::OsRng;
use rand::TryRngCore;
use sha2::{Digest, Sha256};
use std::fmt;
use subtle::ConstantTimeEq;

use crate::error::{Result, TenantError};

/// Every key begins with this; it lets secret scanners and people recognise one.
pub const KEY_PREFIX: &str = "sk-si-";
/// Random bytes in a key.
const KEY_BYTES: usize = 32;
/// Characters in a well-formed key.
const KEY_CHARS: usize = KEY_PREFIX.len() + 2 * KEY_BYTES;

/// A plaintext API key. Returned once, by `create` and `rotate_key`; the store never keeps it.
/// `Debug` does not print the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A fresh key from the operating system's random source.
    pub(crate) fn generate() -> Result<Self> {
        let mut bytes = [0u8; KEY_BYTES];
        OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(|e| TenantError::Entropy(e.to_string()))?;
        Ok(ApiKey(format!("{KEY_PREFIX}{}", hex(&bytes))))
    }

    /// The secret, to show the user once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The secret, to show the user once.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The hash the store keeps.
    pub fn hash(&self) -> KeyHash {
        KeyHash::of(&self.0)
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({KEY_PREFIX}<redacted>)")
    }
}

/// True when `s` has the shape of a key this crate issues. The shape is public, so checking it
/// first leaks nothing and spares the index a lookup for obvious garbage.
pub fn is_well_formed(s: &str) -> bool {
    s.len() == KEY_CHARS
        && s.starts_with(KEY_PREFIX)
        && s[KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// SHA-256 of a key. Equality is constant-time.
#[derive(Clone, Copy, Eq)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    /// The hash of a presented key.
    pub fn of(key: &str) -> Self {
        KeyHash(Sha256::digest(key.as_bytes()).into())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub(crate) fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(KeyHash)
    }

    /// Lowercase hex, as stored in a tenant record.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(KeyHash(out))
    }
}

impl PartialEq for KeyHash {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

// Hashing the bytes agrees with the (constant-time) byte equality above.
impl std::hash::Hash for KeyHash {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHash({})", self.to_hex())
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

#[cfg(test)]
mod tests;
