//! The paged forward against candle-transformers' reference Llama on the same random weights.

use super::*;
use crate::kv::{BlockState, HbmBlock, LogicalBlock};
use crate::model::tiny::write_tiny_model;
use crate::runner::BatchEntry;
use crate::sampling::SamplingParams;
use candle_nn::VarBuilder;
use candle_transformers::models::llama as reference;
use rand::{Rng, SeedableRng};
use superinfer_policies::RequestId;

const TOL: f32 = 1e-4;

struct Fixture {
    _dir: tempfile::TempDir,
    runner: CpuRunner,
    reference: reference::Llama,
    ref_cfg: reference::Config,
    vocab: u32,
}

fn fixture(hbm_blocks: u32) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    write_tiny_model(dir.path(), 11).expect("tiny model");
    let runner = CpuRunner::load(
        dir.path(),
        &CpuRunnerConfig {
            hbm_blocks,
            seed: Some(0),
            ..CpuRunnerConfig::default()
        },
    )
    .expect("load the runner");
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    let cfg: reference::LlamaConfig = serde_json::from_str(&text).unwrap();
    let ref_cfg = cfg.into_config(false);
    let tensors =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let reference = reference::Llama::load(vb, &ref_cfg).unwrap();
    let vocab = ref_cfg.vocab_size as u32;
    Fixture {
        _dir: dir,
        runner,
        reference,
        ref_cfg,
        vocab,
    }
}

impl Fixture {
    fn cache(&self) -> reference::Cache {
        reference::Cache::new(true, DType::F32, &self.ref_cfg, &Device::Cpu).unwrap()
    }

    /// Reference logits of the last token of `tokens[pos..]`, continuing `cache`.
    fn reference(&self, tokens: &[u32], pos: usize, cache: &mut reference::Cache) -> Vec<f32> {
        let x = Tensor::new(&tokens[pos..], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let out = self.reference.forward(&x, pos, cache).unwrap();
        out.squeeze(0).unwrap().to_vec1().unwrap()
    }
}

fn tokens(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..vocab)).collect()
}

/// A block table of `n` scattered HBM slots starting at `first` (stride 3, so neighbours in
/// the table are not neighbours in the arena).
fn table(first: u32, n: usize) -> Vec<LogicalBlock> {
    (0..n as u32)
        .map(|i| LogicalBlock {
            hbm: Some(HbmBlock(first + 3 * i)),
            dram: None,
            state: BlockState::Dirty,
            inflight: None,
            entry: None,
        })
        .collect()
}

