use super::*;
use crate::model::{QuotasPatch, SloPatch};
use std::time::Duration;

fn store() -> (tempfile::TempDir, TenantStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = TenantStore::open(dir.path().join("db")).unwrap();
    (dir, store)
}

fn new(name: &str) -> NewTenant {
    NewTenant::named(name)
}

#[test]
fn create_get_list() {
    let (_dir, s) = store();
    let (a, key_a) = s.create(new("alpha")).unwrap();
    let (b, _) = s.create(new("beta")).unwrap();
    assert_eq!((a.id, b.id), (TenantId(1), TenantId(2)));
    assert!(a.created_at_ms > 1_600_000_000_000, "{}", a.created_at_ms);
    assert!(crate::key::is_well_formed(key_a.expose()));
    assert_eq!(s.get(a.id).unwrap(), Some(a.clone()));
    assert_eq!(s.get(TenantId(99)).unwrap(), None);
    assert_eq!(s.get_by_name("beta").unwrap(), Some(b.clone()));
    assert_eq!(s.get_by_name("gamma").unwrap(), None);
    assert_eq!(s.list().unwrap(), vec![a, b]);
    s.check().unwrap();
}

#[test]
fn create_rejects_invalid_input_and_taken_names() {
    let (_dir, s) = store();
    s.create(new("alpha")).unwrap();
    assert!(matches!(
        s.create(new("alpha")),
        Err(TenantError::NameTaken(n)) if n == "alpha"
    ));
    assert!(matches!(
        s.create(new("bad name")),
        Err(TenantError::Invalid { field: "name", .. })
    ));
    // Names are case-sensitive.
    s.create(new("Alpha")).unwrap();
    assert_eq!(s.list().unwrap().len(), 2);
    // A failed create consumes no id.
    let (c, _) = s.create(new("gamma")).unwrap();
    assert_eq!(c.id, TenantId(3));
    s.check().unwrap();
}

#[test]
fn patch_updates_fields_and_renames_uniquely() {
    let (_dir, s) = store();
    let (a, key) = s.create(new("alpha")).unwrap();
    s.create(new("beta")).unwrap();
    let patched = s
        .patch(
            a.id,
            TenantPatch {
                name: Some("alpha2".into()),
                weight: Some(3.5),
                slo: Some(SloPatch {
                    ttft_ms: Some(900),
                    ..SloPatch::default()
                }),
                quotas: Some(QuotasPatch {
                    tokens_per_min: Some(42),
                    ..QuotasPatch::default()
                }),
                enabled: None,
                cache_namespace: None,
            },
        )
        .unwrap();
    assert_eq!(patched.name, "alpha2");
    assert_eq!((patched.weight, patched.slo.ttft_ms), (3.5, 900));
    assert_eq!(patched.quotas.tokens_per_min, 42);
    assert_eq!(s.get(a.id).unwrap(), Some(patched.clone()));
    assert_eq!(s.get_by_name("alpha").unwrap(), None);
    assert_eq!(s.get_by_name("alpha2").unwrap(), Some(patched));
    // The key survives a rename.
    assert!(matches!(s.authenticate(key.expose()).unwrap(), Auth::Granted(t) if t.id == a.id));

    let rename_to_taken = TenantPatch {
        name: Some("beta".into()),
        ..TenantPatch::default()
    };
    assert!(matches!(
        s.patch(a.id, rename_to_taken),
        Err(TenantError::NameTaken(_))
    ));
    let invalid = TenantPatch {
        weight: Some(0.0),
        ..TenantPatch::default()
    };
    assert!(matches!(
        s.patch(a.id, invalid),
        Err(TenantError::Invalid { .. })
    ));
    assert!(matches!(
        s.patch(TenantId(77), TenantPatch::default()),
        Err(TenantError::NotFound(TenantId(77)))
    ));
    assert_eq!(s.get(a.id).unwrap().unwrap().weight, 3.5);
    s.check().unwrap();
}

#[test]
fn delete_removes_tenant_name_and_key_and_ids_are_not_reused() {
    let (_dir, s) = store();
    let (a, key) = s.create(new("alpha")).unwrap();
    assert_eq!(s.delete(a.id).unwrap(), a);
    assert_eq!(s.get(a.id).unwrap(), None);
    assert_eq!(s.authenticate(key.expose()).unwrap(), Auth::Denied);
    assert!(matches!(s.delete(a.id), Err(TenantError::NotFound(_))));
    let (again, _) = s.create(new("alpha")).unwrap();
    assert_eq!(again.id, TenantId(2));
    s.check().unwrap();
}

#[test]
fn authenticate_good_wrong_rotated_and_disabled() {
    let (_dir, s) = store();
    let (a, key) = s.create(new("alpha")).unwrap();
    let (_b, key_b) = s.create(new("beta")).unwrap();
    assert_eq!(
        s.authenticate(key.expose()).unwrap(),
        Auth::Granted(a.clone())
    );

    // Wrong keys: well-formed but unknown, one digit off, malformed, empty.
    let mut off = key.expose().to_string();
    let last = if off.ends_with('0') { "1" } else { "0" };
    off.replace_range(off.len() - 1.., last);
    for wrong in [
        off.as_str(),
        "sk-si-",
        "",
        "Bearer x",
        &key.expose().to_uppercase(),
    ] {
        assert_eq!(s.authenticate(wrong).unwrap(), Auth::Denied, "{wrong:?}");
    }

    let new_key = s.rotate_key(a.id).unwrap();
    assert_ne!(new_key, key);
    assert_eq!(s.authenticate(key.expose()).unwrap(), Auth::Denied);
    assert_eq!(
        s.authenticate(new_key.expose()).unwrap(),
        Auth::Granted(a.clone())
    );
    assert!(
        matches!(s.authenticate(key_b.expose()).unwrap(), Auth::Granted(t) if t.name == "beta")
    );
    assert!(matches!(
        s.rotate_key(TenantId(9)),
        Err(TenantError::NotFound(_))
    ));

    let disable = TenantPatch {
        enabled: Some(false),
        ..TenantPatch::default()
    };
    let disabled = s.patch(a.id, disable).unwrap();
    assert_eq!(
        s.authenticate(new_key.expose()).unwrap(),
        Auth::Disabled(disabled)
    );
    assert_eq!(s.authenticate(new_key.expose()).unwrap().granted(), None);
    s.check().unwrap();
}

