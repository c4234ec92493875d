#!/usr/bin/env bash
# Peak memory under 256 connections (issue 14: "peak RSS under 256 connections ≤ 30 MiB").
# tidegate-mock on loopback as the upstream, Tidegate (release build, workers = 2 unless
# TIDEGATE_WORKERS says otherwise, unpinned) in front of it, and wrk with 256 keep-alive
# connections: non-stream for DURATION_S, then stream for DURATION_S. Prints Tidegate's
# RSS when idle, its VmHWM (the kernel's peak RSS) after each phase, and the requests
# served. Every process started here is ended by PID.
#
#   perf/peak_rss.sh [DURATION_S] [CONNS]        (defaults 10 s, 256 connections)
#   TIDEGATE_BIN=/some/dir perf/peak_rss.sh       use those binaries, build nothing (or BIN_DIR=)
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
CONNS=${2:-256}
WORKERS=${TIDEGATE_WORKERS:-2}
OUT=perf/out
mkdir -p "$OUT"
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
ulimit -n "$(ulimit -Hn)"
. perf/binaries.sh

MOCK_PORT=$((20000 + RANDOM % 20000))
"$BIN/tidegate-mock" --listen 127.0.0.1:$MOCK_PORT --workers 1 > "$OUT/peak_rss-mock.log" 2>&1 &
pids+=($!)
CFG="$OUT/peak_rss.toml"
cat > "$CFG" <<TOML
[server]
listen = "127.0.0.1:0"
workers = $WORKERS
pin_threads = false

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
LOG="$OUT/peak_rss-tidegate.log"
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$CFG" > "$LOG" 2>&1 &
TG=$!
pids+=($TG)
ADDR=$(listening_addr "$LOG")
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$MOCK_PORT) 2>/dev/null && break; sleep 0.1; done

kib() { awk -v k="$1" '$1 == k":" {print $2}' /proc/$TG/status; }
idle=$(kib VmRSS)
rows=()
for stream in 0 1; do
  mode=$([ $stream = 1 ] && echo stream || echo non-stream)
  reqs=$(STREAM=$stream wrk -t2 -c"$CONNS" -d"${DUR}s" -s perf/post.lua "http://$ADDR/v1/chat/completions" \
    | awk '/requests in/ {print $1}')
  rows+=("| $mode | $CONNS | $reqs | $(($(kib VmRSS) / 1024)) MiB | **$(($(kib VmHWM) / 1024)) MiB** ($(kib VmHWM) KiB) |")
done
echo "Tidegate workers=$WORKERS, idle RSS $((idle / 1024)) MiB ($idle KiB); wrk -t2 -c$CONNS -d${DUR}s per phase, in this order:"
echo
echo "| phase | connections | requests | RSS after | peak RSS so far (VmHWM) |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
