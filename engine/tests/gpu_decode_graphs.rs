//! Decode steps replayed from CUDA graphs against the same launches made directly and against
//! the eager forward pass (feature `cuda`; needs a CUDA GPU, so `#[ignore]`d and run by
//! `scripts/gpu/model.sh run`).
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use superinfer_engine::model::gpu_llama::{DecodeOut, GpuLlama, Overlap};
use superinfer_engine::model::tiny::RandomLlama;
use superinfer_engine::model::{KvArena, SeqChunk};
use superinfer_kernels::attention_plan::decode_split;
use superinfer_kernels::cuda::{DecodeKernel, GpuSample};

const BLOCK: u32 = 16;

fn floats(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den).sqrt()
}

/// Sequences of `lens` tokens each (prefilled up to their last token by the eager forward),
/// with blocks interleaved across sequences so a wrong table reads another's keys.
struct Seqs {
    tokens: Vec<Vec<u32>>,
    tables: Vec<Vec<u32>>,
}

fn seqs(lens: &[usize], vocab: u32) -> Seqs {
    let n = lens.len();
    let most = lens.iter().max().unwrap().div_ceil(BLOCK as usize) + 1;
    Seqs {
        tokens: lens
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                (0..l as u32 + 2)
                    .map(|t| (t * 7919 + i as u32 * 104_729) % vocab)
                    .collect()
            })
            .collect(),
        tables: (0..n)
            .map(|i| (0..most).map(|k| (i + k * n) as u32).collect())
            .collect(),
    }
}

/// The decodes `(sequence, position)` of one step.
fn decode_chunks<'a>(s: &'a Seqs, step: &[(usize, usize)]) -> Vec<SeqChunk<'a>> {
    step.iter()
        .map(|&(i, p)| SeqChunk {
            tokens: &s.tokens[i],
            pos: p,
            end: p + 1,
            blocks: &s.tables[i],
            sample: true,
            all_rows: false,
        })
        .collect()
}

