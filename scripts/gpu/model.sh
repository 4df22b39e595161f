#!/usr/bin/env bash
# The GPU model path in one device call: correctness checks, then step and kernel benchmarks.
#   here:       scripts/gpu/model.sh build   # stages .gpu-bin/model/ (xz-compressed binaries)
#   on the GPU: scripts/gpu/model.sh run     # with carry [".gpu-bin/model"]
# `run` writes under $OUT: env.txt, hf.log (the transformers reference), checks.log (the
# ignored GPU tests of engine/tests/gpu_model_path.rs and gpu_engine_path.rs), bench.log
# (benches/gpu_model.rs), torch.log (scripts/gpu/torch_decoder.py: torch.compile'd decoder,
# HBM read and GEMM rates, passed to the bench). NO_TORCH=1 skips the reference.
# Extra arguments of `run` go to the bench (e.g. --context 1024). CHECKS=<name filter> runs
# only the matching checks; NO_BENCH=1 skips the bench.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
stage=.gpu-bin/model
case "${1:-}" in
  build)
    set -e
    eval "$("${CUDA_TOOLCHAIN_SH:-$root/../shared/cuda-toolchain.sh}")"
    build() {  # cargo args... → path of the executable it builds
      nice -n "${NICE:-10}" cargo "$@" -p superinfer-engine --features cuda \
        --target-dir target-cuda -j "${JOBS:-2}" --no-run --message-format=json \
        | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
    }
    tests=$(build test --release --test gpu_model_path)
    engine_tests=$(build test --release --test gpu_engine_path)
    bench=$(build bench --bench gpu_model)
    mkdir -p "$stage"
    cp "$tests" "$stage/gpu_model_path"
    cp "$engine_tests" "$stage/gpu_engine_path"
    cp "$bench" "$stage/gpu_model_bench"
    strip "$stage/gpu_model_path" "$stage/gpu_engine_path" "$stage/gpu_model_bench"
    (cd "$stage" && rm -f bins.tar.xz \
      && tar cJf bins.tar.xz gpu_model_path gpu_engine_path gpu_model_bench \
      && rm gpu_model_path gpu_engine_path gpu_model_bench)
    ls -l "$stage" ;;
  run)
    shift
    out=${OUT:-$root/out}
    mkdir -p "$out"
    export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export SUPERINFER_KERNEL_CACHE=${SUPERINFER_KERNEL_CACHE:-/tmp/superinfer-kernels}
    bins=/tmp/superinfer-model-bins
    mkdir -p "$bins" && tar xJf "$stage/bins.tar.xz" -C "$bins" || exit 1
    {
      echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
      echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
    } | tee "$out/env.txt"
    ref=/tmp/superinfer-hf-ref
    rm -rf "$ref" && mkdir -p "$ref"
    PYTHONUNBUFFERED=1 python3 scripts/gpu/hf_logits.py "$ref" 2>&1 | tail -5 | tee "$out/hf.log"
    SUPERINFER_HF_REF=$ref RUST_BACKTRACE=1 "$bins/gpu_model_path" ${CHECKS:-} --ignored \
      --nocapture --test-threads 1 2>&1 | tee "$out/checks.log"
    checks=${PIPESTATUS[0]}
    RUST_BACKTRACE=1 "$bins/gpu_engine_path" ${CHECKS:-} --ignored --nocapture \
      --test-threads 1 2>&1 | tee -a "$out/checks.log"
    [ "${PIPESTATUS[0]}" = 0 ] || checks=1
    bench=skipped
    if [ -z "${NO_BENCH:-}" ]; then
      # The compiled-PyTorch reference first, in the same call; its measured HBM read and
      # GEMM rates are the ones our bench's figures are judged against.
      rates=()
      if [ -z "${NO_TORCH:-}" ]; then
        PYTHONUNBUFFERED=1 python3 scripts/gpu/torch_decoder.py 2>&1 | tee "$out/torch.log"
        hbm=$(sed -n 's/^RESULT .*"hbm_read_rate", "tb_per_s": \([0-9.]*\).*/\1/p' "$out/torch.log")
        gemm=$(sed -n 's/^RESULT .*"bf16_gemm_rate", "tflop_per_s": \([0-9.]*\).*/\1/p' "$out/torch.log")
        [ -n "$hbm" ] && rates+=(--hbm-tbs "$hbm")
        [ -n "$gemm" ] && rates+=(--gemm-tflops "$gemm")
      fi
      "$bins/gpu_model_bench" "${rates[@]}" "$@" 2>&1 | tee "$out/bench.log"
      bench=${PIPESTATUS[0]}
    fi
    echo "checks exit $checks, bench exit $bench" | tee -a "$out/checks.log"
    [ "$checks" = 0 ] && { [ "$bench" = 0 ] || [ "$bench" = skipped ]; } ;;
  *) echo "usage: $0 build|run [bench args]" >&2; exit 2 ;;
esac
