#!/usr/bin/env python3
"""Compares a GPU server's step trace (`superinfer serve --step-trace FILE`) with the twin's
step time for the same batches, from a built-in hardware and model profile
(engine/profiles/), and fits what the profile misses.

    scripts/fit_steps.py STEPS.jsonl [STEPS.jsonl ...] --profile h100-llama-3.1-8b

For every traced step it computes the twin's time (the formula of engine/src/runner/sim.rs,
`SimRunner::step_time`, from the step's aggregates) and prints, by kind of step (decode-only
or with prompt chunks) and by the longest context in it: the steps, the runner's measured
time over the twin's, and the iteration (to the next step's start) over the runner's. Then a
least-squares fit of the runner's time on the twin's terms (the fixed part: overhead and the
weights read where they exceed the compute; the KV read; GEMM tokens; chunk attention) says
which term is off and by how much (1.00 each on the twin's own trace: tests/tests/step_trace_fit.rs).
"""
import argparse
import json
import math
import os
import sys

try:
    import tomllib
except ImportError:  # Python before 3.11 (scripts/test-requirements.txt installs tomli)
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_profile(name):
    hw_name, model_name = name.split("-", 1)
    with open(os.path.join(ROOT, "engine/profiles/hardware", hw_name + ".toml"), "rb") as f:
        hw = tomllib.load(f)
    with open(os.path.join(ROOT, "engine/profiles/models", model_name + ".toml"), "rb") as f:
        model = tomllib.load(f)
    return hw, model


def attention_pairs(pos, length, wave, tile):
    """A chunk's causal (query, key) pairs rounded up to the kernel's whole waves."""
    pairs = length * (pos + length / 2.0)
    if length <= 1 or wave <= 0 or tile <= 0:
        return pairs
    waves = math.ceil(math.ceil(length / tile) * tile / wave)
    return max(pairs, waves * wave * (pos + length / 2.0))


def terms(hw, m, s):
    """The twin's step time of trace line `s`, term by term (seconds)."""
    tokens = s["decodes"] + s["chunk_tokens"]
    seqs = s["decodes"] + s["chunks"]
    kv_tokens = s["decode_kv"] + s["chunk_pos"] + s["chunk_tokens"]
    q_width = m["num_heads"] * m["head_dim"]
    # The chunks of more than one token (the twin counts a one-token chunk as a decode): their
    # pairs, and at least the kernel's whole waves of the chunk that needs the most
    # (engine/src/runner/cost.rs, `attention_pairs`); a trace without `chunk_spans` is read as
    # one chunk at its deepest position.
    tile = hw.get("prefill_attention_tile", 0)
    wave = hw.get("prefill_attention_rows_in_flight", 0) / m["num_heads"] if tile else 0.0
    if "chunk_spans" in s:
        spans = [(p, n) for p, n in s["chunk_spans"] if n > 1]
        pairs = sum(n * (p + n / 2.0) for p, n in spans)
    else:
        spans = [(s["max_chunk_pos"], s["chunk_tokens"])] if s["chunks"] else []
        pairs = s["chunk_pairs"]
    waved = max((attention_pairs(p, n, wave, tile) for p, n in spans), default=0.0)
    attn_flops = 4.0 * m["num_layers"] * q_width * max(pairs, waved)
    attn_rate = hw["matmul_tflops"] * 1e12 * hw.get(
        "prefill_attention_efficiency", hw["prefill_efficiency"])
    # A step with a chunk of the wide kernel's length runs all its chunks there: their pairs
    # at its rate (engine/src/runner/sim.rs).
    wide_min = hw.get("prefill_attention_wide_min_tokens", 0)
    if wide_min and "prefill_attention_wide_efficiency" in hw and any(
            n >= wide_min for _, n in spans):
        attn_flops = 4.0 * m["num_layers"] * q_width * pairs
        attn_rate = hw["matmul_tflops"] * 1e12 * hw["prefill_attention_wide_efficiency"]
    gemm = 2.0 * m["params"] * tokens / (hw["matmul_tflops"] * 1e12 * hw["prefill_efficiency"])
    attention = attn_flops / attn_rate
    bandwidth = hw["hbm_bw_gbps"] * 1e9 * hw["hbm_bw_efficiency"]
    bytes_per_token = 2 * m["num_layers"] * m["kv_heads"] * m["head_dim"] * m["dtype_bytes"]
    weights = m["params"] * m["dtype_bytes"] / bandwidth
    kv = kv_tokens * bytes_per_token / (bandwidth * hw.get("kv_read_efficiency", 1.0))
    decode_only = s["chunks"] == 0
    graph = decode_only and seqs <= hw.get("graph_max_seqs", 0)
    layers = hw.get("overhead_layers", 0)
    per_layer = m["num_layers"] / layers if layers else 1.0
    if graph:
        overhead = hw.get("graph_step_overhead_s", 0) + hw.get("graph_step_overhead_per_seq_s", 0) * seqs
    else:
        overhead = hw["step_overhead_s"] + hw.get("step_overhead_per_seq_s", 0) * seqs
    overhead *= per_layer
    compute = gemm + attention
    if hw.get("kv_overlaps_compute", True):
        total = overhead + max(compute, weights + kv)
        memory = weights + kv
    else:
        total = overhead + max(compute, weights) + kv
        memory = weights
    # Additive terms that sum to the total: the fixed part is the overhead plus whatever the
    # memory side adds beyond the compute (a decode step's weights read; with KV reads that
    # overlap the compute, those too, so the KV term is then counted in it).
    fixed = overhead + max(memory - compute, 0.0)
    if hw.get("kv_overlaps_compute", True) and memory > compute:
        kv = 0.0
    return {"fixed": fixed, "kv": kv, "gemm": gemm, "attention": attention, "total": total}


