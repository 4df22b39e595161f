#!/usr/bin/env bash
# On the device machine: runs the DuplexKV benchmark (PAPER.md Table 1 on this GPU) and the
# hazard checks with the binary staged by scripts/gpu/build.sh, and writes everything under
# $OUT (default ./out): duplex.log (all output), duplex.md (tables), duplex-raw.csv (every
# repetition), env.txt (date, GPU, driver). Extra arguments go to `superinfer-bench duplex`.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SUPERINFER_KERNEL_CACHE=${SUPERINFER_KERNEL_CACHE:-/tmp/superinfer-kernels}
bin=$root/.gpu-bin/superinfer-bench
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem \
    --format=csv,noheader 2>&1 || true
  echo "command: scripts/gpu/duplex.sh $*  (superinfer-bench duplex --out \$OUT $*)"
} | tee "$out/env.txt"
"$bin" duplex --out "$out" "$@" 2>&1 | tee "$out/duplex.log"
rc=${PIPESTATUS[0]}
echo "exit status: $rc" | tee -a "$out/duplex.log"
exit "$rc"
