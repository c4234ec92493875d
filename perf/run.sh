#!/usr/bin/env bash
# Load test: the same wrk load against tidegate-mock directly and through Tidegate, in one
# run, non-stream and stream, 64 and 256 connections. Writes perf/out/load.md (figures and
# the exact commands). Traffic stays on 127.0.0.1; every process started here is ended by PID.
#
#   perf/run.sh [DURATION_S]        (default 10 s per measurement)
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
OUT=perf/out; mkdir -p "$OUT"
RATE=${RATE:-4000}
. perf/common.sh
write_config "$OUT/perf.toml" "${TIDEGATE_WORKERS:-1}" "${TIDEGATE_PIN:-true}"
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$OUT/perf.toml" > "$OUT/tidegate.log" 2>&1 &
TG_PID=$!; pids+=($TG_PID)
for _ in $(seq 100); do grep -q "listening on" "$OUT/tidegate.log" && break; sleep 0.1; done
TG_ADDR=$(sed -n 's/^tidegate listening on \([^ ]*\) .*/\1/p' "$OUT/tidegate.log")
[ -n "$TG_ADDR" ] || { cat "$OUT/tidegate.log"; exit 1; }

cpu_ticks() { awk '{print $14 + $15}' /proc/$TG_PID/stat; }
# wrk_run NAME URL CONNS STREAM -> prints "rps p50_ms p99_ms"
wrk_run() {
  local name=$1 url=$2 conns=$3 stream=$4
  STREAM=$stream wrk -t2 -c"$conns" -d"${DUR}s" --latency -s perf/post.lua "$url" > "$OUT/$name.txt" 2>&1
  local rps p50 p99
  rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$name.txt")
  p50=$(awk '$1=="50%" {print $2}' "$OUT/$name.txt")
  p99=$(awk '$1=="99%" {print $2}' "$OUT/$name.txt")
  echo "$rps $(to_ms "$p50") $(to_ms "$p99")"
}
to_ms() { awk -v v="$1" 'BEGIN{ if (v ~ /us$/) {sub(/us/,"",v); print v/1000} else if (v ~ /ms$/) {sub(/ms/,"",v); print v+0} else if (v ~ /s$/) {sub(/s/,"",v); print v*1000} else print v }'; }

# Warm up both paths.
STREAM=0 wrk -t1 -c8 -d2s -s perf/post.lua "http://127.0.0.1:$MOCK_PORT/v1/chat/completions" > /dev/null
STREAM=0 wrk -t1 -c8 -d2s -s perf/post.lua "http://$TG_ADDR/v1/chat/completions" > /dev/null

HZ=$(getconf CLK_TCK)
rows=()
for stream in 0 1; do
  for conns in 64 256; do
    mode=$([ $stream = 1 ] && echo stream || echo non-stream)
    read -r d_rps d_p50 d_p99 < <(wrk_run "direct-$mode-$conns" "http://127.0.0.1:$MOCK_PORT/v1/chat/completions" "$conns" "$stream")
    t0=$(cpu_ticks)
    read -r g_rps g_p50 g_p99 < <(wrk_run "tidegate-$mode-$conns" "http://$TG_ADDR/v1/chat/completions" "$conns" "$stream")
    t1=$(cpu_ticks)
    cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$HZ" -v d="$DUR" 'BEGIN{printf "%.0f", (b-a)/hz/d*100}')
    ratio=$(awk -v a="$g_rps" -v b="$d_rps" 'BEGIN{printf "%.2f", a/b}')
    added=$(awk -v a="$g_p99" -v b="$d_p99" 'BEGIN{printf "%.3f", a-b}')
    rows+=("| $mode | $conns | $d_rps | $d_p50 | $d_p99 | $g_rps | $g_p50 | $g_p99 | **$ratio** | $added | $cpu% |")
  done
done
# Added latency at a fixed offered rate (below both capacities), corrected for coordinated
# omission: the same oha load directly and through Tidegate.
oha_run() {
  local url=$1 stream=$2
  local body='{"model":"perf/gpt-4o-mini","stream":'$([ "$stream" = 1 ] && echo true || echo false)',"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
  "$OHA" -z "${DUR}s" -c 64 -q "$RATE" --latency-correction --no-tui --output-format json \
    -m POST -H "Authorization: Bearer perf-key" -T application/json -d "$body" "$url" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); p=d["latencyPercentiles"]; s=d["summary"]; print("%.0f %.3f %.3f %.3f" % (s["requestsPerSec"], p["p50"]*1000, p["p99"]*1000, s["successRate"]))'
}
lat_rows=()
for stream in 0 1; do
  mode=$([ $stream = 1 ] && echo stream || echo non-stream)
  read -r d_rps d_p50 d_p99 d_ok < <(oha_run "http://127.0.0.1:$MOCK_PORT/v1/chat/completions" $stream)
  read -r g_rps g_p50 g_p99 g_ok < <(oha_run "http://$TG_ADDR/v1/chat/completions" $stream)
  added50=$(awk -v a="$g_p50" -v b="$d_p50" 'BEGIN{printf "%.3f", a-b}')
  added99=$(awk -v a="$g_p99" -v b="$d_p99" 'BEGIN{printf "%.3f", a-b}')
  lat_rows+=("| $mode | 64 | $RATE | $d_rps | $d_p50 | $d_p99 | $g_rps | $g_p50 | $g_p99 | $added50 | **$added99** | $g_ok |")
done
RSS_KB=$(awk '/VmHWM/ {print $2}' /proc/$TG_PID/status)

{
  echo "# Tidegate load test results"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(uname -r)); load generator, mock and Tidegate share the machine."
  echo "Tidegate workers=${TIDEGATE_WORKERS:-1} pin_threads=${TIDEGATE_PIN:-true}, mock workers=1, wrk -t2, ${DUR}s per row. Latencies in ms (wrk --latency)."
  echo
  echo "| mode | conns | direct rps | direct p50 | direct p99 | tidegate rps | tidegate p50 | tidegate p99 | ratio | added p99 | tidegate CPU |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Added latency at a fixed offered rate (oha -c 64 -q $RATE --latency-correction, ${DUR}s; ms):"
  echo
  echo "| mode | conns | offered rps | direct rps | direct p50 | direct p99 | tidegate rps | tidegate p50 | tidegate p99 | added p50 | added p99 | success |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${lat_rows[@]}"
  echo
  echo "Tidegate peak RSS over the whole run (VmHWM): $((RSS_KB / 1024)) MiB ($RSS_KB KiB)."
  echo
  echo "Command: \`perf/run.sh $DUR\` (TIDEGATE_WORKERS=${TIDEGATE_WORKERS:-1} TIDEGATE_PIN=${TIDEGATE_PIN:-true} RATE=$RATE); per row \`STREAM=0|1 wrk -t2 -c<conns> -d${DUR}s --latency -s perf/post.lua <url>/v1/chat/completions\`. Raw wrk output in perf/out/."
} > "$OUT/load.md"
cat "$OUT/load.md"
