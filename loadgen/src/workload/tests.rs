use super::*;

fn tenant(name: &str, arrivals: ArrivalSpec) -> TenantSpec {
    TenantSpec::new(name, LengthSpec::Sharegpt, arrivals)
}

fn two_tenants() -> Vec<TenantSpec> {
    vec![
        tenant(
            "gold",
            ArrivalSpec::Hawkes {
                baseline_rps: 4.0,
                excitation: 0.5,
                decay_per_s: 2.0,
            },
        ),
        TenantSpec {
            dataset: LengthSpec::Lmsys,
            ..tenant("bronze", ArrivalSpec::Poisson { rps: 8.0 })
        },
    ]
}

#[test]
fn requests_are_sorted_with_ids_in_arrival_order() {
    let r = generate(&two_tenants(), 300.0, 42).unwrap();
    assert!(r.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
    assert!(r.iter().enumerate().all(|(i, q)| q.id == i as u64));
    assert!(r.iter().all(|q| q.tenant < 2 && q.arrival_s < 300.0));
    assert!(r
        .iter()
        .all(|q| q.prompt_tokens >= 1 && q.output_tokens >= 1));
}

#[test]
fn each_tenant_gets_its_own_rate() {
    let d = 2_000.0;
    let r = generate(&two_tenants(), d, 1).unwrap();
    for (index, want) in [(0, 8.0), (1, 8.0)] {
        let got = r.iter().filter(|q| q.tenant == index).count() as f64 / d;
        assert!(
            (got - want).abs() < 0.05 * want,
            "tenant {index}: {got} rps"
        );
    }
}

#[test]
fn same_seed_same_requests_other_seed_other_requests() {
    let t = two_tenants();
    let a = generate(&t, 60.0, 42).unwrap();
    assert_eq!(a, generate(&t, 60.0, 42).unwrap());
    assert_ne!(a, generate(&t, 60.0, 43).unwrap());
}

#[test]
fn a_tenant_keeps_its_requests_when_others_change() {
    let t = two_tenants();
    let both = generate(&t, 60.0, 42).unwrap();
    let alone = generate(&t[1..], 60.0, 42).unwrap();
    let bronze: Vec<_> = both
        .iter()
        .filter(|q| q.tenant == 1)
        .map(|q| (q.arrival_s, q.prompt_tokens, q.output_tokens))
        .collect();
    let alone: Vec<_> = alone
        .iter()
        .map(|q| (q.arrival_s, q.prompt_tokens, q.output_tokens))
        .collect();
    assert_eq!(bronze, alone);
}

#[test]
fn changing_the_dataset_does_not_move_arrivals() {
    let mut t = two_tenants();
    let a = generate(&t, 60.0, 5).unwrap();
    t[0].dataset = LengthSpec::Fixed {
        prompt: 10,
        output: 10,
    };
    let b = generate(&t, 60.0, 5).unwrap();
    let times = |r: &[RequestSpec]| r.iter().map(|q| q.arrival_s).collect::<Vec<_>>();
    assert_eq!(times(&a), times(&b));
}

#[test]
fn invalid_workloads_are_rejected() {
    assert!(matches!(generate(&[], 10.0, 0), Err(Error::NoTenants)));
    assert!(matches!(
        generate(&two_tenants(), 0.0, 0),
        Err(Error::Duration(_))
    ));
    let mut t = two_tenants();
    t[1].dataset = LengthSpec::Fixed {
        prompt: 0,
        output: 3,
    };
    let e = generate(&t, 10.0, 0).unwrap_err().to_string();
    assert!(e.contains("'bronze'"), "{e}");
}
