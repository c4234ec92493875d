#!/usr/bin/env bash
# Many concurrent slow streams through 2 shards: is memory bounded and flat?
#
#   perf/slow_streams.sh [N] [SECONDS]            N streams (default 10000), sampled SECONDS (60)
#   MODE=net perf/slow_streams.sh 9000            upstream over loopback (tidegate-mock)
#   TIDEGATE_BIN=/some/dir perf/slow_streams.sh … use those binaries, build nothing (or BIN_DIR=)
#
# Every stream asks for model `drip-1000`: one word a second for ~150 s.
# MODE=inproc (default): the upstream is the in-process `mock` provider, so Tidegate holds
# one socket per stream, and its RSS includes the mock's state per stream. MODE=net: the
# upstream is `tidegate-mock` on loopback (which plays the drip too: one chunk a second),
# so Tidegate's RSS is the gateway's alone, with two sockets per stream (client and
# upstream).
# Open files: the script raises the hard limit to 65536 where it may (CAP_SYS_RESOURCE)
# and the soft limit to the hard one. Where the hard limit stays lower (this container:
# 20000 per process, and root here lacks CAP_SYS_RESOURCE), MODE=net runs as many
# streams as two sockets each allow, and says so on stderr.
# Tidegate runs with workers = 2, unpinned (the machine is shared). Prints one JSON line
# (perf/slow_streams.py) and keeps it in perf/out/slow_streams-<mode>-<N>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
SECONDS_=${2:-60}
MODE=${MODE:-inproc}
OUT=perf/out
mkdir -p "$OUT"
ulimit -Hn 65536 2>/dev/null || true
ulimit -n "$(ulimit -Hn)"
FDS=$(ulimit -n)
PER_STREAM=1
[ "$MODE" = net ] && PER_STREAM=2
# Room for the gateway's own descriptors (listeners, rings, eventfds, logs).
MAX_N=$(( (FDS - 64) / PER_STREAM ))
if [ "$N" -gt "$MAX_N" ]; then
  echo "slow_streams: the open-files limit is $FDS: $N streams need $PER_STREAM socket(s) each in MODE=$MODE; running $MAX_N" >&2
  N=$MAX_N
fi
. perf/binaries.sh

CFG="$OUT/slow_streams.toml"
if [ "$MODE" = net ]; then
  MOCK_PORT=$((20000 + RANDOM % 20000))
  "$BIN/tidegate-mock" --listen 127.0.0.1:$MOCK_PORT --workers 1 > "$OUT/slow_streams-mock.log" 2>&1 &
  pids+=($!)
  UPSTREAM="format = \"openai\"
base_url = \"http://127.0.0.1:$MOCK_PORT/v1\""
else
  UPSTREAM='format = "mock"'
fi
cat > "$CFG" <<TOML
[server]
listen = "127.0.0.1:0"
workers = 2
pin_threads = false

[[client_keys]]
id = "perf"
key = "perf-key"

[[providers]]
id = "perf"
$UPSTREAM
models = ["drip-1000"]

[[connections]]
id = "perf-1"
provider = "perf"
TOML

LOG="$OUT/slow_streams-tidegate.log"
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$CFG" > "$LOG" 2>&1 &
TG=$!
pids+=($TG)
ADDR=$(listening_addr "$LOG")
python3 perf/slow_streams.py "$ADDR" "$TG" "$N" "$SECONDS_" "perf/drip-1000" | tee "$OUT/slow_streams-$MODE-$N.json"
