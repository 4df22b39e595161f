//! Version 2 → 3: the usage ledger's tree `usage` (tenant id + UTC hour → counters, see
//! `crate::usage`). Tenant records are unchanged; the migration creates the empty tree and
//! records version 3. The bump keeps a version-2 binary from serving the store afterwards:
//! it would not record usage, and the ledger would silently miss what it served.

use sled::transaction::TransactionError;
use sled::Db;

use super::super::layout::{META, SCHEMA_VERSION as VERSION_KEY};
use crate::error::{Result, TenantError};
use crate::usage::USAGE;

pub(crate) fn migrate_to_v3(db: &Db) -> Result<()> {
    db.open_tree(USAGE)?;
    let meta = db.open_tree(META)?;
    meta.transaction(|meta| {
        meta.insert(VERSION_KEY, &3u32.to_be_bytes())?;
        Ok(())
    })
    .map_err(|e: TransactionError<TenantError>| match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => e.into(),
    })
}
