//! Version 0: the prototype layout, before versions were recorded. One tree, `tenants`, keyed
//! by tenant name, each value a flat JSON object:
//!
//! ```json
//! {"id": 7, "ttft_ms": 5000, "tbt_ms": 100, "weight": 2.0,
//!  "api_key_sha256": "<64 hex digits>", "enabled": true}
//! ```
//!
//! No quotas, no creation time, no indexes, no id counter. Version 1 re-keys `tenants` by id
//! and adds the name and key-hash indexes and the `meta` tree; the migration gives every
//! tenant the default quotas and the migration time as its creation time, and keeps ids (so
//! the engine's tenant numbers do not change).

use serde::Deserialize;
use sled::transaction::{TransactionError, Transactional};
use sled::Db;
use std::collections::HashSet;

use super::super::layout::{
    id_key, Record, Trees, Tx, FIRST_ID, GENERATION, NEXT_ID, SCHEMA_VERSION as VERSION_KEY,
};
use crate::error::{Result, TenantError};
use crate::key::KeyHash;
use crate::model::{NewTenant, Quotas, Slo, TenantId};

#[derive(Deserialize)]
struct V0Tenant {
    id: u32,
    ttft_ms: u32,
    tbt_ms: u32,
    weight: f64,
    api_key_sha256: String,
    enabled: bool,
}

/// True when the version-0 tree holds tenants.
pub(crate) fn is_present(db: &Db) -> Result<bool> {
    Ok(!db.open_tree(super::super::layout::TENANTS)?.is_empty())
}

fn failed(reason: String) -> TenantError {
    TenantError::Migration { from: 0, reason }
}

/// Rewrites a version-0 store as version 1 in one transaction.
pub(crate) fn migrate_to_v1(db: &Db) -> Result<()> {
    let trees = Trees::open(db)?;
    let created_at_ms = super::super::layout::now_ms();
    let mut old_keys = Vec::new();
    let mut records = Vec::new();
    let (mut ids, mut hashes) = (HashSet::new(), HashSet::new());
    for kv in trees.tenants.iter() {
        let (k, v) = kv?;
        let name = String::from_utf8(k.to_vec())
            .map_err(|_| failed(format!("tenant name {:?} is not UTF-8", &k[..])))?;
        let old: V0Tenant = serde_json::from_slice(&v)
            .map_err(|e| failed(format!("tenant `{name}` does not decode: {e}")))?;
        let hash = KeyHash::from_hex(&old.api_key_sha256)
            .ok_or_else(|| failed(format!("tenant `{name}`: bad api_key_sha256")))?;
        if !ids.insert(old.id) || !hashes.insert(hash) {
            return Err(failed(format!("tenant `{name}`: duplicate id or key hash")));
        }
        let new = NewTenant {
            name: name.clone(),
            slo: Slo {
                ttft_ms: old.ttft_ms,
                tbt_ms: old.tbt_ms,
                queue_deadline_ms: None,
            },
            weight: old.weight,
            quotas: Quotas::default(),
            enabled: old.enabled,
            cache_namespace: None,
        };
        let valid = new
            .validate()
            .map_err(|e| failed(format!("tenant `{name}`: {e}")))?;
        let tenant = valid.into_tenant(TenantId(old.id), created_at_ms);
        records.push((Record::new(tenant, &hash), hash));
        old_keys.push(k);
    }
    let next_id = ids.iter().max().map_or(FIRST_ID, |&m| u64::from(m) + 1);

    (&trees.tenants, &trees.names, &trees.keys, &trees.meta)
        .transaction(|(tenants, names, keys, meta)| {
            let tx = Tx {
                tenants,
                names,
                keys,
                meta,
            };
            // Old keys (names) and new keys (ids) share the tree: remove every old one before
            // inserting any new one, so a 4-byte name cannot clobber a migrated record.
            for k in &old_keys {
                tx.tenants.remove(k)?;
            }
            for (r, hash) in &records {
                let id = id_key(r.tenant.id);
                tx.put_record(r)?;
                tx.names.insert(r.tenant.name.as_bytes(), &id)?;
                tx.keys.insert(hash.as_bytes(), &id)?;
            }
            tx.set_meta_u64(NEXT_ID, next_id)?;
            tx.set_meta_u64(GENERATION, 1)?;
            tx.meta.insert(VERSION_KEY, &1u32.to_be_bytes())?;
            Ok(())
        })
        .map_err(|e: TransactionError<TenantError>| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => e.into(),
        })
}
