use super::*;

#[test]
fn generated_keys_are_well_formed_and_distinct() {
    let a = ApiKey::generate().unwrap();
    let b = ApiKey::generate().unwrap();
    assert!(is_well_formed(a.expose()), "{}", a.expose());
    assert!(a.expose().starts_with("sk-si-"));
    assert_eq!(a.expose().len(), 6 + 64);
    assert_ne!(a, b);
    assert_ne!(a.hash(), b.hash());
}

#[test]
fn debug_does_not_leak_the_secret() {
    let k = ApiKey::generate().unwrap();
    let shown = format!("{k:?}");
    assert!(!shown.contains(&k.expose()[6..]), "{shown}");
}

#[test]
fn hash_is_sha256_and_round_trips_through_hex() {
    // SHA-256("abc"), FIPS 180-2 appendix B.1.
    let h = KeyHash::of("abc");
    assert_eq!(
        h.to_hex(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(KeyHash::from_hex(&h.to_hex()), Some(h));
    assert_eq!(KeyHash::from_hex("zz"), None);
    assert_eq!(KeyHash::from_hex(&"g".repeat(64)), None);
    assert_eq!(KeyHash::from_slice(&[0u8; 31]), None);
}

#[test]
fn malformed_keys_are_recognised() {
    let good = ApiKey::generate().unwrap();
    let s = good.expose();
    assert!(!is_well_formed(""));
    assert!(!is_well_formed(&s[..s.len() - 1]));
    assert!(!is_well_formed(&s.to_uppercase()));
    assert!(!is_well_formed(&format!("sk-xx-{}", &s[6..])));
    assert!(!is_well_formed(&format!("{s}0")));
    // A multi-byte character where a hex digit belongs must not panic on slicing.
    assert!(!is_well_formed(&format!("{}é{}", &s[..10], &s[12..])));
}
