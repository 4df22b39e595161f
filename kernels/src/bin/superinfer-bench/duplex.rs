//! Table 1 of PAPER.md on this GPU, each row against the ceiling measured in the same run.

use std::fmt::Write as _;
use std::sync::Arc;

use superinfer_kernels::compile_cache::CompileCache;
use superinfer_kernels::cuda::cudarc::driver::{CudaEvent, CudaStream, DriverError};
use superinfer_kernels::cuda::nvrtc::{compiler_version, Origin};
use superinfer_kernels::cuda::{
    Arena, Blocks, Copier, CopyMode, DeviceArena, DuplexConfig, DuplexEngine, Gpu, Kernels,
};
use superinfer_kernels::pattern::{
    block_tag, par_count_mismatches, par_fill, PieceJob, SplitMix64,
};
use superinfer_kernels::plan::{self, BlockCopy, BlockShape, Layout, MergeLimits, Segment};
use superinfer_kernels::report::{self, median, Ceilings, Interference, Mode, Row, Verified};
use superinfer_kernels::{Error, Result};

use crate::Opts;

const GIB: u64 = 1 << 30;
/// Qwen2.5-32B's KV: 64 layers; K (or V) of one layer of a 16-token block is
/// 16 tokens x 8 heads x 128 dims x 2 B (bf16) = 32 KiB; a block is 4 MiB.
const LAYERS: u32 = 64;
const HALF_LAYER_BYTES: u64 = 16 * 8 * 128 * 2;
const NAIVE: &str =
    "Naive: layer-first, one copy per layer per block per K/V (32 KiB), one stream, out then in";

pub(crate) fn cuda(op: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        detail: format!("{e:?}"),
    }
}

pub(crate) fn elapsed(a: &CudaEvent, b: &CudaEvent) -> Result<f64> {
    a.elapsed_ms(b)
        .map(f64::from)
        .map_err(cuda("cuEventElapsedTime"))
}

/// Which blocks move where: `out` HBM -> DRAM (eviction), `inn` DRAM -> HBM (restore).
#[derive(Clone, Debug)]
pub(crate) struct Sets {
    pub out: Vec<BlockCopy>,
    pub inn: Vec<BlockCopy>,
}

/// How a duplex row moves its bytes.
#[derive(Clone, Copy)]
enum How {
    Copies(CopyMode),
    SmKernel,
}

struct Bench {
    gpu: Gpu,
    engine: DuplexEngine,
    kernels: Kernels,
    /// Blocks per direction.
    n: u32,
    /// Blocks in each arena (2n: the two directions never share a block).
    total: u32,
    block_bytes: u64,
    generation: u32,
    threads: usize,
    copier: Copier,
    copier2: Copier,
    raw: String,
}

fn kv_shape() -> BlockShape {
    BlockShape::kv(LAYERS, HALF_LAYER_BYTES)
}

impl Bench {
    fn events(&self, n: usize) -> Result<Vec<CudaEvent>> {
        (0..n).map(|_| self.gpu.new_event(true)).collect()
    }

    fn streams(&self) -> (Arc<CudaStream>, Arc<CudaStream>) {
        let (h, d) = self.engine.streams();
        (h.clone(), d.clone())
    }

    /// Fresh data in every source block of `sets` (a new generation, so anything left from
    /// an earlier row fails verification).
    fn prepare(&mut self, sets: &Sets, layout: Layout, shape: BlockShape) -> Result<()> {
        self.generation += 1;
        let g = self.generation;
        let ids: Vec<u32> = sets.out.iter().map(|c| c.src).collect();
        let tags: Vec<u64> = ids.iter().map(|&b| block_tag(g, 0, b)).collect();
        let compute = self.gpu.compute_stream().clone();
        let blocks = Blocks {
            arena: self.engine.hbm(),
            layout,
            shape,
            ids: &ids,
            tags: &tags,
        };
        self.kernels.fill(&compute, &blocks, 0)?;
        let pb = shape.piece_bytes;
        let mut slots: Vec<Option<&mut [u8]>> = self
            .engine
            .dram_pieces_mut(pb)?
            .into_iter()
            .map(Some)
            .collect();
        let mut jobs = Vec::with_capacity(sets.inn.len() * shape.pieces as usize);
        for c in &sets.inn {
            for p in 0..shape.pieces {
                let k = (layout.offset(shape, c.src, p) / pb) as usize;
                let buf = slots[k]
                    .take()
                    .ok_or(Error::Invalid(format!("piece {k} filled twice")))?;
                jobs.push(PieceJob {
                    buf,
                    tag: block_tag(g, 1, c.src),
                    piece: p,
                });
            }
        }
        par_fill(jobs, self.threads);
        compute.synchronize().map_err(cuda("cuStreamSynchronize"))
    }

