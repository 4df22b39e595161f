//! GPU correctness and hazard checks of the duplex engine, printed as PASS/FAIL lines.
//! Each check can fail: where it relies on timing, a control run shows the race it guards
//! against actually happens without the guard.

use superinfer_kernels::compile_cache::CompileCache;
use superinfer_kernels::cuda::{Blocks, CopyMode, DuplexConfig, DuplexEngine, Gpu, Kernels};
use superinfer_kernels::pattern::{block_tag, count_mismatches, fill_piece};
use superinfer_kernels::plan::{BlockCopy, BlockShape, Layout};
use superinfer_kernels::{Error, Result, Tier};

const LAYERS: u32 = 64;
const HALF_LAYER_BYTES: u64 = 16 * 8 * 128 * 2;
/// About 50 ms of SM cycles at H200 clocks: a producer slow enough that an ungated D2H copy
/// would read the block before the kernel writes it.
const SPIN_CYCLES: u64 = 100_000_000;

struct Ctx {
    engine: DuplexEngine,
    kernels: Kernels,
    shape: BlockShape,
    generation: u32,
    failures: u32,
}

fn c(src: u32, dst: u32) -> BlockCopy {
    BlockCopy { src, dst }
}

impl Ctx {
    fn report(&mut self, name: &str, ok: bool, detail: String) {
        if ok {
            println!(
                "PASS {name}{}",
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(" ({detail})")
                }
            );
        } else {
            self.failures += 1;
            println!("FAIL {name}: {detail}");
        }
    }

    /// Writes the pattern of generation `g` into HBM blocks on the compute stream.
    fn fill_hbm(&self, ids: &[u32], g: u32, spin: u64) -> Result<()> {
        let tags: Vec<u64> = ids.iter().map(|&b| block_tag(g, 0, b)).collect();
        let blocks = Blocks {
            arena: self.engine.hbm(),
            layout: Layout::BlockFirst,
            shape: self.shape,
            ids,
            tags: &tags,
        };
        self.kernels
            .fill(self.engine.gpu().compute_stream(), &blocks, spin)
    }

    fn hbm_mismatches(&self, ids: &[u32], tags: &[u64]) -> Result<u64> {
        let blocks = Blocks {
            arena: self.engine.hbm(),
            layout: Layout::BlockFirst,
            shape: self.shape,
            ids,
            tags,
        };
        self.kernels
            .verify(self.engine.gpu().compute_stream(), &blocks)
    }

    fn fill_dram(&mut self, ids: &[u32], g: u32) -> Result<()> {
        let pieces = self.shape.pieces as usize;
        let mut slots = self.engine.dram_pieces_mut(self.shape.piece_bytes)?;
        for &b in ids {
            for p in 0..pieces {
                fill_piece(slots[b as usize * pieces + p], block_tag(g, 1, b), p as u32);
            }
        }
        drop(slots);
        Ok(())
    }

    /// Mismatching words of DRAM blocks against (tag per block).
    fn dram_mismatches(&self, ids: &[u32], tags: &[u64]) -> Result<u64> {
        let pieces = self.shape.pieces as usize;
        let slots = self.engine.dram_pieces(self.shape.piece_bytes)?;
        let mut bad = 0;
        for (&b, &tag) in ids.iter().zip(tags) {
            for p in 0..pieces {
                bad += count_mismatches(slots[b as usize * pieces + p], tag, p as u32);
            }
        }
        Ok(bad)
    }

    fn sync_compute(&self) -> Result<()> {
        self.engine
            .gpu()
            .compute_stream()
            .synchronize()
            .map_err(|e| Error::Cuda {
                op: "cuStreamSynchronize",
                detail: format!("{e:?}"),
            })
    }

    fn next_gen(&mut self) -> u32 {
        self.generation += 1;
        self.generation
    }
}

/// Eviction of 16 blocks racing a restore of 16 other (interleaved) blocks in one batch; the
/// tracker refusing a restore into a block whose eviction is in flight, and allowing it after.
fn eviction_races_restore(x: &mut Ctx) -> Result<()> {
    let g = x.next_gen();
    let evict: Vec<u32> = (0..16).map(|i| 2 * i).collect(); // even HBM blocks
    let restore_to: Vec<u32> = (0..16).map(|i| 2 * i + 1).collect(); // odd HBM blocks
    let mirrors: Vec<u32> = (0..16).collect(); // DRAM 0..16 receive the evictions
    let sources: Vec<u32> = (32..48).collect(); // DRAM 32..48 feed the restores
    x.fill_hbm(&evict, g, 0)?;
    x.fill_dram(&sources, g)?;
    x.sync_compute()?;
    let d2h: Vec<BlockCopy> = evict.iter().zip(&mirrors).map(|(&s, &d)| c(s, d)).collect();
    let h2d: Vec<BlockCopy> = sources
        .iter()
        .zip(&restore_to)
        .map(|(&s, &d)| c(s, d))
        .collect();
    let id = x.engine.submit(&h2d, &d2h)?;

    // While that batch is in flight (the tracker clears it only when its events are seen
    // complete), a restore into an evicting block and a read of a mirror being written must
    // be refused, and a restore into untouched blocks allowed.
    let busy = x.engine.is_busy(Tier::Hbm, evict[3]);
    let into_evicting = x.engine.check(&[c(40, evict[3])], &[]);
    let from_mirror = x.engine.check(&[c(mirrors[5], 60)], &[]);
    let elsewhere = x.engine.check(&[c(50, 61)], &[]);
    let refused = matches!(into_evicting, Err(Error::Hazard(_)))
        && matches!(from_mirror, Err(Error::Hazard(_)));
    x.report(
        "hazard: restore into a block whose eviction is in flight is refused, so is reading a mirror being written",
        busy && refused && elsewhere.is_ok(),
        format!("busy={busy}, into evicting: {into_evicting:?}, from mirror: {from_mirror:?}, elsewhere: {elsewhere:?}"),
    );

    let done = x.engine.wait_all()?;
    let after = x.engine.check(&[c(40, evict[3])], &[]);
    x.report(
        "hazard: the same restore is allowed once the eviction has landed",
        done == vec![id] && after.is_ok(),
        format!("completed {done:?}, then {after:?}"),
    );

    let evict_tags: Vec<u64> = evict.iter().map(|&b| block_tag(g, 0, b)).collect();
    let restore_tags: Vec<u64> = sources.iter().map(|&b| block_tag(g, 1, b)).collect();
    let bad_mirrors = x.dram_mismatches(&mirrors, &evict_tags)?;
    let bad_restored = x.hbm_mismatches(&restore_to, &restore_tags)?;
    let bad_evicted_src = x.hbm_mismatches(&evict, &evict_tags)?;
    let bad_sources = x.dram_mismatches(&sources, &restore_tags)?;
    let total = bad_mirrors + bad_restored + bad_evicted_src + bad_sources;
    x.report(
        "race: eviction of 16 blocks and restore of 16 interleaved others in one batch, both streams",
        total == 0,
        format!("wrong words: mirrors {bad_mirrors}, restored {bad_restored}, evicted sources {bad_evicted_src}, restore sources {bad_sources}"),
    );
    Ok(())
}

