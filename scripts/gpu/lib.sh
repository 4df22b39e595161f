# Shell helpers of the GPU experiment scripts (sourced, not run).

# server_up LOG PID: waits up to 300 s for the server writing LOG (process PID) to listen;
# succeeds once it does. If it exits or never listens: prints the log's tail, stops it, fails.
server_up() {
  local log=$1 pid=$2
  for _ in $(seq 1 300); do
    grep -q "listening on" "$log" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  grep -q "listening on" "$log" && return 0
  echo "the server did not start:"; tail -20 "$log"
  kill "$pid" 2>/dev/null
  return 1
}
