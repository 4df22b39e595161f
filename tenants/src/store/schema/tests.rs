use super::*;
use crate::key::{ApiKey, KeyHash};
use crate::model::{Quotas, TenantId};
use crate::snapshot::Auth;
use crate::store::TenantStore;
use std::path::Path;

/// Writes a version-0 store by hand, exactly as the prototype did: one `tenants` tree keyed by
/// name, flat JSON values, nothing else.
fn write_v0(path: &Path, tenants: &[(&str, u32, f64, bool, &KeyHash)]) {
    let db = sled::open(path).unwrap();
    let tree = db.open_tree("tenants").unwrap();
    for &(name, id, weight, enabled, hash) in tenants {
        let value = format!(
            r#"{{"id":{id},"ttft_ms":2000,"tbt_ms":80,"weight":{weight},"api_key_sha256":"{}","enabled":{enabled}}}"#,
            hash.to_hex()
        );
        tree.insert(name.as_bytes(), value.as_bytes()).unwrap();
    }
    db.flush().unwrap();
}

#[test]
fn a_version_0_store_is_migrated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let keys: Vec<ApiKey> = (0..3).map(|_| ApiKey::generate().unwrap()).collect();
    let hashes: Vec<KeyHash> = keys.iter().map(ApiKey::hash).collect();
    // "silver" gets the id whose 4-byte key equals the version-0 key of "gold": the rewrite
    // must not let one clobber the other.
    let silver_id = u32::from_be_bytes(*b"gold");
    write_v0(
        &path,
        &[
            ("gold", 1, 4.0, true, &hashes[0]),
            ("silver", silver_id, 2.0, true, &hashes[1]),
            ("bronze", 5, 1.0, false, &hashes[2]),
        ],
    );

    let s = reopen(&path);
    s.check().unwrap();
    assert_eq!(stored_version(&s.db).unwrap(), Some(SCHEMA_VERSION));
    let list = s.list().unwrap();
    let ids: Vec<u32> = list.iter().map(|t| t.id.0).collect();
    assert_eq!(ids, vec![1, 5, silver_id]);
    let gold = s.get_by_name("gold").unwrap().unwrap();
    assert_eq!((gold.id, gold.weight), (TenantId(1), 4.0));
    assert_eq!((gold.slo.ttft_ms, gold.slo.tbt_ms), (2000, 80));
    assert_eq!(gold.quotas, Quotas::default());
    assert!(gold.created_at_ms > 0);
    // Keys issued under version 0 keep working; the disabled tenant stays disabled.
    assert_eq!(
        s.authenticate(keys[0].expose()).unwrap(),
        Auth::Granted(gold)
    );
    assert!(
        matches!(s.authenticate(keys[1].expose()).unwrap(), Auth::Granted(t) if t.name == "silver")
    );
    assert!(
        matches!(s.authenticate(keys[2].expose()).unwrap(), Auth::Disabled(t) if t.name == "bronze")
    );
    // The id counter continues above the largest migrated id.
    let (next, _) = s.create(crate::NewTenant::named("new")).unwrap();
    assert_eq!(next.id.0, silver_id + 1);
    drop(s);

    // Opening again runs no migration and changes nothing. sled's background flusher may hold
    // the file lock for a moment after the drop (seen under load): wait for it, briefly.
    let s = reopen(&path);
    assert_eq!(s.list().unwrap().len(), 4);
    s.check().unwrap();
}

#[test]
fn a_bad_version_0_record_stops_the_migration_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let hash = KeyHash::of("x");
    write_v0(
        &path,
        &[
            ("ok", 1, 1.0, true, &hash),
            ("bad", 2, -3.0, true, &KeyHash::of("y")),
        ],
    );
    let err = TenantStore::open(&path).err().unwrap();
    assert!(
        matches!(&err, TenantError::Migration { from: 0, reason } if reason.contains("bad") && reason.contains("weight")),
        "{err}"
    );
    let db = sled::open(&path).unwrap();
    assert_eq!(stored_version(&db).unwrap(), None);
    assert_eq!(db.open_tree("tenants").unwrap().len(), 2);
    assert!(db
        .open_tree("tenants")
        .unwrap()
        .get("ok")
        .unwrap()
        .is_some());
}

