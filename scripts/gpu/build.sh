#!/usr/bin/env bash
# Builds the CUDA benchmark binary here (no GPU needed) and stages it, stripped, in .gpu-bin/
# (git-ignored through .git/info/exclude) to be carried to the device machine:
#   scripts/gpu/build.sh            # then: run(command="scripts/gpu/duplex.sh", carry=[".gpu-bin"])
# The compiler comes from ../shared/cuda-toolchain.sh (CUDA 13.0 from PyPI wheels); the first
# build of candle's kernels takes ~17 min on 2 cores, later builds are incremental.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
toolchain=${CUDA_TOOLCHAIN_SH:-$root/../shared/cuda-toolchain.sh}
eval "$("$toolchain")"
jobs=${JOBS:-1}
nice -n "${NICE:-15}" cargo build --release -p superinfer-kernels --features cuda \
  --target-dir target-cuda -j "$jobs" --bin superinfer-bench
mkdir -p .gpu-bin
cp target-cuda/release/superinfer-bench .gpu-bin/
strip .gpu-bin/superinfer-bench
ls -l .gpu-bin/superinfer-bench
