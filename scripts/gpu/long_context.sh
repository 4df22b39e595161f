#!/usr/bin/env bash
# The long-context acceptance runs in one device call: the isolation run (a chat tenant beside
# the Mooncake trace at 2x its sustainable rate, weighted LVF, step budget 0.8) and the memory
# wall (N 32k-token conversations, two tiers and HBM-only), each server writing its step trace.
#   here:       scripts/gpu/slo.sh build                       # .gpu-bin/slo/
#   on the GPU: scripts/gpu/long_context.sh [VAR=value …]      # with carry [".gpu-bin/slo"]
# Settings: POLICIES [wlvf; comma-separated] for the isolation run (empty: no isolation run), WORKLOAD its tenants
# [loadgen/workloads/replay/mooncake-beside-chat.toml; …-backlogged.toml: the chat tenant at 40
# RPS, for the GPU time split against the weights; TRACE_START_S, passed on to slo.sh, replays a
# later window of the trace, e.g. 371.2: one 87k prompt]; TWO and HBM: the
# conversation counts of the memory wall on two tiers (DRAM KV 80 GB) and HBM-only [H100: 8,16
# and 4; H200, whose HBM tier holds about twice the tokens: 16,32 and 16].
# Writes under $OUT: summary.md (every run's summary table), attainment.tsv and one PART.tar.xz
# per part (isolation, wall-two, wall-hbm: reports, server logs, step traces, metrics).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
for kv in "$@"; do export "${kv?}"; done
out=${OUT:-$root/out}
mkdir -p "$out"
POLICIES=${POLICIES-wlvf}
WORKLOAD=${WORKLOAD:-loadgen/workloads/replay/mooncake-beside-chat.toml}
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H100*) TWO=${TWO-8,16}; HBM=${HBM-4} ;;
  *) TWO=${TWO-16,32}; HBM=${HBM-16} ;;
esac
# Each part is packed as soon as it ends (PART.tar.xz), so a call cut short keeps what ran.
pack() {
  local part=$1
  [ -d "$out/$part" ] || return 0
  { echo "# $part"; cat "$out/$part/env.txt" "$out/$part/summary.md" 2>/dev/null; } >> "$out/summary.md"
  { echo "# $part"; cat "$out/$part/attainment.tsv" 2>/dev/null; } >> "$out/attainment.tsv"
  (cd "$out" && tar cJf "$part.tar.xz" "$part" && rm -rf "$part")
}
: > "$out/summary.md"; : > "$out/attainment.tsv"
# About 200 s a policy (120 s of load, 20 s of drain, the server's start; a heavier window of the
# trace, TRACE_START_S, takes longer: 230 s cut one short).
[ -n "$POLICIES" ] && OUT=$out/isolation timeout $((280 * $(echo "$POLICIES" | tr , " " | wc -w))) scripts/gpu/slo.sh run MODEL=random:llama-3.1-8b \
  WORKLOAD="$WORKLOAD" RPS=file RATE_SCALE=0.4 \
  TRACE_DURATION_S=48 POLICIES="$POLICIES" STEP_TBT_SHARE=0.8 HBM_KV_GB=50 DRAM_KV_GB=48 \
  MAX_BATCHED_TOKENS=16384 DRAIN=20 STEP_TRACE=1 2>&1 | tail -25
pack isolation
# About 100 s a cell (60 s of load, 20 s of drain, the server's start; pinning 80 GB of DRAM for
# the two-tier server takes about a minute more: 110 s cut it short).
cells() { echo $(( 170 * $(echo "$1" | tr ',' '\n' | grep -c .) )); }
[ -n "$TWO" ] && OUT=$out/wall-two timeout "$(cells "$TWO")" scripts/gpu/memwall.sh TIERS=two:80 COUNTS="$TWO" \
  DURATION=60 DRAIN=20 STEP_TRACE=1 2>&1 | tail -8
pack wall-two
[ -n "$HBM" ] && OUT=$out/wall-hbm timeout "$(cells "$HBM")" scripts/gpu/memwall.sh TIERS=hbm:0 COUNTS="$HBM" \
  DURATION=60 DRAIN=20 STEP_TRACE=1 2>&1 | tail -8
pack wall-hbm
cat "$out/attainment.tsv"
