#!/usr/bin/env bash
# Candidate kernels in one device call: their correctness checks and the bench A/B against the
# shipped ones (scripts/gpu/kernels.sh), then, only if every check passed, the SLO experiment
# served with them (scripts/gpu/slo.sh, the server told by SUPERINFER_DECODE_KERNEL and
# SUPERINFER_CUDA_SOURCES, docs/OPERATIONS.md), so a kernel that has never run is measured in
# the served loop without a rebuild or a second machine start.
#   here:       scripts/gpu/model.sh build && scripts/gpu/slo.sh build
#   on the GPU: scripts/gpu/candidate.sh [VAR=value …]
#               # with carry [".gpu-bin/model", ".gpu-bin/slo"]
# Settings, defaults in brackets:
#   VARIANT (required)       a folder of scripts/gpu/variants/ (its files replace the tree's)
#   DECODE [tensor-core]     the decode kernel the server runs
#   SLO ["POLICIES=wlvf RPS=24,22 DURATION=60 DRAIN=30"]  settings of slo.sh; empty: no SLO run
# Writes under $OUT: kernels/ (kernels.sh's files), variant-check.log (the attention check
# with the variant's sources) and slo/ (slo.sh's files).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
for kv in "$@"; do export "${kv?}"; done
VARIANT=${VARIANT:-}; DECODE=${DECODE:-tensor-core}
[ -n "$VARIANT" ] && [ -d "scripts/gpu/variants/$VARIANT" ] ||
  { echo "VARIANT=<a folder of scripts/gpu/variants/> is required (got '$VARIANT')" >&2; exit 2; }
SLO=${SLO-POLICIES=wlvf RPS=24,22 DURATION=60 DRAIN=30}
out=${OUT:-$root/out}
mkdir -p "$out/kernels" "$out/slo"
# The shipped kernels' checks (every decode kernel against f64, graph replay with both
# per-sequence-part kernels), and the bench of the tree and the variant side by side.
OUT=$out/kernels scripts/gpu/kernels.sh CHECKS='attention_kernels graph_replay' \
  VARIANTS="tree,$VARIANT" SECTIONS=attention,prefill,decode ITERS=10
status=$?
# The variant's sources through the same attention check.
vdir=/tmp/superinfer-cu-$VARIANT
SUPERINFER_CUDA_SOURCES=$vdir SUPERINFER_KERNEL_CACHE=/tmp/superinfer-kernels-$VARIANT \
  RUST_BACKTRACE=1 /tmp/superinfer-model-bins/gpu_model_path attention_kernels --ignored \
  --nocapture --test-threads 1 > "$out/variant-check.log" 2>&1
[ $? = 0 ] || status=1
tail -5 "$out/variant-check.log"
if [ "$status" != 0 ]; then
  echo "a check failed: no SLO run with the candidate kernels"
  exit 1
fi
[ -n "$SLO" ] || exit 0
# shellcheck disable=SC2086 # SLO is a list of VAR=value words
OUT=$out/slo SUPERINFER_DECODE_KERNEL=$DECODE SUPERINFER_CUDA_SOURCES=$vdir \
  scripts/gpu/slo.sh run $SLO
