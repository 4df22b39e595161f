use super::*;

fn shape() -> AttentionShape {
    AttentionShape {
        num_heads: 8,
        kv_heads: 2,
        head_dim: 64,
        num_layers: 3,
        block_size: 4,
        window: 0,
    }
}

#[test]
fn sections_hold_positions_slots_tiles_and_tables() {
    let a = [7u32, 2, 9];
    let b = [5u32];
    // A 70-token prefill chunk at positions 2..72 needs 18 blocks; use a long table.
    let long: Vec<u32> = (100..118).collect();
    let seqs = [
        SeqSpan {
            q_offset: 0,
            pos: 10,
            end: 11,
            blocks: &a,
        },
        SeqSpan {
            q_offset: 1,
            pos: 0,
            end: 3,
            blocks: &b,
        },
        SeqSpan {
            q_offset: 4,
            pos: 2,
            end: 72,
            blocks: &long,
        },
    ];
    let p = AttentionPlan::new(&shape(), &seqs).unwrap();
    assert_eq!(p.tokens, 1 + 3 + 70);
    let pos = &p.data[p.positions..p.positions + p.tokens as usize];
    assert_eq!(&pos[..4], &[10, 0, 1, 2]);
    assert_eq!(pos[4], 2);
    // Position 10 of the first sequence: block a[2] = 9, offset 2; rows per block 3*2*4 = 24.
    let slots = &p.data[p.slots..p.slots + p.tokens as usize];
    assert_eq!(slots[0], 9 * 24 + 2);
    assert_eq!(slots[1], 5 * 24);
    assert_eq!(slots[4], 100 * 24 + 2);
    // Decode: [q_row, ctx, table_start, 0]; tables: a (3 blocks), b (1), long (18).
    assert_eq!(p.num_decodes, 1);
    assert_eq!(&p.data[p.decode_seqs..p.decode_seqs + 4], &[0, 11, 0, 0]);
    // Prefill sequences [q_offset, pos, end, table_start] and tiles of 64 queries.
    assert_eq!(
        &p.data[p.prefill_seqs..p.prefill_seqs + 8],
        &[1, 0, 3, 3, 4, 2, 72, 4]
    );
    assert_eq!((p.num_tiles, p.prefill_tile), (3, PREFILL_TILE));
    assert_eq!(
        &p.data[p.prefill_tiles..p.prefill_tiles + 6],
        &[0, 0, 1, 0, 1, 64]
    );
    assert_eq!(&p.data[p.tables..p.tables + 4], &[7, 2, 9, 5]);
    // One sequence of 11 keys over 2 KV heads: one split of 32 keys.
    assert_eq!((p.decode_part, p.decode_splits), (32, 1));
}

