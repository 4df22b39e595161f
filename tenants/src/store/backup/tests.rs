use crate::model::NewTenant;
use crate::snapshot::Auth;
use crate::usage::{UsageCounts, UsageQuery};
use crate::TenantStore;
use std::path::Path;

const HOUR_MS: u64 = 3_600_000;

fn counts(prompt: u64) -> UsageCounts {
    UsageCounts {
        requests: 1,
        sequences: 1,
        prompt_tokens: prompt,
        ..UsageCounts::default()
    }
}

/// Overwrites the store's files past their first bytes with `fill`: a crash's torn writes,
/// far worse than one.
fn damage(store: &Path, fill: u8) {
    for entry in std::fs::read_dir(store).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let mut bytes = std::fs::read(&path).unwrap();
            for b in bytes.iter_mut().skip(64) {
                *b = fill;
            }
            std::fs::write(&path, bytes).unwrap();
        }
    }
}

/// A store whose files are damaged past sled's recovery reopens rebuilt from its verified
/// copy: every tenant, key and ledger row as acknowledged; the damaged files kept aside.
#[test]
fn a_damaged_store_is_rebuilt_from_its_verified_copy_without_loss() {
    for fill in [0x00, 0xA5] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let (tenants, keys, rows) = {
            let s = TenantStore::open(&path).unwrap();
            let mut made = Vec::new();
            for name in ["a", "b", "c"] {
                made.push(s.create(NewTenant::named(name)).unwrap());
            }
            let u = s.usage();
            for (i, (t, _)) in made.iter().enumerate() {
                u.record(t.id, 491_000 * HOUR_MS + i as u64, counts(10 + i as u64));
                u.flush().unwrap();
                u.record(t.id, 491_001 * HOUR_MS, counts(5));
            }
            s.flush().unwrap();
            let rows = u.rows(&UsageQuery::default()).unwrap();
            let keys: Vec<String> = made.iter().map(|(_, k)| k.expose().to_string()).collect();
            (s.list().unwrap(), keys, rows)
        };
        damage(&path, fill);
        let s = TenantStore::open(&path).expect("rebuilt from the verified copy");
        assert_eq!(s.list().unwrap(), tenants, "fill {fill:#x}");
        for (k, t) in keys.iter().zip(&tenants) {
            assert!(matches!(s.authenticate(k).unwrap(), Auth::Granted(g) if g.id == t.id));
        }
        assert_eq!(s.usage().rows(&UsageQuery::default()).unwrap(), rows);
        s.check().unwrap();
        // The store serves on: a new write, and another reopen.
        s.create(NewTenant::named("d")).unwrap();
        drop(s);
        let again = TenantStore::open(&path).unwrap();
        assert_eq!(again.list().unwrap().len(), 4);
        let kept = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with("db.corrupt-")
            })
            .count();
        assert_eq!(kept, 1, "the damaged files are kept aside, once");
    }
}

/// The ledger log holds every batch before it is flushed: a tree behind it (a batch logged
/// before a crash kept it from the disk) is raised to it at open, and a torn last batch is
/// one that never became durable.
#[test]
fn the_ledger_log_raises_a_tree_behind_it_and_skips_a_torn_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let backup = super::dir_of(&path);
    let id = {
        let s = TenantStore::open(&path).unwrap();
        let (t, _) = s.create(NewTenant::named("a")).unwrap();
        s.usage().record(t.id, 7 * HOUR_MS, counts(10));
        s.flush().unwrap();
        t.id
    };
    // A batch in the log that never reached the tree, then half of another.
    let mut batch = std::collections::HashMap::new();
    batch.insert((id, 7), counts(3));
    crate::usage::journal::append_ledger(&backup, &batch).unwrap();
    let log = backup.join(crate::usage::journal::LEDGER);
    let whole = std::fs::read(&log).unwrap();
    crate::usage::journal::append_ledger(&backup, &batch).unwrap();
    let mut torn = std::fs::read(&log).unwrap();
    torn.truncate(whole.len() + 10);
    std::fs::write(&log, torn).unwrap();
    let s = TenantStore::open(&path).unwrap();
    let rows = s.usage().rows(&UsageQuery::default()).unwrap();
    assert_eq!(rows.len(), 1);
    let want = UsageCounts {
        requests: 2,
        sequences: 2,
        prompt_tokens: 13,
        ..UsageCounts::default()
    };
    assert_eq!(rows[0].counts, want);
}
