#!/usr/bin/env bash
# The prefill attention kernel at long context in one device call: the kernel alone, the
# tree's beside BASE's and PyTorch's SDPA (scripts/gpu/prefill_attention.py: checks against a
# float32 reference, then chunks of 2k-16k queries at 0-112k), then the model's 32k and 128k
# prefills in the engine's chunks with the tree's kernels (model.sh long, the CUDA sources
# read from the tree), beside PyTorch's one-shot prefill of the same lengths.
#   here:       scripts/gpu/model.sh build-long                 # .gpu-bin/long
#   on the GPU: scripts/gpu/prefill.sh [BASE=rev] [CASES=…] [VARIANTS=…] [NO_MODEL=1]
#               # with carry [".gpu-bin/long"]; VARIANTS: other shapes of the tree's wide kernel
#               # (prefill_attention.py --variants, e.g. 'PFW_N=64;PFW_MT=1,PFW_N=64')
# Writes under $OUT: kernel.md, and env.txt, torch.log, bench.log of the model's prefills.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
for kv in "$@"; do export "${kv?}"; done
out=${OUT:-$root/out}
mkdir -p "$out"
base=()
[ -n "${BASE:-}" ] && base=(--base "$BASE")
PYTHONUNBUFFERED=1 timeout 300 python3 scripts/gpu/prefill_attention.py "${base[@]}" \
  ${CASES:+--cases "$CASES"} ${VARIANTS:+--variants "$VARIANTS"} 2>&1 | tee "$out/kernel.md"
status=${PIPESTATUS[0]}
[ -n "${NO_MODEL:-}" ] && exit "$status"
SUPERINFER_CUDA_SOURCES=$root/kernels/src/cuda/cu \
  TORCH_ARGS="--context 32768 --batches 1 --iters 3 --prefill 32768,131072" \
  scripts/gpu/model.sh long --long-contexts 32768 --batches 1
exit $(( status | $? ))
