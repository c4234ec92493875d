#!/usr/bin/env bash
# Kernel work per proxied request: syscalls, io_uring submissions (by opcode), io_uring
# waits, voluntary sleeps and involuntary switches of the proxy's threads, counted with
# bpftrace over a fixed number of seconds of closed-loop `wrk` load, divided by the
# requests wrk completed in that window. The same load through Tidegate and through nginx
# (perf/nginx.conf.in), one after the other. These are counts, not timings: a noisy
# machine changes them little (a busier box batches more completions per wait).
#
#   perf/syscalls.sh [DURATION_S] [CONNS]           (default 5 s, 64 connections)
#   STREAM=1 perf/syscalls.sh                       (`"stream": true` requests)
#   TIDEGATE_WORKERS=2 TIDEGATE_DRIVER=epoll TIDEGATE_BIN=DIR are the other knobs.
#
# Writes perf/out/syscalls.md. Needs bpftrace (installed from the distribution when absent)
# and root. Run inside `flock /tmp/tidegate-perf.lock`. Traffic stays on 127.0.0.1; every
# process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-5}
CONNS=${2:-64}
STREAM=${STREAM:-0}
WORKERS=${TIDEGATE_WORKERS:-1}
OUT=perf/out; mkdir -p "$OUT"
command -v bpftrace >/dev/null || { apt-get update -qq && apt-get install -y -qq bpftrace; }
# Tracepoints need tracefs, which is not mounted on every boot.
[ -e /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
. perf/binaries.sh   # $BIN, pids, cleanup

start_mock "$BIN" "$OUT/sys-mock.log"; MOCK_PORT=$STARTED_PORT
gateway_config "$OUT/sys.toml" "$MOCK_PORT" "$WORKERS" "${TIDEGATE_PIN:-true}"
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$OUT/sys.toml" > "$OUT/sys-tidegate.log" 2>&1 &
TG_PID=$!; pids+=($TG_PID)
TG_ADDR=$(listening_addr "$OUT/sys-tidegate.log")
DRIVER=$(sed -n 's/.*driver=\([a-z_]*\).*/\1/p' "$OUT/sys-tidegate.log")

NGINX_PORT=$((MOCK_PORT + 1))
NGX=$PWD/$OUT/sys-nginx; rm -rf "$NGX"; mkdir -p "$NGX"/{client_body,proxy,fastcgi,uwsgi,scgi}; chmod -R 777 "$NGX"
sed -e "s|@MOCK_PORT@|$MOCK_PORT|g; s|@NGINX_PORT@|$NGINX_PORT|g; s|@PREFIX@|$NGX|g" perf/nginx.conf.in > "$NGX/nginx.conf"
nginx -p "$NGX" -c "$NGX/nginx.conf" > "$OUT/sys-nginx.log" 2>&1 &
NGX_PID=$!; pids+=($NGX_PID)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$NGINX_PORT) 2>/dev/null && break; sleep 0.1; done

# syscall numbers -> names, from the kernel headers when present
declare -A SYSNAME=()
if [ -r /usr/include/x86_64-linux-gnu/asm/unistd_64.h ]; then
  while read -r _ name nr; do SYSNAME[$nr]=${name#__NR_}; done < <(grep '^#define __NR_' /usr/include/x86_64-linux-gnu/asm/unistd_64.h)
fi

# count SIDE URL PID... : bpftrace over the processes while wrk runs; appends a table.
count() {
  local side=$1 url=$2; shift 2
  local filter; filter=$(printf 'pid == %s || ' "$@"); filter=${filter% || }
  cat > "$OUT/sys-$side.bt" <<BT
tracepoint:raw_syscalls:sys_enter /$filter/ { @sys[args->id] = count(); }
tracepoint:io_uring:io_uring_submit_req /$filter/ { @op[str(args->op_str)] = count(); }
tracepoint:io_uring:io_uring_poll_arm /$filter/ { @ev["io_uring poll armed (op not ready at submit)"] = count(); }
tracepoint:io_uring:io_uring_cqring_wait /$filter/ { @ev["io_uring waits for completions"] = count(); }
tracepoint:sched:sched_switch /($filter) && args->prev_state != 0/ { @ev["thread slept (voluntary switch)"] = count(); }
tracepoint:sched:sched_switch /($filter) && args->prev_state == 0/ { @ev["thread preempted (involuntary)"] = count(); }
BT
  STREAM=$STREAM wrk -t2 -c"$CONNS" -d2s -s perf/post.lua "$url" > /dev/null   # warm-up
  bpftrace -q "$OUT/sys-$side.bt" > "$OUT/sys-$side.raw" 2>&1 &
  local bt=$!
  sleep 2 # attach
  STREAM=$STREAM wrk -t2 -c"$CONNS" -d"${DUR}s" -s perf/post.lua "$url" > "$OUT/sys-$side-wrk.txt"
  kill -INT "$bt"; wait "$bt" || true
  local n; n=$(awk '/requests in/ {print $1}' "$OUT/sys-$side-wrk.txt")
  REQS[$side]=$n
  # @sys[NR]: COUNT / @op[NAME]: COUNT / @ev[NAME]: COUNT
  while IFS= read -r line; do
    case "$line" in
      @sys\[*) nr=${line#@sys[}; nr=${nr%%]*}; c=${line##*: }; key="syscall ${SYSNAME[$nr]:-#$nr}";;
      @op\[*) k=${line#@op[}; k=${k%]*}; c=${line##*: }; key="io_uring op ${k}";;
      @ev\[*) k=${line#@ev[}; k=${k%]*}; c=${line##*: }; key=$k;;
      *) continue;;
    esac
    [ -n "$c" ] || continue
    PER["$side|$key"]=$(awk -v c="$c" -v n="$n" 'BEGIN{printf "%.3f", c/n}')
    KEYS[$key]=1
  done < "$OUT/sys-$side.raw"
}
declare -A REQS=() PER=() KEYS=()
count tidegate "http://$TG_ADDR/v1/chat/completions" "$TG_PID"
NGX_WORKERS=$(pgrep -P "$NGX_PID" | tr '\n' ' ')
# shellcheck disable=SC2086
count nginx "http://127.0.0.1:$NGINX_PORT/v1/chat/completions" "$NGX_PID" $NGX_WORKERS

{
  echo "Per request, $([ "$STREAM" = 1 ] && echo stream || echo non-stream), wrk -t2 -c$CONNS -d${DUR}s: Tidegate workers=$WORKERS driver=$DRIVER ($(printf "%'d" "${REQS[tidegate]}") requests), nginx worker_processes 2 ($(printf "%'d" "${REQS[nginx]}") requests)."
  echo
  echo "| per request | tidegate | nginx |"
  echo "|---|---|---|"
  for key in $(printf '%s\n' "${!KEYS[@]}" | tr ' ' '\a' | sort); do
    k=${key//$'\a'/ }
    t=${PER["tidegate|$k"]:-0}; g=${PER["nginx|$k"]:-0}
    awk -v t="$t" -v g="$g" 'BEGIN{exit !(t >= 0.01 || g >= 0.01)}' || continue
    echo "| $k | $t | $g |"
  done
  echo
  echo "Command: \`STREAM=$STREAM TIDEGATE_WORKERS=$WORKERS perf/syscalls.sh $DUR $CONNS\`$([ -n "${TIDEGATE_DRIVER:-}" ] && echo " with TIDEGATE_DRIVER=$TIDEGATE_DRIVER")."
} > "$OUT/syscalls.md"
cat "$OUT/syscalls.md"