    /// Words in the destination blocks of `sets` that differ from their source's pattern.
    fn verify(&mut self, sets: &Sets, layout: Layout, shape: BlockShape) -> Result<u64> {
        let g = self.generation;
        let ids: Vec<u32> = sets.inn.iter().map(|c| c.dst).collect();
        let tags: Vec<u64> = sets.inn.iter().map(|c| block_tag(g, 1, c.src)).collect();
        let compute = self.gpu.compute_stream().clone();
        let blocks = Blocks {
            arena: self.engine.hbm(),
            layout,
            shape,
            ids: &ids,
            tags: &tags,
        };
        let on_gpu = self.kernels.verify(&compute, &blocks)?;
        let pb = shape.piece_bytes;
        let pieces = self.engine.dram_pieces(pb)?;
        let mut jobs = Vec::with_capacity(sets.out.len() * shape.pieces as usize);
        for c in &sets.out {
            for p in 0..shape.pieces {
                let k = (layout.offset(shape, c.dst, p) / pb) as usize;
                jobs.push(PieceJob {
                    buf: pieces[k],
                    tag: block_tag(g, 0, c.src),
                    piece: p,
                });
            }
        }
        Ok(on_gpu + par_count_mismatches(&jobs, self.threads))
    }

    fn record_raw(&mut self, name: &str, samples: &[(f64, f64, f64)]) {
        for (i, (t, h, d)) in samples.iter().enumerate() {
            let _ = writeln!(self.raw, "{name},{i},{t:.4},{h:.4},{d:.4}");
        }
    }

    fn finish(
        &mut self,
        name: &str,
        mode: Mode,
        samples: &[(f64, f64, f64)],
        copies: (u64, u64),
        calls: (u64, u64),
        bad: u64,
    ) -> Row {
        self.record_raw(name, samples);
        let pick =
            |f: fn(&(f64, f64, f64)) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
        let row = Row {
            name: name.to_string(),
            mode,
            copies,
            calls,
            bytes: u64::from(self.n) * self.block_bytes,
            total_ms: pick(|s| s.0),
            dir_ms: (pick(|s| s.1), pick(|s| s.2)),
            verified: if bad == 0 {
                Verified::Ok
            } else {
                Verified::Mismatch(bad)
            },
        };
        println!(
            "  {name}: {:.1} ms (H2D {:.1} GB/s, D2H {:.1} GB/s), {} copies, {}",
            row.total_ms,
            report::gbps(row.bytes, row.dir_ms.0),
            report::gbps(row.bytes, row.dir_ms.1),
            copies.0.max(copies.1),
            if bad == 0 {
                "data verified".to_string()
            } else {
                format!("{bad} WORDS WRONG")
            }
        );
        row
    }

    /// Out (D2H) then in (H2D) on one stream.
    #[allow(clippy::too_many_arguments)]
    fn sequential(
        &mut self,
        name: &str,
        sets: &Sets,
        layout: Layout,
        shape: BlockShape,
        out: &[Segment],
        inn: &[Segment],
        mode: CopyMode,
        reps: usize,
        warmup: bool,
    ) -> Result<Row> {
        self.prepare(sets, layout, shape)?;
        let (_, stream) = self.streams();
        let ev = self.events(3)?;
        let mut samples = Vec::new();
        let mut calls = (0, 0);
        for rep in 0..reps + usize::from(warmup) {
            ev[0].record(&stream).map_err(cuda("cuEventRecord"))?;
            // SAFETY: the arenas outlive the copies (we wait on ev[2] below before anything
            // else touches them); plans come from disjoint block sets, so no destination
            // overlaps another or a source.
            calls.1 = unsafe {
                self.copier
                    .issue(&stream, self.engine.hbm(), self.engine.dram(), out, mode)?
            };
            ev[1].record(&stream).map_err(cuda("cuEventRecord"))?;
            // SAFETY: as above.
            calls.0 = unsafe {
                self.copier
                    .issue(&stream, self.engine.dram(), self.engine.hbm(), inn, mode)?
            };
            ev[2].record(&stream).map_err(cuda("cuEventRecord"))?;
            let sample = (
                elapsed(&ev[0], &ev[2])?,
                elapsed(&ev[1], &ev[2])?,
                elapsed(&ev[0], &ev[1])?,
            );
            if rep >= usize::from(warmup) {
                samples.push(sample);
            }
        }
        let bad = self.verify(sets, layout, shape)?;
        Ok(self.finish(
            name,
            Mode::Sequential,
            &samples,
            (inn.len() as u64, out.len() as u64),
            calls,
            bad,
        ))
    }