fn entry<'a>(
    id: u64,
    tokens: &'a [u32],
    span: (usize, usize),
    blocks: &'a [LogicalBlock],
    sampling: &'a SamplingParams,
) -> BatchEntry<'a> {
    BatchEntry {
        id: RequestId(id),
        tokens,
        prompt_len: tokens.len() as u32,
        pos: span.0 as u32,
        end: span.1 as u32,
        blocks,
        sample: span.1 == tokens.len(),
        sampling,
        mask: None,
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn row(t: &Tensor, i: usize) -> Vec<f32> {
    t.get(i).unwrap().to_vec1().unwrap()
}

fn argmax(xs: &[f32]) -> u32 {
    crate::sampling::sample(
        &mut xs.to_vec(),
        &SamplingParams::default(),
        &[],
        0,
        &mut ChaCha8Rng::seed_from_u64(0),
    )
    .token
}

#[test]
fn chunked_prefill_and_decode_match_the_reference() {
    let mut f = fixture(3 * 24);
    let sp = SamplingParams::default();
    for (n, chunks) in [
        (1, vec![1]),
        (15, vec![15, 4]),
        (16, vec![16, 5]),
        (17, vec![17, 16, 3]),
        (300, vec![300, 64, 37]),
    ] {
        let mut seq = tokens(n, f.vocab, n as u64);
        let blocks = table(1, (n + 4).div_ceil(16));
        let mut cache = f.cache();
        let want = f.reference(&seq, 0, &mut cache);
        for chunk in chunks {
            let mut got = None;
            let mut pos = 0;
            while pos < n {
                let end = (pos + chunk).min(n);
                let e = entry(1, &seq[..n], (pos, end), &blocks, &sp);
                let logits = f.runner.logits(&StepBatch { entries: vec![e] }).unwrap();
                if end == n {
                    got = Some(row(&logits, 0));
                } else {
                    assert_eq!(logits.dims()[0], 0, "no logits before the last chunk");
                }
                pos = end;
            }
            let d = max_diff(&got.unwrap(), &want);
            assert!(d <= TOL, "prompt {n}, chunk {chunk}: max |diff| {d}");
        }
        // Three decode steps on top of the last prefill.
        let mut next = argmax(&want);
        for step in 0..3 {
            seq.push(next);
            let len = seq.len();
            let want = f.reference(&seq, len - 1, &mut cache);
            let e = entry(1, &seq, (len - 1, len), &blocks, &sp);
            let got = row(
                &f.runner.logits(&StepBatch { entries: vec![e] }).unwrap(),
                0,
            );
            let d = max_diff(&got, &want);
            assert!(d <= TOL, "prompt {n}, decode {step}: max |diff| {d}");
            next = argmax(&want);
        }
    }
}

#[test]
fn mixed_prefill_and_decode_batches_match_the_reference() {
    mixed_batch(false);
}

#[test]
fn mixed_batches_match_the_reference_through_the_generic_decode_path() {
    mixed_batch(true);
}

fn mixed_batch(generic_decode: bool) {
    let mut f = fixture(200);
    f.runner.model_mut().set_generic_decode(generic_decode);
    let sp = SamplingParams::default();
    let a = tokens(40, f.vocab, 1);
    let b = tokens(70, f.vocab, 2);
    let c = tokens(23, f.vocab, 3);
    let d = tokens(9, f.vocab, 4);
    let (ta, tb, tc, td) = (table(0, 4), table(1, 5), table(2, 3), table(50, 2));
    // Prefill a (whole) and the first 30 tokens of b; d up to its last token.
    let warm = StepBatch {
        entries: vec![
            entry(1, &a[..39], (0, 39), &ta, &sp),
            entry(2, &b, (0, 30), &tb, &sp),
            entry(4, &d[..8], (0, 8), &td, &sp),
        ],
    };
    f.runner.logits(&warm).unwrap();
    // One step: decode a and d, continue b's prefill, start c: four kinds at once, with
    // decodes in between prefills.
    let mixed = StepBatch {
        entries: vec![
            entry(1, &a, (39, 40), &ta, &sp),
            entry(2, &b, (30, 70), &tb, &sp),
            entry(3, &c, (0, 23), &tc, &sp),
            entry(4, &d, (8, 9), &td, &sp),
        ],
    };
    let got = f.runner.logits(&mixed).unwrap();
    assert_eq!(got.dims()[0], 4);
    for (i, seq) in [&a, &b, &c, &d].into_iter().enumerate() {
        let want = f.reference(seq, 0, &mut f.cache());
        let diff = max_diff(&row(&got, i), &want);
        assert!(diff <= TOL, "sequence {i}: max |diff| {diff}");
    }
}

#[test]
fn step_samples_and_reports_logprobs() {
    let mut f = fixture(16);
    let seq = tokens(20, f.vocab, 5);
    let blocks = table(0, 2);
    let sp = SamplingParams {
        logprobs: Some(3),
        ..SamplingParams::default()
    };
    let out = f
        .runner
        .step(&StepBatch {
            entries: vec![entry(1, &seq, (0, 20), &blocks, &sp)],
        })
        .unwrap();
    let want = f.reference(&seq, 0, &mut f.cache());
    assert_eq!(out.tokens, vec![Some(argmax(&want))]);
    let lp = out.logprobs[0].as_ref().unwrap();
    assert_eq!(lp.top.len(), 3);
    assert_eq!(lp.top[0].0, argmax(&want));
    assert!(lp.logprob <= 0.0 && (lp.logprob - lp.top[0].1).abs() < 1e-6);
    assert!(out.elapsed > 0.0);
}

#[test]
fn missing_and_unsupported_model_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let load = |d: &std::path::Path| {
        CpuRunner::load(d, &CpuRunnerConfig::default())
            .err()
            .expect("must fail")
            .to_string()
    };
    let e = load(dir.path());
    assert!(e.contains("config.json") && e.contains("not found"), "{e}");
    write_tiny_model(dir.path(), 1).unwrap();
    let cfg_path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        text.replace("LlamaForCausalLM", "GPT2LMHeadModel"),
    )
    .unwrap();
    let e = load(dir.path());
    assert!(
        e.contains("architectures") && e.contains("GPT2LMHeadModel"),
        "{e}"
    );
    std::fs::write(&cfg_path, text.replace("\"hidden_size\"", "\"hidden\"")).unwrap();
    let e = load(dir.path());
    assert!(
        e.contains("config.json") && e.contains("hidden_size"),
        "{e}"
    );
    std::fs::write(&cfg_path, &text).unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let e = load(dir.path());
    assert!(
        e.contains("model.safetensors") && e.contains("not found"),
        "{e}"
    );
}

