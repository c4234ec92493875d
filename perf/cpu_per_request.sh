#!/usr/bin/env bash
# CPU per proxied request at a fixed rate, Tidegate beside nginx: tidegate-mock behind
# Tidegate (release build, not pinned) and behind nginx (perf/nginx.conf.in, the plain
# keep-alive reverse proxy perf/run.sh compares with), the same open-loop oha load at a
# fixed rate (non-stream chat completions, perf/post.lua's body) against each side in
# interleaved rounds, and `perf stat` attached to each proxy's processes for exactly its
# load's duration. Per answered request: µs of CPU (all threads, user + kernel, perf's
# task-clock), the user/kernel split (/proc/PID/stat ticks), context switches, system
# calls (`io_uring_enter` and `epoll_wait` among them) and io_uring submissions.
# A fixed rate (not a saturating load) keeps the figure comparable between runs on a
# shared machine: the work per request is what is counted, not how much CPU was free;
# nginx at the same rate is the reference for what a request costs a plain proxy that
# also wakes for (almost) every request at this rate.
#
#   perf/cpu_per_request.sh [RATE] [DURATION_S] [ROUNDS]   (default 4000 10 3)
#   TIDEGATE_BIN=DIR      prebuilt tidegate + tidegate-mock (build nothing)
#   BASE_BIN=DIR          adds a side "base": the tidegate binary in DIR (e.g. a copy of
#                         main's build), same config and mock, same rounds
#   SIDES="tidegate nginx" the sides measured (base is added by BASE_BIN); also
#                         plain, coop, defer (Tidegate with that TIDEGATE_URING_SETUP) and
#                         epoll (TIDEGATE_DRIVER=epoll)
#   WORKERS=1             Tidegate shards and nginx worker_processes (the same count)
#   CONNS=64 STREAM=0     oha connections; STREAM=1 sends `"stream": true`
#   TIDEGATE_ENV="K=V …"  environment for the measured Tidegate (not base), e.g.
#                         TIDEGATE_URING_SETUP=defer
#
# Writes perf/out/cpu_per_request.md. Run it inside `flock /tmp/tidegate-perf.lock` on
# this shared box. Traffic stays on 127.0.0.1; every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-4000}
DUR=${2:-10}
ROUNDS=${3:-3}
CONNS=${CONNS:-64}
STREAM=${STREAM:-0}
WORKERS=${WORKERS:-1}
SIDES=${SIDES:-tidegate nginx}
[ -n "${BASE_BIN:-}" ] && SIDES="base $SIDES"
OUT=perf/out; mkdir -p "$OUT"
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; }
command -v nginx >/dev/null || { printf 'nginx is not installed (perf/run.sh installs it)\n' >&2; exit 1; }
. perf/common.sh

declare -A URL=() PIDS=()
start_gateway() { # start_gateway SIDE BINDIR ENV...
  local side=$1 bin=$2; shift 2
  gateway_config "$OUT/cpu-$side.toml" "$MOCK_PORT" "$WORKERS" false
  env "$@" TIDEGATE_LOG=warn "$bin/tidegate" serve --config "$OUT/cpu-$side.toml" > "$OUT/cpu-$side.log" 2>&1 &
  PIDS[$side]=$!; pids+=($!)
  URL[$side]="http://$(listening_addr "$OUT/cpu-$side.log")/v1/chat/completions"
}
for side in $SIDES; do
  case $side in
    tidegate) read -ra tg_env <<< "${TIDEGATE_ENV:-}"; start_gateway tidegate "$BIN" "${tg_env[@]}";;
    base) start_gateway base "$BASE_BIN";;
    plain|coop|defer) start_gateway "$side" "$BIN" TIDEGATE_DRIVER=io_uring "TIDEGATE_URING_SETUP=$side";;
    epoll) start_gateway epoll "$BIN" TIDEGATE_DRIVER=epoll;;
    nginx)
      NGINX_PORT=$((MOCK_PORT + 1))
      NGX=$PWD/$OUT/cpu-nginx; rm -rf "$NGX"; mkdir -p "$NGX"/{client_body,proxy,fastcgi,uwsgi,scgi}; chmod -R 777 "$NGX"
      sed -e "s|@MOCK_PORT@|$MOCK_PORT|g; s|@NGINX_PORT@|$NGINX_PORT|g; s|@PREFIX@|$NGX|g" \
          -e "s|^worker_processes .*|worker_processes $WORKERS;|" perf/nginx.conf.in > "$NGX/nginx.conf"
      nginx -p "$NGX" -c "$NGX/nginx.conf" > "$OUT/cpu-nginx.log" 2>&1 &
      ngx_master=$!; pids+=($ngx_master)
      for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$NGINX_PORT) 2>/dev/null && break; sleep 0.1; done
      PIDS[nginx]="$ngx_master $(pgrep -P "$ngx_master" | tr '\n' ' ')"
      URL[nginx]="http://127.0.0.1:$NGINX_PORT/v1/chat/completions";;
    *) echo "unknown side $side" >&2; exit 1;;
  esac
done

