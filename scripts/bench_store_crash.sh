#!/usr/bin/env bash
# The tenant store's crash test at many kills: a child does admin writes in a loop,
# is killed with SIGKILL at a random moment, and the store is reopened and checked (every
# acknowledged write there, nothing else but the one in flight) and rebuilt from its verified
# copy when sled cannot reopen it. Usage: scripts/bench_store_crash.sh [KILLS] (default
# 20000; ~50 ms a kill on 2 cores). Prints the test's summary line (kills, writes, reopens
# rebuilt) and the seed that replays the run (SUPERINFER_CRASH_SEED=…).
set -euo pipefail
cd "$(dirname "$0")/.."
kills="${1:-20000}"
SUPERINFER_CRASH_ROUNDS="$kills" cargo test --release -p superinfer-tenants --test crash \
  -- --exact acknowledged_admin_writes_survive_sigkill --nocapture 2>&1 |
  grep -E "crash test seed|kills in|test result|panicked|round"
