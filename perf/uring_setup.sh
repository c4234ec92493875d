#!/usr/bin/env bash
# io_uring ring setups side by side (TIDEGATE_URING_SETUP=plain|coop|defer, and the epoll
# driver): one Tidegate per setup in front of the same tidegate-mock, the same closed-loop
# `wrk` load against each in interleaved rounds, and `perf stat -e task-clock` on the
# gateway for exactly the load's duration: requests/s and µs of CPU (all of Tidegate's
# threads, user + kernel) per request, the median over rounds.
#
#   perf/uring_setup.sh [DURATION_S] [CONNS] [ROUNDS]   (default 8 s, 64 connections, 3)
#   SETUPS="plain coop defer epoll" TIDEGATE_WORKERS=2 (default: nproc) TIDEGATE_BIN=DIR
#   BASE_BIN=DIR adds a side "base": the tidegate binary in DIR (an earlier build, e.g. a
#   copy of main's) with its own defaults, against the same mock, in the same rounds.
#
# Writes perf/out/uring_setup.md. Run inside `flock /tmp/tidegate-perf.lock`. Traffic
# stays on 127.0.0.1; every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-8}
CONNS=${2:-64}
ROUNDS=${3:-3}
SETUPS=${SETUPS:-plain coop defer epoll}
WORKERS=${TIDEGATE_WORKERS:-$(nproc)}
OUT=perf/out; mkdir -p "$OUT"
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
. perf/binaries.sh   # $BIN, pids, cleanup

start_mock "$BIN" "$OUT/setup-mock.log"; MOCK_PORT=$STARTED_PORT
gateway_config "$OUT/setup.toml" "$MOCK_PORT" "$WORKERS" "${TIDEGATE_PIN:-true}"
declare -A PID=() URL=() RPS=() CPU=()
[ -n "${BASE_BIN:-}" ] && SETUPS="base $SETUPS"
for s in $SETUPS; do
  bin=$BIN
  if [ "$s" = base ]; then env=(TIDEGATE_DRIVER=auto); bin=$BASE_BIN
  elif [ "$s" = epoll ]; then env=(TIDEGATE_DRIVER=epoll)
  else env=(TIDEGATE_DRIVER=io_uring "TIDEGATE_URING_SETUP=$s"); fi
  env "${env[@]}" TIDEGATE_LOG=warn "$bin/tidegate" serve --config "$OUT/setup.toml" > "$OUT/setup-$s.log" 2>&1 &
  PID[$s]=$!; pids+=($!)
  addr=$(listening_addr "$OUT/setup-$s.log")
  URL[$s]="http://$addr/v1/chat/completions"
  STREAM=0 wrk -t2 -c"$CONNS" -d2s -s perf/post.lua "${URL[$s]}" > /dev/null   # warm-up
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2 }'; }
for r in $(seq "$ROUNDS"); do
  for s in $SETUPS; do
    perf stat -e task-clock -x, -o "$OUT/setup-$s-r$r.stat" -p "${PID[$s]}" &
    ps_pid=$!
    STREAM=0 wrk -t2 -c"$CONNS" -d"${DUR}s" -s perf/post.lua "${URL[$s]}" > "$OUT/setup-$s-r$r.txt"
    kill -INT "$ps_pid"; wait "$ps_pid" || true
    n=$(awk '/requests in/ {print $1}' "$OUT/setup-$s-r$r.txt")
    ms=$(awk -F, '$3 ~ /task-clock/ {print $1}' "$OUT/setup-$s-r$r.stat")
    RPS[$s]+="$(awk -v n="$n" -v d="$DUR" 'BEGIN{printf "%.0f", n/d}') "
    CPU[$s]+="$(awk -v ms="$ms" -v n="$n" 'BEGIN{printf "%.2f", ms*1000/n}') "
  done
done
{
  echo "io_uring setups, wrk -t2 -c$CONNS -d${DUR}s non-stream, $ROUNDS interleaved rounds, Tidegate workers=$WORKERS pin_threads=${TIDEGATE_PIN:-true}; $(uptime | sed 's/.*load/load/')."
  echo
  echo "| setup | rps (median) | rps per round | CPU µs/request (median) | per round |"
  echo "|---|---|---|---|---|"
  for s in $SETUPS; do
    # shellcheck disable=SC2086
    echo "| $s | $(median ${RPS[$s]}) | ${RPS[$s]% } | $(median ${CPU[$s]}) | ${CPU[$s]% } |"
  done
  echo
  echo "Command: \`${BASE_BIN:+BASE_BIN=$BASE_BIN }SETUPS=\"${SETUPS#base }\" TIDEGATE_WORKERS=$WORKERS perf/uring_setup.sh $DUR $CONNS $ROUNDS\`."
} > "$OUT/uring_setup.md"
cat "$OUT/uring_setup.md"
