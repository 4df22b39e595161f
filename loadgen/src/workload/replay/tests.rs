use super::*;
use crate::workload::{ArrivalSpec, LengthSpec, TraceBlocks};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/traces")
        .join(name)
}

fn tenants(names: &[&str]) -> Vec<TenantSpec> {
    names
        .iter()
        .map(|n| TenantSpec::new(*n, LengthSpec::Replay, ArrivalSpec::replay()))
        .collect()
}

fn replay(spec: &ReplaySpec, names: &[&str], rate: f64, cap: Option<u32>) -> Replay {
    let file = spec.read(Path::new("")).unwrap();
    build(spec, &file, &tenants(names), rate, cap).unwrap()
}

#[test]
fn every_row_is_one_request_in_order_at_its_scaled_time() {
    let spec = ReplaySpec::new(fixture("azure-2024.csv"));
    let r = replay(&spec, &["a"], 1.0, None);
    let got: Vec<(f64, u32, u32)> = r
        .requests
        .iter()
        .map(|q| (q.arrival_s, q.prompt_tokens, q.output_tokens))
        .collect();
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].1, got[0].2, got[1].1, got[1].2),
        (2048, 28, 4096, 12)
    );
    assert!((got[1].0 - 1.49007).abs() < 1e-6);
    // Twice the rate, half the time; a time scale of 4 on top: twice as long.
    let fast = replay(&spec, &["a"], 2.0, None);
    assert!((fast.requests[1].arrival_s - 1.49007 / 2.0).abs() < 1e-6);
    assert!((fast.info.run_s - r.info.run_s / 2.0).abs() < 1e-9);
    let slow = ReplaySpec {
        time_scale: 4.0,
        ..spec.clone()
    };
    let slow = replay(&slow, &["a"], 2.0, None);
    assert!((slow.requests[1].arrival_s - 1.49007 * 2.0).abs() < 1e-6);
    assert!(r.requests.iter().all(|q| q.blocks.is_none()));
}

#[test]
fn a_window_picks_its_rows_and_sets_the_run_length() {
    let spec = ReplaySpec {
        start_s: 1.0,
        duration_s: Some(10.0),
        ..ReplaySpec::new(fixture("azure-2023.csv"))
    };
    let r = replay(&spec, &["a"], 1.0, None);
    // The rows at 4.31 s: one served, one without output (counted, not sent).
    assert_eq!(r.info.rows_in_window, 2);
    assert_eq!(r.info.empty, 1);
    assert_eq!(r.requests.len(), 1);
    assert!((r.requests[0].arrival_s - 3.314579).abs() < 1e-6);
    assert_eq!(r.info.window_s, 10.0);
    let empty = ReplaySpec {
        start_s: 100.0,
        ..spec
    };
    let file = empty.read(Path::new("")).unwrap();
    let e = build(&empty, &file, &tenants(&["a"]), 1.0, None).unwrap_err();
    assert!(e.to_string().contains("no row"), "{e}");
}

#[test]
fn a_row_above_the_cap_is_counted_not_clipped() {
    let spec = ReplaySpec::new(fixture("azure-2024.csv"));
    let r = replay(&spec, &["a"], 1.0, Some(3000));
    assert_eq!(r.requests.len(), 1);
    assert_eq!(r.requests[0].prompt_tokens, 2048);
    assert_eq!((r.info.over_cap, r.info.longest_over_cap), (1, 4096));
    // The spec's own cap wins over the target's.
    let own = ReplaySpec {
        max_prompt_tokens: Some(5000),
        ..spec
    };
    assert_eq!(replay(&own, &["a"], 1.0, Some(3000)).requests.len(), 2);
}

#[test]
fn tenants_by_round_robin_by_a_column_or_all_to_one() {
    let spec = ReplaySpec::new(fixture("burstgpt.csv"));
    let who = |r: &Replay| r.requests.iter().map(|q| q.tenant).collect::<Vec<_>>();
    // Row 2 has no output: the served rows are the 1st and 3rd of the window.
    assert_eq!(who(&replay(&spec, &["a", "b"], 1.0, None)), [0, 0]);
    let spec = ReplaySpec::new(fixture("azure-2024.csv"));
    assert_eq!(who(&replay(&spec, &["a", "b"], 1.0, None)), [0, 1]);
    let one = ReplaySpec {
        assign: "one:b".parse().unwrap(),
        ..spec.clone()
    };
    assert_eq!(who(&replay(&one, &["a", "b"], 1.0, None)), [1, 1]);
    let nobody = ReplaySpec {
        assign: "one:c".parse().unwrap(),
        ..spec
    };
    let file = nobody.read(Path::new("")).unwrap();
    assert!(build(&nobody, &file, &tenants(&["a"]), 1.0, None).is_err());
    let by_block = ReplaySpec {
        assign: "hash:hash_ids".parse().unwrap(),
        ..ReplaySpec::new(fixture("mooncake.jsonl"))
    };
    let r = replay(&by_block, &["a", "b", "c", "d", "e"], 1.0, None);
    assert_eq!(
        r.requests[0].tenant, r.requests[1].tenant,
        "same first block"
    );
    for bad in ["", "hash:", "one:", "random"] {
        assert!(bad.parse::<Assign>().is_err(), "{bad}");
    }
    assert_eq!(
        "hash:user".parse::<Assign>().unwrap().to_string(),
        "hash:user"
    );
}

