# Shared by perf/run.sh and perf/instructions.sh (sourced, not run): installs wrk and oha
# when missing, builds the release binaries, starts tidegate-mock on a random loopback
# port, and writes a one-connection Tidegate config in front of it. Every process started
# is recorded in `pids` and ended by PID on exit.

command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
OHA=$(command -v oha || echo /opt/oha/bin/oha)
[ -x "$OHA" ] || { cargo install oha --locked --root /opt/oha -q; OHA=/opt/oha/bin/oha; }
. perf/binaries.sh   # $BIN (TIDEGATE_BIN=DIR: prebuilt), pids, cleanup

MOCK_PORT=$((20000 + RANDOM % 20000))
"$BIN/tidegate-mock" --listen 127.0.0.1:$MOCK_PORT --workers 1 > "$OUT/mock.log" 2>&1 &
pids+=($!)

# write_config FILE WORKERS PIN: Tidegate on 127.0.0.1:0 with key `perf-key` and one
# connection to the mock (model `perf/gpt-4o-mini`).
write_config() {
  cat > "$1" <<TOML
[server]
listen = "127.0.0.1:0"
workers = $2
pin_threads = $3

[[client_keys]]
id = "perf"
key = "perf-key"

[[providers]]
id = "perf"
format = "openai"
base_url = "http://127.0.0.1:$MOCK_PORT/v1"
models = ["gpt-4o-mini"]

[[connections]]
id = "perf-1"
provider = "perf"
TOML
}
