use super::*;

#[test]
fn mix64_matches_splitmix_reference() {
    // SplitMix64 seeded with 0: first output is mix64(0) = 0xE220A8397B1DCDAF.
    assert_eq!(mix64(0), 0xE220_A839_7B1D_CDAF);
    let mut r = SplitMix64::new(0);
    assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
}

#[test]
fn fill_then_check_is_clean_and_detects_each_fault() {
    let mut buf = vec![0u8; 4096];
    fill_piece(&mut buf, 42, 3);
    assert_eq!(count_mismatches(&buf, 42, 3), 0);
    assert_eq!(count_mismatches(&buf, 43, 3), 512, "another block's data");
    assert_eq!(
        count_mismatches(&buf, 42, 4),
        512,
        "another piece (layer) of the block"
    );
    buf[100] ^= 1;
    assert_eq!(count_mismatches(&buf, 42, 3), 1, "one flipped bit");
}

#[test]
fn tags_are_unique_per_generation_tier_block() {
    let mut tags = std::collections::HashSet::new();
    for g in 0..4 {
        for t in 0..2 {
            for b in [0, 1, 77, u32::MAX] {
                assert!(tags.insert(block_tag(g, t, b)));
            }
        }
    }
}

#[test]
fn parallel_fill_and_check_agree_with_serial() {
    let mut arena = vec![0u8; 64 * 256];
    let jobs: Vec<PieceJob<&mut [u8]>> = arena
        .chunks_mut(256)
        .enumerate()
        .map(|(i, buf)| PieceJob {
            buf,
            tag: 1000 + (i as u64 / 4),
            piece: (i % 4) as u32,
        })
        .collect();
    par_fill(jobs, 3);
    let check: Vec<PieceJob<&[u8]>> = arena
        .chunks(256)
        .enumerate()
        .map(|(i, buf)| PieceJob {
            buf,
            tag: 1000 + (i as u64 / 4),
            piece: (i % 4) as u32,
        })
        .collect();
    assert_eq!(par_count_mismatches(&check, 5), 0);
    assert_eq!(count_mismatches(&arena[256..512], 1000, 1), 0);
    let wrong: Vec<PieceJob<&[u8]>> = arena
        .chunks(256)
        .map(|buf| PieceJob {
            buf,
            tag: 7,
            piece: 0,
        })
        .collect();
    assert_eq!(par_count_mismatches(&wrong, 4), 64 * 32);
}

#[test]
fn permutation_is_a_permutation_and_deterministic() {
    let p = SplitMix64::new(9).permutation(1000);
    let mut s = p.clone();
    s.sort_unstable();
    assert_eq!(s, (0..1000).collect::<Vec<u32>>());
    assert_ne!(p, s, "shuffled");
    assert_eq!(p, SplitMix64::new(9).permutation(1000));
}

#[test]
fn below_stays_in_range() {
    let mut r = SplitMix64::new(1);
    assert!((0..10_000).all(|_| r.below(7) < 7));
}

#[test]
fn fnv1a64_reference_values() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
}
