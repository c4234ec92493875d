# Sourced by the perf scripts (through perf/binaries.sh, or directly by the A/B scripts that
# take their binaries as arguments): starting the mock and a one-connection Tidegate in front
# of it. Processes started are recorded in the caller's `pids`.

# start_mock DIR LOG: tidegate-mock from DIR (1 worker) on a random loopback port, recorded
# in `pids`, once it says it listens; the port in $STARTED_PORT.
start_mock() {
  STARTED_PORT=$((20000 + RANDOM % 20000))
  "$1/tidegate-mock" --listen 127.0.0.1:$STARTED_PORT --workers 1 > "$2" 2>&1 &
  pids+=($!)
  # listening before the caller's first request (up to 10 s)
  for _ in $(seq 100); do grep -q 'listening on' "$2" 2>/dev/null && break; sleep 0.1; done
}

# gateway_config FILE MOCK_PORT WORKERS PIN: Tidegate on 127.0.0.1:0 with key `perf-key`
# and one connection to the mock on MOCK_PORT (model `perf/gpt-4o-mini`).
gateway_config() {
  cat > "$1" <<TOML
[server]
listen = "127.0.0.1:0"
workers = $3
pin_threads = $4

[[client_keys]]
id = "perf"
key = "perf-key"

[[providers]]
id = "perf"
format = "openai"
base_url = "http://127.0.0.1:$2/v1"
models = ["gpt-4o-mini"]

[[connections]]
id = "perf-1"
provider = "perf"
TOML
}

# listening_addr LOG [TENTHS]: waits (default 10 s) until a gateway logging to LOG has
# written its whole `tidegate listening on ADDR …` line and prints ADDR; on a timeout
# prints the log to stderr and fails. Reads the address, not just the words, so a line
# still being written is not taken for a complete one.
listening_addr() {
  local log=$1 addr=
  for _ in $(seq "${2:-100}"); do
    addr=$(sed -n 's/^tidegate listening on \([^ ]*\) .*/\1/p' "$log" 2>/dev/null)
    [ -n "$addr" ] && { echo "$addr"; return 0; }
    sleep 0.1
  done
  cat "$log" >&2
  return 1
}
