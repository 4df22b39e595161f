//! These need a CUDA GPU, so they are ignored by default; on the device machine:
//! `scripts/gpu/engine-tests.sh` runs them with `--ignored`.

use std::time::{Duration, Instant};

use superinfer_kernels::cuda::Gpu;
use superinfer_kernels::pattern::{block_tag, count_mismatches, fill_piece};

use super::*;
use crate::kv::block::{DramBlock, HbmBlock};
use crate::transfer::{D2hCopy, H2dCopy};

/// 4 layers x K/V x 16 tokens x 8 heads x 128 x bf16 = 256 KiB blocks.
fn geometry() -> BlockGeometry {
    BlockGeometry {
        num_layers: 4,
        block_size: 16,
        kv_heads: 8,
        head_dim: 128,
        dtype_bytes: 2,
    }
}

fn transfer() -> CudaTransfer {
    let gpu = Gpu::new(0).expect("these tests need a CUDA GPU");
    let cfg = CudaTransferConfig {
        geometry: geometry(),
        hbm_blocks: 64,
        dram_blocks: 96,
        pinned_chunk_bytes: 1 << 30,
    };
    CudaTransfer::new(&gpu, cfg).expect("allocating both tiers")
}

/// Polls until `n` tickets have completed (at most 10 s).
fn wait(t: &mut CudaTransfer, n: usize) -> Vec<Ticket> {
    let start = Instant::now();
    let mut done = Vec::new();
    while done.len() < n && start.elapsed() < Duration::from_secs(10) {
        done.extend(t.poll(0.0));
    }
    done
}

fn fill_dram(t: &mut CudaTransfer, blocks: std::ops::Range<u32>, generation: u32) {
    let bb = geometry().block_bytes();
    let mut slots = t
        .engine_mut()
        .dram_pieces_mut(bb)
        .expect("no batch in flight");
    for b in blocks {
        fill_piece(slots[b as usize], block_tag(generation, 1, b), 0);
    }
}

fn dram_mismatches(
    t: &CudaTransfer,
    blocks: std::ops::Range<u32>,
    src: u32,
    generation: u32,
) -> u64 {
    let bb = geometry().block_bytes();
    let slots = t.engine().dram_pieces(bb).expect("no batch in flight");
    blocks
        .enumerate()
        .map(|(i, b)| {
            count_mismatches(
                slots[b as usize],
                block_tag(generation, 1, src + i as u32),
                0,
            )
        })
        .sum()
}

fn h2d(src: u32, dst: u32, n: u32) -> Vec<H2dCopy> {
    (0..n)
        .map(|i| H2dCopy {
            src: DramBlock(src + i),
            dst: HbmBlock(dst + i),
        })
        .collect()
}

