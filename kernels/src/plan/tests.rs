use super::*;

const MIB: u64 = 1 << 20;

fn c(src: u32, dst: u32) -> BlockCopy {
    BlockCopy { src, dst }
}

#[test]
fn qwen_block_is_4_mib_of_64_kib_pieces() {
    // K (or V) of one layer of one 16-token block: 16 x 8 x 128 x 2 B = 32 KiB.
    let per_kv = BlockShape::kv(64, 16 * 8 * 128 * 2);
    assert_eq!(per_kv.piece_bytes, 32 * 1024);
    assert_eq!(per_kv.pieces, 128);
    assert_eq!(per_kv.block_bytes(), 4 * MIB);
    let per_layer = BlockShape::per_layer(64, 2 * 16 * 8 * 128 * 2);
    assert_eq!(per_layer.piece_bytes, 64 * 1024);
    assert_eq!(per_layer.block_bytes(), 4 * MIB);
}

#[test]
fn layouts_place_pieces() {
    let shape = BlockShape {
        piece_bytes: 10,
        pieces: 4,
    };
    assert_eq!(Layout::BlockFirst.offset(shape, 3, 2), 3 * 40 + 2 * 10);
    let lf = Layout::LayerFirst { num_blocks: 5 };
    assert_eq!(lf.offset(shape, 3, 2), (2 * 5 + 3) * 10);
}

#[test]
fn layouts_are_bijections_onto_the_arena() {
    let shape = BlockShape {
        piece_bytes: 8,
        pieces: 6,
    };
    for layout in [Layout::BlockFirst, Layout::LayerFirst { num_blocks: 7 }] {
        let mut seen: Vec<u64> = (0..7)
            .flat_map(|b| (0..6).map(move |p| layout.offset(shape, b, p)))
            .collect();
        seen.sort_unstable();
        let expected: Vec<u64> = (0..42).map(|i| i * 8).collect();
        assert_eq!(seen, expected, "{layout:?}");
    }
}

#[test]
fn per_piece_issues_one_copy_per_layer_per_kv() {
    let shape = BlockShape {
        piece_bytes: 64,
        pieces: 4,
    };
    let lf = Layout::LayerFirst { num_blocks: 10 };
    let segs = per_piece(&[c(1, 2), c(7, 3)], shape, lf, lf);
    assert_eq!(segs.len(), 8);
    assert!(segs.iter().all(|s| s.bytes == 64));
    assert_eq!(total_bytes(&segs), 2 * shape.block_bytes());
    assert_eq!(
        segs[1],
        Segment {
            src_offset: 7 * 64,
            dst_offset: 3 * 64,
            bytes: 64
        }
    );
}

#[test]
fn per_block_keeps_order_and_size() {
    let segs = per_block(&[c(5, 1), c(2, 9)], MIB);
    assert_eq!(
        segs,
        vec![
            Segment {
                src_offset: 5 * MIB,
                dst_offset: MIB,
                bytes: MIB
            },
            Segment {
                src_offset: 2 * MIB,
                dst_offset: 9 * MIB,
                bytes: MIB
            },
        ]
    );
}

#[test]
fn merged_joins_runs_consecutive_on_both_sides() {
    // 3,4,5 -> 10,11,12 is one run; 6 -> 20 breaks it (dst jumps); 8 -> 21 breaks (src jumps).
    let copies = [c(5, 12), c(3, 10), c(4, 11), c(6, 20), c(8, 21)];
    let segs = merged(&copies, MIB, MergeLimits::UNLIMITED);
    assert_eq!(
        segs,
        vec![
            Segment {
                src_offset: 3 * MIB,
                dst_offset: 10 * MIB,
                bytes: 3 * MIB
            },
            Segment {
                src_offset: 6 * MIB,
                dst_offset: 20 * MIB,
                bytes: MIB
            },
            Segment {
                src_offset: 8 * MIB,
                dst_offset: 21 * MIB,
                bytes: MIB
            },
        ]
    );
}

#[test]
fn merged_never_crosses_a_chunk_or_the_cap() {
    let copies: Vec<BlockCopy> = (0..10).map(|i| c(i, 100 + i)).collect();
    let limits = MergeLimits {
        src_chunk_blocks: 4,
        dst_chunk_blocks: u32::MAX,
        max_blocks: 3,
    };
    let segs = merged(&copies, 1, limits);
    let lens: Vec<u64> = segs.iter().map(|s| s.bytes).collect();
    // chunk starts at 4 and 8; cap of 3 splits 0..4 into 3 + 1.
    assert_eq!(lens, vec![3, 1, 3, 1, 2]);
    let dst_limits = MergeLimits {
        src_chunk_blocks: u32::MAX,
        dst_chunk_blocks: 8,
        max_blocks: 99,
    };
    let segs = merged(&copies, 1, dst_limits);
    // dst 100..110: chunk start at 104 (104 % 8 == 0).
    assert_eq!(segs.iter().map(|s| s.bytes).collect::<Vec<_>>(), vec![4, 6]);
}

#[test]
fn merged_covers_every_byte_once() {
    let mut state = 7u64;
    let mut copies = Vec::new();
    let mut dsts: Vec<u32> = (0..300).collect();
    for i in (1..dsts.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        dsts.swap(i, (state >> 33) as usize % (i + 1));
    }
    for (src, dst) in (0..300u32).zip(dsts) {
        if src % 3 != 0 {
            copies.push(c(src, dst));
        }
    }
    let segs = merged(&copies, 16, MergeLimits::UNLIMITED);
    assert_eq!(total_bytes(&segs), copies.len() as u64 * 16);
    let mut pairs: Vec<(u64, u64)> = segs
        .iter()
        .flat_map(|s| {
            (0..s.bytes / 16).map(move |k| (s.src_offset / 16 + k, s.dst_offset / 16 + k))
        })
        .collect();
    pairs.sort_unstable();
    let mut expected: Vec<(u64, u64)> = copies
        .iter()
        .map(|c| (u64::from(c.src), u64::from(c.dst)))
        .collect();
    expected.sort_unstable();
    assert_eq!(pairs, expected);
}

#[test]
fn merged_of_nothing_is_nothing() {
    assert!(merged(&[], MIB, MergeLimits::UNLIMITED).is_empty());
}

#[test]
fn duplicate_destinations_are_found() {
    assert_eq!(duplicate_destination(&[c(1, 2), c(3, 4)]), None);
    assert_eq!(duplicate_destination(&[c(1, 2), c(3, 4), c(5, 2)]), Some(2));
}

#[test]
fn overlapping_destinations_are_found() {
    let seg = |dst_offset, bytes| Segment {
        src_offset: 0,
        dst_offset,
        bytes,
    };
    assert_eq!(overlapping_destination(&[seg(0, 10), seg(10, 10)]), None);
    assert_eq!(
        overlapping_destination(&[seg(20, 10), seg(0, 10), seg(5, 10)]),
        Some(5)
    );
}

#[test]
fn strides_agree_with_offsets() {
    let shape = BlockShape {
        piece_bytes: 12,
        pieces: 5,
    };
    for layout in [Layout::BlockFirst, Layout::LayerFirst { num_blocks: 9 }] {
        let (bs, ps) = layout.strides(shape);
        for b in 0..9 {
            for p in 0..5 {
                assert_eq!(
                    layout.offset(shape, b, p),
                    u64::from(b) * bs + u64::from(p) * ps
                );
            }
        }
    }
}