#[test]
fn tied_rows_are_spread_over_one_step_of_the_grid() {
    let spec = ReplaySpec::new(fixture("mooncake.jsonl"));
    let r = replay(&spec, &["a"], 1.0, None);
    let t: Vec<f64> = r.requests.iter().map(|q| q.arrival_s).collect();
    // Two rows at 0 on a 3 s grid: 0 and 1.5 s; the row at 3 s stays.
    assert_eq!(t, [0.0, 1.5, 3.0]);
    assert_eq!(r.info.spread, 1);
    let at_once = ReplaySpec {
        spread_ties: false,
        ..spec
    };
    let t: Vec<f64> = replay(&at_once, &["a"], 1.0, None)
        .requests
        .iter()
        .map(|q| q.arrival_s)
        .collect();
    assert_eq!(t, [0.0, 0.0, 3.0]);
}

#[test]
fn rows_share_exactly_the_blocks_their_ids_share() {
    let spec = ReplaySpec::new(fixture("mooncake.jsonl"));
    let r = replay(&spec, &["a"], 1.0, None);
    let p: Vec<Vec<u32>> = r
        .requests
        .iter()
        .map(|q| {
            q.blocks
                .as_ref()
                .unwrap()
                .prompt_ids(q.content_seed, q.prompt_tokens)
        })
        .collect();
    assert_eq!((p[0].len(), p[1].len(), p[2].len()), (1100, 700, 40));
    // [0, 1, 2] and [0, 5]: the first 512 tokens are equal, the next differ at once.
    assert_eq!(p[0][..512], p[1][..512]);
    assert_ne!(p[0][512], p[1][512]);
    // 1100 tokens over three 512-token ids: the third block is cut, nothing is filled.
    let b = r.requests[0].blocks.as_ref().unwrap();
    let two = TraceBlocks {
        hash_ids: b.hash_ids[..2].into(),
        ..b.clone()
    };
    // Ids that cover less than the prompt: the rest is the row's own content.
    let filled = two.prompt_ids(7, 1100);
    assert_eq!(filled[..1024], p[0][..1024]);
    assert_ne!(filled[1024..], p[0][1024..]);
}

#[test]
fn the_ideal_cache_hits_follow_the_shared_blocks() {
    use crate::workload::prefix_ideal::ideal_hits;
    let spec = ReplaySpec::new(fixture("mooncake.jsonl"));
    let r = replay(&spec, &["a"], 1.0, None);
    let ideal = ideal_hits(&r.requests, 16, Some(1_000));
    // Only row 2 hits: its first 512 tokens (32 blocks of 16) are row 1's.
    assert_eq!(ideal.infinite_tokens, 512);
    assert_eq!(ideal.bounded_tokens, Some(512));
    assert_eq!(ideal.prompt_tokens, 1840);
    // A cache of 40 blocks keeps only row 1's last 40 of 68: its first block is gone.
    let small = ideal_hits(&r.requests, 16, Some(40));
    assert_eq!(small.bounded_tokens, Some(0));
}

#[test]
fn a_copy_tenant_replays_the_trace_of_its_own_at_its_multiple() {
    // azure-2024.csv: two rows, at 0 and 1.49007 s.
    let spec = ReplaySpec {
        copies: [("flood".to_string(), 3.0)].into(),
        ..ReplaySpec::new(fixture("azure-2024.csv"))
    };
    let r = replay(&spec, &["a", "flood"], 1.0, None);
    let of = |t: usize| -> Vec<f64> {
        r.requests
            .iter()
            .filter(|q| q.tenant == t)
            .map(|q| q.arrival_s)
            .collect()
    };
    // "a" takes every row at 1x; the flood three windows of trace time in one, wrapping at
    // the trace's end (one resolution step after its last row).
    assert_eq!(of(0).len(), 2);
    let flood = of(1);
    assert_eq!(flood.len(), 6, "{flood:?}");
    let w = r.info.window_s;
    assert!((flood[1] - 1.49007 / 3.0).abs() < 1e-6, "{flood:?}");
    assert!((flood[2] - w / 3.0).abs() < 1e-6, "{flood:?} {w}");
    assert!(flood.iter().all(|&t| t < w), "{flood:?}");
    // In arrival order, ids renumbered, no prompt content shared with the rows it repeats.
    assert!(r
        .requests
        .windows(2)
        .all(|p| p[0].arrival_s <= p[1].arrival_s));
    assert!(r.requests.iter().enumerate().all(|(i, q)| q.id == i as u64));
    let seeds: std::collections::BTreeSet<u64> =
        r.requests.iter().map(|q| q.content_seed).collect();
    assert_eq!(seeds.len(), r.requests.len());
    // A copy names a tenant that takes rows, and a positive multiple.
    let file = spec.read(Path::new("")).unwrap();
    assert!(build(&spec, &file, &tenants(&["a"]), 1.0, None).is_err());
    let bad = ReplaySpec {
        copies: [("flood".to_string(), 0.0)].into(),
        ..spec
    };
    assert!(bad.validate().is_err());
}
