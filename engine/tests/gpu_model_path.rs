//! The GPU model path (feature `cuda`; the tests need a CUDA GPU and are `#[ignore]`d, run by
//! `scripts/gpu/model.sh` on the device machine): the GPU runner's logits against the CPU
//! runner (f32, the exact reference) on the tiny model and on a head-dim-128 GQA model, and
//! against PyTorch/transformers; GPU sampling against the host's argmax and softmax; the
//! attention and GEMV kernels against references. The engine on the GPU (rotation, prefix
//! cache): `gpu_engine_path.rs`.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use std::path::Path;
use superinfer_engine::model::gpu_llama::GpuLlama;
use superinfer_engine::model::tiny::write_tiny_model;
use superinfer_engine::model::{KvArena, ModelConfig, PagedLlama, SeqChunk};
use superinfer_kernels::cuda::GpuSample;

/// The GEMV kernel's checks.
#[path = "gpu_model_path/gemv.rs"]
mod gemv;

fn cuda() -> Device {
    Device::new_cuda(0).expect("a CUDA GPU")
}

/// The model kernels on the GPU, with its device.
fn model_kernels() -> (Device, superinfer_kernels::cuda::ModelKernels) {
    let dev = cuda();
    let Device::Cuda(cd) = &dev else {
        unreachable!()
    };
    let gpu = superinfer_kernels::cuda::Gpu::from_candle(cd);
    let cache = superinfer_kernels::compile_cache::CompileCache::new(
        superinfer_kernels::compile_cache::CompileCache::default_dir(),
    );
    let k = superinfer_kernels::cuda::ModelKernels::load(&gpu, &cache).unwrap();
    (dev, k)
}

fn prompt(id: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((id * 7919 + i * 104_729) % 1900 + 10) as u32)
        .collect()
}

/// ||a - b|| / ||b|| over all elements.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let b = b.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
    let a: Vec<f64> = a.to_vec1().unwrap();
    let b: Vec<f64> = b.to_vec1().unwrap();
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// Sequences (token ids) and, per step, each one's chunk `pos..end` (a sequence absent from
/// a step does not run in it).
struct Script {
    seqs: Vec<Vec<u32>>,
    steps: Vec<Vec<(usize, usize, usize)>>,
}

/// Prefill chunks of several lengths (1, 15, 17, 300 tokens; the longest in chunks of 128),
/// then decode steps mixed with the remaining prefill.
fn script() -> Script {
    let seqs: Vec<Vec<u32>> = [1usize, 15, 17, 300, 70]
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(i as u64, n + 4))
        .collect();
    let steps = vec![
        vec![(0, 0, 1), (1, 0, 15), (2, 0, 17), (3, 0, 128)],
        vec![
            (0, 1, 2),
            (1, 15, 16),
            (2, 17, 18),
            (3, 128, 256),
            (4, 0, 70),
        ],
        vec![(0, 2, 3), (1, 16, 17), (3, 256, 300), (4, 70, 71)],
        vec![
            (0, 3, 4),
            (1, 17, 18),
            (2, 18, 19),
            (3, 300, 301),
            (4, 71, 72),
        ],
    ];
    Script { seqs, steps }
}

/// Block tables: sequence `i` gets blocks `i, i + n, i + 2n, ...` (interleaved, so a wrong
/// table reads another sequence's keys).
fn tables(n_seqs: usize, blocks_each: usize) -> Vec<Vec<u32>> {
    (0..n_seqs)
        .map(|i| (0..blocks_each).map(|k| (i + k * n_seqs) as u32).collect())
        .collect()
}

fn chunks<'a>(
    s: &'a Script,
    t: &'a [Vec<u32>],
    step: &[(usize, usize, usize)],
) -> Vec<SeqChunk<'a>> {
    step.iter()
        .map(|&(i, pos, end)| SeqChunk {
            tokens: &s.seqs[i],
            pos,
            end,
            blocks: &t[i],
            sample: true,
            all_rows: false,
        })
        .collect()
}

/// Rewrites the f32 weights of `dir` with values exactly representable in bf16, so the CPU
/// runner (f32) and the GPU runner (bf16) compute with the same weights and their difference
/// is the GPU's own arithmetic (activations in bf16).
fn round_weights_to_bf16(dir: &Path) {
    let path = dir.join("model.safetensors");
    let tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    let rounded: std::collections::HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(k, t)| {
            let r = t
                .to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            (k, r)
        })
        .collect();
    candle_core::safetensors::save(&rounded, &path).unwrap();
}