def lstsq(rows, ys):
    """Ordinary least squares by the normal equations (a handful of columns)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda k: abs(a[k][c]))
        if abs(a[p][c]) < 1e-30:
            return None
        a[c], a[p], b[c], b[p] = a[p], a[c], b[p], b[c]
        for k in range(n):
            if k != c:
                f = a[k][c] / a[c][c]
                a[k] = [x - f * y for x, y in zip(a[k], a[c])]
                b[k] -= f * b[c]
    return [b[i] / a[i][i] for i in range(n)]


def bucket(s):
    ctx = max(s["max_decode_kv"], s["max_chunk_pos"])
    edge = next((e for e in (4096, 16384, 65536) if ctx <= e), None)
    kind = "decode" if s["chunks"] == 0 else "mixed"
    return kind, f"<= {edge}" if edge else "> 65536"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--profile", required=True, help="e.g. h100-llama-3.1-8b")
    args = ap.parse_args()
    hw, m = load_profile(args.profile)
    steps = []
    for path in args.traces:
        with open(path) as f:
            steps += [json.loads(line) for line in f if line.strip()]
    if not steps:
        sys.exit("no steps in the traces")
    groups = {}
    for s in steps:
        s["twin"] = terms(hw, m, s)
        groups.setdefault(bucket(s), []).append(s)
    print(f"{len(steps)} steps; profile {args.profile}")
    print("| steps | context | n | runner / twin (p50, mean) | iteration / runner (p50) | host gap p50 (ms) |")
    print("|---|---|---:|---:|---:|---:|")
    for key in sorted(groups):
        g = groups[key]
        r = sorted(s["elapsed_s"] / s["twin"]["total"] for s in g)
        it = sorted(s["iteration_s"] / s["elapsed_s"] for s in g if s.get("iteration_s"))
        gap = sorted(1e3 * (s["iteration_s"] - s["elapsed_s"]) for s in g if s.get("iteration_s"))
        med = lambda v: v[len(v) // 2] if v else math.nan
        print(f"| {key[0]} | {key[1]} | {len(g)} | {med(r):.2f}, {sum(r) / len(r):.2f} | "
              f"{med(it):.2f} | {med(gap):.1f} |")
    cols = ["fixed", "kv", "gemm", "attention"]
    for target in ("elapsed_s", "iteration_s"):
        use = [s for s in steps if s.get(target)]
        fit = lstsq([[s["twin"][c] for c in cols] for s in use], [s[target] for s in use])
        if fit is None:
            print(f"{target}: the terms are not independent in these steps; no fit")
            continue
        err = [abs(sum(f * s["twin"][c] for f, c in zip(fit, cols)) - s[target]) / s[target] for s in use]
        err.sort()
        print(f"{target} ≈ " + " + ".join(f"{f:.2f}·{c}" for f, c in zip(fit, cols))
              + f"  (median error {100 * err[len(err) // 2]:.1f}%, p90 {100 * err[int(0.9 * len(err))]:.1f}%)")


if __name__ == "__main__":
    main()
