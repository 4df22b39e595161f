use super::*;

fn key<'a>(source: &'a str, arch: &'a str, options: &'a [String]) -> CacheKey<'a> {
    CacheKey {
        name: "block copy",
        source,
        arch,
        options,
        compiler: "13.0",
    }
}

#[test]
fn key_changes_with_source_arch_options_and_compiler() {
    let none: Vec<String> = vec![];
    let opt = vec!["-lineinfo".to_string()];
    let base = key("a", "sm_90", &none);
    assert_eq!(base.hash(), key("a", "sm_90", &none).hash());
    assert_ne!(base.hash(), key("b", "sm_90", &none).hash());
    assert_ne!(base.hash(), key("a", "sm_80", &none).hash());
    assert_ne!(base.hash(), key("a", "sm_90", &opt).hash());
    let newer = CacheKey {
        compiler: "13.1",
        ..base.clone()
    };
    assert_ne!(base.hash(), newer.hash());
}

#[test]
fn file_name_is_safe_and_names_the_arch() {
    let none: Vec<String> = vec![];
    let name = key("x", "sm_90", &none).file_name();
    assert!(name.starts_with("block_copy-sm_90-"), "{name}");
    assert!(name.ends_with(".cubin"));
    assert!(!name.contains('/') && !name.contains(' '));
}

#[test]
fn put_then_get_round_trips_and_misses_other_keys() {
    let dir = std::env::temp_dir().join(format!("superinfer-cache-test-{}", std::process::id()));
    let cache = CompileCache::new(&dir);
    let none: Vec<String> = vec![];
    let k = key("src", "sm_90", &none);
    assert_eq!(cache.get(&k), None);
    cache.put(&k, b"\x7fELF binary").unwrap();
    assert_eq!(cache.get(&k).as_deref(), Some(&b"\x7fELF binary"[..]));
    assert_eq!(cache.get(&key("src2", "sm_90", &none)), None);
    std::fs::remove_dir_all(&dir).unwrap();
}