stream_json=$([ "$STREAM" = 1 ] && echo true || echo false)
body='{"model":"perf/gpt-4o-mini","stream":'$stream_json',"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
load() { # load URL RATE SECONDS OUTFILE
  "$OHA" -z "${3}s" -c "$CONNS" -q "$2" --no-tui -m POST -H "Authorization: Bearer perf-key" \
    -T application/json -d "$body" "$1" > "$4"
}
HZ=$(getconf CLK_TCK)
# user and kernel ticks of the processes, summed: "USER SYS"
ticks() { local u=0 s=0 p; for p in "$@"; do read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat"); u=$((u + pu)); s=$((s + ps)); done; echo "$u $s"; }
EVENTS=task-clock,context-switches,cpu-migrations,raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_epoll_wait,io_uring:io_uring_submit_req,io_uring:io_uring_poll_arm,io_uring:io_uring_task_work_run
COLS=(us user_us sys_us cs migr sys enter epoll subm arm twork)
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2 }'; }

for side in $SIDES; do load "${URL[$side]}" "$RATE" 2 /dev/null; done # warm-up: pools, caches
declare -A VAL=()
for r in $(seq "$ROUNDS"); do
  for side in $SIDES; do
    # shellcheck disable=SC2086
    set -- ${PIDS[$side]}
    stat_out="$OUT/cpu-$side-perfstat-$r.txt"
    perf stat -e "$EVENTS" -x, -o "$stat_out" -p "$(IFS=,; echo "$*")" &
    perf_pid=$!
    sleep 0.2 # attached
    read -r u0 s0 < <(ticks "$@")
    load "${URL[$side]}" "$RATE" "$DUR" "$OUT/cpu-$side-oha-$r.txt"
    read -r u1 s1 < <(ticks "$@")
    kill -INT "$perf_pid"; wait "$perf_pid" || true
    grep -Eq "Success rate:[[:space:]]+100.00%" "$OUT/cpu-$side-oha-$r.txt" || { cat "$OUT/cpu-$side-oha-$r.txt"; exit 1; }
    n=$(awk '/^[[:space:]]*\[200\]/ {print $2}' "$OUT/cpu-$side-oha-$r.txt")
    ev() { awk -F, -v e="$1" '$3 == e {print ($1 ~ /^[0-9.]+$/) ? $1 : 0}' "$stat_out"; }
    per() { awk -v c="$1" -v n="$n" -v k="${2:-1}" 'BEGIN{printf "%.3f", c * k / n}'; }
    vals=(
      "$(per "$(ev task-clock)" 1000)"
      "$(per $((u1 - u0)) "$(awk -v hz="$HZ" 'BEGIN{print 1e6 / hz}')")"
      "$(per $((s1 - s0)) "$(awk -v hz="$HZ" 'BEGIN{print 1e6 / hz}')")"
      "$(per "$(ev context-switches)")" "$(per "$(ev cpu-migrations)")"
      "$(per "$(ev raw_syscalls:sys_enter)")" "$(per "$(ev syscalls:sys_enter_io_uring_enter)")"
      "$(per "$(ev syscalls:sys_enter_epoll_wait)")" "$(per "$(ev io_uring:io_uring_submit_req)")"
      "$(per "$(ev io_uring:io_uring_poll_arm)")" "$(per "$(ev io_uring:io_uring_task_work_run)")"
    )
    for i in "${!COLS[@]}"; do VAL[$side|${COLS[$i]}]+="${vals[$i]} "; done
    echo "round $r $side: $n requests; µs CPU/request ${vals[0]} (user ${vals[1]}, kernel ${vals[2]}); per request: switches ${vals[3]}, syscalls ${vals[5]}, io_uring_enter ${vals[6]}, epoll_wait ${vals[7]}, submissions ${vals[8]}"
  done
done

{
  echo "CPU per request at a fixed $RATE rps ($([ "$STREAM" = 1 ] && echo stream || echo non-stream), oha -c $CONNS -q $RATE, ${DUR}s × $ROUNDS interleaved rounds; medians), Tidegate workers=$WORKERS unpinned${TIDEGATE_ENV:+ ($TIDEGATE_ENV)}, nginx worker_processes $WORKERS; $(uptime | sed 's/.*load/load/')."
  echo
  echo "| per request | $(echo $SIDES | sed 's/ / | /g') |"
  echo "|---$(for _ in $SIDES; do printf '|---'; done)|"
  label() { case $1 in
    us) echo "CPU µs (task-clock)";; user_us) echo "user µs (/proc ticks)";; sys_us) echo "kernel µs (/proc ticks)";;
    cs) echo "context switches";; migr) echo "CPU migrations";; sys) echo "system calls";;
    enter) echo "io_uring_enter";; epoll) echo "epoll_wait";; subm) echo "io_uring submissions";;
    arm) echo "io_uring poll armed";; twork) echo "io_uring task-work runs";; esac; }
  for c in "${COLS[@]}"; do
    row="| $(label "$c")"
    # shellcheck disable=SC2086
    for side in $SIDES; do row+=" | $(median ${VAL[$side|$c]})"; done
    echo "$row |"
  done
  echo
  echo "Per round (µs CPU/request): $(for side in $SIDES; do printf '%s %s; ' "$side" "${VAL[$side|us]% }"; done)"
  echo
  echo "Command: \`${BASE_BIN:+BASE_BIN=$BASE_BIN }${TIDEGATE_ENV:+TIDEGATE_ENV=\"$TIDEGATE_ENV\" }WORKERS=$WORKERS CONNS=$CONNS STREAM=$STREAM perf/cpu_per_request.sh $RATE $DUR $ROUNDS\`."
} > "$OUT/cpu_per_request.md"
cat "$OUT/cpu_per_request.md"
