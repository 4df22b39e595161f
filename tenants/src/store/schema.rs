//! Schema versions and migrations, run by `TenantStore::open` before anything else touches the
//! trees.
//!
//! The version lives in the `meta` tree under `schema_version`. A store without it is either
//! new (no tenants anywhere: initialize the current layout) or older than versions were
//! recorded (version 0, see [`v0`]). Each migration moves the store one version forward in one
//! sled transaction that also writes the new version number, then flushes; so a crash leaves
//! the store either wholly at the old version or wholly at the new one, and the next open
//! picks up from there.

pub(crate) mod v0;
pub(crate) mod v1;
pub(crate) mod v2;
pub(crate) mod v3;

#[cfg(test)]
mod tests;

use sled::transaction::TransactionError;
use sled::Db;

use super::layout::{
    decode_u32, new_ledger_id, FIRST_ID, GENERATION, LEDGER_ID, META, NEXT_ID,
    SCHEMA_VERSION as VERSION_KEY,
};
use crate::error::{Result, TenantError};

/// The layout this build reads and writes.
pub const SCHEMA_VERSION: u32 = 4;

/// One step forward: `run` must move a store at version `from` to `from + 1`, writing the new
/// version in the same transaction as the data.
struct Migration {
    from: u32,
    run: fn(&Db) -> Result<()>,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        from: 0,
        run: v0::migrate_to_v1,
    },
    Migration {
        from: 1,
        run: v1::migrate_to_v2,
    },
    Migration {
        from: 2,
        run: v2::migrate_to_v3,
    },
    Migration {
        from: 3,
        run: v3::migrate_to_v4,
    },
];

/// Brings the store at `db` to [`SCHEMA_VERSION`].
pub(crate) fn migrate(db: &Db) -> Result<()> {
    loop {
        let Some(version) = stored_version(db)? else {
            if v0::is_present(db)? {
                run(db, 0)?;
                continue;
            }
            return init(db);
        };
        match version.cmp(&SCHEMA_VERSION) {
            std::cmp::Ordering::Equal => return Ok(()),
            std::cmp::Ordering::Greater => {
                return Err(TenantError::SchemaTooNew {
                    found: version,
                    supported: SCHEMA_VERSION,
                })
            }
            std::cmp::Ordering::Less => run(db, version)?,
        }
    }
}

fn run(db: &Db, from: u32) -> Result<()> {
    let Some(m) = MIGRATIONS.iter().find(|m| m.from == from) else {
        return Err(TenantError::Migration {
            from,
            reason: "this build has no migration from that version".into(),
        });
    };
    (m.run)(db)?;
    db.flush()?;
    match stored_version(db)? {
        Some(v) if v == from + 1 => Ok(()),
        other => Err(TenantError::Migration {
            from,
            reason: format!("left the store at version {other:?}"),
        }),
    }
}

/// The recorded version, or `None` for a store that predates version numbers (or is new).
pub(crate) fn stored_version(db: &Db) -> Result<Option<u32>> {
    let meta = db.open_tree(META)?;
    meta.get(VERSION_KEY)?
        .map(|bytes| decode_u32("schema_version", &bytes))
        .transpose()
}

/// A new, empty store at the current version.
fn init(db: &Db) -> Result<()> {
    let meta = db.open_tree(META)?;
    let ledger = new_ledger_id()?;
    meta.transaction(|meta| {
        meta.insert(NEXT_ID, &FIRST_ID.to_be_bytes())?;
        meta.insert(LEDGER_ID, &ledger)?;
        meta.insert(GENERATION, &0u64.to_be_bytes())?;
        meta.insert(VERSION_KEY, &SCHEMA_VERSION.to_be_bytes())?;
        Ok(())
    })
    .map_err(|e: TransactionError<TenantError>| match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => e.into(),
    })?;
    db.flush()?;
    Ok(())
}
