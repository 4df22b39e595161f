#!/usr/bin/env bash
# The memory wall on the GPU: how many concurrent long-context conversations one node serves
# within their SLOs with HBM-only KV against two tiers (HBM + pinned DRAM). Each conversation
# is a tenant with its own CONTEXT-token document, talking turn after turn with think times
# (scripts/memwall_tenants.py); `superinfer serve` at its default knobs but for the DRAM tier
# (and STEP_TBT_SHARE), driven by `superinfer-loadgen http` on the same machine.
#   here:       scripts/gpu/slo.sh build                 # the same binaries, .gpu-bin/slo/
#   on the GPU: scripts/gpu/memwall.sh [VAR=value …]     # with carry [".gpu-bin/slo"]
# Settings (environment or VAR=value arguments), defaults in brackets:
#   TIERS [hbm:0,two:80: name:DRAM_KV_GB pairs; 0 = HBM-only; empty: the server's default]  COUNTS [8,16: conversations]
#   MODEL [random:llama-3.1-8b]  CONTEXT [32000]  THINK_S [5]  STAGGER_S [2]  DURATION [100]
#   DRAIN [30]  STEP_TBT_SHARE [0.8; empty: off]  TTFT_S [5]  TBT_S [0.1]  SEED [42]
#   STEP_TRACE [unset; 1: each server writes NAME.steps.jsonl, one line per engine step]
# Writes under $OUT: env.txt, summary.md, attainment.tsv (tiers, count, TTFT and TBT
# attainment, p99s, prefix-cache hits) and runs.tar.xz (reports and server logs).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=scripts/gpu/lib.sh
. scripts/gpu/lib.sh
for kv in "$@"; do export "${kv?}"; done
TIERS=${TIERS:-hbm:0,two:80}; COUNTS=${COUNTS:-8,16}; MODEL=${MODEL:-random:llama-3.1-8b}
CONTEXT=${CONTEXT:-32000}; THINK_S=${THINK_S:-5}; STAGGER_S=${STAGGER_S:-2}
DURATION=${DURATION:-100}; DRAIN=${DRAIN:-30}; STEP_TBT_SHARE=${STEP_TBT_SHARE-0.8}
TTFT_S=${TTFT_S:-5}; TBT_S=${TBT_S:-0.1}; SEED=${SEED:-42}
out=${OUT:-$root/out}
mkdir -p "$out"
ulimit -n 65536 2>/dev/null || true
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SUPERINFER_KERNEL_CACHE=${SUPERINFER_KERNEL_CACHE:-/tmp/superinfer-kernels}
# BINS: a folder with superinfer and superinfer-loadgen already there (else the staged ones);
# SERVE_ARGS: what runs the model (e.g. "--sim-profile h100-llama-3.1-8b" for a dry run here).
bins=${BINS:-/tmp/superinfer-slo-bins}
if [ -z "${BINS:-}" ]; then
  mkdir -p "$bins" && tar xJf .gpu-bin/slo/bins.tar.xz -C "$bins" || exit 1
fi
SERVE_ARGS=${SERVE_ARGS:---device cuda --model $MODEL}
budget=()
[ -n "$STEP_TBT_SHARE" ] && budget=(--step-tbt-share "$STEP_TBT_SHARE")
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
  echo "settings: MODEL=$MODEL TIERS=$TIERS COUNTS=$COUNTS CONTEXT=$CONTEXT THINK_S=$THINK_S" \
    "STAGGER_S=$STAGGER_S DURATION=$DURATION DRAIN=$DRAIN STEP_TBT_SHARE=$STEP_TBT_SHARE" \
    "TTFT_S=$TTFT_S TBT_S=$TBT_S SEED=$SEED"
} | tee "$out/env.txt"
: > "$out/summary.md"
printf 'tiers\tconversations\tttft_attainment\ttbt_attainment\tp99_ttft_s\tp99_tbt_s\tprefix_hit_rate\n' > "$out/attainment.tsv"
max=0
for n in ${COUNTS//,/ }; do [ "$n" -gt "$max" ] && max=$n; done
runs=()
port=18500
for tier in ${TIERS//,/ }; do
  name=${tier%%:*}; dram=${tier#*:}
  data=/tmp/memwall-data-$name
  rm -rf "$data"
  # Every conversation's tenant, created before the server opens the store.
  for i in $(seq 1 "$max"); do
    key=$("$bins/superinfer" tenants --data-dir "$data" create "conv-$i" --ttft-ms \
      "$(python3 -c "print(round($TTFT_S * 1000))")" --tbt-ms "$(python3 -c "print(round($TBT_S * 1000))")" \
      --max-prompt-tokens 1000000 --requests-per-s 100000 --burst 100000 \
      --tokens-per-min 4000000000 --max-concurrent 100000 | sed -n 's/^api key: //p')
    export "SLO_KEY_$i=$key"
  done
  port=$((port + 1))
  log=$out/$name.server.log
  trace=()
  [ "${STEP_TRACE:-}" = 1 ] && trace=(--step-trace "$out/$name.steps.jsonl") && runs+=("$name.steps.jsonl")
  # shellcheck disable=SC2086 # SERVE_ARGS is a list of words
  "$bins/superinfer" serve $SERVE_ARGS ${dram:+--dram-kv-gb "$dram"} "${budget[@]}" "${trace[@]}" \
    --data-dir "$data" --listen "127.0.0.1:$port" > "$log" 2>&1 &
  server=$!
  server_up "$log" $server || { echo "(tiers $name)"; continue; }
  echo "== $name: $(grep -m1 "KV tiers" "$log" | sed 's/.*INFO //')"
  runs+=("$name.server.log")
  for n in ${COUNTS//,/ }; do
    run=$name-n$n
    # Documents of their own per run: a later run finds none of an earlier one's cached.
    python3 scripts/memwall_tenants.py "$out/$run.workload" "$n" --context "$CONTEXT" \
      --think-s "$THINK_S" --stagger-s "$STAGGER_S" --ttft-s "$TTFT_S" --tbt-s "$TBT_S" \
      --key-prefix "$run"
    "$bins/superinfer-loadgen" http --target "http://127.0.0.1:$port" \
      --tenants "$out/$run.workload/tenants.toml" --duration "$DURATION" --seed "$SEED" \
      --drain-s "$DRAIN" --policy wlvf --no-progress --out "$out/$run" 2>&1 | tail -4
    { echo "## $run (DRAM KV $dram GB)"; cat "$out/$run/summary.md" 2>/dev/null; echo; } >> "$out/summary.md"
    python3 - "$out/$run/summary.json" "$name" "$n" >> "$out/attainment.tsv" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    hit = (r.get("cache") or {}).get("hit_rate", float("nan"))
    print(sys.argv[2], sys.argv[3], *(f"{r[k]:.6f}" for k in ("ttft_attainment", "tbt_attainment",
          "p99_ttft_s", "p99_tbt_s")), f"{hit:.4f}", sep="\t")
PY
    runs+=("$run" "$run.workload")
  done
  kill -TERM $server; wait $server 2>/dev/null
done
(cd "$out" && for f in "${runs[@]}"; do [ -e "$f" ] && echo "$f"; done > runs.list \
  && tar cJf runs.tar.xz -T runs.list && xargs rm -rf < runs.list; rm -f runs.list)
cat "$out/attainment.tsv"
