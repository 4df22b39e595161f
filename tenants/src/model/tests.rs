use super::*;
use crate::error::TenantError;

fn field_of(r: Result<ValidNewTenant>) -> &'static str {
    match r {
        Err(TenantError::Invalid { field, .. }) => field,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

#[test]
fn defaults_are_valid() {
    let v = NewTenant::named("acme").validate().unwrap();
    assert_eq!(v.get().weight, 1.0);
    assert!(v.get().enabled);
    assert_eq!(v.get().slo, Slo::default());
}

#[test]
fn names_are_checked() {
    for ok in [
        "a",
        "acme-corp_1.prod",
        "1a",
        "1.0",
        "a..b",
        "a-",
        &"x".repeat(MAX_NAME_CHARS),
    ] {
        NewTenant::named(ok).validate().unwrap();
    }
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "-flag",
        "_x",
        "has space",
        "slash/",
        "ünï",
        "semi;colon",
        "1",
        "007",
        "99999999999",
        &"x".repeat(65),
    ] {
        assert_eq!(
            field_of(NewTenant::named(bad).validate()),
            "name",
            "{bad:?}"
        );
    }
    let msg = NewTenant::named("a b").validate().unwrap_err().to_string();
    assert!(msg.contains("`name`") && msg.contains("' '"), "{msg}");
    let msg = NewTenant::named("..").validate().unwrap_err().to_string();
    assert!(
        msg.contains("`name`") && msg.contains("letter or a digit"),
        "{msg}"
    );
}

#[test]
fn dot_names_are_refused_by_the_store_on_create_and_patch() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::TenantStore::open(dir.path()).unwrap();
    let (acme, _) = store.create(NewTenant::named("acme")).unwrap();
    for bad in [".", ".."] {
        let invalid = |r: Result<Tenant>| match r {
            Err(TenantError::Invalid { field, .. }) => field,
            other => panic!("{bad:?}: expected a validation error, got {other:?}"),
        };
        assert_eq!(
            invalid(store.create(NewTenant::named(bad)).map(|(t, _)| t)),
            "name"
        );
        let rename = TenantPatch {
            name: Some(bad.into()),
            ..TenantPatch::default()
        };
        assert_eq!(invalid(store.patch(acme.id, rename)), "name");
        let shared = NewTenant {
            cache_namespace: Some(bad.into()),
            ..NewTenant::named("beta")
        };
        assert_eq!(
            invalid(store.create(shared).map(|(t, _)| t)),
            "cache_namespace"
        );
    }
    let names: Vec<String> = store.list().unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["acme"]);
}

#[test]
fn weight_is_finite_and_within_its_range() {
    for bad in [
        0.0,
        -1.0,
        f64::NAN,
        f64::INFINITY,
        1e-30,
        1e30,
        MIN_WEIGHT / 2.0,
        MAX_WEIGHT * 1.5,
    ] {
        let mut t = NewTenant::named("a");
        t.weight = bad;
        assert_eq!(field_of(t.validate()), "weight", "{bad}");
    }
    let msg = NewTenant {
        weight: 1e-30,
        ..NewTenant::named("a")
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("1e-30") && msg.contains("[0.01, 100]"),
        "{msg}"
    );
    for ok in [MIN_WEIGHT, 1.0, MAX_WEIGHT] {
        let mut t = NewTenant::named("a");
        t.weight = ok;
        t.validate().unwrap();
    }
    let base = NewTenant::named("a")
        .validate()
        .unwrap()
        .into_tenant(TenantId(1), 0);
    let patch = TenantPatch {
        weight: Some(1e30),
        ..TenantPatch::default()
    };
    assert!(matches!(
        patch.apply(&base),
        Err(TenantError::Invalid {
            field: "weight",
            ..
        })
    ));
}

#[test]
fn slos_must_be_positive_and_plausible() {
    let mut t = NewTenant::named("a");
    t.slo.ttft_ms = 0;
    assert_eq!(field_of(t.validate()), "slo.ttft_ms");
    let mut t = NewTenant::named("a");
    t.slo.tbt_ms = 0;
    assert_eq!(field_of(t.validate()), "slo.tbt_ms");
    let mut t = NewTenant::named("a");
    t.slo.tbt_ms = MAX_TBT_MS + 1;
    assert_eq!(field_of(t.validate()), "slo.tbt_ms");
}

#[test]
fn quotas_are_checked_field_by_field() {
    type Breaker = fn(&mut Quotas);
    let cases: [(Breaker, &str); 7] = [
        (|q| q.requests_per_s = 0.0, "quotas.requests_per_s"),
        (|q| q.requests_per_s = f64::NAN, "quotas.requests_per_s"),
        (|q| q.burst = 0, "quotas.burst"),
        (|q| q.tokens_per_min = 0, "quotas.tokens_per_min"),
        (|q| q.max_concurrent = 0, "quotas.max_concurrent"),
        (|q| q.max_prompt_tokens = 0, "quotas.max_prompt_tokens"),
        (|q| q.max_output_tokens = 0, "quotas.max_output_tokens"),
    ];
    for (break_it, field) in cases {
        let mut t = NewTenant::named("a");
        break_it(&mut t.quotas);
        assert_eq!(field_of(t.validate()), field);
    }
}