fn d2h(src: u32, dst: u32, n: u32) -> Vec<D2hCopy> {
    (0..n)
        .map(|i| D2hCopy {
            src: HbmBlock(src + i),
            dst: DramBlock(dst + i),
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn round_trip_through_hbm_preserves_every_byte() {
    let mut t = transfer();
    let bb = geometry().block_bytes();
    fill_dram(&mut t, 0..8, 1);
    let a = t
        .submit(
            0.0,
            CopyBatch {
                h2d: h2d(0, 10, 8),
                d2h: vec![],
            },
        )
        .h2d
        .unwrap();
    assert_eq!(wait(&mut t, 1), vec![a]);
    assert_eq!(
        t.engine().last_segments(),
        (1, 0),
        "8 adjacent blocks merge into one copy"
    );
    t.step_issued();
    let b = t
        .submit(
            0.0,
            CopyBatch {
                h2d: vec![],
                d2h: d2h(10, 20, 8),
            },
        )
        .d2h
        .unwrap();
    assert_eq!(wait(&mut t, 1), vec![b]);
    assert_eq!(dram_mismatches(&t, 20..28, 0, 1), 0);
    assert_eq!(t.bytes_moved(), (8 * bb, 8 * bb));
    assert!(t.poll(0.0).is_empty(), "each ticket is reported once");
    assert_eq!(t.next_completion(), None);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn restore_and_eviction_in_one_batch_both_land() {
    let mut t = transfer();
    fill_dram(&mut t, 0..8, 2);
    fill_dram(&mut t, 30..38, 2);
    let first = t
        .submit(
            0.0,
            CopyBatch {
                h2d: h2d(0, 0, 8),
                d2h: vec![],
            },
        )
        .h2d
        .unwrap();
    assert_eq!(wait(&mut t, 1), vec![first]);
    // Restore DRAM 30..38 into HBM 40..48 while HBM 0..8 is evicted to DRAM 50..58.
    t.step_issued();
    let both = t.submit(
        0.0,
        CopyBatch {
            h2d: h2d(30, 40, 8),
            d2h: d2h(0, 50, 8),
        },
    );
    // Two tickets, one per direction, each reported once.
    let mut landed = wait(&mut t, 2);
    landed.sort();
    assert_eq!(landed, vec![both.h2d.unwrap(), both.d2h.unwrap()]);
    t.step_issued();
    let back = t
        .submit(
            0.0,
            CopyBatch {
                h2d: vec![],
                d2h: d2h(40, 60, 8),
            },
        )
        .d2h
        .unwrap();
    assert_eq!(wait(&mut t, 1), vec![back]);
    assert_eq!(dram_mismatches(&t, 50..58, 0, 2), 0, "evicted blocks");
    assert_eq!(dram_mismatches(&t, 60..68, 30, 2), 0, "restored blocks");
}

/// Both copy streams wait for the step issued last: a restore into a slot that the step still
/// reads (a slot freed by an abort or a recompute is handed out at once) lands after the step.
/// The "step" is a chain of large matrix products followed by a copy of HBM slot 0, all on the
/// compute stream; the restore into slot 0 is submitted right after `step_issued`. Without the
/// wait the restore (microseconds) overtakes the chain (tens of milliseconds) and the step
/// reads the new bytes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_restore_never_overtakes_the_step_that_reads_its_slot() {
    use candle_core::{DType, Device, Tensor};
    let gpu = Gpu::new(0).expect("these tests need a CUDA GPU");
    let dev = Device::Cuda(gpu.candle().clone());
    let g = geometry();
    let elems = g.block_bytes() as usize / 2;
    let arena = Tensor::zeros((8, elems), DType::BF16, &dev).unwrap();
    let cfg = CudaTransferConfig {
        geometry: g,
        hbm_blocks: 8,
        dram_blocks: 8,
        pinned_chunk_bytes: 1 << 30,
    };
    let mut t = CudaTransfer::with_arena(&gpu, cfg, &arena).expect("copy engine");
    let bits = |x: &Tensor| -> Vec<u32> {
        x.to_dtype(DType::F32)
            .and_then(|x| x.flatten_all())
            .and_then(|x| x.to_vec1::<f32>())
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    };
    for round in 0..5u32 {
        fill_dram(&mut t, 0..2, 10 + round);
        t.submit(
            0.0,
            CopyBatch {
                h2d: h2d(0, 0, 1),
                d2h: vec![],
            },
        );
        assert_eq!(wait(&mut t, 1).len(), 1);
        let before = bits(&arena.narrow(0, 0, 1).unwrap());
        // The step: ~30 ms of products, then it reads slot 0.
        let a = Tensor::randn(0f32, 0.01, (4096, 4096), &dev)
            .and_then(|a| a.to_dtype(DType::BF16))
            .unwrap();
        let mut x = a.clone();
        for _ in 0..100 {
            x = x.matmul(&a).unwrap();
        }
        let seen = arena.narrow(0, 0, 1).unwrap().copy().unwrap();
        t.step_issued();
        // The restore of another block into slot 0, right away.
        t.submit(
            0.0,
            CopyBatch {
                h2d: h2d(1, 0, 1),
                d2h: vec![],
            },
        );
        assert_eq!(wait(&mut t, 1).len(), 1);
        drop(x);
        let after = bits(&arena.narrow(0, 0, 1).unwrap());
        assert_ne!(before, after, "round {round}: the restore did not land");
        assert_eq!(
            bits(&seen),
            before,
            "round {round}: the step read bytes of a restore issued after it"
        );
    }
}
