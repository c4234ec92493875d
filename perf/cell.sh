#!/usr/bin/env bash
# Where the CPU goes in one saturated cell of perf/run.sh: the same closed-loop wrk load
# (non-stream or stream, CONNS connections) against tidegate-mock directly, through nginx
# (perf/nginx.conf.in; `nginx-pinned` adds `worker_cpu_affinity auto`) and through Tidegate
# pinned and unpinned (`pin_threads`; `epoll-pinned`, `epoll-unpinned`: the same with
# TIDEGATE_DRIVER=epoll), in interleaved rounds. Per side and round: wrk's
# requests/s and, from /proc, the CPU time of wrk, of the mock and of the proxy per request
# (µs) and the machine's idle share. A proxy that makes the mock or wrk work more per request
# shows here; so does a side that leaves a core idle while requests wait.
#
#   perf/cell.sh [CONNS] [DURATION_S] [ROUNDS]   (default 256 8 3)
#   STREAM=1 (default; 0 = non-stream)  WORKERS=2 (Tidegate shards, nginx workers)
#   SIDES="direct nginx nginx-pinned pinned unpinned"   TIDEGATE_BIN=DIR (prebuilt)
#
# Writes perf/out/cell.md. Run it inside `flock /tmp/tidegate-perf.lock`. Traffic stays on
# 127.0.0.1; every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${1:-256}
DUR=${2:-8}
ROUNDS=${3:-3}
STREAM=${STREAM:-1}
WORKERS=${WORKERS:-2}
SIDES=${SIDES:-direct nginx nginx-pinned pinned unpinned}
# CPU is read over the load's middle: a second after its start to a second before its end.
[ "$DUR" -ge 3 ] || { echo "perf/cell.sh: DURATION_S must be at least 3" >&2; exit 2; }
OUT=perf/out; mkdir -p "$OUT"
command -v nginx >/dev/null || { printf 'nginx is not installed (perf/run.sh installs it)\n' >&2; exit 1; }
. perf/common.sh
MOCK_PID=${pids[0]}

declare -A URL=() PID=()
URL[direct]="http://127.0.0.1:$MOCK_PORT/v1/chat/completions"
port=$((MOCK_PORT + 1))
for side in $SIDES; do
  case $side in
    direct) PID[direct]=;;
    pinned|unpinned|epoll-pinned|epoll-unpinned)
      # the shipped default (pinned, io_uring), unpinned (`pin_threads = false`), and the
      # same two with the epoll driver
      env=(TIDEGATE_LOG=warn); [[ $side == epoll-* ]] && env+=(TIDEGATE_DRIVER=epoll)
      gateway_config "$OUT/cell-$side.toml" "$MOCK_PORT" "$WORKERS" "$([[ $side == *unpinned ]] && echo false || echo true)"
      env "${env[@]}" "$BIN/tidegate" serve --config "$OUT/cell-$side.toml" > "$OUT/cell-$side.log" 2>&1 &
      pids+=($!); PID[$side]=$!
      URL[$side]="http://$(listening_addr "$OUT/cell-$side.log")/v1/chat/completions";;
    nginx|nginx-pinned)
      NGX=$PWD/$OUT/cell-$side; rm -rf "$NGX"; mkdir -p "$NGX"/{client_body,proxy,fastcgi,uwsgi,scgi}; chmod -R 777 "$NGX"
      affinity=""; [ "$side" = nginx-pinned ] && affinity="worker_cpu_affinity auto;"
      sed -e "s|@MOCK_PORT@|$MOCK_PORT|g; s|@NGINX_PORT@|$port|g; s|@PREFIX@|$NGX|g" \
          -e "s|^worker_processes .*|worker_processes $WORKERS; $affinity|" perf/nginx.conf.in > "$NGX/nginx.conf"
      nginx -p "$NGX" -c "$NGX/nginx.conf" > "$OUT/cell-$side.log" 2>&1 &
      pids+=($!); PID[$side]=$!
      for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
      URL[$side]="http://127.0.0.1:$port/v1/chat/completions"
      port=$((port + 1));;
    *) echo "unknown side $side" >&2; exit 1;;
  esac
done