#[test]
fn everything_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (a, key, rotated, generation) = {
        let s = TenantStore::open(&path).unwrap();
        let (a, key) = s.create(new("alpha")).unwrap();
        let (b, _) = s.create(new("beta")).unwrap();
        let rotated = s.rotate_key(b.id).unwrap();
        let a = s
            .patch(
                a.id,
                TenantPatch {
                    weight: Some(2.0),
                    ..TenantPatch::default()
                },
            )
            .unwrap();
        (a, key, rotated, s.generation().unwrap())
    };
    let s = TenantStore::open(&path).unwrap();
    assert_eq!(s.generation().unwrap(), generation);
    assert_eq!(s.get(a.id).unwrap(), Some(a.clone()));
    assert_eq!(s.authenticate(key.expose()).unwrap(), Auth::Granted(a));
    assert!(
        matches!(s.authenticate(rotated.expose()).unwrap(), Auth::Granted(t) if t.name == "beta")
    );
    // The counter persisted too: the next id follows the last one.
    assert_eq!(s.create(new("gamma")).unwrap().0.id, TenantId(3));
    s.check().unwrap();
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let (dir, _s) = store();
    let err = TenantStore::open(dir.path().join("db")).err().unwrap();
    assert!(matches!(err, TenantError::Locked { .. }), "{err}");
}

#[test]
fn open_existing_creates_nothing_where_no_store_is() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for path in [&typo, &empty] {
        assert!(!TenantStore::exists(path));
        assert!(matches!(
            TenantStore::open_existing(path),
            Err(TenantError::NoStore { .. })
        ));
    }
    assert!(!typo.exists(), "nothing was created");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);

    let real = dir.path().join("real");
    let s = TenantStore::open(&real).unwrap();
    s.create(new("alpha")).unwrap();
    drop(s);
    assert!(TenantStore::exists(&real));
    let s = TenantStore::open_existing(&real).unwrap();
    assert_eq!(s.list().unwrap().len(), 1);
}

#[test]
fn snapshot_authenticates_in_memory() {
    let (_dir, s) = store();
    let (a, key_a) = s.create(new("alpha")).unwrap();
    let (b, key_b) = s.create(new("beta")).unwrap();
    s.patch(
        b.id,
        TenantPatch {
            enabled: Some(false),
            ..TenantPatch::default()
        },
    )
    .unwrap();
    let snap = s.snapshot().unwrap();
    assert_eq!(snap.generation(), s.generation().unwrap());
    assert_eq!(snap.len(), 2);
    assert_eq!(snap.get(a.id), Some(&a));
    assert_eq!(snap.authenticate(key_a.expose()), Auth::Granted(&a));
    assert!(matches!(snap.authenticate(key_b.expose()), Auth::Disabled(t) if t.id == b.id));
    assert_eq!(snap.authenticate("sk-si-nope"), Auth::Denied);
    s.rotate_key(a.id).unwrap();
    let fresh = s.snapshot().unwrap();
    assert!(fresh.generation() > snap.generation());
    assert_eq!(fresh.authenticate(key_a.expose()), Auth::Denied);
    assert!(Snapshot::default().is_empty());
}

#[test]
fn every_write_bumps_the_generation_and_notifies_subscribers() {
    let (_dir, s) = store();
    let mut sub = s.subscribe();
    let g0 = s.generation().unwrap();
    let (a, _) = s.create(new("alpha")).unwrap();
    s.rotate_key(a.id).unwrap();
    s.patch(a.id, TenantPatch::default()).unwrap();
    s.delete(a.id).unwrap();
    assert_eq!(s.generation().unwrap(), g0 + 4);
    for _ in 0..4 {
        sub.next_timeout(Duration::from_secs(5)).unwrap();
    }
    // A write that fails changes nothing and tells no one.
    assert!(s.delete(a.id).is_err());
    assert_eq!(s.generation().unwrap(), g0 + 4);
    assert!(sub.next_timeout(Duration::from_millis(50)).is_err());
}

#[test]
fn check_reports_a_dangling_key_index_entry() {
    let (_dir, s) = store();
    let (a, _) = s.create(new("alpha")).unwrap();
    s.check().unwrap();
    s.trees.keys.insert([7u8; 32], &id_key(a.id)).unwrap();
    let err = s.check().unwrap_err().to_string();
    assert!(err.contains("key hash index"), "{err}");
    s.trees.keys.remove([7u8; 32]).unwrap();
    s.trees.names.remove("alpha").unwrap();
    let err = s.check().unwrap_err().to_string();
    assert!(err.contains("name index covers 0 of 1"), "{err}");
}

#[test]
fn concurrent_creates_get_distinct_ids_and_unique_names() {
    let (_dir, s) = store();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                (0..10)
                    .filter(|i| s.create(new(&format!("n{}", (t + i) % 12))).is_ok())
                    .count()
            })
        })
        .collect();
    let created: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(created, 12);
    assert_eq!(s.list().unwrap().len(), 12);
    s.check().unwrap();
}