#[test]
fn qwen2_with_qkv_bias_matches_the_reference() {
    use crate::model::tiny::{write_random_llama, RandomLlama};
    use candle_transformers::models::qwen2;
    let dir = tempfile::tempdir().unwrap();
    let spec = RandomLlama {
        architecture: "Qwen2ForCausalLM",
        ..RandomLlama::TINY
    };
    write_random_llama(dir.path(), &spec, 3).unwrap();
    let mut runner = CpuRunner::load(dir.path(), &CpuRunnerConfig::default()).unwrap();
    assert!(runner.model().config().qkv_bias);
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    let cfg: qwen2::Config = serde_json::from_str(&text).unwrap();
    let tensors =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let mut reference = qwen2::ModelForCausalLM::new(&cfg, vb).unwrap();
    let mut seq = tokens(37, cfg.vocab_size as u32, 8);
    let blocks = table(0, 3);
    let sp = SamplingParams::default();
    let mut got = None;
    for (pos, end) in [(0, 16), (16, 32), (32, 37)] {
        let e = entry(1, &seq, (pos, end), &blocks, &sp);
        let l = runner.logits(&StepBatch { entries: vec![e] }).unwrap();
        got = (end == 37).then(|| row(&l, 0));
    }
    let x = Tensor::new(seq.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let want: Vec<f32> = reference
        .forward(&x, 0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let d = max_diff(&got.unwrap(), &want);
    assert!(d <= TOL, "prefill: max |diff| {d}");
    seq.push(argmax(&want));
    let x = Tensor::new(&seq[37..], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let want: Vec<f32> = reference
        .forward(&x, 37)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let e = entry(1, &seq, (37, 38), &blocks, &sp);
    let got = row(&runner.logits(&StepBatch { entries: vec![e] }).unwrap(), 0);
    let d = max_diff(&got, &want);
    assert!(d <= TOL, "decode: max |diff| {d}");
}

/// Logits of one 20-token prompt from the model in `dir`.
fn logits_of(dir: &std::path::Path) -> Vec<f32> {
    let mut r = CpuRunner::load(dir, &CpuRunnerConfig::default()).unwrap();
    let seq = tokens(20, r.model().config().vocab_size as u32, 21);
    let blocks = table(0, 2);
    let sp = SamplingParams::default();
    let e = entry(1, &seq, (0, 20), &blocks, &sp);
    row(&r.logits(&StepBatch { entries: vec![e] }).unwrap(), 0)
}

#[test]
fn sharded_and_half_precision_weights_load() {
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 4).unwrap();
    let want = logits_of(dir.path());
    let single = dir.path().join("model.safetensors");
    let all = candle_core::safetensors::load(&single, &Device::Cpu).unwrap();
    // Two shards and an index, as transformers writes them.
    let (mut a, mut b) = (HashMap::new(), HashMap::new());
    let mut map = serde_json::Map::new();
    for (name, t) in &all {
        let (part, file) = if name.contains("layers.0.") || name.contains("embed") {
            (&mut a, "model-00001-of-00002.safetensors")
        } else {
            (&mut b, "model-00002-of-00002.safetensors")
        };
        part.insert(name.clone(), t.clone());
        map.insert(name.clone(), serde_json::json!(file));
    }
    std::fs::remove_file(&single).unwrap();
    candle_core::safetensors::save(&a, dir.path().join("model-00001-of-00002.safetensors"))
        .unwrap();
    candle_core::safetensors::save(&b, dir.path().join("model-00002-of-00002.safetensors"))
        .unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    assert_eq!(logits_of(dir.path()), want, "sharded = single file");
    // bf16 and f16 files, computed in f32: close to the f32 model (rounding of the weights).
    for dtype in [DType::BF16, DType::F16] {
        let half: HashMap<String, Tensor> = all
            .iter()
            .map(|(n, t)| (n.clone(), t.to_dtype(dtype).unwrap()))
            .collect();
        let d2 = tempfile::tempdir().unwrap();
        for f in ["config.json", "tokenizer.json", "generation_config.json"] {
            std::fs::copy(dir.path().join(f), d2.path().join(f)).unwrap();
        }
        candle_core::safetensors::save(&half, d2.path().join("model.safetensors")).unwrap();
        let got = logits_of(d2.path());
        let d = max_diff(&got, &want);
        assert!(d > 0.0 && d < 0.25, "{dtype:?}: max |diff| {d}");
    }
    // A shard named by the index but missing is named in the error.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = CpuRunner::load(dir.path(), &CpuRunnerConfig::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
}

#[test]
fn mistral_sliding_window_is_the_same_in_every_path() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 6).unwrap();
    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    cfg["sliding_window"] = serde_json::json!(12);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let load = || CpuRunner::load(dir.path(), &CpuRunnerConfig::default()).unwrap();
    let mut r = load();
    assert_eq!(r.model().config().sliding_window, Some(12));
    let vocab = r.model().config().vocab_size as u32;
    let seq = tokens(41, vocab, 13);
    let blocks = table(0, 3);
    let sp = SamplingParams::default();
    let run = |r: &mut CpuRunner, spans: &[(usize, usize)]| {
        let mut last = Vec::new();
        for &span in spans {
            let e = entry(1, &seq[..span.1], span, &blocks, &sp);
            last = row(&r.logits(&StepBatch { entries: vec![e] }).unwrap(), 0);
        }
        last
    };
    // Whole prefill, chunked prefill, and decode (in place and generic) of the last token.
    let whole = run(&mut r, &[(0, 41)]);
    let chunked = run(&mut r, &[(0, 7), (7, 30), (30, 41)]);
    let decoded = run(&mut r, &[(0, 40), (40, 41)]);
    r.model_mut().set_generic_decode(true);
    let generic = run(&mut r, &[(0, 40), (40, 41)]);
    for (name, got) in [
        ("chunked", chunked),
        ("decode", decoded),
        ("generic", generic),
    ] {
        let d = max_diff(&got, &whole);
        assert!(d <= 1e-5, "{name}: max |diff| {d}");
    }
    // The window matters: without it the last token's logits differ.
    let mut cfg2 = cfg.clone();
    cfg2["sliding_window"] = serde_json::Value::Null;
    std::fs::write(&cfg_path, cfg2.to_string()).unwrap();
    let full = run(&mut load(), &[(0, 41)]);
    assert!(max_diff(&full, &whole) > 1e-3);
}
