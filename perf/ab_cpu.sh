#!/usr/bin/env bash
# CPU per proxied request of two Tidegate builds side by side: each build runs (workers = 1,
# not pinned) in front of its own tidegate-mock, and the same saturating wrk load
# (perf/post.lua, 2 threads, CONNS connections, DUR seconds) goes to A, then B, then A...
# for ROUNDS rounds, non-stream and then stream; `perf stat -e task-clock` is attached to
# the loaded Tidegate for exactly its load. Prints µs of CPU (user + kernel) per answered
# request per run, and the median per build. Both builds see the same machine load within
# a round, so the ratio is what to read on a shared box; wrk (not oha) so nothing needs
# installing beyond the distribution's wrk.
#
#   flock /tmp/tidegate-perf.lock perf/ab_cpu.sh DIR_A DIR_B [ROUNDS] [DUR_S] [CONNS]
#                                                  (default 3 8 64)
#
# Traffic stays on 127.0.0.1; every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1; B=$2; ROUNDS=${3:-3}; DUR=${4:-8}; CONNS=${5:-64}
OUT=perf/out; mkdir -p "$OUT"
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
. perf/stack.sh   # start_mock, gateway_config, listening_addr
declare -A URL TG
for side in A B; do
  dir=${!side}
  start_mock "$dir" "$OUT/ab-mock-$side.log"
  gateway_config "$OUT/ab-$side.toml" "$STARTED_PORT" 1 false
  TIDEGATE_LOG=warn "$dir/tidegate" serve --config "$OUT/ab-$side.toml" > "$OUT/ab-tg-$side.log" 2>&1 &
  TG[$side]=$!; pids+=($!)
  URL[$side]=http://$(listening_addr "$OUT/ab-tg-$side.log")/v1/chat/completions
  STREAM=0 wrk -t1 -c8 -d2s -s perf/post.lua "${URL[$side]}" > /dev/null
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2 }'; }
for s in 0 1; do
  declare -A RES=()
  for r in $(seq "$ROUNDS"); do
    for side in A B; do
      perf stat -e task-clock -x, -o "$OUT/ab-stat.txt" -p "${TG[$side]}" &
      pp=$!
      STREAM=$s wrk -t2 -c"$CONNS" -d"${DUR}s" -s perf/post.lua "${URL[$side]}" > "$OUT/ab-wrk.txt" 2>&1
      kill -INT $pp; wait $pp || true
      ! grep -q "Non-2xx" "$OUT/ab-wrk.txt" || { cat "$OUT/ab-wrk.txt"; exit 1; }
      n=$(awk '/requests in/ {print $1}' "$OUT/ab-wrk.txt")
      ms=$(awk -F, '$3 ~ /task-clock/ {print $1}' "$OUT/ab-stat.txt")
      us=$(awk -v ms="$ms" -v n="$n" 'BEGIN{printf "%.2f", ms*1000/n}')
      rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/ab-wrk.txt")
      echo "stream=$s round=$r $side=${!side}: $rps rps, task-clock $ms ms, $n requests -> $us µs CPU/request"
      RES[$side]="${RES[$side]:-} $us"
    done
  done
  for side in A B; do
    # shellcheck disable=SC2086
    echo "median stream=$s $side=${!side}: $(median ${RES[$side]}) µs CPU/request"
  done
done
echo "($(uptime | sed 's/.*load/load/'))"
