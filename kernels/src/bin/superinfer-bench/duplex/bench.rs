//! The bench state of `duplex` (device, arenas, copy engines, events) and its timed
//! movements, shared by the rows, the interference run and the setup.

use std::fmt::Write as _;
use std::sync::Arc;

use superinfer_kernels::compile_cache::CompileCache;
use superinfer_kernels::cuda::cudarc::driver::{CudaEvent, CudaStream, DriverError};
use superinfer_kernels::cuda::{
    Blocks, Copier, CopyMode, DuplexConfig, DuplexEngine, Gpu, Kernels,
};
use superinfer_kernels::pattern::{block_tag, par_count_mismatches, par_fill, PieceJob};
use superinfer_kernels::plan::{BlockCopy, BlockShape, Layout, Segment};
use superinfer_kernels::report::{self, median, Mode, Row, Verified};
use superinfer_kernels::{Error, Result};

use crate::opts::Opts;

pub(super) const GIB: u64 = 1 << 30;
/// Qwen2.5-32B's KV: 64 layers; K (or V) of one layer of a 16-token block is
/// 16 tokens x 8 heads x 128 dims x 2 B (bf16) = 32 KiB; a block is 4 MiB.
pub(super) const LAYERS: u32 = 64;
pub(super) const HALF_LAYER_BYTES: u64 = 16 * 8 * 128 * 2;
pub(super) const NAIVE: &str =
    "Naive: layer-first, one copy per layer per block per K/V (32 KiB), one stream, out then in";

pub(super) fn cuda(op: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        detail: format!("{e:?}"),
    }
}

pub(super) fn elapsed(a: &CudaEvent, b: &CudaEvent) -> Result<f64> {
    a.elapsed_ms(b)
        .map(f64::from)
        .map_err(cuda("cuEventElapsedTime"))
}

/// Which blocks move where: `out` HBM -> DRAM (eviction), `inn` DRAM -> HBM (restore).
#[derive(Clone, Debug)]
pub(super) struct Sets {
    pub out: Vec<BlockCopy>,
    pub inn: Vec<BlockCopy>,
}

/// What a row moves: its blocks, their layout and shape (for filling and verifying), and
/// the copy plan of each direction.
pub(super) struct Movement<'a> {
    pub(super) sets: &'a Sets,
    pub(super) layout: Layout,
    pub(super) shape: BlockShape,
    pub(super) out: &'a [Segment],
    pub(super) inn: &'a [Segment],
}

/// How a duplex row moves its bytes.
#[derive(Clone, Copy)]
pub(super) enum How {
    Copies(CopyMode),
    SmKernel,
}

pub(super) struct Bench {
    pub(super) gpu: Gpu,
    pub(super) engine: DuplexEngine,
    pub(super) kernels: Kernels,
    /// Blocks per direction.
    pub(super) n: u32,
    /// Blocks in each arena (2n: the two directions never share a block).
    pub(super) total: u32,
    pub(super) block_bytes: u64,
    pub(super) generation: u32,
    pub(super) threads: usize,
    pub(super) copier: Copier,
    pub(super) copier2: Copier,
    pub(super) raw: String,
}

pub(super) fn kv_shape() -> BlockShape {
    BlockShape::kv(LAYERS, HALF_LAYER_BYTES)
}

impl Bench {
    pub(super) fn events(&self, n: usize) -> Result<Vec<CudaEvent>> {
        (0..n).map(|_| self.gpu.new_event(true)).collect()
    }

    pub(super) fn streams(&self) -> (Arc<CudaStream>, Arc<CudaStream>) {
        let (h, d) = self.engine.streams();
        (h.clone(), d.clone())
    }

    /// Fresh data in every source block of `sets` (a new generation, so anything left from
    /// an earlier row fails verification).
    pub(super) fn prepare(&mut self, sets: &Sets, layout: Layout, shape: BlockShape) -> Result<()> {
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
    pub(super) fn verify(&mut self, sets: &Sets, layout: Layout, shape: BlockShape) -> Result<u64> {
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

    pub(super) fn record_raw(&mut self, name: &str, samples: &[(f64, f64, f64)]) {
        for (i, (t, h, d)) in samples.iter().enumerate() {
            let _ = writeln!(self.raw, "{name},{i},{t:.4},{h:.4},{d:.4}");
        }
    }

    pub(super) fn finish(
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
    pub(super) fn sequential(
        &mut self,
        name: &str,
        m: &Movement<'_>,
        mode: CopyMode,
        reps: usize,
        warmup: bool,
    ) -> Result<Row> {
        let (sets, layout, shape, out, inn) = (m.sets, m.layout, m.shape, m.out, m.inn);
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
    pub(super) fn duplex_raw(
        &mut self,
        name: &str,
        m: &Movement<'_>,
        how: How,
        reps: usize,
    ) -> Result<Row> {
        let (sets, out, inn) = (m.sets, m.out, m.inn);
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
    pub(super) fn engine_batch(
        &mut self,
        sets: &Sets,
        start: Option<&CudaEvent>,
    ) -> Result<(f64, f64, f64)> {
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

    pub(super) fn duplex_engine(&mut self, name: &str, sets: &Sets, reps: usize) -> Result<Row> {
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

/// Runs the whole table; returns whether every row's data verified.
impl Bench {
    pub(super) fn new(o: &Opts) -> Result<Bench> {
        let block_bytes = kv_shape().block_bytes();
        let n = (o.gib * GIB / block_bytes) as u32;
        let total = 2 * n;
        let gpu = Gpu::new(0)?;
        let t = std::time::Instant::now();
        let cfg = DuplexConfig {
            block_bytes,
            hbm_blocks: total,
            dram_blocks: total,
            pinned_chunk_bytes: o.chunk_gib * GIB,
            mode: CopyMode::Batched,
            merge: true,
        };
        let engine = DuplexEngine::new(&gpu, cfg)?;
        let gib = 2 * o.gib;
        let secs = t.elapsed().as_secs_f64();
        println!("allocated {gib} GiB HBM + {gib} GiB pinned in {secs:.1} s");
        let kernels = Kernels::load(&gpu, &CompileCache::new(CompileCache::default_dir()))?;
        Ok(Bench {
            gpu,
            engine,
            kernels,
            n,
            total,
            block_bytes,
            generation: 0,
            threads: std::thread::available_parallelism().map_or(4, |p| p.get()),
            copier: Copier::default(),
            copier2: Copier::default(),
            raw: String::from("row,rep,total_ms,h2d_ms,d2h_ms\n"),
        })
    }
}
