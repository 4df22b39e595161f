//! Version 1 → 2: tenants gained `cache_namespace` (a shared prefix-cache namespace, `null`
//! for the tenant's own). A version-1 record has no such field and decodes as `null`, so the
//! migration rewrites every record unchanged in meaning (now with the field) and records
//! version 2 in the same transaction. The version bump is what matters: a version-1 binary
//! refuses the store from then on (`SchemaTooNew`) instead of dropping the field on its next
//! write.

use sled::transaction::{TransactionError, Transactional};
use sled::Db;

use super::super::layout::{Record, Trees, Tx, SCHEMA_VERSION as VERSION_KEY};
use crate::error::{Result, TenantError};

/// Rewrites a version-1 store as version 2 in one transaction.
pub(crate) fn migrate_to_v2(db: &Db) -> Result<()> {
    let trees = Trees::open(db)?;
    let mut records = Vec::new();
    for kv in trees.tenants.iter() {
        let (k, v) = kv?;
        let r = Record::decode(&k, &v).map_err(|e| TenantError::Migration {
            from: 1,
            reason: e.to_string(),
        })?;
        r.tenant.validate().map_err(|e| TenantError::Migration {
            from: 1,
            reason: format!("tenant `{}`: {e}", r.tenant.name),
        })?;
        records.push(r);
    }
    (&trees.tenants, &trees.names, &trees.keys, &trees.meta)
        .transaction(|(tenants, names, keys, meta)| {
            let tx = Tx {
                tenants,
                names,
                keys,
                meta,
            };
            for r in &records {
                tx.put_record(r)?;
            }
            tx.meta.insert(VERSION_KEY, &2u32.to_be_bytes())?;
            Ok(())
        })
        .map_err(|e: TransactionError<TenantError>| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => e.into(),
        })
}