fn logits(m: &GpuLlama, c: &[SeqChunk<'_>], kv: &KvArena) -> Vec<f32> {
    match m.decode(c, kv, None).unwrap() {
        Some(DecodeOut::Logits(l)) => floats(&l),
        _ => panic!("a decode step through the buckets"),
    }
}

fn ids(m: &GpuLlama, c: &[SeqChunk<'_>], kv: &KvArena, temperature: f32) -> Vec<u32> {
    let draws: Vec<GpuSample> = c
        .iter()
        .enumerate()
        .map(|(i, x)| GpuSample {
            temperature,
            seed: 42 + i as u64,
            counter: x.end as u32,
        })
        .collect();
    match m.decode(c, kv, Some(&draws)).unwrap() {
        Some(DecodeOut::Ids(v)) => v,
        _ => panic!("a decode step through the buckets"),
    }
}

/// The fixed plan's decode splits (a graph key's) and keys per split (in the plan buffer,
/// the eager plan's) of a step of `lens` contexts.
fn fixed_split(kv_heads: u32, lens: &[u32]) -> (u32, u32) {
    let keys = lens.iter().copied().max().unwrap();
    let (part, splits) = decode_split(lens.len() as u32, kv_heads, keys);
    (splits.next_power_of_two(), part)
}

/// Steps with each norm of a one-row step fused into the GEMV after it (gemv.cu's
/// `gemv_norm`), with silu_mul fused into the gate/up GEMV (`gemv_silu`, any GEMV step), each
/// alone and both, and with every kernel launched by programmatic dependent launch (with and
/// without the GEMVs' L2 prefetch, alone and with both fusions),
/// launched directly and replayed from a graph: the same logits, bit for bit, and the same ids
/// as the separate kernels launched one after the other (`direct`, with the same GEMV rows).
fn variants_match(
    m: &mut GpuLlama,
    s: &Seqs,
    kv: &KvArena,
    steps: &[Vec<(usize, usize)>],
    direct: &[(Vec<f32>, Vec<u32>, Vec<u32>)],
    name: &str,
) {
    let buckets = [1, 2, 4, 8];
    assert!(
        steps.iter().any(|s| s.len() == 1),
        "the steps include a one-row step"
    );
    let none = Overlap::default();
    let variants: &[(bool, bool, Overlap)] = &[
        (true, false, none),
        (false, true, none),
        (true, true, none),
        (false, false, Overlap::PDL),
        (false, false, Overlap::PDL_PREFETCH),
        (true, true, Overlap::PDL_PREFETCH),
    ];
    for &(norm, silu, overlap) in variants {
        m.set_decode_fused_norm(norm);
        m.set_decode_fused_silu(silu);
        m.set_decode_overlap(overlap);
        for graphs in [false, true] {
            m.set_decode_buckets(&buckets, graphs);
            for round in 0..2 {
                for (k, step) in steps.iter().enumerate() {
                    let c = decode_chunks(s, step);
                    let (want, greedy, drawn) = &direct[k];
                    let got = logits(m, &c, kv);
                    println!(
                        "{name} step {k} ({} rows), norm {norm} silu {silu} {overlap:?}, graphs {graphs}, round {round}: vs separate kernels identical: {} ({:.2e})",
                        c.len(),
                        &got == want,
                        rel_err(&got, want)
                    );
                    assert!(
                        &got == want,
                        "a fused or overlapped step changed the logits"
                    );
                    assert_eq!(&ids(m, &c, kv, 0.0), greedy, "greedy ids, step {k}");
                    assert_eq!(&ids(m, &c, kv, 1.0), drawn, "drawn ids, step {k}");
                }
            }
        }
    }
    m.set_decode_fused_norm(false);
    m.set_decode_fused_silu(false);
    m.set_decode_overlap(none);
}

/// Graph replay against direct launches (identical ids and logits) and against the eager
/// forward (close logits), over buckets with and without padding rows, steps that reuse a
/// captured graph with other contexts, and GEMV and cuBLAS matmuls.
fn graphs_match(spec: RandomLlama, vocab: usize, name: &str, kernel: DecodeKernel) {
    let dev = Device::new_cuda(0).expect("a CUDA GPU");
    let mut m = GpuLlama::random(&spec, vocab, DType::BF16, &dev, 7).unwrap();
    m.kernels().set_decode_kernel(kernel);
    let name = &format!("{name}, {kernel:?}");
    let geometry = m.config().kv_geometry(BLOCK, DType::BF16);
    let lens = [1usize, 17, 40, 300, 1000];
    let s = seqs(&lens, vocab as u32);
    let blocks = (s.tables.len() * s.tables[0].len()) as u32;
    let kv = KvArena::new(geometry, blocks, DType::BF16, &dev).unwrap();
    // Prefill every sequence but its last token.
    for (i, &l) in lens.iter().enumerate().filter(|(_, &l)| l > 1) {
        let c = [SeqChunk {
            tokens: &s.tokens[i],
            pos: 0,
            end: l - 1,
            blocks: &s.tables[i],
            sample: true,
            all_rows: false,
        }];
        m.forward(&c, &kv).unwrap();
    }
    let all: Vec<(usize, usize)> = lens.iter().map(|l| l - 1).enumerate().collect();
    let next: Vec<(usize, usize)> = all.iter().map(|&(i, p)| (i, p + 1)).collect();
    // Steps: all five (bucket 8: three padding rows), one (bucket 1), then all five one
    // position further (the bucket-8 graph replayed with other contexts), then three, then
    // three others (the bucket-4 graph replayed with other keys per split: same split count,
    // checked below).
    let steps: Vec<Vec<(usize, usize)>> = vec![
        all.clone(),
        vec![all[3]],
        next.clone(),
        vec![next[4], next[0], next[2]],
        vec![next[3], next[1], next[2]],
    ];
    let ctx = |k: usize| -> Vec<u32> { steps[k].iter().map(|&(_, p)| p as u32 + 1).collect() };
    let kv_heads = m.config().num_kv_heads as u32;
    let (a, b) = (
        fixed_split(kv_heads, &ctx(3)),
        fixed_split(kv_heads, &ctx(4)),
    );
    assert!(
        a.0 == b.0 && a.1 != b.1,
        "steps 3 and 4 share a graph but not the keys per split: {a:?} {b:?}"
    );
    let buckets = [1, 2, 4, 8];
    // GEMV for one row (the default), for every bucket, and never.
    for gemv_rows in [1usize, 8, 0] {
        m.set_gemv_max_rows(gemv_rows);
        // The reference: the kernels launched one after the other (PDL, the default, is one of
        // the variants checked against it).
        m.set_decode_overlap(Overlap::default());
        m.set_decode_buckets(&buckets, false);
        let direct: Vec<(Vec<f32>, Vec<u32>, Vec<u32>)> = steps
            .iter()
            .map(|step| {
                let c = decode_chunks(&s, step);
                (
                    logits(&m, &c, &kv),
                    ids(&m, &c, &kv, 0.0),
                    ids(&m, &c, &kv, 1.0),
                )
            })
            .collect();
        if gemv_rows > 0 {
            variants_match(&mut m, &s, &kv, &steps, &direct, name);
        }
        // One decoder with graphs for all steps: the first call of a key runs directly and
        // captures, later ones (other steps of the bucket too) replay.
        m.set_decode_buckets(&buckets, true);
        let mut captured = 0;
        for round in 0..2 {
            for (k, (step, (want, greedy, drawn))) in steps.iter().zip(&direct).enumerate() {
                let c = decode_chunks(&s, step);
                let replay = logits(&m, &c, &kv);
                let e = rel_err(&replay, want);
                println!(
                    "{name} gemv<={gemv_rows} round {round} step {k} ({} rows): graph vs direct logits identical: {} (relative difference {e:.2e})",
                    c.len(),
                    &replay == want
                );
                assert!(
                    e <= 1e-3,
                    "graph replay drifted from direct launches: {e:.2e}"
                );
                assert_eq!(&ids(&m, &c, &kv, 0.0), greedy, "greedy ids, step {k}");
                assert_eq!(&ids(&m, &c, &kv, 1.0), drawn, "drawn ids, step {k}");
            }
            let now = m.decode_graph_captures();
            if round == 0 {
                // Buckets 8, 1, 8, 4, 4, each with and without sampling (splits may differ).
                assert!((6..=8).contains(&now), "{now} graphs captured");
                captured = now;
            } else {
                assert_eq!(now, captured, "the second round only replays");
            }
        }
        for (k, (step, (want, ..))) in steps.iter().zip(&direct).enumerate() {
            let c = decode_chunks(&s, step);
            let eager = floats(&m.forward(&c, &kv).unwrap());
            let e = rel_err(want, &eager);
            // Same keys per split as the eager plan: identical unless a matmul differs.
            println!(
                "{name} gemv<={gemv_rows} step {k}: buckets vs eager forward identical: {} ({e:.2e})",
                want == &eager
            );
            assert!(e < 2e-2, "decode buckets vs eager forward: {e:.2e}");
        }
    }
    // More rows than the largest bucket: not taken (the caller runs the eager forward).
    m.set_decode_buckets(&[2], true);
    let c = decode_chunks(&s, &all);
    assert!(m.decode(&c, &kv, None).unwrap().is_none());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_replay_matches_direct_launches_and_the_eager_forward() {
    // Both decode kernels that graphs can launch.
    for kernel in [DecodeKernel::OnePass, DecodeKernel::TensorCore] {
        graphs_match(
            RandomLlama::SMALL_100M,
            32_000,
            "100M (head dim 64, GQA 3)",
            kernel,
        );
        graphs_match(
            RandomLlama::QWEN2_5_7B,
            152_064,
            "qwen2.5-7b (QKV bias, GQA 7)",
            kernel,
        );
    }
}