/// Runs the script through the CPU runner (f32) and the GPU runner (bf16); returns the worst
/// step's relative error of the logits.
fn gpu_vs_cpu(dir: &Path) -> f64 {
    let cfg = ModelConfig::from_model_dir(dir).unwrap();
    let cpu = PagedLlama::load(dir, &cfg, DType::F32, &Device::Cpu).unwrap();
    let dev = cuda();
    let gpu = GpuLlama::load(dir, &cfg, DType::BF16, &dev).unwrap();
    let geometry = superinfer_engine::kv::BlockGeometry {
        num_layers: cfg.num_layers as u32,
        block_size: 16,
        kv_heads: cfg.num_kv_heads as u32,
        head_dim: cfg.head_dim as u32,
        dtype_bytes: 4,
    };
    let s = script();
    let t = tables(s.seqs.len(), 20);
    let blocks = (s.seqs.len() * 20) as u32;
    let cpu_kv = KvArena::new(geometry, blocks, DType::F32, &Device::Cpu).unwrap();
    let gpu_geometry = superinfer_engine::kv::BlockGeometry {
        dtype_bytes: 2,
        ..geometry
    };
    let gpu_kv = KvArena::new(gpu_geometry, blocks, DType::BF16, &dev).unwrap();
    let mut worst = 0f64;
    for (k, step) in s.steps.iter().enumerate() {
        let c = chunks(&s, &t, step);
        let want = cpu.forward(&c, &cpu_kv).unwrap();
        let got = gpu.forward(&c, &gpu_kv).unwrap();
        let e = rel_err(&got, &want);
        println!("  step {k}: {} chunks, relative error {e:.2e}", c.len());
        worst = worst.max(e);
    }
    worst
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_logits_match_the_cpu_runner_on_the_tiny_model() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 5).unwrap();
    round_weights_to_bf16(dir.path());
    let e = gpu_vs_cpu(dir.path());
    println!("tiny model (head dim 32): GPU bf16 vs CPU f32, worst relative error {e:.2e}");
    assert!(e <= 1e-2, "relative error {e}");
}

