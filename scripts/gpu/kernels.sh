#!/usr/bin/env bash
# Kernel A/B in one device call: the gpu_model bench (binaries of `scripts/gpu/model.sh build`)
# once per variant of the CUDA sources, so an edited kernel is measured side by side with the
# one it replaces, on the same machine, in the same run. The model kernels are compiled at run
# time by NVRTC; SUPERINFER_CUDA_SOURCES points the binary at a folder of sources instead of the
# embedded ones (kernels/src/cuda/model.rs), so no rebuild is needed between variants.
#   on the GPU: scripts/gpu/kernels.sh [VAR=value …]   # with carry [".gpu-bin/model"]
#   here:       scripts/gpu/kernels.sh compile           # no GPU: every module of the tree and
#               those each variant changes, compiled by nvcc for sm_90 (the PyPI toolchain), with
#               ptxas' registers, spills and shared memory per kernel, before spending device time
# Settings, defaults in brackets:
#   VARIANTS [base,tree]  each a name: `tree` (kernels/src/cuda/cu as sent), `base` (the tree's
#            sources with the FILES of git revision BASE), or a folder of its own under
#            scripts/gpu/variants/ (any file it lacks comes from the tree)
#   BASE [HEAD]  FILES [prefill.cu decode.cu]  SECTIONS [attention]  ITERS [10]
#   CHECKS [unset: a filter of the GPU checks to run first, with the tree's sources, e.g.
#          "attention_kernels graph_replay"]
#   BENCH_ARGS [none: more arguments of the bench, e.g. "--batches 1,8,32"]
# Writes under $OUT: env.txt, checks.log (with CHECKS), bench-<variant>.log.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
src=kernels/src/cuda/cu
if [ "${1:-}" = compile ]; then
  # The modules as kernels/src/cuda/model/state.rs assembles them (common.cuh first; keep the two lists alike).
  eval "$("${CUDA_TOOLCHAIN_SH:-$root/../shared/cuda-toolchain.sh}")"
  tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
  status=0
  for v in tree $(ls scripts/gpu/variants 2>/dev/null); do
    dir=$tmp/$v && mkdir -p "$dir" && cp "$src"/* "$dir"/
    [ "$v" = tree ] || cp "scripts/gpu/variants/$v"/* "$dir"/
    for m in "prefill.cu prefill_wide.cu attention.cu" "decode.cu decode_mma.cu" rope_kv.cu norm_act.cu sample.cu gemv.cu; do
      name=${m%% *}; name=${name%.cu}
      # A variant's modules: only those holding a file of its own (the rest are the tree's).
      if [ "$v" != tree ]; then
        own=0
        for f in $m; do [ -f "scripts/gpu/variants/$v/$f" ] && own=1; done
        [ "$own" = 1 ] || continue
      fi
      (cd "$dir" && cat common.cuh $m) > "$tmp/$v-$name.cu"
      echo "== $v: $m"
      nvcc -std=c++17 -arch=sm_90 -cubin -Xptxas -v "$tmp/$v-$name.cu" -o "$tmp/$v-$name.cubin" 2>&1 \
        | sed -n "s/^ptxas info    : Compiling entry function '\(.*\)' for.*/\1/p; s/^ptxas info    : Used/  used/p; s/^ *\([0-9]* bytes stack frame.*\)/  \1/p; /error/p"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
    done
  done
  exit $status
fi
for kv in "$@"; do export "${kv?}"; done
VARIANTS=${VARIANTS:-base,tree}; BASE=${BASE:-HEAD}; FILES=${FILES:-prefill.cu decode.cu}
SECTIONS=${SECTIONS:-attention}; ITERS=${ITERS:-10}
out=${OUT:-$root/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SUPERINFER_KERNEL_CACHE=${SUPERINFER_KERNEL_CACHE:-/tmp/superinfer-kernels}
bins=/tmp/superinfer-model-bins
mkdir -p "$bins" && tar xJf .gpu-bin/model/bins.tar.xz -C "$bins" || exit 1
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree); base: $BASE ($FILES)"
  echo "variants: $VARIANTS; sections: $SECTIONS; iters: $ITERS"
} | tee "$out/env.txt"
status=0
if [ -n "${CHECKS:-}" ]; then
  : > "$out/checks.log"
  for t in gpu_model_path gpu_decode_graphs; do
    SUPERINFER_CUDA_SOURCES=$root/$src RUST_BACKTRACE=1 "$bins/$t" $CHECKS --ignored \
      --nocapture --test-threads 1 2>&1 \
      | tee -a "$out/checks.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
fi
for v in ${VARIANTS//,/ }; do
  dir=/tmp/superinfer-cu-$v
  rm -rf "$dir" && mkdir -p "$dir" && cp "$src"/* "$dir"/
  case "$v" in
    tree) ;;
    base)
      for f in $FILES; do
        git show "$BASE:$src/$f" > "$dir/$f" || { echo "no $f at $BASE" >&2; exit 1; }
      done ;;
    *)
      [ -d "scripts/gpu/variants/$v" ] || { echo "no variant $v" >&2; exit 1; }
      cp "scripts/gpu/variants/$v"/* "$dir"/ ;;
  esac
  echo "== variant $v ($dir)" | tee "$out/bench-$v.log"
  SUPERINFER_CUDA_SOURCES=$dir "$bins/gpu_model_bench" --sections "$SECTIONS" --iters "$ITERS" \
    ${BENCH_ARGS:-} 2>&1 | tee -a "$out/bench-$v.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
echo "exit $status" | tee -a "$out/env.txt"
exit $status
