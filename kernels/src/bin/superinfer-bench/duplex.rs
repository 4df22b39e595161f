//! Table 1 of PAPER.md on this GPU, each row against the ceiling measured in the same run.

use std::fmt::Write as _;

use superinfer_kernels::cuda::{Arena, CopyMode};
use superinfer_kernels::plan::{self, BlockShape, Layout, MergeLimits};
use superinfer_kernels::report::{self, Ceilings, Interference, Row, Verified};
use superinfer_kernels::{Error, Result};

use crate::opts::Opts;

mod bench;
mod interference;
mod setup;

use bench::{kv_shape, Bench, How, Movement, Sets, HALF_LAYER_BYTES, LAYERS, NAIVE};

use interference::interference;
use setup::{contiguous_sets, header, random_sets};

/// The contiguous ceilings: (out then in, both at once).
fn ceilings(b: &mut Bench, reps: usize) -> Result<(Row, Row)> {
    let cont = contiguous_sets(b.n);
    let dram_chunk_blocks = (b.engine.dram().chunk_bytes() / b.block_bytes) as u32;
    let unlimited = MergeLimits::UNLIMITED;
    let to_dram = MergeLimits {
        dst_chunk_blocks: dram_chunk_blocks,
        ..unlimited
    };
    let from_dram = MergeLimits {
        src_chunk_blocks: dram_chunk_blocks,
        ..unlimited
    };
    let out = plan::merged(&cont.out, b.block_bytes, to_dram);
    let inn = plan::merged(&cont.inn, b.block_bytes, from_dram);
    let m = Movement {
        sets: &cont,
        layout: Layout::BlockFirst,
        shape: kv_shape(),
        out: &out,
        inn: &inn,
    };
    let seq = b.sequential(
        "Ceiling: contiguous, out then in",
        &m,
        CopyMode::PerSegment,
        reps,
        true,
    )?;
    let both = How::Copies(CopyMode::PerSegment);
    let dup = b.duplex_raw("Ceiling: contiguous, both at once", &m, both, reps)?;
    Ok((seq, dup))
}

/// The naive rows: a vLLM-style layer-first cache, one copy per layer per block per K/V.
fn naive_rows(b: &mut Bench, o: &Opts, sets: &Sets) -> Result<Vec<Row>> {
    let (shape, nreps) = (kv_shape(), o.naive_reps.max(1));
    let layer_first = Layout::LayerFirst {
        num_blocks: b.total,
    };
    let out = plan::per_piece(&sets.out, shape, layer_first, layer_first);
    let inn = plan::per_piece(&sets.inn, shape, layer_first, layer_first);
    let m = Movement {
        sets,
        layout: layer_first,
        shape,
        out: &out,
        inn: &inn,
    };
    let mut rows = vec![b.sequential(NAIVE, &m, CopyMode::PerSegment, nreps, false)?];
    if o.naive_sync {
        let name =
            "(baseline) Naive as a synchronous swap loop: same 32 KiB copies, each waited for";
        rows.push(b.sequential(name, &m, CopyMode::Synchronous, 1, false)?);
    }
    if o.naive_layer {
        let per_layer = BlockShape::per_layer(LAYERS, 2 * HALF_LAYER_BYTES);
        let out = plan::per_piece(&sets.out, per_layer, layer_first, layer_first);
        let inn = plan::per_piece(&sets.inn, per_layer, layer_first, layer_first);
        let m = Movement {
            sets,
            layout: layer_first,
            shape: per_layer,
            out: &out,
            inn: &inn,
        };
        let name = "(baseline) Naive with K and V of a layer adjacent: one copy per layer per block (64 KiB)";
        rows.push(b.sequential(name, &m, CopyMode::PerSegment, nreps, false)?);
    }
    Ok(rows)
}

