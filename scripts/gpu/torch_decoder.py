#!/usr/bin/env python3
"""The compiled-PyTorch reference of issue 14: a Llama-3-8B-shaped decoder (random bf16
weights) with a static KV cache, its decode step compiled with
torch.compile(mode="reduce-overhead") (CUDA graphs, Inductor's fused kernels), timed at the
batch sizes of benches/gpu_model.rs, on the same GPU in the same device call as our bench.

It also measures the two rates our figures are judged against: the HBM read rate (a
reduction over 8 GiB) and the bf16 GEMM rate (8192^3 matmuls).

    python3 scripts/gpu/torch_decoder.py [--context 512] [--iters 50] [--batches 1,8,32,64]
        [--profile] [--prefill 32768,131072] [--no-rates]

--prefill: also one-shot causal prefills of those lengths (batch 1, eager: flash SDPA through
F.scaled_dot_product_attention(is_causal=True) and cuBLAS matmuls), TFLOP/s against the GEMM
rate. --no-rates: skip measuring the HBM and GEMM rates (a second call in the same run).

Prints one JSON line per figure (prefixed "RESULT ") and a markdown table. With --profile,
also each batch's compiled step kernel by kernel (torch.profiler over 10 steps: GPU time per
step by kernel name), to set beside `ncu` on our bench (scripts/gpu/model.sh profile).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

# Llama-3-8B.
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 4096, 32, 32, 8, 128
INTER, VOCAB, EPS, THETA = 14336, 128256, 1e-5, 500000.0


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def timed(fn, iters, warmup=5):
    """Median seconds of fn() over iters runs after warm-up, each ended by a synchronize."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def hbm_read_rate(iters):
    x = torch.empty(4 << 30, dtype=torch.bfloat16, device="cuda").uniform_()
    t = timed(lambda: x.sum(dtype=torch.float32), iters)
    rate = x.numel() * 2 / t
    del x
    return rate


def gemm_rate(iters):
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    t = timed(lambda: a @ b, iters)
    return 2 * n**3 / t