    /// Both directions at once on the two copy streams, issued directly (not via the engine).
    fn duplex_raw(
        &mut self,
        name: &str,
        sets: &Sets,
        out: &[Segment],
        inn: &[Segment],
        how: How,
        reps: usize,
    ) -> Result<Row> {
        self.prepare(sets, Layout::BlockFirst, kv_shape())?;
        let (h2d, d2h) = self.streams();
        let ev = self.events(3)?;
        let mut samples = Vec::new();
        let mut calls = (1, 1);
        for rep in 0..=reps {
            ev[0].record(&h2d).map_err(cuda("cuEventRecord"))?;
            d2h.wait(&ev[0]).map_err(cuda("cuStreamWaitEvent"))?;
            let (hbm, dram) = (self.engine.hbm(), self.engine.dram());
            match how {
                // SAFETY: as in `sequential`; the two directions use disjoint blocks.
                How::Copies(mode) => unsafe {
                    calls.0 = self.copier.issue(&h2d, dram, hbm, inn, mode)?;
                    calls.1 = self.copier2.issue(&d2h, hbm, dram, out, mode)?;
                },
                // SAFETY: as above.
                How::SmKernel => unsafe {
                    self.kernels.copy_segments(&h2d, dram, hbm, inn)?;
                    self.kernels.copy_segments(&d2h, hbm, dram, out)?;
                },
            }
            ev[1].record(&h2d).map_err(cuda("cuEventRecord"))?;
            ev[2].record(&d2h).map_err(cuda("cuEventRecord"))?;
            let (h, d) = (elapsed(&ev[0], &ev[1])?, elapsed(&ev[0], &ev[2])?);
            if rep > 0 {
                samples.push((h.max(d), h, d));
            }
        }
        let bad = self.verify(sets, Layout::BlockFirst, kv_shape())?;
        Ok(self.finish(
            name,
            Mode::Duplex,
            &samples,
            (inn.len() as u64, out.len() as u64),
            calls,
            bad,
        ))
    }

    /// One duplex batch through the engine (the code path the serving engine uses), timed
    /// from a start event that both copy streams wait on. Returns (total, h2d, d2h) ms.
    fn engine_batch(&mut self, sets: &Sets, start: Option<&CudaEvent>) -> Result<(f64, f64, f64)> {
        let (h2d, d2h) = self.streams();
        let ev = self.events(3)?;
        let e0 = match start {
            Some(e) => e,
            None => {
                ev[0].record(&h2d).map_err(cuda("cuEventRecord"))?;
                &ev[0]
            }
        };
        h2d.wait(e0).map_err(cuda("cuStreamWaitEvent"))?;
        d2h.wait(e0).map_err(cuda("cuStreamWaitEvent"))?;
        self.engine.submit(&sets.inn, &sets.out)?;
        ev[1].record(&h2d).map_err(cuda("cuEventRecord"))?;
        ev[2].record(&d2h).map_err(cuda("cuEventRecord"))?;
        self.engine.wait_all()?;
        let (h, d) = (elapsed(e0, &ev[1])?, elapsed(e0, &ev[2])?);
        Ok((h.max(d), h, d))
    }

    fn duplex_engine(&mut self, name: &str, sets: &Sets, reps: usize) -> Result<Row> {
        self.prepare(sets, Layout::BlockFirst, kv_shape())?;
        let mut samples = Vec::new();
        for rep in 0..=reps {
            let s = self.engine_batch(sets, None)?;
            if rep > 0 {
                samples.push(s);
            }
        }
        let segs = self.engine.last_segments();
        let bad = self.verify(sets, Layout::BlockFirst, kv_shape())?;
        Ok(self.finish(
            name,
            Mode::Duplex,
            &samples,
            (segs.0 as u64, segs.1 as u64),
            (1, 1),
            bad,
        ))
    }
}

