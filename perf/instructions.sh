#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: a throughput figure that does
# not move with machine load (wall-clock ratios from perf/run.sh do, badly, on a shared
# 2-core VM). Runs Tidegate (workers=1, epoll driver — valgrind and io_uring do not mix)
# under `valgrind --tool=callgrind` twice, with N1 and N2 non-stream requests from oha,
# and prints (I(N2) - I(N1)) / (N2 - N1): startup and shutdown cancel out.
#
#   perf/instructions.sh [N1] [N2]        (default 500 2500)
#
# Traffic stays on 127.0.0.1; every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${1:-500}
N2=${2:-2500}
OUT=perf/out; mkdir -p "$OUT"
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
. perf/common.sh
write_config "$OUT/instr.toml" 1 false

body='{"model":"perf/gpt-4o-mini","stream":false,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'

# count N -> total instructions of one Tidegate run serving N requests
count() {
  local n=$1 log="$OUT/instr-$1.log" cg="$OUT/callgrind.out.$1"
  rm -f "$cg"
  TIDEGATE_DRIVER=epoll TIDEGATE_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$cg" \
    "$BIN/tidegate" serve --config "$OUT/instr.toml" > "$log" 2>&1 &
  local pid=$!
  pids+=($pid)
  local addr
  addr=$(listening_addr "$log" 600)
  if [ "$n" -gt 0 ]; then
    "$OHA" -n "$n" -c 4 --no-tui -m POST -H "Authorization: Bearer perf-key" \
      -T application/json -d "$body" "http://$addr/v1/chat/completions" > "$OUT/oha-$n.txt"
    grep -Eq "Success rate:[[:space:]]+100.00%" "$OUT/oha-$n.txt" || { cat "$OUT/oha-$n.txt"; exit 1; }
  fi
  kill -TERM "$pid"
  wait "$pid" || true
  awk '/^summary:/ {print $2}' "$cg"
}

i1=$(count "$N1")
i2=$(count "$N2")
per=$(( (i2 - i1) / (N2 - N1) ))
echo "instructions: N=$N1 -> $i1, N=$N2 -> $i2; per request: $per"
