#!/usr/bin/env python3
"""The paged prefill attention kernels alone, beside PyTorch, in one process on the GPU.

Compiles `kernels/src/cuda/cu/prefill.cu` and `prefill_wide.cu` (with `common.cuh`, as the
engine does through NVRTC) of the working tree and, with `--base REV`, a git revision's
`paged_prefill`, and runs each on the same paged KV arena (block-first layout, shuffled block
table, Llama-3.1-8B heads: 32 query heads, 8 KV heads, head dim 128, 32 layers, blocks of 16
tokens) for chunks of queries at a position:

- checks each against a float32 reference on sampled query rows (causal, sliding window, a
  partial tile, a block size that is not a power of two, head dims 64 and 32);
- times each chunk (CUDA events, median of --iters) and gives TFLOP/s of the causal chunk
  (4 * head_dim * heads per visible query-key pair);
- times PyTorch's scaled_dot_product_attention on the same chunk with contiguous K/V (flash
  where it takes a lower-right causal mask, else the backend it picks; the line says which).

With --variants, builds of the tree's wide kernel with other shapes (its #ifndef defines) run
beside it. Usage (on the GPU): python3 scripts/gpu/prefill_attention.py [--base REV] [--iters 5]
    [--variants 'PFW_N=64;PFW_MT=1,PFW_N=64']
    [--cases 2048@0,16384@16384,16384@114688]
Prints a markdown table; exits 1 when a kernel's output is off the reference.
"""
import argparse
import math
import re
import pathlib
import subprocess
import sys

import cupy
import numpy as np
import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]
CU = "kernels/src/cuda/cu"


def source(rev):
    """common.cuh and the prefill kernels of the tree (rev None) or of a revision (a revision
    before prefill_wide.cu has prefill.cu alone)."""
    names = ["common.cuh", "prefill.cu", "prefill_wide.cu"]
    if rev is None:
        return "".join((ROOT / CU / f).read_text() for f in names if (ROOT / CU / f).exists())
    out = []
    for f in names:
        got = subprocess.run(["git", "show", f"{rev}:{CU}/{f}"], cwd=ROOT, capture_output=True,
                             text=True)
        if got.returncode == 0:
            out.append(got.stdout)
        elif f != "prefill_wide.cu":
            raise SystemExit(f"{rev} has no {CU}/{f}")
    return "".join(out)


class Kernel:
    """One prefill kernel (`entry`: paged_prefill, or paged_prefill_wide, whose shape comes
    from #ifndef-guarded PFW_ defines and which takes dynamic shared memory) of the tree's
    sources (rev None) or a revision's, built with -D defines."""

    def __init__(self, rev, entry="paged_prefill", defines=()):
        src = source(rev)
        defs = dict(defines)
        opts = ("--std=c++17",) + tuple(f"-D{k}={v}" for k, v in defs.items())
        self.mod = cupy.RawModule(code=src, options=opts)
        self.entry = entry
        prefix = "PFW" if entry.endswith("_wide") else "PF"
        guarded = dict(re.findall(rf"#ifndef ({prefix}_\w+)\n#define \1 (\d+)", src))
        if f"{prefix}_WARPS" in guarded:
            cfg = {k: int(v) for k, v in {**guarded, **defs}.items()}
            self.rows = cfg[f"{prefix}_WARPS"] * 16 * cfg[f"{prefix}_MT"]
            self.threads = cfg[f"{prefix}_WARPS"] * 32
            self.keys = cfg[f"{prefix}_N"]
        else:
            self.rows = int(re.search(rf"#define {prefix}_M (\d+)", src).group(1))
            self.threads = int(re.search(rf"#define {prefix}_THREADS (\d+)", src).group(1))
            self.keys = None
        self.funcs = {}

    def smem(self, d):
        return 0 if self.keys is None else (self.rows + 2 * self.keys) * (d + 8) * 2

    def get(self, d):
        if d not in self.funcs:
            fn = self.mod.get_function(f"{self.entry}_bf16_d{d}")
            if self.smem(d) > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = self.smem(d)
            self.funcs[d] = fn
        return self.funcs[d]