/// Random scattered block ids: each direction gets `n` blocks of each arena, disjoint.
pub(crate) fn random_sets(n: u32, seed: u64) -> Sets {
    let mut rng = SplitMix64::new(seed);
    let hbm = rng.permutation(2 * n);
    let dram = rng.permutation(2 * n);
    let (nu, total) = (n as usize, 2 * n as usize);
    Sets {
        out: (0..nu)
            .map(|i| BlockCopy {
                src: hbm[i],
                dst: dram[i],
            })
            .collect(),
        inn: (nu..total)
            .map(|i| BlockCopy {
                src: dram[i],
                dst: hbm[i],
            })
            .collect(),
    }
}

/// The ceiling's blocks: one contiguous range each way (DRAM 0..n -> HBM 0..n in, HBM
/// n..2n -> DRAM n..2n out).
fn contiguous_sets(n: u32) -> Sets {
    Sets {
        out: (n..2 * n).map(|b| BlockCopy { src: b, dst: b }).collect(),
        inn: (0..n).map(|b| BlockCopy { src: b, dst: b }).collect(),
    }
}

fn header(b: &Bench, o: &Opts) -> Result<String> {
    let (maj, min) = b.gpu.driver_version()?;
    let origin = match b.kernels.origin {
        Origin::Cached => "loaded from cache".to_string(),
        Origin::Compiled { ms } => format!("compiled by NVRTC in {ms:.0} ms"),
    };
    Ok(format!(
        "GPU: {} ({}), driver CUDA {maj}.{min}, NVRTC {}, kernels {origin}\n\
         KV: Qwen2.5-32B shape, {} layers x K/V x 16 tokens x 8 heads x 128 x bf16 = {} MiB blocks, block-first\n\
         moved: {} GiB each way = {} blocks, random scattered ids (seed {}), arenas of {} blocks per tier\n\
         pinned DRAM tier: {} chunk(s) of up to {} GiB; {} timed reps per row (median), naive {}",
        b.gpu.name()?,
        b.gpu.arch()?,
        compiler_version()?,
        LAYERS,
        b.block_bytes >> 20,
        o.gib,
        b.n,
        o.seed,
        b.total,
        b.engine.dram().num_chunks(),
        o.chunk_gib,
        o.reps,
        o.naive_reps,
    ))
}

