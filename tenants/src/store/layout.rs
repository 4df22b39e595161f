//! The on-disk layout of schema version 4 (version 1's, with `cache_namespace` in each
//! tenant record since version 2, the usage ledger's tree `usage` since version 3, laid
//! out in `crate::usage`, and its `sequences` column and `ledger_id` since version 4): tree
//! names, meta keys, record encoding, and the transactional view that every write goes
//! through.
//!
//! | tree | key | value |
//! |---|---|---|
//! | `tenants` | id, u32 big-endian | [`Record`] as JSON |
//! | `tenant_names` | name, UTF-8 | id, u32 big-endian |
//! | `key_hashes` | SHA-256 of the key, 32 bytes | id, u32 big-endian |
//! | `meta` | `schema_version` | u32 big-endian |
//! | `meta` | `next_id` | u64 big-endian: the id the next tenant gets |
//! | `meta` | `generation` | u64 big-endian: bumped by every admin write |
//! | `meta` | `ledger_id` | 16 random bytes naming this store's ledger in a fleet's export |

use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionalTree};
use sled::{Db, Tree};

use crate::error::{Result, TenantError};
use crate::key::KeyHash;
use crate::model::{Tenant, TenantId};

pub(crate) const TENANTS: &str = "tenants";
pub(crate) const NAMES: &str = "tenant_names";
pub(crate) const KEYS: &str = "key_hashes";
pub(crate) const META: &str = "meta";

pub(crate) const SCHEMA_VERSION: &[u8] = b"schema_version";
pub(crate) const NEXT_ID: &[u8] = b"next_id";
pub(crate) const GENERATION: &[u8] = b"generation";
pub(crate) const LEDGER_ID: &[u8] = b"ledger_id";

/// Now, in milliseconds since the Unix epoch (0 before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A new store's ledger id: 16 bytes from the OS, so two stores never share one.
pub(crate) fn new_ledger_id() -> Result<[u8; 16]> {
    use rand::TryRngCore;
    let mut id = [0u8; 16];
    rand::rngs::OsRng
        .try_fill_bytes(&mut id)
        .map_err(|e| TenantError::Corrupt(format!("no randomness for the ledger id: {e}")))?;
    Ok(id)
}

/// Ids start at 1 so that 0 never names a stored tenant.
pub(crate) const FIRST_ID: u64 = 1;

/// What the `tenants` tree holds for one tenant.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub tenant: Tenant,
    /// SHA-256 of the tenant's one active key, lowercase hex.
    pub key_sha256: String,
}

impl Record {
    pub fn new(tenant: Tenant, hash: &KeyHash) -> Self {
        Record {
            tenant,
            key_sha256: hash.to_hex(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a Record has only string keys and finite numbers")
    }

    pub fn decode(id_key: &[u8], bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| {
            TenantError::Corrupt(format!("record under key {id_key:?} does not decode: {e}"))
        })
    }

    pub fn key_hash(&self) -> Result<KeyHash> {
        KeyHash::from_hex(&self.key_sha256)
            .ok_or_else(|| TenantError::Corrupt(format!("tenant {}: bad key hash", self.tenant.id)))
    }
}

pub(crate) fn id_key(id: TenantId) -> [u8; 4] {
    id.0.to_be_bytes()
}

pub(crate) fn decode_id(bytes: &[u8]) -> Result<TenantId> {
    let arr: [u8; 4] = bytes
        .try_into()
        .map_err(|_| TenantError::Corrupt(format!("tenant id {bytes:?} is not 4 bytes")))?;
    Ok(TenantId(u32::from_be_bytes(arr)))
}

pub(crate) fn decode_u64(name: &str, bytes: &[u8]) -> Result<u64> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| TenantError::Corrupt(format!("meta `{name}` is not 8 bytes")))?;
    Ok(u64::from_be_bytes(arr))
}

pub(crate) fn decode_u32(name: &str, bytes: &[u8]) -> Result<u32> {
    let arr: [u8; 4] = bytes
        .try_into()
        .map_err(|_| TenantError::Corrupt(format!("meta `{name}` is not 4 bytes")))?;
    Ok(u32::from_be_bytes(arr))
}

/// Handles on the four trees of the current layout.
#[derive(Clone)]
pub(crate) struct Trees {
    pub tenants: Tree,
    pub names: Tree,
    pub keys: Tree,
    pub meta: Tree,
}

impl Trees {
    pub fn open(db: &Db) -> Result<Self> {
        Ok(Trees {
            tenants: db.open_tree(TENANTS)?,
            names: db.open_tree(NAMES)?,
            keys: db.open_tree(KEYS)?,
            meta: db.open_tree(META)?,
        })
    }
}

/// The four trees inside one transaction.
pub(crate) struct Tx<'a> {
    pub tenants: &'a TransactionalTree,
    pub names: &'a TransactionalTree,
    pub keys: &'a TransactionalTree,
    pub meta: &'a TransactionalTree,
}

/// What a transaction closure returns: our error aborts, sled's conflicts retry.
pub(crate) type TxResult<T> = Result<T, ConflictableTransactionError<TenantError>>;

/// Aborts the transaction with `e`.
pub(crate) fn abort<T>(e: TenantError) -> TxResult<T> {
    Err(ConflictableTransactionError::Abort(e))
}

impl Tx<'_> {
    pub fn record(&self, id: TenantId) -> TxResult<Option<Record>> {
        let key = id_key(id);
        match self.tenants.get(key)? {
            None => Ok(None),
            Some(bytes) => Record::decode(&key, &bytes).map(Some).or_else(abort),
        }
    }

    pub fn put_record(&self, record: &Record) -> TxResult<()> {
        self.tenants
            .insert(&id_key(record.tenant.id), record.encode())?;
        Ok(())
    }

    pub fn meta_u64(&self, key: &[u8]) -> TxResult<Option<u64>> {
        let name = String::from_utf8_lossy(key);
        match self.meta.get(key)? {
            None => Ok(None),
            Some(bytes) => decode_u64(&name, &bytes).map(Some).or_else(abort),
        }
    }

    pub fn set_meta_u64(&self, key: &[u8], value: u64) -> TxResult<()> {
        self.meta.insert(key, &value.to_be_bytes())?;
        Ok(())
    }

    /// Takes the next id from the counter.
    pub fn allocate_id(&self) -> TxResult<TenantId> {
        let next = self.meta_u64(NEXT_ID)?.unwrap_or(FIRST_ID);
        let Ok(id) = u32::try_from(next) else {
            return abort(TenantError::IdsExhausted);
        };
        self.set_meta_u64(NEXT_ID, next + 1)?;
        Ok(TenantId(id))
    }

    /// Counts one more admin write, for subscribers and snapshot freshness.
    pub fn bump_generation(&self) -> TxResult<u64> {
        let next = self.meta_u64(GENERATION)?.unwrap_or(0) + 1;
        self.set_meta_u64(GENERATION, next)?;
        Ok(next)
    }
}
