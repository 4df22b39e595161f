//! The store's invariants as one checker: the crash test runs it after every restart, and the
//! gateway's CLI can offer it to operators.

use std::collections::HashMap;

use super::layout::{decode_id, decode_u64, Record, GENERATION, NEXT_ID};
use super::schema::{stored_version, SCHEMA_VERSION};
use super::TenantStore;
use crate::error::{Result, TenantError};
use crate::key::KeyHash;
use crate::model::TenantId;

/// Stop listing problems after this many; one is enough to fail.
const MAX_PROBLEMS: usize = 20;

impl TenantStore {
    /// Verifies that the records and the indexes agree: every record decodes, is valid and is
    /// stored under its own id; the name index and the key-hash index map exactly the records'
    /// names and key hashes to their ids (so names and keys are unique); the id counter is
    /// above every id; the schema version is current; every usage row decodes and belongs to an
    /// id that was handed out. `Err(Corrupt)` lists what is wrong.
    pub fn check(&self) -> Result<()> {
        let _serial = self.lock_writes();
        let mut problems = Vec::new();
        let version = stored_version(&self.db)?;
        if version != Some(SCHEMA_VERSION) {
            problems.push(format!(
                "schema version is {version:?}, not {SCHEMA_VERSION}"
            ));
        }
        let next_id = self.meta_u64(NEXT_ID, "next_id", &mut problems)?;
        self.meta_u64(GENERATION, "generation", &mut problems)?;
        if let Err(e) = self.ledger_id() {
            problems.push(e.to_string());
        }

        let mut names: HashMap<String, TenantId> = HashMap::new();
        let mut keys: HashMap<KeyHash, TenantId> = HashMap::new();
        for kv in self.trees.tenants.iter() {
            let (k, v) = kv?;
            let (id, record) = match (decode_id(&k), Record::decode(&k, &v)) {
                (Ok(id), Ok(record)) => (id, record),
                (Err(e), _) | (_, Err(e)) => {
                    problems.push(e.to_string());
                    continue;
                }
            };
            check_record(id, &record, next_id, &mut problems);
            if let Some(other) = names.insert(record.tenant.name.clone(), id) {
                problems.push(format!("tenants {other} and {id} share a name"));
            }
            match record.key_hash() {
                Ok(hash) => {
                    if let Some(other) = keys.insert(hash, id) {
                        problems.push(format!("tenants {other} and {id} share a key hash"));
                    }
                }
                Err(e) => problems.push(e.to_string()),
            }
        }
        self.check_index(
            "name",
            &self.trees.names,
            &names,
            |k| String::from_utf8(k.to_vec()).ok(),
            &mut problems,
        )?;
        self.check_index(
            "key hash",
            &self.trees.keys,
            &keys,
            KeyHash::from_slice,
            &mut problems,
        )?;

        for kv in self.usage.tree_iter() {
            let (k, v) = kv?;
            match (
                crate::usage::decode_key(&k),
                crate::usage::UsageCounts::decode(&v),
            ) {
                (Ok((id, _)), Ok(_)) => {
                    if next_id.is_some_and(|n| u64::from(id.0) >= n) {
                        problems.push(format!("usage of tenant {id}, an id never handed out"));
                    }
                }
                (Err(e), _) | (_, Err(e)) => problems.push(e.to_string()),
            }
        }

        if problems.is_empty() {
            return Ok(());
        }
        problems.truncate(MAX_PROBLEMS);
        Err(TenantError::Corrupt(problems.join("; ")))
    }

    fn meta_u64(&self, key: &[u8], name: &str, problems: &mut Vec<String>) -> Result<Option<u64>> {
        match self.trees.meta.get(key)? {
            None => {
                problems.push(format!("meta `{name}` is missing"));
                Ok(None)
            }
            Some(bytes) => match decode_u64(name, &bytes) {
                Ok(v) => Ok(Some(v)),
                Err(e) => {
                    problems.push(e.to_string());
                    Ok(None)
                }
            },
        }
    }

    /// The index tree must hold exactly `expected`, each entry pointing at the right id.
    fn check_index<K: Eq + std::hash::Hash + std::fmt::Debug>(
        &self,
        what: &str,
        tree: &sled::Tree,
        expected: &HashMap<K, TenantId>,
        parse: impl Fn(&[u8]) -> Option<K>,
        problems: &mut Vec<String>,
    ) -> Result<()> {
        let mut seen = 0usize;
        for kv in tree.iter() {
            let (k, v) = kv?;
            let Some(key) = parse(&k) else {
                problems.push(format!("{what} index has a malformed key {:?}", &k[..]));
                continue;
            };
            let id = decode_id(&v)?;
            match expected.get(&key) {
                Some(&want) if want == id => seen += 1,
                Some(&want) => problems.push(format!(
                    "{what} index maps {key:?} to tenant {id}, but tenant {want} has it"
                )),
                None => problems.push(format!(
                    "{what} index maps {key:?} to tenant {id}, which has no such {what}"
                )),
            }
        }
        if seen != expected.len() {
            problems.push(format!(
                "{what} index covers {seen} of {} tenants",
                expected.len()
            ));
        }
        Ok(())
    }
}

fn check_record(id: TenantId, record: &Record, next_id: Option<u64>, problems: &mut Vec<String>) {
    if record.tenant.id != id {
        problems.push(format!("record under id {id} says id {}", record.tenant.id));
    }
    if next_id.is_some_and(|next| u64::from(id.0) >= next) {
        problems.push(format!(
            "tenant {id} is not below the id counter {next_id:?}"
        ));
    }
    if let Err(e) = record.tenant.validate() {
        problems.push(format!("tenant {id}: {e}"));
    }
}