HZ=$(getconf CLK_TCK)
# ticks PID [FIELDS]: user+system ticks (FIELDS "14" user only, "15" system only) of the
# process and of its children (nginx: the master's workers)
ticks() {
  local p=$1 sum=0 c f
  [ -n "$p" ] || { echo 0; return; }
  for c in $p $(pgrep -P "$p" || true); do
    for f in ${2:-14 15}; do
      sum=$((sum + $(awk -v f="$f" '{print $f}' /proc/"$c"/stat 2>/dev/null || echo 0)))
    done
  done
  echo $sum
}
idle() { awk '/^cpu / {print $5 + $6}' /proc/stat; }
for side in $SIDES; do STREAM=0 wrk -t1 -c8 -d2s -s perf/post.lua "${URL[$side]}" > /dev/null; done # warm-up

declare -A R=()
for r in $(seq "$ROUNDS"); do
  for side in $SIDES; do
    STREAM=$STREAM wrk -t2 -c"$CONNS" -d"${DUR}s" --latency -s perf/post.lua "${URL[$side]}" > "$OUT/cell-$side-$r.txt" 2>&1 &
    wrk_pid=$!
    sleep 1   # connections made, load steady
    m0=$(ticks "$MOCK_PID"); p0=$(ticks "${PID[$side]}"); s0=$(ticks "${PID[$side]}" 15); w0=$(ticks "$wrk_pid"); i0=$(idle); t0=$(date +%s%N)
    sleep $((DUR - 2))
    m1=$(ticks "$MOCK_PID"); p1=$(ticks "${PID[$side]}"); s1=$(ticks "${PID[$side]}" 15); w1=$(ticks "$wrk_pid"); i1=$(idle); t1=$(date +%s%N)
    wait "$wrk_pid"
    rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/cell-$side-$r.txt")
    p99=$(awk '$1=="99%" {print $2}' "$OUT/cell-$side-$r.txt")
    row="$(awk -v rps="$rps" -v hz="$HZ" -v m=$((m1 - m0)) -v p=$((p1 - p0)) -v w=$((w1 - w0)) -v i=$((i1 - i0)) -v ps=$((s1 - s0)) -v ns=$((t1 - t0)) -v p99="$p99" \
      'BEGIN { s = ns / 1e9; n = rps * s; printf "%.0f,%.1f,%.1f,%.1f,%.0f,%.0f,%.0f,%.0f,%s,%.1f", rps, m / hz * 1e6 / n, p / hz * 1e6 / n, w / hz * 1e6 / n, m / hz / s * 100, p / hz / s * 100, w / hz / s * 100, i / hz / s / 2 * 100, p99, ps / hz * 1e6 / n }')"
    R[$side]+="$row;"
    echo "round $r $side: $row (rps, µs/req mock proxy wrk, CPU % mock proxy wrk idle, p99, proxy sys µs/req)" >&2
  done
done

python3 - "$CONNS" "$DUR" "$ROUNDS" "$STREAM" "$WORKERS" "$(uptime | sed 's/.*load/load/')" > "$OUT/cell.md" <<PY
import re, statistics, sys
def ms(v):
    """wrk's latency ("850.00us", "12.3ms", "1.2s") in ms."""
    m = re.match(r'([0-9.]+)(us|ms|s)$', v)
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)] if m else float('nan')
conns, dur, rounds, stream, workers, load = sys.argv[1:]
rows = {$(for s in $SIDES; do printf '"%s": "%s", ' "$s" "${R[$s]}"; done)}
print(f"One saturated cell ({'stream' if stream == '1' else 'non-stream'}, wrk -t2 -c{conns}, {dur}s; CPU read over the middle {int(dur) - 2} s) in {rounds} interleaved rounds, medians; "
      f"Tidegate workers={workers}, nginx worker_processes {workers}; {load}. CPU µs per request from /proc ticks (10 ms resolution); idle = the machine's idle share of its 2 cores.")
print()
print("| side | rps | wrk p99 ms | mock µs/req | proxy µs/req (of it kernel) | wrk µs/req | mock CPU % | proxy CPU % | wrk CPU % | idle % | rounds' rps |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for side, raw in rows.items():
    rs = [r.split(",") for r in raw.strip(";").split(";")]
    med = lambda i: statistics.median(float(r[i]) for r in rs)
    print(f"| {side} | {med(0):.0f} | {statistics.median(ms(r[8]) for r in rs):.2f} | {med(1):.1f} | {med(2):.1f} ({med(9):.1f}) | {med(3):.1f} | {med(4):.0f} | {med(5):.0f} | {med(6):.0f} | {med(7):.0f} | {' '.join(r[0] for r in rs)} |")
print()
print(f"Command: \`STREAM={stream} WORKERS={workers} SIDES=\"{' '.join(rows)}\" perf/cell.sh {conns} {dur} {rounds}\`.")
PY
cat "$OUT/cell.md"
