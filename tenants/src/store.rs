//! [`TenantStore`]: the registry on sled. Reads go straight to sled; every write is one sled
//! transaction over all the trees it touches, followed by a flush, so a write that returned
//! `Ok` survives a crash and a crash never leaves half a write behind.

mod apply;
pub(crate) mod backup;
mod check;
mod layout;
mod schema;

#[cfg(test)]
mod tests;

use sled::transaction::{TransactionError, Transactional};
use sled::Db;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{Result, TenantError};
use crate::key::{is_well_formed, ApiKey, KeyHash};
use crate::model::{NewTenant, Tenant, TenantId, TenantPatch, TenantRef};
use crate::snapshot::{Auth, Snapshot};
use crate::usage::{UsageLedger, UsageQuery, UsageReport, UsageReportRow};
use layout::{
    abort, decode_id, decode_u64, id_key, now_ms, Record, Trees, Tx, TxResult, GENERATION,
};

pub use apply::ApplyReport;
pub use schema::SCHEMA_VERSION;

/// The tenant registry. Cheap to clone (all clones share one database); `Send + Sync`.
///
/// sled locks its directory, so one process at a time opens a store: the server, or the
/// offline CLI while the server is stopped.
#[derive(Clone)]
pub struct TenantStore {
    db: Db,
    trees: Trees,
    usage: UsageLedger,
    path: PathBuf,
    /// The verified copy beside the store ([`backup`]).
    backup: PathBuf,
    /// Serializes writes with each other and with snapshots, so a snapshot never sees half of
    /// a concurrent write (sled transactions are atomic, but a scan is many reads).
    writes: Arc<Mutex<()>>,
}