/// The value of `#define NAME` under `#ifndef NAME` in a kernel source.
fn guarded_default(source: &str, name: &str) -> u32 {
    let line = format!("#ifndef {name}\n#define {name} ");
    let at = source
        .find(&line)
        .unwrap_or_else(|| panic!("no guarded {name}"))
        + line.len();
    let digits: String = source[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

#[test]
fn the_prefill_constants_are_the_kernels() {
    let cu = include_str!("../cuda/cu/prefill.cu");
    assert!(cu.contains(&format!("#define PF_M {PREFILL_TILE}\n")));
    assert!(cu.contains(&format!("#define PF_THREADS {PREFILL_THREADS} ")));
    let wide = include_str!("../cuda/cu/prefill_wide.cu");
    let (warps, m_tiles) = (
        guarded_default(wide, "PFW_WARPS"),
        guarded_default(wide, "PFW_MT"),
    );
    assert_eq!(PREFILL_WIDE_TILE, warps * 16 * m_tiles);
    assert_eq!(PREFILL_THREADS, warps * 32);
    assert_eq!(PREFILL_WIDE_KEY_TILE, guarded_default(wide, "PFW_N"));
    assert_eq!(prefill_wide_shared_bytes(128), (128 + 64) * 136 * 2);
}

#[test]
fn the_h100_profile_models_these_kernels() {
    // The twin's cost model (engine/src/runner/cost.rs) must see the tiles and the threshold
    // the runner launches with.
    let h100 = include_str!("../../../engine/profiles/hardware/h100.toml");
    assert!(h100.contains(&format!("\nprefill_attention_tile = {PREFILL_TILE}\n")));
    let wide = format!("\nprefill_attention_wide_min_tokens = {PREFILL_WIDE_MIN_TOKENS}\n");
    assert!(h100.contains(&wide));
}

#[test]
fn a_step_with_a_long_chunk_takes_the_wide_kernels_tiles() {
    let table: Vec<u32> = (0..2100).collect();
    let span = |q_offset, pos, end| SeqSpan {
        q_offset,
        pos,
        end,
        blocks: &table,
    };
    let n = PREFILL_WIDE_MIN_TOKENS;
    // One token short: the narrow kernel; a second sequence's chunk takes the step's tile.
    let p = AttentionPlan::new(&shape(), &[span(0, 0, n - 1)]).unwrap();
    assert_eq!(
        (p.prefill_tile, p.num_tiles),
        (PREFILL_TILE, (n - 1).div_ceil(64))
    );
    let p = AttentionPlan::new(&shape(), &[span(0, 0, n), span(n, 0, 200)]).unwrap();
    assert_eq!(p.prefill_tile, PREFILL_WIDE_TILE);
    assert_eq!(p.num_tiles, n / 128 + 2);
    let tiles = &p.data[p.prefill_tiles..p.prefill_tiles + 2 * p.num_tiles as usize];
    assert_eq!(&tiles[2 * (n as usize / 128)..], &[1, 0, 1, 128]);
}

#[test]
fn decode_splits_follow_the_longest_context_and_the_window() {
    let blocks: Vec<u32> = (0..300).collect();
    let seqs = [SeqSpan {
        q_offset: 0,
        pos: 1000,
        end: 1001,
        blocks: &blocks,
    }];
    let p = AttentionPlan::new(&shape(), &seqs).unwrap();
    // One sequence: small parts so 2 KV heads x splits approach the target grid.
    assert_eq!(p.decode_part, 32);
    assert_eq!(p.decode_splits, 1001u32.div_ceil(32));
    let windowed = AttentionShape {
        window: 300,
        ..shape()
    };
    let p = AttentionPlan::new(&windowed, &seqs).unwrap();
    assert_eq!(p.decode_splits, 300u32.div_ceil(p.decode_part));
}

#[test]
fn decode_parts_cover_the_keys_and_grow_with_the_batch() {
    for decodes in [1u32, 3, 8, 64, 256] {
        for kv_heads in [1u32, 8] {
            for keys in [1u32, 31, 32, 513, 4000, 32768] {
                let (part, splits) = decode_split(decodes, kv_heads, keys);
                assert!(part % 32 == 0 && (32..=DECODE_PART).contains(&part));
                assert!(splits * part >= keys && (splits - 1) * part < keys.max(1));
            }
        }
    }
    // Many sequences: full parts; few: the grid is filled by splitting the context.
    assert_eq!(decode_split(64, 8, 513), (192, 3));
    assert_eq!(decode_split(8, 8, 4097), (256, 17));
    assert_eq!(decode_split(1, 8, 513).0, 32);
}

#[test]
fn bad_spans_and_shapes_are_refused() {
    let b = [0u32];
    let gap = [SeqSpan {
        q_offset: 1,
        pos: 0,
        end: 1,
        blocks: &b,
    }];
    assert!(AttentionPlan::new(&shape(), &gap).is_err());
    let short = [SeqSpan {
        q_offset: 0,
        pos: 0,
        end: 5,
        blocks: &b,
    }];
    assert!(AttentionPlan::new(&shape(), &short).is_err());
    let empty = [SeqSpan {
        q_offset: 0,
        pos: 3,
        end: 3,
        blocks: &b,
    }];
    assert!(AttentionPlan::new(&shape(), &empty).is_err());
    let odd = AttentionShape {
        head_dim: 80,
        ..shape()
    };
    assert!(odd.validate().is_err());
    let wide = AttentionShape {
        num_heads: 40,
        kv_heads: 2,
        ..shape()
    };
    assert!(wide.validate().is_err());
}

fn decodes<'a>(tables: &'a [Vec<u32>], ends: &[u32]) -> Vec<SeqSpan<'a>> {
    ends.iter()
        .zip(tables)
        .enumerate()
        .map(|(i, (&end, blocks))| SeqSpan {
            q_offset: i as u32,
            pos: end - 1,
            end,
            blocks,
        })
        .collect()
}

#[test]
fn a_fixed_decode_plan_matches_the_plan_and_pads_its_bucket() {
    let s = shape();
    let tables = vec![vec![7u32, 2, 9], vec![5u32], vec![11u32, 12]];
    let seqs = decodes(&tables, &[11, 3, 5]);
    let layout = FixedDecodeLayout {
        rows: 8,
        table_entries: 32,
    };
    let mut out = vec![99; 3];
    let splits = layout.write(&s, 4, &seqs, &mut out).unwrap();
    assert!(splits.is_power_of_two() && splits <= MAX_FIXED_SPLITS);
    let p = AttentionPlan::new(&s, &seqs).unwrap();
    let n = seqs.len();
    assert_eq!(out[..n], p.data[p.positions..p.positions + n]);
    assert_eq!(out[layout.slots()..][..n], p.data[p.slots..p.slots + n]);
    for i in 0..n {
        let mine = &out[layout.seqs() + 4 * i..][..4];
        let theirs = &p.data[p.decode_seqs + 4 * i..][..4];
        assert_eq!(mine[..2], theirs[..2], "row and context of sequence {i}");
        assert_eq!(
            mine[3], p.decode_part,
            "the eager keys per split, sequence {i}"
        );
        let blocks = seqs[i].end.div_ceil(s.block_size) as usize;
        assert_eq!(
            out[layout.tables() + mine[2] as usize..][..blocks],
            p.data[p.tables + theirs[2] as usize..][..blocks],
            "table of sequence {i}"
        );
    }
    // The padding row of bucket 4: no slot, no keys, its own row.
    assert_eq!(out[layout.slots() + 3], NO_SLOT);
    assert_eq!(out[layout.seqs() + 12..][..4], [3, 0, 0, 0]);
    assert_eq!(out[layout.positions() + 3], 0);
    // Only the used tables were written.
    assert_eq!(out.len(), layout.tables() + 3 + 1 + 2);
}

