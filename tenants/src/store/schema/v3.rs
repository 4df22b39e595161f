//! Version 3 → 4: each usage row gained `sequences` (the choices the engine accepted, beside
//! the requests), so a value grows from five counters (40 bytes) to six (48). Version 3 did
//! not record sequences; every request had at least one, so a migrated row says
//! `sequences = requests`, a lower bound for hours served before the upgrade (exact for
//! requests with one prompt and `n = 1`). The store also gets its `ledger_id` (16 random
//! bytes) that a fleet's usage export tells nodes apart by. Rows, id and version move in one
//! transaction.

use sled::transaction::{TransactionError, Transactional};
use sled::Db;

use super::super::layout::{new_ledger_id, LEDGER_ID, META, SCHEMA_VERSION as VERSION_KEY};
use crate::error::{Result, TenantError};
use crate::usage::{be_u64s, UsageCounts, USAGE};

/// Five big-endian u64 counters: requests, prompt, cached and completion tokens, errors.
const V3_VALUE_BYTES: usize = 40;

/// A version-3 value as the current counters.
fn decode_v3(bytes: &[u8]) -> Result<UsageCounts> {
    let [requests, prompt_tokens, cached_tokens, completion_tokens, errors] = be_u64s(bytes)
        .ok_or_else(|| TenantError::Migration {
            from: 3,
            reason: format!(
                "a usage value is {} bytes, not {V3_VALUE_BYTES}",
                bytes.len()
            ),
        })?;
    Ok(UsageCounts {
        requests,
        sequences: requests,
        prompt_tokens,
        cached_tokens,
        completion_tokens,
        errors,
    })
}

/// Rewrites every usage row in the version-4 layout and records version 4, in one transaction.
pub(crate) fn migrate_to_v4(db: &Db) -> Result<()> {
    let usage = db.open_tree(USAGE)?;
    let meta = db.open_tree(META)?;
    let ledger = new_ledger_id()?;
    let mut rows = Vec::new();
    for kv in usage.iter() {
        let (k, v) = kv?;
        rows.push((k, decode_v3(&v)?.encode()));
    }
    (&usage, &meta)
        .transaction(|(usage, meta)| {
            for (k, v) in &rows {
                usage.insert(k, v.to_vec())?;
            }
            if meta.get(LEDGER_ID)?.is_none() {
                meta.insert(LEDGER_ID, &ledger)?;
            }
            meta.insert(VERSION_KEY, &4u32.to_be_bytes())?;
            Ok(())
        })
        .map_err(|e: TransactionError<TenantError>| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => e.into(),
        })
}