/// `SUPERINFER_HF_REF`: a directory written by `scripts/gpu/hf_logits.py` (a random Llama
/// saved by transformers' `save_pretrained`, `ids.json`, and transformers' logits of each
/// prompt's last position in f32 and bf16): our bf16 logits against transformers' f32 ones.
#[test]
#[ignore = "needs a CUDA GPU and the transformers reference (scripts/gpu/model.sh)"]
fn gpu_logits_match_transformers() {
    let dir = std::env::var("SUPERINFER_HF_REF").expect("SUPERINFER_HF_REF names the reference");
    let dir = Path::new(&dir);
    let read = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(dir.join(name)).expect(name);
        serde_json::from_str(&text).expect(name)
    };
    let ids: Vec<Vec<u32>> = serde_json::from_value(read("ids.json")).unwrap();
    let f32_ref: Vec<Vec<f32>> = serde_json::from_value(read("hf_logits_f32.json")).unwrap();
    let bf16_ref: Vec<Vec<f32>> = serde_json::from_value(read("hf_logits_bf16.json")).unwrap();
    let cfg = ModelConfig::from_model_dir(dir).unwrap();
    let dev = cuda();
    let gpu = GpuLlama::load(dir, &cfg, DType::BF16, &dev).unwrap();
    let geometry = superinfer_engine::kv::BlockGeometry {
        num_layers: cfg.num_layers as u32,
        block_size: 16,
        kv_heads: cfg.num_kv_heads as u32,
        head_dim: cfg.head_dim as u32,
        dtype_bytes: 2,
    };
    let per = ids.iter().map(|s| s.len().div_ceil(16)).max().unwrap();
    let kv = KvArena::new(geometry, (per * ids.len()) as u32, DType::BF16, &dev).unwrap();
    let t = tables(ids.len(), per);
    let c: Vec<SeqChunk<'_>> = ids
        .iter()
        .zip(&t)
        .map(|(s, b)| SeqChunk {
            tokens: s,
            pos: 0,
            end: s.len(),
            blocks: b,
            sample: true,
            all_rows: false,
        })
        .collect();
    let got = gpu
        .forward(&c, &kv)
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap();
    // The CPU runner in f32 on the same directory: checks our loading and model code against
    // transformers without the GPU's rounding.
    let cpu = PagedLlama::load(dir, &cfg, DType::F32, &Device::Cpu).unwrap();
    let cpu_kv = KvArena::new(
        superinfer_engine::kv::BlockGeometry {
            dtype_bytes: 4,
            ..geometry
        },
        (per * ids.len()) as u32,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let cpu_logits = cpu.forward(&c, &cpu_kv).unwrap();
    let vocab = cfg.vocab_size;
    let flat = |v: &[Vec<f32>]| Tensor::from_vec(v.concat(), (v.len(), vocab), &Device::Cpu);
    let want = flat(&f32_ref).unwrap();
    let hf_bf16 = flat(&bf16_ref).unwrap();
    let row = |t: &Tensor, i: usize| t.narrow(0, i, 1).unwrap();
    for (i, s) in ids.iter().enumerate() {
        println!(
            "  prompt of {:>4} tokens: GPU bf16 vs transformers f32 {:.2e}, transformers bf16 vs \
             f32 {:.2e}, our CPU f32 vs transformers f32 {:.2e}",
            s.len(),
            rel_err(&row(&got, i), &row(&want, i)),
            rel_err(&row(&hf_bf16, i), &row(&want, i)),
            rel_err(&row(&cpu_logits, i), &row(&want, i)),
        );
    }
    let ours = rel_err(&got, &want);
    let theirs = rel_err(&hf_bf16, &want);
    let cpu_err = rel_err(&cpu_logits, &want);
    let vs_cpu = rel_err(&got, &cpu_logits);
    println!(
        "vs transformers f32: ours (GPU, bf16) {ours:.2e}; transformers' own bf16 {theirs:.2e}; \
         our CPU runner (f32) {cpu_err:.2e}; GPU vs our CPU runner {vs_cpu:.2e}"
    );
    assert!(cpu_err <= 1e-4, "CPU runner vs transformers: {cpu_err}");
    assert!(ours <= 1e-2, "relative error {ours}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sampling_is_argmax_when_greedy_and_follows_softmax_otherwise() {
    let dev = cuda();
    let gpu = superinfer_kernels::cuda::Gpu::from_candle(match &dev {
        Device::Cuda(c) => c,
        _ => unreachable!(),
    });
    let cache = superinfer_kernels::compile_cache::CompileCache::new(
        superinfer_kernels::compile_cache::CompileCache::default_dir(),
    );
    let k = superinfer_kernels::cuda::ModelKernels::load(&gpu, &cache).unwrap();
    // Greedy: 64 rows of 50,000 random logits, in bf16 as the model produces them.
    let logits = Tensor::randn(0f32, 3.0, (64, 50_000), &dev)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let rows = vec![
        GpuSample {
            temperature: 0.0,
            seed: 0,
            counter: 0
        };
        64
    ];
    let got = k.sample(&logits, &rows).unwrap();
    let want: Vec<u32> = logits
        .to_dtype(DType::F32)
        .unwrap()
        .argmax(1)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(got, want);
    // Temperature 1 over 4 tokens: frequencies of 8192 draws against softmax.
    let row = [1.0f32, 0.0, -1.0, 2.0];
    let n = 8192;
    let logits = Tensor::from_vec(row.repeat(n), (n, 4), &dev).unwrap();
    let draws: Vec<GpuSample> = (0..n as u32)
        .map(|c| GpuSample {
            temperature: 1.0,
            seed: 42,
            counter: c,
        })
        .collect();
    let ids = k.sample(&logits, &draws).unwrap();
    assert_eq!(
        ids,
        k.sample(&logits, &draws).unwrap(),
        "same seeds, same draws"
    );
    let z: f32 = row.iter().map(|x| x.exp()).sum();
    for (t, x) in row.iter().enumerate() {
        let p = x.exp() / z;
        let f = ids.iter().filter(|&&i| i == t as u32).count() as f32 / n as f32;
        let sd = (p * (1.0 - p) / n as f32).sqrt();
        println!("token {t}: softmax {p:.4}, drawn {f:.4}");
        assert!((f - p).abs() < 5.0 * sd, "token {t}: p {p}, frequency {f}");
    }
}

/// The attention kernels alone against attention computed on the host in f64 from the same
/// bf16 inputs: decodes of 1 to 1,000 keys (one and several splits), prefill chunks from
/// position 0 and from inside a sequence, head dims 32/64/128, GQA groups 1 to 8.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_kernels_match_a_host_reference() {
    use superinfer_kernels::attention_plan::{AttentionPlan, AttentionShape, SeqSpan};
    let (dev, k) = model_kernels();
    // (pos, end) per sequence: decodes have end = pos + 1.
    let spans_pe: [(u32, u32); 9] = [
        (0, 1),
        (16, 17),
        (299, 300),
        (999, 1000),
        (0, 15),
        (0, 130),
        (100, 300),
        (0, 700),
        (63, 64),
    ];
    for (d, nh, kvh) in [
        (128u32, 8u32, 2u32),
        (64, 4, 4),
        (32, 8, 1),
        (128, 32, 8),
        (128, 40, 8),
        (64, 6, 2),
    ] {
        let shape = AttentionShape {
            num_heads: nh,
            kv_heads: kvh,
            head_dim: d,
            num_layers: 2,
            block_size: 16,
            window: 0,
        };
        let per: Vec<u32> = spans_pe.iter().map(|&(_, e)| e.div_ceil(16)).collect();
        let total: u32 = per.iter().sum();
        // Interleave blocks: sequence i's k-th block is i + k * n (with gaps skipped).
        let mut tables: Vec<Vec<u32>> = vec![Vec::new(); spans_pe.len()];
        let mut next = 0u32;
        let maxper = *per.iter().max().unwrap();
        for kk in 0..maxper {
            for (i, &p) in per.iter().enumerate() {
                if kk < p {
                    tables[i].push(next);
                    next += 1;
                }
            }
        }
        assert_eq!(next, total);
        let mut spans = Vec::new();
        let mut off = 0u32;
        for (i, &(pos, end)) in spans_pe.iter().enumerate() {
            spans.push(SeqSpan {
                q_offset: off,
                pos,
                end,
                blocks: &tables[i],
            });
            off += end - pos;
        }
        let tokens = off as usize;
        let rows_per_block = (shape.num_layers * 2 * shape.block_size) as usize;
        let width = (kvh * d) as usize;
        let arena = Tensor::randn(0f32, 1.0, (total as usize * rows_per_block, width), &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let q = (Tensor::randn(0f32, 1.0, (tokens, (nh * d) as usize), &dev).unwrap() * 0.5)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let meta = k
            .upload(AttentionPlan::new(&shape, &spans).unwrap(), &shape)
            .unwrap();
        let layer = 1u32;
        let host = |t: &Tensor| -> Vec<f32> {
            t.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let (a, qh) = (host(&arena), host(&q));
        let g = (nh / kvh) as usize;
        let du = d as usize;
        let scale = 1.0 / (d as f64).sqrt();
        let mut want = vec![0f64; tokens * (nh * d) as usize];
        for s in &spans {
            for (i, p) in (s.pos..s.end).enumerate() {
                let t = s.q_offset as usize + i;
                for h in 0..nh as usize {
                    let kh = h / g;
                    let qv = &qh[t * (nh as usize) * du + h * du..][..du];
                    let row = |j: u32, kv: u64| -> usize {
                        let slot = shape.slot(s.blocks[(j / 16) as usize], j % 16)
                            + u64::from(layer) * 2 * 16
                            + kv * 16;
                        slot as usize * width + kh * du
                    };
                    let scores: Vec<f64> = (0..=p)
                        .map(|j| {
                            let kr = &a[row(j, 0)..][..du];
                            qv.iter()
                                .zip(kr)
                                .map(|(x, y)| *x as f64 * *y as f64)
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for (j, wj) in w.iter().enumerate() {
                        let vr = &a[row(j as u32, 1)..][..du];
                        for e in 0..du {
                            want[t * (nh as usize) * du + h * du + e] += wj / z * vr[e] as f64;
                        }
                    }
                }
            }
        }
        // Every decode kernel (those without an instance for the shape fall back to the
        // three-phase one).
        for kernel in superinfer_kernels::cuda::DecodeKernel::ALL {
            k.set_decode_kernel(kernel);
            let out = k.attention(&q, &arena, &meta, &shape, layer).unwrap();
            let oh = host(&out);
            let num: f64 = oh
                .iter()
                .zip(&want)
                .map(|(x, y)| (*x as f64 - y).powi(2))
                .sum();
            let den: f64 = want.iter().map(|y| y * y).sum();
            let err = (num / den).sqrt();
            let worst = oh
                .iter()
                .zip(&want)
                .map(|(x, y)| (*x as f64 - y).abs())
                .fold(0f64, f64::max);
            let kernel = k.decode_kernel(&shape);
            println!(
                "head dim {d}, {nh} heads over {kvh}, {kernel:?} decode: relative error {err:.2e}, \
                 worst element {worst:.2e} ({tokens} query rows, {} decode splits)",
                meta.plan.decode_splits
            );
            assert!(
                err <= 1e-2,
                "head dim {d}, {kernel:?}: relative error {err}"
            );
        }
        k.set_decode_kernel(Default::default());
    }
}
