#!/usr/bin/env python3
"""Writes the memory-wall workload: N concurrent long-context conversations.

Each conversation is its own tenant (equal weights) with its own CONTEXT-token document as the
system prompt, so no two conversations share a prefix. Conversation i (from 1) starts at i * STAGGER_S
and goes on turn after turn (a MESSAGE-token question, an OUTPUT-token answer, an exponential
think time of THINK_S mean) until the run ends. At any moment some conversations decode, some
think: their KV either stays cached (HBM, or DRAM with two tiers) or is recomputed.

    scripts/memwall_tenants.py OUT_DIR N [--context 32000] [--message 64] [--output 128]
        [--think-s 5] [--stagger-s 1] [--ttft-s 5] [--tbt-s 0.1] [--key-prefix conv]

writes OUT_DIR/tenants.toml (a loadgen tenants file) and one arrivals file per conversation.
The tenants' API keys come from SLO_KEY_1..N (scripts/gpu/memwall.sh creates them).
"""
import argparse
import os


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("n", type=int)
    p.add_argument("--context", type=int, default=32000)
    p.add_argument("--message", type=int, default=64)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--think-s", type=float, default=5.0)
    p.add_argument("--stagger-s", type=float, default=1.0)
    p.add_argument("--ttft-s", type=float, default=5.0)
    p.add_argument("--tbt-s", type=float, default=0.1)
    p.add_argument("--max-context", type=int, default=131072)
    p.add_argument("--key-prefix", default="conv",
                   help="seeds the documents: another prefix, other documents")
    a = p.parse_args()
    if a.n < 1 or a.context < 1 or a.message < 1 or a.output < 1 or a.stagger_s <= 0:
        p.error("N, --context, --message and --output must be at least 1, --stagger-s above 0")
    os.makedirs(a.out_dir, exist_ok=True)
    out = []
    for i in range(1, a.n + 1):
        arrivals = os.path.abspath(os.path.join(a.out_dir, f"conv-{i}.arrivals.jsonl"))
        with open(arrivals, "w") as f:
            f.write('{"arrival_s": %.3f}\n' % (i * a.stagger_s))
        out.append(f"""[[tenant]]
name = "conv-{i}"
weight = 1.0
ttft_slo_s = {a.ttft_s}
tbt_slo_s = {a.tbt_s}
system_prompt_tokens = {a.context}
system_prompt_key = "{a.key_prefix}-{i}"
max_prompt_tokens = {a.max_context}
max_output_tokens = {a.output}
dataset = {{ kind = "fixed", prompt = {a.message}, output = {a.output} }}
arrivals = {{ kind = "trace", path = "{arrivals}" }}
conversation = {{ turns_mean = 1000.0, max_turns = 1000, think_time_s = {a.think_s} }}
api_key_env = "SLO_KEY_{i}"
""")
    with open(os.path.join(a.out_dir, "tenants.toml"), "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