#[test]
fn a_fixed_decode_plan_refuses_what_does_not_fit() {
    let s = shape();
    let tables = vec![vec![1u32, 2, 3], vec![4u32, 5, 6]];
    let seqs = decodes(&tables, &[9, 12]);
    let small = FixedDecodeLayout {
        rows: 2,
        table_entries: 5,
    };
    let mut out = Vec::new();
    let e = small.write(&s, 2, &seqs, &mut out).unwrap_err();
    assert!(e.to_string().contains("entries"), "{e}");
    let roomy = FixedDecodeLayout {
        rows: 2,
        table_entries: 64,
    };
    assert!(
        roomy.write(&s, 1, &seqs, &mut out).is_err(),
        "two rows in a bucket of one"
    );
    assert!(
        roomy.write(&s, 4, &seqs, &mut out).is_err(),
        "a bucket beyond the buffers"
    );
    let prefill = [SeqSpan {
        q_offset: 0,
        pos: 0,
        end: 3,
        blocks: &tables[0],
    }];
    assert!(
        roomy.write(&s, 1, &prefill, &mut out).is_err(),
        "a prefill chunk"
    );
    assert_eq!(roomy.write(&s, 2, &seqs, &mut out).unwrap(), {
        let (_, splits) = decode_split(2, s.kv_heads, 12);
        splits.next_power_of_two().min(MAX_FIXED_SPLITS)
    });
}

/// Mixed contexts: every row gets the eager step's keys per split (a short sequence 1-2
/// splits, not the longest's count), and the fixed count covers the longest context.
#[test]
fn a_fixed_decode_plan_splits_each_sequence_as_the_eager_plan() {
    let s = AttentionShape {
        num_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        num_layers: 2,
        block_size: 16,
        window: 0,
    };
    let ends: Vec<u32> = (0..48)
        .map(|i| [150, 400, 620, 1500, 330, 900][i % 6])
        .collect();
    let tables: Vec<Vec<u32>> = (0..48u32)
        .map(|i| (0..94).map(|k| i * 94 + k).collect())
        .collect();
    let seqs = decodes(&tables, &ends);
    let layout = FixedDecodeLayout {
        rows: 64,
        table_entries: 64 * 94,
    };
    let mut out = Vec::new();
    let splits = layout.write(&s, 64, &seqs, &mut out).unwrap();
    let p = AttentionPlan::new(&s, &seqs).unwrap();
    assert_eq!((p.decode_part, p.decode_splits), (256, 6));
    assert_eq!(splits, 8);
    for i in 0..48 {
        assert_eq!(out[layout.seqs() + 4 * i + 3], 256, "row {i}");
    }
    for r in 48..64 {
        assert_eq!(out[layout.seqs() + 4 * r..][..4], [r as u32, 0, 0, 0]);
    }
    // Past MAX_FIXED_SPLITS eager splits: the longest context in that many parts.
    let long = [vec![0u32; 3000]];
    let one = decodes(&long, &[40_000]);
    let big = FixedDecodeLayout {
        rows: 1,
        table_entries: 3000,
    };
    assert_eq!(big.write(&s, 1, &one, &mut out).unwrap(), MAX_FIXED_SPLITS);
    let part = out[big.seqs() + 3];
    assert_eq!(
        part,
        40_000u32.div_ceil(MAX_FIXED_SPLITS).next_multiple_of(32)
    );
    assert!(part * MAX_FIXED_SPLITS >= 40_000);
}

#[test]
fn every_cuda_source_is_compiled_into_a_module() {
    // A kernel file no module lists compiles nowhere: its kernels are looked up at the first
    // launch and fail there ("named symbol not found": the wide prefill kernel once did).
    let modules = include_str!("../cuda/model/state.rs");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda/cu");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".cu"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "{files:?}");
    for f in files {
        assert!(
            modules.contains(&format!("(\"{f}\", ")),
            "{f} is in no module of cuda/model/state.rs"
        );
    }
}
