//! The `attention` section: the attention kernels alone, one layer. Decode with every
//! kernel side by side at batch `max_batch` × `--context + 1` keys, 8 × 4,096 and 1 ×
//! `--context + 1` (also read as one-layer blocks, what the block-first stride costs), and one
//! 2,048-token causal prefill chunk.

use super::{decode_spans, hbm_tables, seqs, time, time_each, Args};
use candle_core::{DType, Device, Tensor};
use superinfer_engine::runner::gpu::GpuRunner;
use superinfer_kernels::attention_plan::{AttentionPlan, AttentionShape, SeqSpan};
use superinfer_kernels::cuda::DecodeKernel;

pub fn run(runner: &GpuRunner, dev: &Device, a: &Args, shape: &AttentionShape, max_batch: usize) {
    let cfg = runner.model().config().clone();
    let kv_per_token = (2 * cfg.num_layers * cfg.kv_width() * 2) as f64;
    let ctx = a.context;
    println!("\n## attention kernels alone (one layer)");
    let k = runner.model().kernels();
    let arena = runner.arena().rows().clone();
    let qw = cfg.q_width();
    // Decode: both kernels side by side (the one-pass kernel is the default), at batch 64 ×
    // `ctx + 1` keys, batch 8 × 4,096 keys and batch 1 (the plan splits the context).
    println!("Each figure: 20 launches back to back, one synchronize.");
    println!(
        "| decode | kernel | splits × keys | us | GB/s of KV | % of {} TB/s |",
        a.hbm_tbs
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let q = Tensor::randn(0f32, 1.0, (max_batch, qw), dev)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    for (n, keys) in [(max_batch, ctx + 1), (8, 4096), (1, ctx + 1)] {
        let tables = hbm_tables(&seqs(n, keys, 0));
        let spans = decode_spans(&tables, keys);
        let meta = k
            .upload(AttentionPlan::new(shape, &spans).unwrap(), shape)
            .unwrap();
        let qn = q.narrow(0, 0, n).unwrap().contiguous().unwrap();
        let bytes = n as f64 * keys as f64 * kv_per_token / cfg.num_layers as f64;
        // The arena as one layer of blocks (64 KB apart instead of a whole block's 2 MB):
        // what the layout's stride costs.
        let one_layer = AttentionShape {
            num_layers: 1,
            ..*shape
        };
        let meta1 = k
            .upload(AttentionPlan::new(&one_layer, &spans).unwrap(), &one_layer)
            .unwrap();
        for (kernel, layers) in DecodeKernel::ALL
            .into_iter()
            .map(|k| (k, "block-first"))
            .chain([(DecodeKernel::OnePass, "one-layer arena")])
        {
            k.set_decode_kernel(kernel);
            let (sh, me) = if layers == "block-first" {
                (shape, &meta)
            } else {
                (&one_layer, &meta1)
            };
            let t = time_each(a.iters, 20, dev, || {
                k.attention(&qn, &arena, me, sh, 0).unwrap();
            });
            println!(
                "| {n} x {keys} | {kernel:?}, {layers} | {} x {} | {:.1} | {:.0} | {:.0}% |",
                meta.plan.decode_splits,
                meta.plan.decode_part,
                t * 1e6,
                bytes / t / 1e9,
                100.0 * bytes / t / (a.hbm_tbs * 1e12),
            );
        }
        k.set_decode_kernel(Default::default());
    }
    // Prefill: one 2,048-token causal chunk.
    let n = 2048usize;
    let tables = hbm_tables(&seqs(1, n, 0));
    let spans = [SeqSpan {
        q_offset: 0,
        pos: 0,
        end: n as u32,
        blocks: &tables[0],
    }];
    let meta = k
        .upload(AttentionPlan::new(shape, &spans).unwrap(), shape)
        .unwrap();
    let q = Tensor::randn(0f32, 1.0, (n, qw), dev)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let t = time(a.iters * 2, dev, || {
        k.attention(&q, &arena, &meta, shape, 0).unwrap();
    });
    let flops = 2.0 * 2.0 * (n * n) as f64 / 2.0 * (cfg.num_heads * cfg.head_dim) as f64;
    println!(
        "prefill, {n} tokens causal: {:.1} us, {:.0} TFLOP/s",
        t * 1e6,
        flops / t / 1e12
    );
}
