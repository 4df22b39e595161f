//! The block sets of the rows and the run's header.

use superinfer_kernels::cuda::nvrtc::{compiler_version, Origin};
use superinfer_kernels::pattern::SplitMix64;
use superinfer_kernels::plan::BlockCopy;
use superinfer_kernels::Result;

use super::bench::{Bench, Sets, LAYERS};
use crate::opts::Opts;

/// Random scattered block ids: each direction gets `n` blocks of each arena, disjoint.
pub(super) fn random_sets(n: u32, seed: u64) -> Sets {
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
pub(super) fn contiguous_sets(n: u32) -> Sets {
    Sets {
        out: (n..2 * n).map(|b| BlockCopy { src: b, dst: b }).collect(),
        inn: (0..n).map(|b| BlockCopy { src: b, dst: b }).collect(),
    }
}

pub(super) fn header(b: &Bench, o: &Opts) -> Result<String> {
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