/// Runs the whole table; returns whether every row's data verified.
pub fn run(o: &Opts) -> Result<bool> {
    let shape = kv_shape();
    let block_bytes = shape.block_bytes();
    let n = (o.gib * GIB / block_bytes) as u32;
    let total = 2 * n;
    let gpu = Gpu::new(0)?;
    let t = std::time::Instant::now();
    let engine = DuplexEngine::new(
        &gpu,
        DuplexConfig {
            block_bytes,
            hbm_blocks: total,
            dram_blocks: total,
            pinned_chunk_bytes: o.chunk_gib * GIB,
            mode: CopyMode::Batched,
            merge: true,
        },
    )?;
    println!(
        "allocated {} GiB HBM + {} GiB pinned in {:.1} s",
        2 * o.gib,
        2 * o.gib,
        t.elapsed().as_secs_f64()
    );
    let kernels = Kernels::load(&gpu, &CompileCache::new(CompileCache::default_dir()))?;
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let mut b = Bench {
        gpu,
        engine,
        kernels,
        n,
        total,
        block_bytes,
        generation: 0,
        threads,
        copier: Copier::default(),
        copier2: Copier::default(),
        raw: String::from("row,rep,total_ms,h2d_ms,d2h_ms\n"),
    };
    let head = header(&b, o)?;
    println!("{head}");

    let sets = random_sets(n, o.seed);
    let cont = contiguous_sets(n);
    let dram_chunk = b.engine.dram().chunk_bytes();
    let limits = MergeLimits {
        src_chunk_blocks: u32::MAX,
        dst_chunk_blocks: (dram_chunk / block_bytes) as u32,
        max_blocks: u32::MAX,
    };
    let limits_in = MergeLimits {
        src_chunk_blocks: limits.dst_chunk_blocks,
        dst_chunk_blocks: u32::MAX,
        max_blocks: u32::MAX,
    };
    let c_out = plan::merged(&cont.out, block_bytes, limits);
    let c_in = plan::merged(&cont.inn, block_bytes, limits_in);
    let (reps, nreps) = (o.reps, o.naive_reps.max(1));

    println!("ceilings (contiguous pinned copies):");
    let seq0 = b.sequential(
        "Ceiling: contiguous, out then in",
        &cont,
        Layout::BlockFirst,
        shape,
        &c_out,
        &c_in,
        CopyMode::PerSegment,
        reps,
        true,
    )?;
    let dup0 = b.duplex_raw(
        "Ceiling: contiguous, both at once",
        &cont,
        &c_out,
        &c_in,
        How::Copies(CopyMode::PerSegment),
        reps,
    )?;

    println!("rows:");
    let mut rows = Vec::new();
    let layer_first = Layout::LayerFirst { num_blocks: total };
    let per_layer = BlockShape::per_layer(LAYERS, 2 * HALF_LAYER_BYTES);
    // Naive as vLLM's swap loop: one tensor per layer per K/V, one copy per block of each.
    let kv_out = plan::per_piece(&sets.out, shape, layer_first, layer_first);
    let kv_in = plan::per_piece(&sets.inn, shape, layer_first, layer_first);
    rows.push(b.sequential(
        NAIVE,
        &sets,
        layer_first,
        shape,
        &kv_out,
        &kv_in,
        CopyMode::PerSegment,
        nreps,
        false,
    )?);
    if o.naive_sync {
        rows.push(b.sequential(
            "(baseline) Naive as a synchronous swap loop: same 32 KiB copies, each waited for",
            &sets,
            layer_first,
            shape,
            &kv_out,
            &kv_in,
            CopyMode::Synchronous,
            1,
            false,
        )?);
    }
    drop((kv_out, kv_in));
    if o.naive_layer {
        let nv_out = plan::per_piece(&sets.out, per_layer, layer_first, layer_first);
        let nv_in = plan::per_piece(&sets.inn, per_layer, layer_first, layer_first);
        rows.push(b.sequential("(baseline) Naive with K and V of a layer adjacent: one copy per layer per block (64 KiB)", &sets, layer_first, per_layer, &nv_out, &nv_in, CopyMode::PerSegment, nreps, false)?);
    }
    let pb_out = plan::per_block(&sets.out, block_bytes);
    let pb_in = plan::per_block(&sets.inn, block_bytes);
    rows.push(b.sequential(
        "Merged segments: block-first, one copy per block (4 MiB), one stream, out then in",
        &sets,
        Layout::BlockFirst,
        shape,
        &pb_out,
        &pb_in,
        CopyMode::PerSegment,
        reps,
        true,
    )?);
    rows.push(b.sequential(
        "Merged + batched: one cuMemcpyBatchAsync per direction, one stream, out then in",
        &sets,
        Layout::BlockFirst,
        shape,
        &pb_out,
        &pb_in,
        CopyMode::Batched,
        reps,
        true,
    )?);
    rows.push(b.duplex_engine(
        "DuplexKV: DuplexEngine, batched, both directions at once on two streams",
        &sets,
        reps,
    )?);
    rows.push(b.duplex_raw(
        "(tried) duplex, one cuMemcpyAsync per block on each stream",
        &sets,
        &pb_out,
        &pb_in,
        How::Copies(CopyMode::PerSegment),
        reps,
    )?);
    rows.push(b.duplex_raw(
        "(tried) duplex, SM gather/scatter kernels (NVRTC) instead of copy engines",
        &sets,
        &pb_out,
        &pb_in,
        How::SmKernel,
        reps,
    )?);

    println!("ceilings again (drift check):");
    let seq1 = b.sequential(
        "Ceiling: contiguous, out then in",
        &cont,
        Layout::BlockFirst,
        shape,
        &c_out,
        &c_in,
        CopyMode::PerSegment,
        reps,
        true,
    )?;
    let dup1 = b.duplex_raw(
        "Ceiling: contiguous, both at once",
        &cont,
        &c_out,
        &c_in,
        How::Copies(CopyMode::PerSegment),
        reps,
    )?;
    let (seq, dup) = (
        if seq1.total_ms < seq0.total_ms {
            seq1
        } else {
            seq0
        },
        if dup1.total_ms < dup0.total_ms {
            dup1
        } else {
            dup0
        },
    );
    let ceilings = Ceilings {
        sequential_ms: seq.total_ms,
        duplex_ms: dup.total_ms,
    };

    println!("interference with a memory-bound kernel on the compute stream:");
    let inter = interference(&mut b, &sets, reps)?;

    rows.push(seq);
    rows.push(dup);
    let all_ok = rows.iter().all(|r| r.verified == Verified::Ok) && inter.1;
    let mut md = format!("```\n{head}\n```\n\n");
    md.push_str(&report::table(&rows, &ceilings));
    let dkv = rows
        .iter()
        .find(|r| r.name.starts_with("DuplexKV"))
        .map_or(f64::NAN, |r| r.total_ms);
    let _ = writeln!(md, "\nDuplexKV = {:.1}% of the same-run duplex ceiling ({:.1} GB/s each way, slower direction).", 100.0 * ceilings.duplex_ms / dkv, report::gbps(u64::from(n) * block_bytes, ceilings.duplex_ms));
    for r in rows.iter().filter(|r| r.name.contains("Naive")) {
        let _ = writeln!(md, "{:.1}x = {} / DuplexKV", r.total_ms / dkv, r.name);
    }
    md.push('\n');
    md.push_str(&report::interference_table(&inter.0));
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

/// The duplex batch beside a memory-bound copy kernel on the compute stream: each timed alone
/// and together. Returns the rows and whether the copied data verified.
fn interference(b: &mut Bench, sets: &Sets, reps: usize) -> Result<(Vec<Interference>, bool)> {
    let bytes = 2 * GIB;
    let src = DeviceArena::new(&b.gpu, bytes)?;
    let dst = DeviceArena::new(&b.gpu, bytes)?;
    let compute = b.gpu.compute_stream().clone();
    let ev = b.events(3)?;
    let passes = |kernels: &Kernels, k: usize| -> Result<()> {
        for _ in 0..k {
            kernels.stream_copy(&compute, &src, &dst, bytes)?;
        }
        Ok(())
    };
    passes(&b.kernels, 3)?;
    ev[0].record(&compute).map_err(cuda("cuEventRecord"))?;
    passes(&b.kernels, 10)?;
    ev[1].record(&compute).map_err(cuda("cuEventRecord"))?;
    let per_pass = elapsed(&ev[0], &ev[1])? / 10.0;
    println!(
        "  load kernel: {:.2} ms per pass over 2 GiB ({:.0} GB/s read+write)",
        per_pass,
        2.0 * report::gbps(bytes, per_pass)
    );

    b.prepare(sets, Layout::BlockFirst, kv_shape())?;
    let mut d_alone = Vec::new();
    for rep in 0..=reps {
        let s = b.engine_batch(sets, None)?;
        if rep > 0 {
            d_alone.push(s.0);
        }
    }
    let d_alone = median(&d_alone);
    let k = ((1.25 * d_alone / per_pass).ceil() as usize).max(1);
    let mut k_alone = Vec::new();
    for _ in 0..reps {
        ev[0].record(&compute).map_err(cuda("cuEventRecord"))?;
        passes(&b.kernels, k)?;
        ev[1].record(&compute).map_err(cuda("cuEventRecord"))?;
        k_alone.push(elapsed(&ev[0], &ev[1])?);
    }
    let (mut k_tog, mut d_tog) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        ev[0].record(&compute).map_err(cuda("cuEventRecord"))?;
        passes(&b.kernels, k)?;
        ev[2].record(&compute).map_err(cuda("cuEventRecord"))?;
        let s = b.engine_batch(sets, Some(&ev[0]))?;
        k_tog.push(elapsed(&ev[0], &ev[2])?);
        d_tog.push(s.0);
    }
    let bad = b.verify(sets, Layout::BlockFirst, kv_shape())?;
    println!(
        "  {k} passes; copied data {}",
        if bad == 0 {
            "verified".to_string()
        } else {
            format!("{bad} WORDS WRONG")
        }
    );
    Ok((
        vec![
            Interference {
                name: format!(
                    "DuplexKV batch ({} GiB each way)",
                    b.n as u64 * b.block_bytes / GIB
                ),
                alone_ms: d_alone,
                together_ms: median(&d_tog),
            },
            Interference {
                name: format!("memory-bound copy kernel, {k} passes over 2 GiB"),
                alone_ms: median(&k_alone),
                together_ms: median(&k_tog),
            },
        ],
        bad == 0,
    ))
}
