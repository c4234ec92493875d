#!/usr/bin/env bash
# Fairness between client connections and accept distribution across shards, under a
# saturating closed-loop load: `wrk -c CONNS` (non-stream) through Tidegate and through
# nginx (perf/nginx.conf.in), and bpftrace counting every write to a client socket
# (tracepoint sock:sock_send_length, keyed by the writing thread and the client's port).
# A non-stream answer is one write, so the count per client port is the number of
# responses that connection got. Prints, per side: connections and responses per
# thread (Tidegate: per shard; nginx: per worker), and the spread of responses per
# connection (min, 1st percentile, median, max; min/median — a starved connection shows
# as a min far below the median), next to wrk's latency p99 and max. "Thread balance" is
# the least-served thread's responses per connection over the best-served thread's: every
# connection is served by the one shard that accepted it, so a shard that gets less CPU
# serves all of its connections less.
#
#   perf/fairness.sh [DURATION_S] [CONNS]    (default 10 s, 256 connections)
#   TIDEGATE_WORKERS=2 (default: the number of cores) TIDEGATE_PIN=true TIDEGATE_BIN=DIR
#
# Writes perf/out/fairness.md. Needs bpftrace with kernel BTF, and root. Run inside
# `flock /tmp/tidegate-perf.lock`. Traffic stays on 127.0.0.1; every process started
# here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
CONNS=${2:-256}
WORKERS=${TIDEGATE_WORKERS:-$(nproc)}
OUT=perf/out; mkdir -p "$OUT"
command -v bpftrace >/dev/null || { apt-get update -qq && apt-get install -y -qq bpftrace; }
# Tracepoints need tracefs, which is not mounted on every boot.
[ -e /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
. perf/binaries.sh   # $BIN, pids, cleanup

start_mock "$BIN" "$OUT/fair-mock.log"; MOCK_PORT=$STARTED_PORT
gateway_config "$OUT/fair.toml" "$MOCK_PORT" "$WORKERS" "${TIDEGATE_PIN:-true}"
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$OUT/fair.toml" > "$OUT/fair-tidegate.log" 2>&1 &
TG_PID=$!; pids+=($TG_PID)
TG_ADDR=$(listening_addr "$OUT/fair-tidegate.log")

NGINX_PORT=$((MOCK_PORT + 1))
NGX=$PWD/$OUT/fair-nginx; rm -rf "$NGX"; mkdir -p "$NGX"/{client_body,proxy,fastcgi,uwsgi,scgi}; chmod -R 777 "$NGX"
sed -e "s|@MOCK_PORT@|$MOCK_PORT|g; s|@NGINX_PORT@|$NGINX_PORT|g; s|@PREFIX@|$NGX|g" perf/nginx.conf.in > "$NGX/nginx.conf"
nginx -p "$NGX" -c "$NGX/nginx.conf" > "$OUT/fair-nginx.log" 2>&1 &
NGX_PID=$!; pids+=($NGX_PID)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$NGINX_PORT) 2>/dev/null && break; sleep 0.1; done

# measure SIDE URL LISTEN_PORT PID... -> one table row
rows=()
# struct sock_common holds skc_dport (network order) at offset 12 and skc_num (the local
# port) at 14: read by offset, as bpftrace 0.17 does not resolve these anonymous-union
# members by name.
measure() {
  local side=$1 url=$2 lport=$3; shift 3
  local filter; filter=$(printf 'pid == %s || ' "$@"); filter=${filter% || }
  cat > "$OUT/fair-$side.bt" <<BT
tracepoint:sock:sock_send_length /$filter/ {
  \$sk = (uint64)args->sk;
  if (*(uint16 *)(\$sk + 14) == $lport) { @w[tid, *(uint16 *)(\$sk + 12)] = count(); }
}
BT
  STREAM=0 wrk -t2 -c"$CONNS" -d2s -s perf/post.lua "$url" > /dev/null   # warm-up
  bpftrace -q "$OUT/fair-$side.bt" > "$OUT/fair-$side.raw" 2>/dev/null &
  local bt=$!
  sleep 2 # attach
  STREAM=0 wrk -t2 -c"$CONNS" -d"${DUR}s" --latency -s perf/post.lua "$url" > "$OUT/fair-$side-wrk.txt"
  kill -INT "$bt"; wait "$bt" || true
  local p99 max reqs
  p99=$(awk '$1=="99%" {print $2}' "$OUT/fair-$side-wrk.txt")
  max=$(awk '$1=="Latency" {print $4}' "$OUT/fair-$side-wrk.txt")
  reqs=$(awk '/requests in/ {print $1}' "$OUT/fair-$side-wrk.txt")
  # "@w[TID, PORT]: COUNT"
  sed -n 's/^@w\[\([0-9]*\), \([0-9]*\)\]: \([0-9]*\)$/\1 \2 \3/p' "$OUT/fair-$side.raw" > "$OUT/fair-$side.txt"
  local threads spread balance
  threads=$(awk '{c[$1]++; n[$1]+=$3} END{for (t in c) printf "%d conns / %d responses, ", c[t], n[t]}' "$OUT/fair-$side.txt" | sed 's/, $//')
  # the least-served thread's responses per connection over the best-served one's
  balance=$(awk '{c[$1]++; n[$1]+=$3} END{lo=-1; hi=0; for (t in c) { r=n[t]/c[t]; if (lo<0 || r<lo) lo=r; if (r>hi) hi=r }; printf "%.2f", (hi>0)?lo/hi:0}' "$OUT/fair-$side.txt")
  spread=$(awk '{print $3}' "$OUT/fair-$side.txt" | sort -n | awk '{a[NR]=$1} END{
    p1=a[int((NR-1)*0.01)+1]; med=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2;
    printf "%d | %d | %d | %d | %d | %.2f", NR, a[1], p1, med, a[NR], (med>0)?a[1]/med:0 }')
  rows+=("| $side | $reqs | $threads | $balance | $spread | $p99 | $max |")
}
measure tidegate "http://$TG_ADDR/v1/chat/completions" "${TG_ADDR##*:}" "$TG_PID"
# shellcheck disable=SC2046
measure nginx "http://127.0.0.1:$NGINX_PORT/v1/chat/completions" "$NGINX_PORT" $(pgrep -P "$NGX_PID")

{
  echo "Fairness at $CONNS connections (wrk -t2 -c$CONNS -d${DUR}s, non-stream; Tidegate workers=$WORKERS pin_threads=${TIDEGATE_PIN:-true}, nginx worker_processes 2). Responses per client connection counted from the proxy's writes to client sockets."
  echo
  echo "| side | requests | per thread (shard / worker): connections / responses | thread balance | connections seen | min | p1 | median | max | min/median | wrk p99 | wrk max |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Command: \`TIDEGATE_WORKERS=$WORKERS perf/fairness.sh $DUR $CONNS\`."
} > "$OUT/fairness.md"
cat "$OUT/fairness.md"
