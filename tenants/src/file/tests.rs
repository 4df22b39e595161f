use super::TenantsFile;
use crate::error::TenantError;
use crate::key::KeyHash;
use crate::store::TenantStore;

const KEY_A: &str = "sk-si-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const KEY_B: &str = "sk-si-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn env(var: &str) -> Option<String> {
    (var == "KEY_B").then(|| KEY_B.to_string())
}

fn parse(text: &str) -> Result<TenantsFile, TenantError> {
    TenantsFile::parse("t.toml", text, env)
}

fn two() -> String {
    format!(
        "[[tenant]]\nname = \"a\"\napi_key_sha256 = \"{}\"\nweight = 2\nttft_ms = 2000\n\
         max_concurrent = 3\n\n[[tenant]]\nname = \"b\"\napi_key_env = \"KEY_B\"\n",
        KeyHash::of(KEY_A).to_hex()
    )
}

fn message(r: Result<TenantsFile, TenantError>) -> String {
    r.expect_err("the file is refused").to_string()
}

#[test]
fn keys_are_flag_names_and_defaults_fill_the_rest() {
    let f = parse(&two()).expect("a valid file");
    let a = f.tenants[0].new.get();
    assert_eq!((a.weight, a.slo.ttft_ms, a.slo.tbt_ms), (2.0, 2000, 100));
    assert_eq!(a.quotas.max_concurrent, 3);
    assert_eq!(f.tenants[0].key, KeyHash::of(KEY_A));
    assert_eq!(f.tenants[1].key, KeyHash::of(KEY_B));
    assert_eq!(f.names().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn plain_keys_are_refused() {
    let m = message(parse(&format!(
        "[[tenant]]\nname = \"a\"\napi_key = \"{KEY_A}\"\n"
    )));
    assert!(m.contains("plain-text API key"), "{m}");
    let m = message(parse(&format!(
        "[[tenant]]\nname = \"a\"\napi_key_sha256 = \"{KEY_A}\"\n"
    )));
    assert!(m.contains("holds a key, not its hash"), "{m}");
    let m = message(parse(&format!(
        "[[tenant]]\nname = \"a\"\napi_key_env = \"{KEY_A}\"\n"
    )));
    assert!(m.contains("not a variable name"), "{m}");
}

#[test]
fn bad_entries_are_refused_with_the_reason() {
    let cases = [
        (format!("{}[[tenant]]\nname = \"a\"\napi_key_sha256 = \"{}\"\n", two(), "c".repeat(64)), "named twice"),
        ("[[tenant]]\nname = \"a\"\napi_key_env = \"NOPE\"\n".into(), "`NOPE` is not set"),
        ("[[tenant]]\nname = \"a\"\napi_key_sha256 = \"abc\"\n".into(), "64 hex digits"),
        ("[[tenant]]\nname = \"a\"\n".into(), "needs `api_key_sha256` or `api_key_env`"),
        (format!("[[tenant]]\nname = \"a\"\napi_key_env = \"KEY_B\"\n[[tenant]]\nname = \"c\"\napi_key_sha256 = \"{}\"\n", KeyHash::of(KEY_B).to_hex()), "same API key"),
        ("[[tenant]]\nname = \"a\"\napi_key_env = \"KEY_B\"\nmax_concurrent = 0\n".into(), "invalid `max_concurrent`"),
        ("[[tenant]]\nname = \"a b\"\napi_key_env = \"KEY_B\"\n".into(), "invalid `name`"),
        ("[[tenant]]\nname = \"a\"\napi_key_env = \"KEY_B\"\nwieght = 2\n".into(), "unknown field `wieght`"),
        ("".into(), "missing field `tenant`"),
    ];
    for (text, want) in cases {
        let m = message(parse(&text));
        assert!(m.contains(want), "{want:?} not in {m:?}");
        assert!(m.starts_with("tenants file t.toml: "), "{m}");
    }
}

fn store() -> (tempfile::TempDir, TenantStore) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = TenantStore::open(dir.path().join("t")).expect("the store opens");
    (dir, store)
}

#[test]
fn applying_twice_changes_nothing() {
    let (_d, store) = store();
    let f = parse(&two()).expect("a valid file");
    let r = store.apply(&f, false).expect("the first apply");
    assert_eq!(
        (r.created.len(), r.to_string().as_str()),
        (2, "2 created, 0 updated, 0 unchanged, 0 removed")
    );
    let generation = store.generation().expect("a generation");
    let before = store.list().expect("a list");
    let r = store.apply(&f, true).expect("the second apply");
    assert_eq!(r.unchanged, ["a", "b"]);
    assert!(!r.changed());
    assert_eq!(store.generation().expect("a generation"), generation);
    assert_eq!(store.list().expect("a list"), before);
    store.check().expect("a consistent store");
}

#[test]
fn keys_from_the_file_authenticate_and_changes_update() {
    let (_d, store) = store();
    store
        .apply(&parse(&two()).expect("valid"), false)
        .expect("applied");
    let a = store
        .authenticate(KEY_A)
        .expect("a lookup")
        .granted()
        .expect("key a works");
    assert_eq!((a.name.as_str(), a.weight), ("a", 2.0));
    assert!(store
        .authenticate(KEY_B)
        .expect("a lookup")
        .granted()
        .is_some());
    // Swap the keys and drop a's weight back to its default, in one apply.
    let swapped = format!(
        "[[tenant]]\nname = \"a\"\napi_key_env = \"KEY_B\"\n\n[[tenant]]\nname = \"b\"\napi_key_sha256 = \"{}\"\n",
        KeyHash::of(KEY_A).to_hex()
    );
    let r = store
        .apply(&parse(&swapped).expect("valid"), false)
        .expect("applied");
    assert_eq!(r.updated, ["a", "b"]);
    let a2 = store
        .authenticate(KEY_B)
        .expect("a lookup")
        .granted()
        .expect("key b is a's now");
    assert_eq!(
        (a2.id, a2.name.as_str(), a2.weight, a2.created_at_ms),
        (a.id, "a", 1.0, a.created_at_ms)
    );
    store.check().expect("a consistent store");
}

#[test]
fn prune_removes_only_the_unnamed() {
    let (_d, store) = store();
    let (extra, extra_key) = store
        .create(crate::NewTenant::named("extra"))
        .expect("created");
    store
        .apply(&parse(&two()).expect("valid"), false)
        .expect("applied");
    assert_eq!(
        store.list().expect("a list").len(),
        3,
        "without --prune nothing is removed"
    );
    let only_a = format!(
        "[[tenant]]\nname = \"a\"\napi_key_sha256 = \"{}\"\nweight = 2\nttft_ms = 2000\nmax_concurrent = 3\n",
        KeyHash::of(KEY_A).to_hex()
    );
    let r = store
        .apply(&parse(&only_a).expect("valid"), true)
        .expect("applied");
    assert_eq!(
        (r.unchanged, r.removed),
        (
            vec!["a".to_string()],
            vec!["extra".to_string(), "b".to_string()]
        )
    );
    let names: Vec<String> = store
        .list()
        .expect("a list")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["a"]);
    assert!(store.get(extra.id).expect("a read").is_none());
    assert!(store
        .authenticate(extra_key.expose())
        .expect("a lookup")
        .granted()
        .is_none());
    assert!(store
        .authenticate(KEY_B)
        .expect("a lookup")
        .granted()
        .is_none());
    store.check().expect("a consistent store");
}

#[test]
fn a_key_held_by_a_tenant_that_keeps_it_is_refused_and_nothing_changes() {
    let (_d, store) = store();
    store
        .apply(&parse(&two()).expect("valid"), false)
        .expect("applied");
    let before = store.list().expect("a list");
    let steal = format!(
        "[[tenant]]\nname = \"c\"\napi_key_sha256 = \"{}\"\n",
        KeyHash::of(KEY_A).to_hex()
    );
    let m = store
        .apply(&parse(&steal).expect("valid on its own"), false)
        .expect_err("a's key is a's")
        .to_string();
    assert!(m.contains("already the key of tenant"), "{m}");
    assert_eq!(store.list().expect("a list"), before);
}