#[test]
fn new_tenant_json_takes_defaults_and_rejects_unknown_fields() {
    let t: NewTenant = serde_json::from_str(r#"{"name":"acme","slo":{"tbt_ms":50}}"#).unwrap();
    assert_eq!(t.slo.tbt_ms, 50);
    assert_eq!(t.slo.ttft_ms, Slo::default().ttft_ms);
    assert_eq!(t.quotas, Quotas::default());
    let err = serde_json::from_str::<NewTenant>(r#"{"name":"a","priority":9}"#).unwrap_err();
    assert!(err.to_string().contains("priority"), "{err}");
}

fn tenant() -> Tenant {
    NewTenant::named("acme")
        .validate()
        .unwrap()
        .into_tenant(TenantId(3), 1234)
}

#[test]
fn patch_changes_only_given_fields() {
    let before = tenant();
    let patch: TenantPatch =
        serde_json::from_str(r#"{"slo":{"ttft_ms":800},"quotas":{"burst":5},"enabled":false}"#)
            .unwrap();
    let after = patch.apply(&before).unwrap();
    assert_eq!(after.slo.ttft_ms, 800);
    assert_eq!(after.slo.tbt_ms, before.slo.tbt_ms);
    assert_eq!(after.quotas.burst, 5);
    assert_eq!(after.quotas.max_concurrent, before.quotas.max_concurrent);
    assert!(!after.enabled);
    assert_eq!(
        (after.id, after.created_at_ms, &after.name),
        (before.id, 1234, &before.name)
    );
    assert!(TenantPatch::default().is_empty());
    assert_eq!(TenantPatch::default().apply(&before).unwrap(), before);
}

#[test]
fn patch_is_validated() {
    let t = tenant();
    let bad = TenantPatch {
        weight: Some(-2.0),
        ..TenantPatch::default()
    };
    assert!(matches!(
        bad.apply(&t),
        Err(TenantError::Invalid {
            field: "weight",
            ..
        })
    ));
    let bad = TenantPatch {
        name: Some(String::new()),
        ..TenantPatch::default()
    };
    assert!(matches!(
        bad.apply(&t),
        Err(TenantError::Invalid { field: "name", .. })
    ));
    let bad = TenantPatch {
        quotas: Some(QuotasPatch {
            max_concurrent: Some(0),
            ..QuotasPatch::default()
        }),
        ..TenantPatch::default()
    };
    assert!(matches!(
        bad.apply(&t),
        Err(TenantError::Invalid {
            field: "quotas.max_concurrent",
            ..
        })
    ));
}

#[test]
fn slo_converts_to_seconds() {
    let s = Slo {
        ttft_ms: 1500,
        tbt_ms: 40,
        queue_deadline_ms: Some(6000),
    };
    assert_eq!((s.ttft_s(), s.tbt_s()), (1.5, 0.04));
    assert_eq!(s.queue_deadline_s(), Some(6.0));
}

#[test]
fn a_queue_deadline_is_optional_at_least_the_ttft_target_and_cleared_by_zero() {
    let t = tenant();
    assert_eq!(t.slo.queue_deadline_ms, None);
    let patch = |ms: u32| TenantPatch {
        slo: Some(SloPatch {
            queue_deadline_ms: Some(ms),
            ..SloPatch::default()
        }),
        ..TenantPatch::default()
    };
    let set = patch(20_000).apply(&t).unwrap();
    assert_eq!(set.slo.queue_deadline_ms, Some(20_000));
    assert!(matches!(
        patch(1_000).apply(&t),
        Err(TenantError::Invalid {
            field: "slo.queue_deadline_ms",
            ..
        })
    ));
    assert_eq!(patch(0).apply(&set).unwrap().slo.queue_deadline_ms, None);
    // Records written before the field existed read as `None`, and `None` is not written.
    let json = serde_json::to_string(&t.slo).unwrap();
    assert!(!json.contains("queue_deadline_ms"), "{json}");
    let old: Slo = serde_json::from_str(r#"{"ttft_ms": 900, "tbt_ms": 50}"#).unwrap();
    assert_eq!(old.queue_deadline_ms, None);
}

#[test]
fn cache_namespace_is_optional_validated_and_patched_as_set_clear_or_keep() {
    let t = tenant();
    assert_eq!(t.cache_namespace, None);
    for bad in [
        "",
        "has space",
        "sl/ash",
        &"x".repeat(MAX_CACHE_NAMESPACE_CHARS + 1),
    ] {
        let n = NewTenant {
            cache_namespace: Some(bad.to_string()),
            ..NewTenant::named("acme")
        };
        let e = n.validate().unwrap_err().to_string();
        assert!(e.contains("`cache_namespace`"), "{bad:?}: {e}");
    }
    let set: TenantPatch = serde_json::from_str(r#"{"cache_namespace": "team-a"}"#).unwrap();
    let shared = set.apply(&t).unwrap();
    assert_eq!(shared.cache_namespace.as_deref(), Some("team-a"));
    let keep: TenantPatch = serde_json::from_str(r#"{"weight": 2}"#).unwrap();
    assert_eq!(
        keep.apply(&shared).unwrap().cache_namespace.as_deref(),
        Some("team-a")
    );
    let clear: TenantPatch = serde_json::from_str(r#"{"cache_namespace": null}"#).unwrap();
    assert!(!clear.is_empty());
    assert_eq!(clear.apply(&shared).unwrap().cache_namespace, None);
    let bad: TenantPatch = serde_json::from_str(r#"{"cache_namespace": "a b"}"#).unwrap();
    assert!(bad
        .apply(&t)
        .unwrap_err()
        .to_string()
        .contains("cache_namespace"));
    assert!(serde_json::from_str::<TenantPatch>(r#"{"cache_namespace": 3}"#).is_err());
}
