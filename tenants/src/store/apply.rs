//! [`TenantStore::apply`]: make the store hold what a [`TenantsFile`] says, in one
//! transaction. Tenants are matched by name; a tenant whose settings and key hash already
//! match is left alone, so applying the same file twice writes nothing the second time.

use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::fmt;

use super::layout::{abort, decode_id, id_key, Record, Tx, TxResult};
use super::{now_ms, TenantStore};
use crate::error::{Result, TenantError};
use crate::file::{FileTenant, TenantsFile};
use crate::key::KeyHash;
use crate::model::Tenant;

/// What an apply did, by tenant name (file order; removals in id order).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    pub created: Vec<String>,
    pub updated: Vec<String>,
    pub unchanged: Vec<String>,
    pub removed: Vec<String>,
}

impl ApplyReport {
    /// True when the apply wrote something.
    pub fn changed(&self) -> bool {
        !(self.created.is_empty() && self.updated.is_empty() && self.removed.is_empty())
    }
}

impl fmt::Display for ApplyReport {
    /// `2 created, 1 updated, 3 unchanged, 0 removed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} created, {} updated, {} unchanged, {} removed",
            self.created.len(),
            self.updated.len(),
            self.unchanged.len(),
            self.removed.len()
        )
    }
}

/// The writes one apply makes.
enum Op<'a> {
    Create(&'a FileTenant),
    /// The record as it will be, and the key hash it had.
    Update(Record, KeyHash),
    Remove(Record),
}

impl TenantStore {
    /// Creates the file's tenants that do not exist, updates those whose settings or key
    /// differ, and with `prune` deletes the tenants the file does not name. All of it is one
    /// durable transaction (or nothing, on an error); when nothing differs nothing is
    /// written. A key hash already held by a tenant that keeps it is refused.
    pub fn apply(&self, file: &TenantsFile, prune: bool) -> Result<ApplyReport> {
        let _serial = self.lock_writes();
        let records = self.records()?;
        let mut report = ApplyReport::default();
        let ops = plan(&records, file, prune, &mut report)?;
        if ops.is_empty() {
            return Ok(report);
        }
        let created_at_ms = now_ms();
        self.transact(|tx| run(tx, &ops, created_at_ms))?;
        Ok(report)
    }
}

fn plan<'a>(
    records: &[Record],
    file: &'a TenantsFile,
    prune: bool,
    report: &mut ApplyReport,
) -> Result<Vec<Op<'a>>> {
    let by_name: HashMap<&str, &Record> = records
        .iter()
        .map(|r| (r.tenant.name.as_str(), r))
        .collect();
    let mut ops = Vec::new();
    for ft in &file.tenants {
        let new = ft.new.get();
        let Some(&old) = by_name.get(new.name.as_str()) else {
            report.created.push(new.name.clone());
            ops.push(Op::Create(ft));
            continue;
        };
        let tenant: Tenant = ft
            .new
            .clone()
            .into_tenant(old.tenant.id, old.tenant.created_at_ms);
        let old_hash = old.key_hash()?;
        if tenant == old.tenant && old_hash == ft.key {
            report.unchanged.push(new.name.clone());
        } else {
            report.updated.push(new.name.clone());
            ops.push(Op::Update(Record::new(tenant, &ft.key), old_hash));
        }
    }
    if prune {
        let named: HashSet<&str> = file.names().collect();
        for r in records {
            if !named.contains(r.tenant.name.as_str()) {
                report.removed.push(r.tenant.name.clone());
                ops.push(Op::Remove(r.clone()));
            }
        }
    }
    Ok(ops)
}

/// Removals and retired keys first, so a key or name may move between tenants in one apply.
fn run(tx: &Tx<'_>, ops: &[Op<'_>], created_at_ms: u64) -> TxResult<()> {
    for op in ops {
        match op {
            Op::Remove(r) => {
                let hash = r.key_hash().or_else(abort)?;
                tx.tenants.remove(&id_key(r.tenant.id))?;
                tx.names.remove(r.tenant.name.as_bytes())?;
                tx.keys.remove(hash.as_bytes())?;
            }
            Op::Update(r, old) if r.key_sha256 != old.to_hex() => {
                tx.keys.remove(old.as_bytes())?;
            }
            Op::Update(..) | Op::Create(_) => {}
        }
    }
    for op in ops {
        match op {
            Op::Update(r, old) => {
                let hash = r.key_hash().or_else(abort)?;
                if hash != *old {
                    claim_key(tx, &r.tenant.name, &hash, &id_key(r.tenant.id))?;
                }
                tx.put_record(r)?;
            }
            Op::Create(ft) => {
                let id = tx.allocate_id()?;
                let tenant = ft.new.clone().into_tenant(id, created_at_ms);
                claim_key(tx, &tenant.name, &ft.key, &id_key(id))?;
                tx.names.insert(tenant.name.as_bytes(), &id_key(id))?;
                tx.put_record(&Record::new(tenant, &ft.key))?;
            }
            Op::Remove(_) => {}
        }
    }
    Ok(())
}

fn claim_key(tx: &Tx<'_>, name: &str, hash: &KeyHash, id: &[u8; 4]) -> TxResult<()> {
    if let Some(holder) = tx.keys.get(hash.as_bytes())? {
        let holder = decode_id(&holder).or_else(abort)?;
        return abort(TenantError::File(format!(
            "tenant `{name}`: its API key is already the key of tenant {holder}, which keeps it; \
             each tenant needs its own key"
        )));
    }
    tx.keys.insert(hash.as_bytes(), id)?;
    Ok(())
}