impl TenantStore {
    /// Opens (creating if needed) the store in directory `path`, then brings its layout to
    /// [`SCHEMA_VERSION`], running any migrations.
    ///
    /// A store sled cannot reopen (its files corrupted by a crash) is rebuilt from its
    /// verified copy when there is one ([`backup`]): the damaged directory is kept beside it
    /// as `<store>.corrupt-<unix seconds>` and an error is logged to stderr.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        match Self::open_as_is(&path) {
            Err(e) if is_corruption(&e) && backup::has_registry(&backup::dir_of(&path)) => {
                Self::recover(&path, e)
            }
            other => other,
        }
    }

    fn open_as_is(path: &Path) -> Result<Self> {
        let db = sled::Config::new()
            .path(path)
            .open()
            .map_err(|e| open_error(e, path))?;
        schema::migrate(&db)?;
        let trees = Trees::open(&db)?;
        let backup = backup::dir_of(path);
        let usage = UsageLedger::open(&db, Some(backup.clone()))?;
        let store = TenantStore {
            db,
            trees,
            usage,
            path: path.to_path_buf(),
            backup,
            writes: Arc::new(Mutex::new(())),
        };
        // Every entry read once: a damaged registry shows here, not at the first request.
        store.check()?;
        // A store that opened but lost acknowledged writes (its recovery dropped a damaged
        // segment) is behind its verified copy: that is damage too.
        let copy = backup::registry_generation(&store.backup);
        let own = store.generation()?;
        if copy.is_some_and(|g| g > own) {
            return Err(TenantError::Corrupt(format!(
                "the store is at write {own} but its verified copy at write {}",
                copy.unwrap_or_default()
            )));
        }
        store.write_backup()?;
        store.usage.open_journal()?;
        Ok(store)
    }

    /// Rebuilds the store at `path` from its verified copy after `why` kept it from opening.
    fn recover(path: &Path, why: TenantError) -> Result<Self> {
        let dir = backup::dir_of(path);
        let registry = backup::read_registry(&dir)?;
        let ledger = crate::usage::journal::read_ledger(&dir)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut kept = path.as_os_str().to_os_string();
        kept.push(format!(".corrupt-{now}"));
        std::fs::rename(path, &kept)?;
        eprintln!(
            "superinfer tenants: the store at {} could not be opened ({why}); rebuilt from its \
             verified copy in {} ({} ledger rows); the damaged files are kept in {}",
            path.display(),
            dir.display(),
            ledger.len(),
            std::path::Path::new(&kept).display()
        );
        let db = sled::Config::new()
            .path(path)
            .open()
            .map_err(|e| open_error(e, path))?;
        for (name, entries) in &registry {
            let tree = db.open_tree(name)?;
            for (k, v) in entries {
                tree.insert(k.as_slice(), v.as_slice())?;
            }
        }
        let usage = db.open_tree(crate::usage::USAGE)?;
        for ((tenant, hour), c) in &ledger {
            usage.insert(crate::usage::row_key(*tenant, *hour), c.encode().to_vec())?;
        }
        db.flush()?;
        drop(usage);
        drop(db);
        Self::open_as_is(path)
    }

    /// Rewrites the registry's verified copy from the trees (after a write is on disk).
    fn write_backup(&self) -> Result<()> {
        let t = &self.trees;
        let mut dump = Vec::new();
        for (name, tree) in [
            (layout::TENANTS, &t.tenants),
            (layout::NAMES, &t.names),
            (layout::KEYS, &t.keys),
            (layout::META, &t.meta),
        ] {
            let entries = tree
                .iter()
                .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            dump.push((name.to_string(), entries));
        }
        backup::write_registry(&self.backup, &dump)
    }

    /// Opens the store in directory `path` like [`TenantStore::open`], but only if one is
    /// there ([`TenantStore::exists`]): `Err(NoStore)` instead of creating an empty store where
    /// an existing one was meant (a mistyped directory).
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if !Self::exists(path) {
            return Err(TenantError::NoStore {
                path: path.display().to_string(),
            });
        }
        Self::open(path)
    }

    /// Whether directory `path` holds a store (sled's `conf` and `db` files), without opening
    /// or creating anything.
    pub fn exists(path: impl AsRef<Path>) -> bool {
        let path = path.as_ref();
        ["conf", "db"].iter().all(|f| path.join(f).is_file())
    }

    /// The directory this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tenant with this id, if there is one.
    pub fn get(&self, id: TenantId) -> Result<Option<Tenant>> {
        Ok(self.record(id)?.map(|r| r.tenant))
    }

    /// The tenant an admin path or CLI argument names ([`TenantRef`]), if there is one.
    pub fn resolve(&self, r: &TenantRef) -> Result<Option<Tenant>> {
        match r {
            TenantRef::Id(id) => self.get(*id),
            TenantRef::NoSuchId(_) => Ok(None),
            TenantRef::Name(n) => self.get_by_name(n),
        }
    }

    /// The tenant with this name (names are case-sensitive), if there is one.
    pub fn get_by_name(&self, name: &str) -> Result<Option<Tenant>> {
        match self.trees.names.get(name.as_bytes())? {
            None => Ok(None),
            Some(id) => self.get(decode_id(&id)?),
        }
    }

    /// Every tenant, in id order.
    pub fn list(&self) -> Result<Vec<Tenant>> {
        Ok(self.records()?.into_iter().map(|r| r.tenant).collect())
    }

    /// Creates a tenant and its first API key. The key is returned here and never again.
    pub fn create(&self, new: NewTenant) -> Result<(Tenant, ApiKey)> {
        let valid = new.validate()?;
        let key = ApiKey::generate()?;
        let hash = key.hash();
        let created_at_ms = now_ms();
        let tenant = self.write(|tx| {
            let name = valid.get().name.as_bytes();
            if tx.names.get(name)?.is_some() {
                return abort(TenantError::NameTaken(valid.get().name.clone()));
            }
            if tx.keys.get(hash.as_bytes())?.is_some() {
                // 2^-256; only a broken random source gets here.
                return abort(TenantError::Entropy("a fresh key collided".into()));
            }
            let id = tx.allocate_id()?;
            let tenant = valid.clone().into_tenant(id, created_at_ms);
            tx.put_record(&Record::new(tenant.clone(), &hash))?;
            tx.names.insert(name, &id_key(id))?;
            tx.keys.insert(hash.as_bytes(), &id_key(id))?;
            Ok(tenant)
        })?;
        Ok((tenant, key))
    }

    /// Applies a partial update; renames keep names unique. Returns the tenant as stored.
    pub fn patch(&self, id: TenantId, patch: TenantPatch) -> Result<Tenant> {
        self.write(|tx| {
            let Some(mut record) = tx.record(id)? else {
                return abort(TenantError::NotFound(id));
            };
            let updated = patch.apply(&record.tenant).or_else(abort)?;
            if updated.name != record.tenant.name {
                if tx.names.get(updated.name.as_bytes())?.is_some() {
                    return abort(TenantError::NameTaken(updated.name));
                }
                tx.names.remove(record.tenant.name.as_bytes())?;
                tx.names.insert(updated.name.as_bytes(), &id_key(id))?;
            }
            record.tenant = updated.clone();
            tx.put_record(&record)?;
            Ok(updated)
        })
    }

    /// Deletes a tenant and its key. Returns the tenant as it was. Ids are never reused.
    pub fn delete(&self, id: TenantId) -> Result<Tenant> {
        self.write(|tx| {
            let Some(record) = tx.record(id)? else {
                return abort(TenantError::NotFound(id));
            };
            let hash = record.key_hash().or_else(abort)?;
            tx.tenants.remove(&id_key(id))?;
            tx.names.remove(record.tenant.name.as_bytes())?;
            tx.keys.remove(hash.as_bytes())?;
            Ok(record.tenant)
        })
    }

    /// Replaces the tenant's key: the old one stops working when this returns. The new key is
    /// returned here and never again.
    pub fn rotate_key(&self, id: TenantId) -> Result<ApiKey> {
        let key = ApiKey::generate()?;
        let hash = key.hash();
        self.write(|tx| {
            let Some(mut record) = tx.record(id)? else {
                return abort(TenantError::NotFound(id));
            };
            let old = record.key_hash().or_else(abort)?;
            tx.keys.remove(old.as_bytes())?;
            tx.keys.insert(hash.as_bytes(), &id_key(id))?;
            record.key_sha256 = hash.to_hex();
            tx.put_record(&record)?;
            Ok(())
        })?;
        Ok(key)
    }

    /// Who presents this key. A disabled tenant is [`Auth::Disabled`] (answer 403), an unknown
    /// or malformed key [`Auth::Denied`] (answer 401). The hash index finds the candidate; the
    /// record's hash is then compared in constant time.
    pub fn authenticate(&self, key: &str) -> Result<Auth> {
        if !is_well_formed(key) {
            return Ok(Auth::Denied);
        }
        let hash = KeyHash::of(key);
        let Some(id) = self.trees.keys.get(hash.as_bytes())? else {
            return Ok(Auth::Denied);
        };
        let Some(record) = self.record(decode_id(&id)?)? else {
            return Ok(Auth::Denied);
        };
        if record.key_hash()? != hash {
            return Ok(Auth::Denied);
        }
        Ok(Auth::from_tenant(record.tenant))
    }

    /// Every tenant and key hash as of one generation: what the gateway authenticates against
    /// in memory. Rebuild it when [`TenantStore::subscribe`] reports a change.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let _serial = self.lock_writes();
        let generation = self.generation()?;
        let entries = self
            .records()?
            .into_iter()
            .map(|r| Ok((r.key_hash()?, r.tenant)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Snapshot::new(generation, entries))
    }

    /// The number of admin writes ever made to this store; grows by one with each.
    pub fn generation(&self) -> Result<u64> {
        match self.trees.meta.get(GENERATION)? {
            None => Ok(0),
            Some(bytes) => decode_u64("generation", &bytes),
        }
    }

    /// Fires once per admin write (after it is applied, before `flush`). Blocking use:
    /// `next_timeout` or iterate; async use: `(&mut subscriber).await`. Read
    /// [`TenantStore::snapshot`] after an event; events carry nothing else of use.
    pub fn subscribe(&self) -> sled::Subscriber {
        self.trees.meta.watch_prefix(GENERATION)
    }

    /// The usage ledger (`docs/TENANTS.md`, "Usage ledger").
    pub fn usage(&self) -> &UsageLedger {
        &self.usage
    }

    /// This store's ledger id (32 hex digits): what tells the nodes of a fleet apart when
    /// their exports are summed, so that none is counted twice.
    pub fn ledger_id(&self) -> Result<String> {
        match self.trees.meta.get(layout::LEDGER_ID)? {
            Some(id) if id.len() == 16 => Ok(id.iter().map(|b| format!("{b:02x}")).collect()),
            Some(id) => Err(TenantError::Corrupt(format!(
                "meta `ledger_id` is {} bytes, not 16",
                id.len()
            ))),
            None => Err(TenantError::Corrupt("meta `ledger_id` is missing".into())),
        }
    }

    /// The ledger rows `q` selects, with the tenants' current names (`None` for deleted
    /// tenants) and the totals.
    pub fn usage_report(&self, q: &UsageQuery) -> Result<UsageReport> {
        let mut report = UsageReport {
            ledgers: vec![self.ledger_id()?],
            ..UsageReport::default()
        };
        let mut names = std::collections::HashMap::new();
        for row in self.usage.rows(q)? {
            let name = match names.entry(row.tenant) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(self.get(row.tenant)?.map(|t| t.name))
                }
            };
            report.totals.add(&row.counts);
            report.data.push(UsageReportRow::new(
                row.tenant.0,
                name.clone(),
                row.hour,
                row.counts,
            ));
        }
        Ok(report)
    }

    /// Waits until everything written is on disk. Writes already do this; call it on shutdown
    /// for good measure.
    pub fn flush(&self) -> Result<()> {
        self.usage.flush()?;
        self.db.flush()?;
        Ok(())
    }

    fn record(&self, id: TenantId) -> Result<Option<Record>> {
        let key = id_key(id);
        match self.trees.tenants.get(key)? {
            None => Ok(None),
            Some(bytes) => Record::decode(&key, &bytes).map(Some),
        }
    }

    fn records(&self) -> Result<Vec<Record>> {
        self.trees
            .tenants
            .iter()
            .map(|kv| {
                let (k, v) = kv?;
                Record::decode(&k, &v)
            })
            .collect()
    }

    fn lock_writes(&self) -> std::sync::MutexGuard<'_, ()> {
        // The mutex guards no data, so a panic while holding it leaves nothing inconsistent.
        self.writes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` as one transaction over all trees, counts the write, and returns only once it
    /// is on disk. `f` may run more than once (sled retries on conflict), so it must be pure.
    fn write<T>(&self, f: impl Fn(&Tx<'_>) -> TxResult<T>) -> Result<T> {
        let _serial = self.lock_writes();
        self.transact(f)
    }

    /// [`TenantStore::write`] for a caller that holds the write mutex already.
    fn transact<T>(&self, f: impl Fn(&Tx<'_>) -> TxResult<T>) -> Result<T> {
        let t = &self.trees;
        let out = (&t.tenants, &t.names, &t.keys, &t.meta)
            .transaction(|(tenants, names, keys, meta)| {
                let tx = Tx {
                    tenants,
                    names,
                    keys,
                    meta,
                };
                let out = f(&tx)?;
                tx.bump_generation()?;
                Ok(out)
            })
            .map_err(|e| match e {
                TransactionError::Abort(e) => e,
                TransactionError::Storage(e) => TenantError::Storage(e),
            })?;
        self.db.flush()?;
        // The verified copy holds the write before it is acknowledged.
        self.write_backup()?;
        Ok(out)
    }
}

/// Whether `e` says the store's files are damaged (not locked, missing or unreadable).
fn is_corruption(e: &TenantError) -> bool {
    matches!(
        e,
        TenantError::Corrupt(_)
            | TenantError::Storage(sled::Error::Corruption { .. })
            | TenantError::Storage(sled::Error::ReportableBug(_))
    )
}

fn open_error(e: sled::Error, path: &Path) -> TenantError {
    match &e {
        sled::Error::Io(io) if io.to_string().contains("could not acquire lock") => {
            TenantError::Locked {
                path: path.display().to_string(),
            }
        }
        _ => TenantError::Storage(e),
    }
}