/// A kernel that writes a block (after ~50 ms), then `step_issued`, then at once a D2H of that
/// block: the mirror must hold the new data. The control run skips `step_issued` and should
/// see stale data, which shows the check can fail.
fn writeback_is_gated(x: &mut Ctx) -> Result<()> {
    let block = 7;
    let mirror = 9;
    for gated in [true, false] {
        let old = x.next_gen();
        x.fill_hbm(&[block], old, 0)?;
        x.sync_compute()?;
        let new = x.next_gen();
        x.fill_hbm(&[block], new, SPIN_CYCLES)?; // the "model step" that fills the block
        if gated {
            x.engine.step_issued()?;
        }
        x.engine.submit(&[], &[c(block, mirror)])?;
        x.engine.wait_all()?;
        x.sync_compute()?;
        let bad_new = x.dram_mismatches(&[mirror], &[block_tag(new, 0, block)])?;
        let words = x.shape.block_bytes() / 8;
        if gated {
            x.report("writeback gated on the producing step: D2H issued right after a slow writer kernel sees its data", bad_new == 0, format!("{bad_new} of {words} words stale"));
        } else {
            let stale = bad_new > 0;
            println!("     control without step_issued: {} ({bad_new} of {words} words differ from the new data)", if stale { "copied stale data, so the check above can fail" } else { "copy happened to see new data; the check above is inconclusive" });
        }
    }
    Ok(())
}

/// Completion comes from events: `poll` right after a large submit reports nothing, each
/// batch is reported exactly once, in order, and bytes are counted per direction.
fn completion_by_events(x: &mut Ctx) -> Result<()> {
    let before = x.engine.bytes_moved();
    let d2h: Vec<BlockCopy> = (0..48).map(|b| c(b, 100 + b)).collect();
    let h2d: Vec<BlockCopy> = (150..198).map(|b| c(b, 100 + (b - 150))).collect();
    let a = x.engine.submit(&h2d, &d2h)?;
    let early = x.engine.poll()?;
    let b = x.engine.submit(&[], &[c(60, 220)])?;
    let mut seen = Vec::new();
    let t = std::time::Instant::now();
    while seen.len() < 2 && t.elapsed().as_secs() < 10 {
        seen.extend(x.engine.poll()?);
    }
    let again = x.engine.poll()?;
    let moved = x.engine.bytes_moved();
    let bb = x.shape.block_bytes();
    let bytes_ok = moved.0 - before.0 == 48 * bb && moved.1 - before.1 == 49 * bb;
    x.report(
        "completion by event query: nothing reported early, each batch once and in order, bytes counted",
        early.is_empty() && seen == vec![a, b] && again.is_empty() && bytes_ok,
        format!("early {early:?}, then {seen:?}, again {again:?}, bytes {:?}", (moved.0 - before.0, moved.1 - before.1)),
    );
    Ok(())
}

/// Runs every check on a small engine; returns whether all passed.
pub fn run() -> Result<bool> {
    println!("hazard and correctness checks (DuplexEngine, 4 MiB blocks):");
    let gpu = Gpu::new(0)?;
    let shape = BlockShape::kv(LAYERS, HALF_LAYER_BYTES);
    let engine = DuplexEngine::new(
        &gpu,
        DuplexConfig {
            block_bytes: shape.block_bytes(),
            hbm_blocks: 256,
            dram_blocks: 256,
            pinned_chunk_bytes: 1 << 30,
            mode: CopyMode::Batched,
            merge: true,
        },
    )?;
    let kernels = Kernels::load(&gpu, &CompileCache::new(CompileCache::default_dir()))?;
    let mut x = Ctx {
        engine,
        kernels,
        shape,
        generation: 1000,
        failures: 0,
    };
    eviction_races_restore(&mut x)?;
    writeback_is_gated(&mut x)?;
    completion_by_events(&mut x)?;
    println!("{} check(s) failed", x.failures);
    Ok(x.failures == 0)
}
