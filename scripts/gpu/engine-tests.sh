#!/usr/bin/env bash
# The engine's `cuda` transfer backend tests (ignored without a GPU).
#   here:       scripts/gpu/engine-tests.sh build   # stages .gpu-bin/engine-tests/
#   on the GPU: scripts/gpu/engine-tests.sh run     # with carry [".gpu-bin/engine-tests"]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
case "${1:-}" in
  build)
    eval "$("${CUDA_TOOLCHAIN_SH:-$root/../shared/cuda-toolchain.sh}")"
    exe=$(nice -n "${NICE:-15}" cargo test --release -p superinfer-engine --features cuda \
      --target-dir target-cuda -j "${JOBS:-1}" --lib --no-run --message-format=json \
      | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    mkdir -p .gpu-bin/engine-tests
    cp "$exe" .gpu-bin/engine-tests/superinfer-engine-tests
    strip .gpu-bin/engine-tests/superinfer-engine-tests
    # xz: the stripped binary is ~60 MB and the tree that travels is limited to 64 MiB.
    xz -T2 -6 -f .gpu-bin/engine-tests/superinfer-engine-tests
    ls -l .gpu-bin/engine-tests/ ;;
  run)
    export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    out=${OUT:-$root/out}
    mkdir -p "$out"
    exe=/tmp/superinfer-engine-tests
    xz -dc .gpu-bin/engine-tests/superinfer-engine-tests.xz > "$exe" && chmod +x "$exe" || exit 1
    "$exe" transfer::cuda --ignored --test-threads 1 2>&1 | tee "$out/engine-tests.log"
    exit "${PIPESTATUS[0]}" ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