class Case:
    """n queries at positions pos..pos+n over keys 0..pos+n, in one sequence."""

    def __init__(self, n, pos, heads=32, kv_heads=8, d=128, layers=32, bs=16, window=0, layer=7):
        self.n, self.pos, self.h, self.kh, self.d = n, pos, heads, kv_heads, d
        self.layers, self.bs, self.window, self.layer = layers, bs, window, layer
        self.end = pos + n

    def name(self):
        extra = "" if (self.d, self.bs, self.window) == (128, 16, 0) else \
            f" (d {self.d}, blocks of {self.bs}, window {self.window})"
        return f"{self.n} queries at {self.pos}{extra}"

    def pairs(self):
        """Visible query-key pairs."""
        if self.window == 0:
            return self.n * self.pos + self.n * (self.n + 1) // 2
        return sum(min(self.pos + i + 1, self.window) for i in range(self.n))

    def build(self, gen):
        blocks = -(-self.end // self.bs)
        total = blocks + 7
        self.table = torch.randperm(total, generator=gen)[:blocks].to(torch.int32).cuda()
        rows = total * self.layers * 2 * self.bs
        self.arena = torch.empty(rows, self.kh * self.d, dtype=torch.bfloat16, device="cuda")
        self.arena.normal_()
        self.q = torch.randn(self.n, self.h * self.d, dtype=torch.bfloat16, device="cuda")
        self.tiles = {}
        self.seqs = torch.tensor([0, self.pos, self.end, 0], dtype=torch.int32, device="cuda")
        j = torch.arange(self.end, device="cuda")
        krow = (self.table[j // self.bs].long() * self.layers + self.layer) * 2 * self.bs + j % self.bs
        self.k = self.arena[krow].view(self.end, self.kh, self.d)
        self.v = self.arena[krow + self.bs].view(self.end, self.kh, self.d)
        self.scale_log2 = (1.0 / math.sqrt(self.d)) * math.log2(math.e)

    def launch(self, kernel, out):
        u32 = np.uint32
        rows = kernel.rows
        if rows not in self.tiles:
            tiles = [(0, q0) for q0 in range(0, self.n, rows)]
            self.tiles[rows] = torch.tensor(tiles, dtype=torch.int32, device="cuda").flatten()
        tiles, fn = self.tiles[rows], kernel.get(self.d)
        fn((tiles.numel() // 2, self.h, 1), (kernel.threads, 1, 1),
           (np.uint64(self.q.data_ptr()), np.uint64(self.arena.data_ptr()),
            np.uint64(out.data_ptr()), np.uint64(tiles.data_ptr()),
            np.uint64(self.seqs.data_ptr()), np.uint64(self.table.data_ptr()),
            u32(self.h), u32(self.kh), u32(self.layers), u32(self.bs), u32(self.layer),
            np.float32(self.scale_log2), u32(self.window)), shared_mem=kernel.smem(self.d))

    def reference(self, rows):
        """float32 attention of the given query rows."""
        g = self.h // self.kh
        q = self.q[rows].view(-1, self.h, self.d).float().transpose(0, 1)  # h r d
        k = self.k.float().repeat_interleave(g, dim=1).transpose(0, 1)  # h end d
        v = self.v.float().repeat_interleave(g, dim=1).transpose(0, 1)
        s = q @ k.transpose(1, 2) / math.sqrt(self.d)  # h r end
        p = self.pos + rows.view(-1, 1)
        j = torch.arange(self.end, device="cuda").view(1, -1)
        hide = j > p
        if self.window:
            hide |= j + self.window <= p
        s = s.masked_fill(hide.unsqueeze(0), float("-inf"))
        o = torch.softmax(s, dim=-1) @ v  # h r d
        return o.transpose(0, 1).reshape(len(rows), self.h * self.d)

    def torch_sdpa(self):
        """PyTorch's attention of the same chunk (contiguous K/V), and the backend it used."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        g = self.h // self.kh
        q = self.q.view(1, self.n, self.h, self.d).transpose(1, 2)
        k = self.k.repeat_interleave(g, dim=1).unsqueeze(0).transpose(1, 2).contiguous()
        v = self.v.repeat_interleave(g, dim=1).unsqueeze(0).transpose(1, 2).contiguous()
        if self.pos == 0:
            call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        else:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(self.n, self.end)
            call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("cuDNN", SDPBackend.CUDNN_ATTENTION),
                              ("mem-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    call()
                    torch.cuda.synchronize()
                return name, lambda b=backend: _with(b, call)
            except Exception:  # noqa: BLE001 (a backend that refuses the mask or shape)
                continue
        return "default", call


def _with(backend, call):
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel([backend]):
        return call()


def timed(fn, iters):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


CHECKS = [Case(1000, 300, window=256), Case(700, 50, bs=24), Case(333, 4000, d=64, heads=8, kv_heads=2),
          Case(130, 64, d=32, heads=4, kv_heads=4), Case(4096, 0), Case(2048, 6000)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="git revision whose prefill.cu runs beside the tree's")
    ap.add_argument("--variants", help="builds of the tree's wide kernel beside its default, each a "
                    "comma-separated list of defines, separated by ';' (e.g. 'PFW_N=64;PFW_MT=1')")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--cases", default="2048@0,16384@0,16384@16384,16384@114688")
    a = ap.parse_args()
    kernels = [("tree", Kernel(None)), ("tree wide", Kernel(None, "paged_prefill_wide"))]
    for spec in filter(None, (a.variants or "").split(";")):
        defs = [kv.split("=") for kv in spec.split(",")]
        kernels.append((f"tree wide {spec}", Kernel(None, "paged_prefill_wide", defs)))
    if a.base:
        kernels.insert(0, (a.base, Kernel(a.base)))
    gen = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    failed = False
    print("\n| check | kernel | max abs error | reference max |\n|---|---|---:|---:|")
    for c in CHECKS + [Case(*map(int, s.split("@"))) for s in a.cases.split(",")]:
        c.build(gen)
        rows = torch.unique(torch.cat([torch.tensor([0, c.n - 1]),
                                       torch.randint(0, c.n, (62,), generator=gen)])).cuda()
        ref = c.reference(rows)
        for name, kernel in kernels:
            out = torch.zeros_like(c.q)
            c.launch(kernel, out)
            torch.cuda.synchronize()
            err = (out[rows].float() - ref).abs().max().item()
            scale = ref.abs().max().item()
            bad = not err <= 0.02 * scale + 0.02
            failed |= bad
            print(f"| {c.name()} | {name} | {err:.4f}{' **off**' if bad else ''} | {scale:.3f} |")
        del c.arena, c.k, c.v
        torch.cuda.empty_cache()
    print("\n| chunk | kernel | ms | TFLOP/s | × first |\n|---|---|---:|---:|---:|")
    for spec in a.cases.split(","):
        c = Case(*map(int, spec.split("@")))
        c.build(gen)
        flops = 4.0 * c.d * c.h * c.pairs()
        first = None
        for name, kernel in kernels:
            out = torch.empty_like(c.q)
            ms = timed(lambda: c.launch(kernel, out), a.iters)
            first = first or ms
            print(f"| {c.name()} | {name} | {ms:.2f} | {flops / ms / 1e9:.0f} | {ms / first:.2f} |")
        backend, call = c.torch_sdpa()
        ms = timed(call, a.iters)
        print(f"| {c.name()} | PyTorch SDPA ({backend}, contiguous K/V) | {ms:.2f} | "
              f"{flops / ms / 1e9:.0f} | {ms / first:.2f} |")
        del c.arena, c.k, c.v
        torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
