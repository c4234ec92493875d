#!/usr/bin/env bash
# CPU per proxied request: Tidegate (release build, workers = 1, not pinned) in front of
# tidegate-mock, an open-loop load from oha at a fixed rate (non-stream chat completions,
# perf/post.lua's body), and `perf stat -e task-clock` attached to the Tidegate process for
# exactly the load's duration. Prints µs of CPU (user + kernel, all of Tidegate's threads)
# per answered request, and the same figure from /proc/PID/stat ticks as a cross-check.
# A fixed rate (not a saturating load) keeps the figure comparable between runs on a
# shared machine: the work per request is what is counted, not how much CPU was free.
#
#   perf/cpu_per_request.sh [RATE] [DURATION_S] [ROUNDS]   (default 4000 10 3)
#   TIDEGATE_BIN=/path/to/dir perf/cpu_per_request.sh      (prebuilt tidegate + tidegate-mock)
#
# Run it inside `flock /tmp/tidegate-perf.lock` on this shared box. Traffic stays on
# 127.0.0.1; every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-4000}
DUR=${2:-10}
ROUNDS=${3:-3}
CONNS=${CONNS:-64}
OUT=perf/out; mkdir -p "$OUT"
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
. perf/common.sh

write_config "$OUT/cpu.toml" 1 false
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$OUT/cpu.toml" > "$OUT/cpu-tidegate.log" 2>&1 &
TG_PID=$!; pids+=($TG_PID)
TG_ADDR=$(listening_addr "$OUT/cpu-tidegate.log")
URL="http://$TG_ADDR/v1/chat/completions"
body='{"model":"perf/gpt-4o-mini","stream":false,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
load() { # load RATE SECONDS OUTFILE
  "$OHA" -z "${2}s" -c "$CONNS" -q "$1" --no-tui -m POST -H "Authorization: Bearer perf-key" \
    -T application/json -d "$body" "$URL" > "$3"
}
HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$TG_PID/stat"; }

load "$RATE" 2 /dev/null # warm-up: pool, caches
results=()
for r in $(seq "$ROUNDS"); do
  stat_out="$OUT/cpu-perfstat-$r.txt"
  perf stat -e task-clock -x, -o "$stat_out" -p "$TG_PID" &
  perf_pid=$!
  t0=$(ticks)
  load "$RATE" "$DUR" "$OUT/cpu-oha-$r.txt"
  t1=$(ticks)
  kill -INT "$perf_pid"; wait "$perf_pid" || true
  grep -Eq "Success rate:[[:space:]]+100.00%" "$OUT/cpu-oha-$r.txt" || { cat "$OUT/cpu-oha-$r.txt"; exit 1; }
  n=$(awk '/^[[:space:]]*\[200\]/ {print $2}' "$OUT/cpu-oha-$r.txt")
  task_ms=$(awk -F, '$3 ~ /task-clock/ {print $1}' "$stat_out")
  us=$(awk -v ms="$task_ms" -v n="$n" 'BEGIN{printf "%.2f", ms * 1000 / n}')
  us_ticks=$(awk -v t=$((t1 - t0)) -v hz="$HZ" -v n="$n" 'BEGIN{printf "%.2f", t / hz * 1e6 / n}')
  echo "round $r: $n requests at $RATE rps, task-clock ${task_ms} ms -> ${us} µs CPU/request (ticks: ${us_ticks} µs)"
  results+=("$us")
done
med=$(printf '%s\n' "${results[@]}" | sort -g | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2 }')
echo "median: $med µs CPU per request (rate $RATE, $CONNS connections, ${DUR}s x $ROUNDS, $(uptime | sed 's/.*load/load/'))"