/// Writes a version-1 store by hand, as a version-1 build laid it out: records without
/// `cache_namespace`, both indexes, the counters and `schema_version = 1`.
fn write_v1(path: &Path, tenants: &[(&str, u32, &KeyHash)]) {
    let db = sled::open(path).unwrap();
    let (records, names, keys, meta) = (
        db.open_tree("tenants").unwrap(),
        db.open_tree("tenant_names").unwrap(),
        db.open_tree("key_hashes").unwrap(),
        db.open_tree("meta").unwrap(),
    );
    for &(name, id, hash) in tenants {
        let value = format!(
            r#"{{"tenant":{{"id":{id},"name":"{name}","slo":{{"ttft_ms":2000,"tbt_ms":80}},"weight":3.0,"quotas":{{"requests_per_s":50.0,"burst":100,"tokens_per_min":1000000,"max_concurrent":64,"max_prompt_tokens":8192,"max_output_tokens":2048}},"enabled":true,"created_at_ms":1700000000000}},"key_sha256":"{}"}}"#,
            hash.to_hex()
        );
        records.insert(id.to_be_bytes(), value.as_bytes()).unwrap();
        names.insert(name.as_bytes(), &id.to_be_bytes()).unwrap();
        keys.insert(hash.as_bytes(), &id.to_be_bytes()).unwrap();
    }
    meta.insert("next_id", &10u64.to_be_bytes()).unwrap();
    meta.insert("generation", &7u64.to_be_bytes()).unwrap();
    meta.insert("schema_version", &1u32.to_be_bytes()).unwrap();
    db.flush().unwrap();
}

#[test]
fn a_version_1_store_is_migrated_on_open_and_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let keys: Vec<ApiKey> = (0..2).map(|_| ApiKey::generate().unwrap()).collect();
    let hashes: Vec<KeyHash> = keys.iter().map(ApiKey::hash).collect();
    write_v1(&path, &[("gold", 1, &hashes[0]), ("silver", 4, &hashes[1])]);

    let s = reopen(&path);
    s.check().unwrap();
    assert_eq!(stored_version(&s.db).unwrap(), Some(SCHEMA_VERSION));
    let gold = s.get_by_name("gold").unwrap().unwrap();
    assert_eq!(
        (gold.id, gold.weight, gold.cache_namespace),
        (TenantId(1), 3.0, None)
    );
    assert_eq!(gold.created_at_ms, 1_700_000_000_000);
    assert!(
        matches!(s.authenticate(keys[1].expose()).unwrap(), Auth::Granted(t) if t.name == "silver")
    );
    // The new field is stored from now on.
    let patch = crate::TenantPatch {
        cache_namespace: Some(Some("team-a".into())),
        ..crate::TenantPatch::default()
    };
    s.patch(gold.id, patch).unwrap();
    let (next, _) = s.create(crate::NewTenant::named("new")).unwrap();
    assert_eq!(next.id.0, 10);
    drop(s);
    let s = reopen(&path);
    let gold = s.get_by_name("gold").unwrap().unwrap();
    assert_eq!(gold.cache_namespace.as_deref(), Some("team-a"));
    s.check().unwrap();
}

#[test]
fn a_new_store_starts_at_the_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let s = TenantStore::open(dir.path()).unwrap();
    assert_eq!(stored_version(&s.db).unwrap(), Some(SCHEMA_VERSION));
    assert_eq!(s.generation().unwrap(), 0);
    s.check().unwrap();
}

#[test]
fn a_store_from_a_newer_release_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = sled::open(dir.path()).unwrap();
        let meta = db.open_tree(META).unwrap();
        meta.insert(VERSION_KEY, &(SCHEMA_VERSION + 1).to_be_bytes())
            .unwrap();
        db.flush().unwrap();
    }
    let err = TenantStore::open(dir.path()).err().unwrap();
    assert!(
        matches!(err, TenantError::SchemaTooNew { found, supported } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{err}"
    );
}