class Decoder(torch.nn.Module):
    """Weights stored as the matmuls read them (x @ W^T through F.linear)."""

    def __init__(self, batch, cache_len, caches=True):
        super().__init__()
        dev, dt = "cuda", torch.bfloat16

        def w(*shape):
            return torch.randn(*shape, device=dev, dtype=dt) * (1.0 / math.sqrt(shape[-1]))

        # Registered as buffers, so torch.compile treats them as static inputs of the CUDA
        # graph (the caches are mutated in place by every step).
        def reg(name, t):
            self.register_buffer(name, t, persistent=False)

        reg("embed", w(VOCAB, HIDDEN))
        for i in range(LAYERS):
            reg(f"qkv{i}", w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN))
            reg(f"o{i}", w(HIDDEN, HEADS * HEAD_DIM))
            reg(f"gate_up{i}", w(2 * INTER, HIDDEN))
            reg(f"down{i}", w(HIDDEN, INTER))
            reg(f"norm1_{i}", torch.ones(HIDDEN, device=dev, dtype=dt))
            reg(f"norm2_{i}", torch.ones(HIDDEN, device=dev, dtype=dt))
            if not caches:
                continue
            # Static cache: (batch, kv heads, cache_len, head dim), filled with random keys.
            reg(f"k_cache{i}", torch.randn(batch, KV_HEADS, cache_len, HEAD_DIM, device=dev,
                                           dtype=dt))
            reg(f"v_cache{i}", torch.randn(batch, KV_HEADS, cache_len, HEAD_DIM, device=dev,
                                           dtype=dt))
        reg("norm_f", torch.ones(HIDDEN, device=dev, dtype=dt))
        reg("lm_head", w(VOCAB, HIDDEN))
        inv = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, device=dev).float() / HEAD_DIM))
        ang = torch.outer(torch.arange(cache_len, device=dev).float(), inv)
        reg("cos", ang.cos().to(dt))
        reg("sin", ang.sin().to(dt))

    def weight_bytes(self):
        return 2 * sum(t.numel() for name, t in self.named_buffers()
                       if "cache" not in name and name not in ("cos", "sin"))

    @staticmethod
    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w

    def rope(self, x, pos):
        # x: (batch, heads, tokens, head dim); rotate-half form, as Llama.
        c, s = self.cos[pos].view(1, 1, -1, HEAD_DIM // 2), self.sin[pos].view(1, 1, -1, HEAD_DIM // 2)
        x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    def forward(self, ids, pos):
        """One decode step: ids (batch,), pos a 1-element tensor (every sequence's position);
        attends over the cache up to and including pos; returns the greedy next ids."""
        b = ids.shape[0]
        x = self.embed[ids]
        for i in range(LAYERS):
            layer = lambda name: getattr(self, f"{name}{i}")  # noqa: E731
            h = self.rms(x, layer("norm1_"))
            qkv = F.linear(h, layer("qkv"))
            q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
            q = self.rope(q.view(b, 1, HEADS, HEAD_DIM).transpose(1, 2), pos)
            k = self.rope(k.view(b, 1, KV_HEADS, HEAD_DIM).transpose(1, 2), pos)
            v = v.view(b, 1, KV_HEADS, HEAD_DIM).transpose(1, 2)
            kc, vc = layer("k_cache"), layer("v_cache")
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            x = x + F.linear(a.transpose(1, 2).reshape(b, HEADS * HEAD_DIM), layer("o"))
            h = self.rms(x, layer("norm2_"))
            g, u = F.linear(h, layer("gate_up")).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, layer("down"))
        logits = F.linear(self.rms(x, self.norm_f), self.lm_head)
        return logits.argmax(-1)


    def prefill(self, ids):
        """A causal prefill of ids (tokens,) in one pass (no cache kept); the greedy next id."""
        n = ids.shape[0]
        pos = torch.arange(n, device=ids.device)
        x = self.embed[ids]
        for i in range(LAYERS):
            layer = lambda name: getattr(self, f"{name}{i}")  # noqa: E731
            h = self.rms(x, layer("norm1_"))
            q, k, v = F.linear(h, layer("qkv")).split(
                [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
            q = self.rope(q.view(1, n, HEADS, HEAD_DIM).transpose(1, 2), pos)
            k = self.rope(k.view(1, n, KV_HEADS, HEAD_DIM).transpose(1, 2), pos)
            v = v.view(1, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + F.linear(a.transpose(1, 2).reshape(n, HEADS * HEAD_DIM), layer("o"))
            del q, k, v, a
            h = self.rms(x, layer("norm2_"))
            g, u = F.linear(h, layer("gate_up")).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, layer("down"))
            del h, g, u
        return F.linear(self.rms(x[-1:], self.norm_f), self.lm_head).argmax(-1)


def kernel_table(step, batch, steps=10):
    """The GPU kernels of `steps` calls of step(), per step, by name (markdown)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        n, t = rows.get(e.name, (0, 0.0))
        rows[e.name] = (n + 1, t + e.device_time)
    total = sum(t for _, t in rows.values())
    print(f"\n### torch.compile batch {batch}: kernels per step ({total / steps / 1e3:.3f} ms of "
          "kernel time)")
    print("| kernel | launches | us | share |")
    print("| --- | --- | --- | --- |")
    for name, (n, t) in sorted(rows.items(), key=lambda r: -r[1][1]):
        print(f"| {name[:110]} | {n / steps:.0f} | {t / steps:.1f} | {t / total:.1%} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--prefill", default="")
    ap.add_argument("--no-rates", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__}, {props.name}, {props.total_memory / 2**30:.0f} GiB")

    hbm, gemm = 0.0, 0.0
    if not args.no_rates:
        hbm = hbm_read_rate(args.iters)
        result(figure="hbm_read_rate", tb_per_s=hbm / 1e12)
        gemm = gemm_rate(args.iters)
        result(figure="bf16_gemm_rate", tflop_per_s=gemm / 1e12)

    # Every sequence has `context` tokens of KV and decodes its next one: the cache holds
    # context + 1 rows and the step attends over all of them (513 keys at the default).
    keys = args.context + 1
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        model = Decoder(batch, keys)
        step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        ids = torch.randint(0, VOCAB, (batch,), device="cuda")
        pos = torch.tensor([args.context], device="cuda")
        with torch.no_grad():
            t_eager = timed(lambda: model.forward(ids, pos), max(5, args.iters // 5))
            t = timed(lambda: step(ids, pos), args.iters)
            if args.profile:
                kernel_table(lambda: step(ids, pos), batch)
        kv = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2 * batch * keys
        roof = (model.weight_bytes() + kv) / hbm if hbm else float("nan")
        rows.append((batch, t, t_eager, roof))
        result(figure="torch_compile_decode", batch=batch, keys=keys, ms=t * 1e3,
               eager_ms=t_eager * 1e3, roofline_ms=roof * 1e3, x_roofline=t / roof)
        del model, step
        torch._dynamo.reset()
        torch.cuda.empty_cache()

    prefills = []
    for n in [int(p) for p in args.prefill.split(",") if p]:
        model = Decoder(1, n, caches=False)
        ids = torch.randint(0, VOCAB, (n,), device="cuda")
        with torch.no_grad():
            t = timed(lambda: model.prefill(ids), 1 if n > 65536 else 3, warmup=1)
        params = model.weight_bytes() / 2 - VOCAB * HIDDEN
        flops = 2 * params * n + 2 * VOCAB * HIDDEN + 2 * 2 * n * n / 2 * HEADS * HEAD_DIM * LAYERS
        prefills.append((n, t, flops / t))
        result(figure="torch_prefill", tokens=n, ms=t * 1e3, tflop_per_s=flops / t / 1e12,
               of_gemm_rate=flops / t / gemm if gemm else None)
        del model
        torch.cuda.empty_cache()

    print(f"\nHBM read rate {hbm / 1e12:.2f} TB/s, bf16 GEMM {gemm / 1e12:.0f} TFLOP/s")
    print(f"decode, {keys} keys per sequence")
    print("| batch | torch.compile ms | eager ms | roofline ms | x roofline |")
    print("| --- | --- | --- | --- | --- |")
    for batch, t, te, roof in rows:
        print(f"| {batch} | {t * 1e3:.2f} | {te * 1e3:.2f} | {roof * 1e3:.2f} | {t / roof:.2f} |")
    if prefills:
        print("| prefill tokens | ms | TFLOP/s | of GEMM rate |")
        print("| --- | --- | --- | --- |")
        for n, t, rate in prefills:
            share = f"{rate / gemm:.0%}" if gemm else "—"
            print(f"| {n} | {t * 1e3:.0f} | {rate / 1e12:.0f} | {share} |")


if __name__ == "__main__":
    main()
