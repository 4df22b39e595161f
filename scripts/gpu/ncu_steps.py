#!/usr/bin/env python3
"""Kernel-by-kernel tables of the decode steps that `gpu_model_bench --profile` ran under
`ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw`.

    python3 scripts/gpu/ncu_steps.py NCU_CSV BENCH_LOG

The bench profiles exactly one step after timing each decode configuration, in the order its
table rows appear in BENCH_LOG; every step ends with the sampling kernel, which splits the
ncu rows into steps. For each step: GPU time by kernel (launches, us, share) and the sum,
beside the step's wall time from the bench (the difference is time between kernels).
"""
import csv
import re
import sys


def kernel_rows(path):
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("==")]
    for row in csv.DictReader(lines):
        if not row.get("ID", "").strip().isdigit():
            continue  # the units row
        yield row["Kernel Name"], float(row["gpu__time_duration.sum"].replace(",", ""))


def steps(rows):
    step = []
    for name, ns in rows:
        step.append((name, ns))
        if "sample" in name:
            yield step
            step = []
    if step:
        yield step


def configs(bench_log):
    """The bench's decode rows in order: (label, ms per step)."""
    out = []
    for line in open(bench_log):
        m = re.match(r"\| (\d+) \| ([^|]+) \| ([0-9.]+) \|", line)
        if m:
            out.append((f"batch {m.group(1)}, {m.group(2).strip()}", float(m.group(3))))
    return out


def main():
    labels = configs(sys.argv[2])
    for i, step in enumerate(steps(kernel_rows(sys.argv[1]))):
        label, ms = labels[i] if i < len(labels) else (f"step {i}", float("nan"))
        by = {}
        for name, ns in step:
            n, t = by.get(name, (0, 0.0))
            by[name] = (n + 1, t + ns)
        total = sum(t for _, t in by.values())
        print(f"\n### {label}: {len(step)} kernels, {total / 1e6:.3f} ms of kernel time "
              f"(step {ms:.2f} ms timed)")
        print("| kernel | launches | us | share |")
        print("| --- | --- | --- | --- |")
        for name, (n, t) in sorted(by.items(), key=lambda r: -r[1][1]):
            print(f"| {name[:110]} | {n} | {t / 1e3:.1f} | {t / total:.1%} |")


if __name__ == "__main__":
    main()
