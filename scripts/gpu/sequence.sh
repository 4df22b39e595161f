#!/usr/bin/env bash
# Several experiments in one device call (a machine start costs minutes of device time), each
# with its own time limit and output folder, so one that overruns or fails leaves the others'.
#   on the GPU: scripts/gpu/sequence.sh 'NAME:SECONDS:COMMAND' …   # carry what the commands need
# Each COMMAND runs with OUT=<folder of its own> under `timeout SECONDS`, its console in
# console.log there. A call brings back at most 8 files, so $OUT gets NAME.tar.xz per step
# (its folder, written as soon as the step ends, so a call cut short keeps the steps before)
# and status.txt (each step's exit status and seconds).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/out}
work=$(mktemp -d)
mkdir -p "$out"
for step in "$@"; do
  name=${step%%:*} rest=${step#*:}
  secs=${rest%%:*} cmd=${rest#*:}
  case "$name" in ''|*[!A-Za-z0-9_-]*) echo "bad step name: $name" >&2; exit 2 ;; esac
  case "$secs" in ''|*[!0-9]*) echo "bad seconds for $name: $secs" >&2; exit 2 ;; esac
  mkdir -p "$work/$name"
  t0=$(date +%s)
  echo "== $name ($secs s): $cmd"
  OUT=$work/$name timeout "$secs" bash -c "$cmd" > "$work/$name/console.log" 2>&1
  rc=$?
  echo "$name rc=$rc seconds=$(( $(date +%s) - t0 ))" | tee -a "$out/status.txt"
  tail -n 40 "$work/$name/console.log"
  tar cJf "$out/$name.tar.xz" -C "$work" "$name"
done
