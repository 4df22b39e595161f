//! The GEMV kernel (gemv.cu) against cuBLAS for 1 to 8 rows, and its fused SwiGLU epilogue
//! against the separate kernels, bitwise.

use super::{cuda, model_kernels, prompt, rel_err, tables};
use candle_core::{DType, Tensor};
use superinfer_engine::model::gpu_llama::{DecodeOut, GpuLlama};
use superinfer_engine::model::tiny::RandomLlama;
use superinfer_engine::model::{KvArena, SeqChunk};
use superinfer_kernels::cuda::DecodeKernel;

/// The small-batch GEMV kernel against candle's matmul (cuBLAS) in f32, for 1 to 8 rows; the
/// shapes include widths that are not a multiple of the columns a warp takes from 2 rows on
/// (1003 is odd; it and 70 are not multiples of 4, the other split measured), and rows that
/// end in a partial 256-element chunk (1000, 520, 136).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_matches_cublas_for_one_to_eight_rows() {
    let (dev, k) = model_kernels();
    for (n, kk) in [
        (1000usize, 4096usize),
        (4096, 14336),
        (72, 136),
        (1003, 1000),
        (70, 520),
    ] {
        let w = Tensor::randn(0f32, 1.0, (n, kk), &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        for m in 1..=8usize {
            let x = Tensor::randn(0f32, 1.0, (m, kk), &dev)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let got = k.gemv(&x, &w).unwrap();
            let want = x
                .to_dtype(DType::F32)
                .unwrap()
                .matmul(&w.to_dtype(DType::F32).unwrap().t().unwrap())
                .unwrap();
            let e = rel_err(&got, &want);
            assert!(e <= 5e-3, "gemv {m}x{kk} by {n}x{kk}: relative error {e}");
        }
    }
    println!(
        "gemv: 1..8 rows x (1000, 4096), (4096, 14336), (72, 136), (1003, 1000), (70, 520): \
         within 5e-3 of f32"
    );
}

/// gemv_silu (silu_mul in the gate/up GEMV's epilogue) for 1 to 8 rows, which only decode
/// buckets launch: decode steps of 1 to 8 sequences through buckets of exactly that many rows,
/// every matmul through the GEMV kernel, with silu_mul fused and not, give the same logits
/// bit for bit (the fused epilogue is silu_mul over the plain GEMV's columns, each dot product
/// summed in the same order). The MLP is 1000 wide (its down projection's rows end in a
/// partial chunk) and the vocabulary 1003 (the LM head's width is odd).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_silu_matches_silu_mul_over_gemv_for_one_to_eight_rows() {
    const BLOCK: u32 = 16;
    let dev = cuda();
    let spec = RandomLlama {
        intermediate_size: 1000,
        num_layers: 2,
        ..RandomLlama::SMALL_100M
    };
    let vocab = 1003usize;
    let mut m = GpuLlama::random(&spec, vocab, DType::BF16, &dev, 11).unwrap();
    // A decode kernel that the buckets launch, whatever SUPERINFER_DECODE_KERNEL says.
    m.kernels().set_decode_kernel(DecodeKernel::TensorCore);
    let lens = [5usize, 17, 40, 9, 33, 64, 2, 100];
    let tokens: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| prompt(i as u64, l + 1))
        .map(|t| {
            t.into_iter()
                .map(|x| x % vocab as u32)
                .collect::<Vec<u32>>()
        })
        .collect();
    let per_seq = 100 / BLOCK as usize + 2;
    let blocks = tables(lens.len(), per_seq);
    let geometry = m.config().kv_geometry(BLOCK, DType::BF16);
    let kv = KvArena::new(geometry, (lens.len() * per_seq) as u32, DType::BF16, &dev).unwrap();
    m.set_gemv_max_rows(8);
    // Every sequence but its last token.
    for (i, &l) in lens.iter().enumerate() {
        let c = [SeqChunk {
            tokens: &tokens[i],
            pos: 0,
            end: l - 1,
            blocks: &blocks[i],
            sample: true,
            all_rows: false,
        }];
        m.forward(&c, &kv).unwrap();
    }
    // Step b: the last token of the first b sequences (each step writes that position's keys
    // before it reads them, so the steps do not depend on each other).
    let step = |m: &GpuLlama, b: usize| -> Vec<f32> {
        let c: Vec<SeqChunk<'_>> = (0..b)
            .map(|i| SeqChunk {
                tokens: &tokens[i],
                pos: lens[i] - 1,
                end: lens[i],
                blocks: &blocks[i],
                sample: true,
                all_rows: false,
            })
            .collect();
        match m.decode(&c, &kv, None).unwrap() {
            Some(DecodeOut::Logits(l)) => l
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap(),
            _ => panic!("a decode step through the buckets"),
        }
    };
    m.set_decode_buckets(&[1, 2, 3, 4, 5, 6, 7, 8], false);
    m.set_decode_fused_silu(false);
    let separate: Vec<Vec<f32>> = (1..=8).map(|b| step(&m, b)).collect();
    m.set_decode_fused_silu(true);
    for (b, want) in (1..=8).zip(&separate) {
        let got = step(&m, b);
        println!(
            "gemv_silu, {b} rows: identical to silu_mul over gemv: {}",
            &got == want
        );
        assert!(&got == want, "gemv_silu for {b} rows changed the logits");
    }
}
