#!/usr/bin/env bash
# The SLO experiment on the GPU: `superinfer serve` (random-weight Llama-3-8B-shaped model,
# bf16, a small HBM KV tier so memory pressure is real, a pinned DRAM tier) driven by
# `superinfer-loadgen http` on the same machine, once per policy and offered load.
#   here:       scripts/gpu/slo.sh build            # stages .gpu-bin/slo/ (xz-compressed)
#   on the GPU: scripts/gpu/slo.sh run [VAR=value …] # with carry [".gpu-bin/slo"]
# Settings (environment or VAR=value arguments), defaults in brackets:
#   POLICIES [fcfs,lvf,wlvf]  RPS [22]  DURATION [120]  HBM_KV_GB [4; "default": the server's
#   own rule, what the GPU has, and the twin's --gpu-memory-utilization 0.9]  DRAM_KV_GB [48]
#   MAX_BATCHED_TOKENS [2048; "default": the server's, 16384]  B_XFER [auto: the server's automatic budget; a number fixes it]  TENANTS [3: weights 1,2,4, equal Poisson shares of RPS]
#   CACHE [on: the prefix cache; a list of on, off (--no-prefix-cache), hbm (HBM-only)]
#   MAX_CONNS [60000: the server's --max-connections and --max-connections-per-ip]
#   MODEL [random:llama-3-8b; random:qwen2.5-32b is the paper's shape]
#   (the server takes SUPERINFER_DECODE_KERNEL and SUPERINFER_CUDA_SOURCES from the
#   environment: docs/OPERATIONS.md)
#   DATASET [sharegpt]  SEED [42]  DRAIN [60]  MAX_ROTATIONS [unset: the server's 1; weighted
#   LVF's cap on consecutive rotations of one request]  PROGRESS_TOKENS [unset: the server's
#   32; tokens of one running period that reset the count]  STEP_TBT_SHARE [unset: off; e.g.
#   0.8, the step time budget for long contexts, server and twin alike]  WORKLOAD [unset: a loadgen
#   tenants file, e.g. loadgen/workloads/noisy-neighbour.toml; with RPS=file its own rates;
#   a replay workload, e.g. loadgen/workloads/replay/mooncake-1-2-4.toml, with RPS=file and
#   RATE_SCALE (default 1), and optionally TRACE_START_S, TRACE_DURATION_S (a window of the
#   trace, in its own seconds) and MAX_PROMPT_TOKENS (rows above are reported, not sent)]
#   STEP_TRACE [unset; 1: the server writes one line per engine step to POLICY-rpsR.steps.jsonl
#   (--step-trace), for fitting the cost model]
#   TWIN [unset; 1: first the twin's prediction of the same runs (superinfer-loadgen sim, the
#   profile of the GPU found, h100- or h200-, with MODEL's shape), written to twin/]
# Writes under $OUT (at most 8 files come back from a device call): env.txt, summary.md (all
# runs' summary tables), attainment.tsv (each run's attainments unrounded, from its
# summary.json) and runs.tar.xz (per run POLICY-rpsR: the load generator's report folder,
# summary.json/md and requests.jsonl, the server's log and the tenants file).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=scripts/gpu/lib.sh
. scripts/gpu/lib.sh
stage=.gpu-bin/slo
case "${1:-}" in
  build)
    set -e
    eval "$("${CUDA_TOOLCHAIN_SH:-$root/../shared/cuda-toolchain.sh}")"
    nice -n "${NICE:-10}" cargo build --release -p superinfer-gateway -p superinfer-loadgen \
      --features superinfer-gateway/cuda --target-dir target-cuda -j "${JOBS:-2}"
    mkdir -p "$stage"
    cp target-cuda/release/superinfer target-cuda/release/superinfer-loadgen "$stage/"
    strip "$stage/superinfer" "$stage/superinfer-loadgen"
    (cd "$stage" && rm -f bins.tar.xz && tar cJf bins.tar.xz superinfer superinfer-loadgen \
      && rm superinfer superinfer-loadgen)
    ls -l "$stage" ;;
  run)
    shift
    for kv in "$@"; do export "${kv?}"; done
    POLICIES=${POLICIES:-fcfs,lvf,wlvf}; RPS=${RPS:-22}; DURATION=${DURATION:-120}
    B_XFER=${B_XFER:-auto}
    caps=()
    if [ "$B_XFER" != auto ]; then caps+=(--b-xfer "$B_XFER"); fi
    if [ -n "${MAX_ROTATIONS:-}" ]; then caps+=(--max-rotations "$MAX_ROTATIONS"); fi
    if [ -n "${PROGRESS_TOKENS:-}" ]; then caps+=(--progress-tokens "$PROGRESS_TOKENS"); fi
    if [ -n "${STEP_TBT_SHARE:-}" ]; then caps+=(--step-tbt-share "$STEP_TBT_SHARE"); fi
    HBM_KV_GB=${HBM_KV_GB:-4}; DRAM_KV_GB=${DRAM_KV_GB:-48}; MBT=${MAX_BATCHED_TOKENS:-2048}
    # The HBM tier and the token budget: given, or (with "default") the server's own.
    sizes=()
    [ "$HBM_KV_GB" != default ] && sizes+=(--hbm-kv-gb "$HBM_KV_GB")
    [ "$MBT" != default ] && sizes+=(--max-batched-tokens "$MBT")
    DATASET=${DATASET:-sharegpt}; SEED=${SEED:-42}; DRAIN=${DRAIN:-60}
    MODEL=${MODEL:-random:llama-3-8b}
    # Every tenant's requests come from this one load generator, i.e. one address: the
    # server's per-address connection cap (256 by default, docs/OPERATIONS.md) would refuse
    # requests of every tenant alike once a queue builds up (each request is a connection),
    # which is admission control, not scheduling. Both caps go out of the way.
    MAX_CONNS=${MAX_CONNS:-60000}
    ulimit -n 131072 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    out=${OUT:-$root/out}
    mkdir -p "$out"
    export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export SUPERINFER_KERNEL_CACHE=${SUPERINFER_KERNEL_CACHE:-/tmp/superinfer-kernels}
    bins=/tmp/superinfer-slo-bins
    mkdir -p "$bins" && tar xJf "$stage/bins.tar.xz" -C "$bins" || exit 1
    {
      echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
      echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
      echo "kernels: SUPERINFER_DECODE_KERNEL=${SUPERINFER_DECODE_KERNEL:-default} SUPERINFER_CUDA_SOURCES=${SUPERINFER_CUDA_SOURCES:-embedded}"
      echo "settings: MODEL=$MODEL POLICIES=$POLICIES RPS=$RPS CACHE=${CACHE:-on} DURATION=$DURATION HBM_KV_GB=$HBM_KV_GB" \
        "DRAM_KV_GB=$DRAM_KV_GB MAX_BATCHED_TOKENS=$MBT MAX_CONNS=$MAX_CONNS fds=$(ulimit -n) B_XFER=$B_XFER MAX_ROTATIONS=${MAX_ROTATIONS:-} PROGRESS_TOKENS=${PROGRESS_TOKENS:-} DATASET=$DATASET SEED=$SEED"
    } | tee "$out/env.txt"
    : > "$out/summary.md"
    printf 'run\tttft_attainment\ttbt_attainment\ttokens_per_s\tp99_ttft_s\tp99_tbt_s\n' > "$out/attainment.tsv"
    runs=()
    port=18000
    CACHE=${CACHE:-on}
    for rps in ${RPS//,/ }; do
      for cache in ${CACHE//,/ }; do
      for policy in ${POLICIES//,/ }; do
        run=$policy-rps$rps
        cache_args=()
        case "$cache" in
          on) ;;
          off) cache_args=(--no-prefix-cache); run=$run-nocache ;;
          hbm) cache_args=(--prefix-cache-hbm-only); run=$run-hbmcache ;;
          *) echo "CACHE: on, off or hbm, got $cache" >&2; exit 2 ;;
        esac
        data=/tmp/slo-data-$run
        rm -rf "$data"
        # Three tenants (weights 1, 2, 4) sharing the offered load equally, or the tenants of
        # WORKLOAD (a loadgen tenants file; RPS "file" keeps its rates); quotas out of the
        # way (the experiment is about scheduling, not admission control).
        tenants=$out/$run.tenants.toml
        : > "$tenants"
        if [ -n "${WORKLOAD:-}" ]; then
          specs=$(python3 -c 'import sys, tomllib
for t in tomllib.load(open(sys.argv[1], "rb"))["tenant"]:
    print(t["name"], t.get("weight", 1.0), round(t.get("ttft_slo_s", 5.0) * 1000),
          round(t.get("tbt_slo_s", 0.1) * 1000))' "$WORKLOAD")
        else
          specs=$(printf 'w1 1.0 5000 100\nw2 2.0 5000 100\nw4 4.0 5000 100\n')
        fi
        i=0
        # The server's tenants get the workload's SLOs, which the scheduler and the report use.
        while read -r name weight ttft_ms tbt_ms; do
          i=$((i + 1))
          key=$("$bins/superinfer" tenants --data-dir "$data" create "$name" --weight "$weight" \
            --ttft-ms "$ttft_ms" --tbt-ms "$tbt_ms" --max-prompt-tokens 1000000 \
            --requests-per-s 100000 --burst 100000 --tokens-per-min 4000000000 \
            --max-concurrent 100000 | sed -n 's/^api key: //p')
          export "SLO_KEY_$i=$key"
          if [ -z "${WORKLOAD:-}" ]; then
            rate=$(python3 -c "print($rps / 3)")
            printf '[[tenant]]\nname = "%s"\nweight = %s\nttft_slo_s = 5.0\ntbt_slo_s = 0.1\ndataset = "%s"\narrivals = { kind = "poisson", rps = %s }\napi_key_env = "SLO_KEY_%s"\n\n' \
              "$name" "$weight" "$DATASET" "$rate" "$i" >> "$tenants"
          fi
        done <<< "$specs"
        if [ -n "${WORKLOAD:-}" ]; then
          python3 - "$WORKLOAD" >> "$tenants" <<'PY'
import os, re, sys
i = 0
here = os.path.dirname(os.path.abspath(sys.argv[1]))
for line in open(sys.argv[1]):
    # Relative trace paths are relative to the workload's folder, not the copy's.
    line = re.sub(r'path = "([^"/][^"]*)"', lambda m: 'path = "%s"' % os.path.join(here, m.group(1)), line)
    if line.strip() == "[[tenant]]":
        if i:
            print(f'api_key_env = "SLO_KEY_{i}"')
        i += 1
    print(line, end="")
print(f'api_key_env = "SLO_KEY_{i}"')
PY
        fi
        rps_args=(--rps "$rps")
        [ "$rps" = file ] && rps_args=()
        # A replay workload ([replay] in WORKLOAD, RPS=file): its rows set the rate, scaled by
        # RATE_SCALE.
        # The length of a run: DURATION, or for a replay the trace (window) itself.
        len_args=(--duration "$DURATION")
        [ "$rps" = file ] && grep -q '^\[replay\]' "${WORKLOAD:-/dev/null}" && len_args=()
        [ -n "${RATE_SCALE:-}" ] && rps_args=(--rate-scale "$RATE_SCALE")
        [ -n "${TRACE_START_S:-}" ] && rps_args+=(--trace-start-s "$TRACE_START_S")
        [ -n "${TRACE_DURATION_S:-}" ] && rps_args+=(--trace-duration-s "$TRACE_DURATION_S")
        [ -n "${MAX_PROMPT_TOKENS:-}" ] && rps_args+=(--max-prompt-tokens "$MAX_PROMPT_TOKENS")
        if [ "${TWIN:-}" = 1 ]; then
          gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
          case "$gpu" in *H100*) hw=h100 ;; *) hw=h200 ;; esac
          shape=${MODEL#random:}
          echo "== twin: $hw-$shape $policy"
          "$bins/superinfer-loadgen" sim --profile "$hw-$shape" --tenants "$tenants" \
            "${rps_args[@]}" "${len_args[@]}" --seed "$SEED" --drain-s "$DRAIN" \
            --policies "$policy" "${sizes[@]}" --dram-gb "$DRAM_KV_GB" \
            "${caps[@]}" --no-progress --out "$out/twin-$run" 2>&1 | tail -12
          { echo "## twin $hw-$shape $run"; cat "$out/twin-$run/summary.md" 2>/dev/null; echo; } >> "$out/summary.md"
          runs+=("twin-$run")
        fi
        port=$((port + 1))
        trace_args=()
        [ "${STEP_TRACE:-}" = 1 ] && trace_args=(--step-trace "$out/$run.steps.jsonl")
        "$bins/superinfer" serve --device cuda --model "$MODEL" --policy "$policy" \
          "${sizes[@]}" --dram-kv-gb "$DRAM_KV_GB" \
          "${caps[@]}" "${cache_args[@]}" "${trace_args[@]}" --max-queue 100000 --data-dir "$data" --listen "127.0.0.1:$port" \
          --max-connections "$MAX_CONNS" --max-connections-per-ip "$MAX_CONNS" \
          > "$out/$run.server.log" 2>&1 &
        server=$!
        server_up "$out/$run.server.log" $server || { echo "(run $run)"; continue; }
        echo "== $run: server up ($(grep -m1 'KV tiers' "$out/$run.server.log" | sed 's/.*INFO //'))"
        grep -m1 'rotation budget' "$out/$run.server.log" | sed 's/.*INFO /   /'
        "$bins/superinfer-loadgen" http --target "http://127.0.0.1:$port" --tenants "$tenants" \
          "${rps_args[@]}" "${len_args[@]}" --seed "$SEED" --drain-s "$DRAIN" --policy "$policy" \
          --no-progress --out "$out/$run" 2>&1 | tail -30
        # The step budget's learned scale and the step histograms, as the run left them.
        curl -s "http://127.0.0.1:$port/metrics" > "$out/$run.metrics.txt" 2>/dev/null || true
        kill -TERM $server; wait $server 2>/dev/null
        { echo "## $run"; cat "$out/$run/summary.md" 2>/dev/null; echo; } >> "$out/summary.md"
        python3 - "$out/$run/summary.json" "$run" >> "$out/attainment.tsv" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(sys.argv[2], *(f"{r[k]:.6f}" for k in ("ttft_attainment", "tbt_attainment",
          "throughput_tokens_per_s", "p99_ttft_s", "p99_tbt_s")), sep="\t")
PY
        runs+=("$run" "$run.server.log" "$run.tenants.toml" "$run.metrics.txt" "$run.steps.jsonl")
      done
      done
    done
    (cd "$out" && for f in "${runs[@]}"; do [ -e "$f" ] && echo "$f"; done > runs.list \
      && tar cJf runs.tar.xz -T runs.list && xargs rm -rf < runs.list; rm -f runs.list)
    cat "$out/summary.md" "$out/attainment.tsv" ;;
  *) echo "usage: $0 build|run [VAR=value ...]" >&2; exit 2 ;;
esac