/// Opens `path` again after the store on it was dropped, waiting up to 5 s for sled's
/// background thread to release the file lock.
fn reopen(path: &std::path::Path) -> TenantStore {
    let start = std::time::Instant::now();
    loop {
        match TenantStore::open(path) {
            Err(crate::TenantError::Locked { .. })
                if start.elapsed() < std::time::Duration::from_secs(5) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r.unwrap(),
        }
    }
}

#[test]
fn a_version_2_store_gains_the_usage_ledger_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let key = {
        let s = TenantStore::open(&path).unwrap();
        let (_, key) = s.create(crate::NewTenant::named("gold")).unwrap();
        key
    };
    {
        // What a version-2 binary left: no `usage` tree, version 2.
        let db = sled::open(&path).unwrap();
        assert!(db.drop_tree("usage").unwrap());
        let meta = db.open_tree("meta").unwrap();
        meta.insert(VERSION_KEY, &2u32.to_be_bytes()).unwrap();
        db.flush().unwrap();
    }
    let s = reopen(&path);
    s.check().unwrap();
    assert_eq!(stored_version(&s.db).unwrap(), Some(SCHEMA_VERSION));
    let gold = s.get_by_name("gold").unwrap().unwrap();
    assert!(matches!(s.authenticate(key.expose()).unwrap(), Auth::Granted(t) if t.id == gold.id));
    let counts = crate::UsageCounts {
        requests: 1,
        prompt_tokens: 5,
        ..Default::default()
    };
    s.usage().record(gold.id, 0, counts);
    let report = s.usage_report(&crate::UsageQuery::default()).unwrap();
    assert_eq!(report.totals, counts);
}

#[test]
fn a_version_3_ledger_gains_sequences_on_open_and_a_bad_row_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let id = {
        let s = TenantStore::open(&path).unwrap();
        s.create(crate::NewTenant::named("gold")).unwrap().0.id
    };
    // What a version-3 binary left: five counters per row, version 3.
    let v3 = |fields: [u64; 5]| {
        fields
            .iter()
            .flat_map(|f| f.to_be_bytes())
            .collect::<Vec<u8>>()
    };
    let write = |rows: &[(u64, Vec<u8>)]| {
        let db = sled::open(&path).unwrap();
        let usage = db.open_tree("usage").unwrap();
        for (hour, v) in rows {
            usage
                .insert(crate::usage::row_key(id, *hour), v.clone())
                .unwrap();
        }
        let meta = db.open_tree("meta").unwrap();
        meta.insert(VERSION_KEY, &3u32.to_be_bytes()).unwrap();
        db.flush().unwrap();
    };
    // A row of the wrong size stops the migration: nothing is rewritten, the version stays.
    write(&[(7, v3([2, 30, 16, 9, 1])), (8, vec![0; 12])]);
    let err = TenantStore::open(&path).map(|_| ()).unwrap_err();
    assert!(
        matches!(&err, TenantError::Migration { from: 3, reason } if reason.contains("12 bytes")),
        "{err}"
    );
    {
        let db = sled::open(&path).unwrap();
        assert_eq!(stored_version(&db).unwrap(), Some(3));
        let usage = db.open_tree("usage").unwrap();
        assert_eq!(
            usage
                .get(crate::usage::row_key(id, 7))
                .unwrap()
                .unwrap()
                .len(),
            40
        );
        usage.remove(crate::usage::row_key(id, 8)).unwrap();
        db.flush().unwrap();
    }
    let s = reopen(&path);
    s.check().unwrap();
    assert_eq!(stored_version(&s.db).unwrap(), Some(SCHEMA_VERSION));
    let rows = s.usage().rows(&crate::UsageQuery::default()).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].counts,
        crate::UsageCounts {
            requests: 2,
            sequences: 2,
            prompt_tokens: 30,
            cached_tokens: 16,
            completion_tokens: 9,
            errors: 1,
        }
    );
}