/// The block-first rows: merged, batched, DuplexKV and the variants tried.
fn block_first_rows(b: &mut Bench, sets: &Sets, reps: usize) -> Result<Vec<Row>> {
    let out = plan::per_block(&sets.out, b.block_bytes);
    let inn = plan::per_block(&sets.inn, b.block_bytes);
    let m = Movement {
        sets,
        layout: Layout::BlockFirst,
        shape: kv_shape(),
        out: &out,
        inn: &inn,
    };
    Ok(vec![
        b.sequential(
            "Merged segments: block-first, one copy per block (4 MiB), one stream, out then in",
            &m,
            CopyMode::PerSegment,
            reps,
            true,
        )?,
        b.sequential(
            "Merged + batched: one cuMemcpyBatchAsync per direction, one stream, out then in",
            &m,
            CopyMode::Batched,
            reps,
            true,
        )?,
        b.duplex_engine(
            "DuplexKV: DuplexEngine, batched, both directions at once on two streams",
            sets,
            reps,
        )?,
        b.duplex_raw(
            "(tried) duplex, one cuMemcpyAsync per block on each stream",
            &m,
            How::Copies(CopyMode::PerSegment),
            reps,
        )?,
        b.duplex_raw(
            "(tried) duplex, SM gather/scatter kernels (NVRTC) instead of copy engines",
            &m,
            How::SmKernel,
            reps,
        )?,
    ])
}

fn faster(a: Row, b: Row) -> Row {
    if b.total_ms < a.total_ms {
        b
    } else {
        a
    }
}

/// The Markdown report of a run.
fn markdown(
    head: &str,
    rows: &[Row],
    ceilings: &Ceilings,
    bytes: u64,
    inter: &[Interference],
) -> String {
    let mut md = format!("```\n{head}\n```\n\n");
    md.push_str(&report::table(rows, ceilings));
    let dkv = rows
        .iter()
        .find(|r| r.name.starts_with("DuplexKV"))
        .map_or(f64::NAN, |r| r.total_ms);
    let _ = writeln!(
        md,
        "\nDuplexKV = {:.1}% of the same-run duplex ceiling ({:.1} GB/s each way, slower direction).",
        100.0 * ceilings.duplex_ms / dkv,
        report::gbps(bytes, ceilings.duplex_ms)
    );
    for r in rows.iter().filter(|r| r.name.contains("Naive")) {
        let _ = writeln!(md, "{:.1}x = {} / DuplexKV", r.total_ms / dkv, r.name);
    }
    md.push('\n');
    md.push_str(&report::interference_table(inter));
    md
}

/// Runs the whole table; returns whether every row's data verified.
pub fn run(o: &Opts) -> Result<bool> {
    let mut b = Bench::new(o)?;
    let head = header(&b, o)?;
    println!("{head}");
    let sets = random_sets(b.n, o.seed);
    println!("ceilings (contiguous pinned copies):");
    let (seq0, dup0) = ceilings(&mut b, o.reps)?;
    println!("rows:");
    let mut rows = naive_rows(&mut b, o, &sets)?;
    rows.extend(block_first_rows(&mut b, &sets, o.reps)?);
    println!("ceilings again (drift check):");
    let (seq1, dup1) = ceilings(&mut b, o.reps)?;
    let (seq, dup) = (faster(seq0, seq1), faster(dup0, dup1));
    let ceilings = Ceilings {
        sequential_ms: seq.total_ms,
        duplex_ms: dup.total_ms,
    };
    println!("interference with a memory-bound kernel on the compute stream:");
    let (inter, inter_ok) = interference(&mut b, &sets, o.reps)?;
    rows.push(seq);
    rows.push(dup);
    let all_ok = rows.iter().all(|r| r.verified == Verified::Ok) && inter_ok;
    let md = markdown(
        &head,
        &rows,
        &ceilings,
        u64::from(b.n) * b.block_bytes,
        &inter,
    );
    println!("\n{md}");
    if let Some(dir) = &o.out {
        let io = |e: std::io::Error| Error::Io {
            path: dir.display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::write(dir.join("duplex.md"), &md).map_err(io)?;
        std::fs::write(dir.join("duplex-raw.csv"), &b.raw).map_err(io)?;
    }
    Ok(all_ok)
}
