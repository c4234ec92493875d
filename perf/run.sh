#!/usr/bin/env bash
# Load test: the same load against tidegate-mock directly, through nginx (a plain keep-alive
# reverse proxy, perf/nginx.conf.in) and through Tidegate, in interleaved rounds (direct,
# nginx, Tidegate back to back for every cell), non-stream and stream, 64 and 256
# connections; a fixed-rate added-latency table (oha, coordinated-omission corrected); and a
# sequential c=1 overhead probe (median of per-round differences). Writes perf/out/load.md
# (figures and the exact commands). Traffic stays on 127.0.0.1; every process started here
# is ended by PID.
#
#   perf/run.sh [DURATION_S]        (default 10 s per measurement)
#   ROUNDS=3 perf/run.sh 10         (median of 3 interleaved rounds per cell, the fixed-rate
#                                   table included; default 1)
#   RATE=4000 PROBE_ROUNDS=5 TIDEGATE_WORKERS TIDEGATE_PIN=true are the other knobs.
#   ONLY=fixed runs the fixed-rate added-latency table alone (FIXED_ROUNDS=1 times, each
#   round direct, nginx, Tidegate back to back; medians of the rounds), writing
#   perf/out/fixed.md.
#   BASE_DIR=DIR                    (a directory holding an older build's `tidegate`) adds a
#                                   fourth side, "base": that build with the same config in
#                                   front of the same mock, in the same interleaved rounds,
#                                   and a Tidegate/base table (same-format throughput A/B);
#                                   BASE_PIN=true|false runs it with its own pin_threads.
#   TIDEGATE_WORKERS defaults to the number of cores (`nproc`): the shipped default
#   (`workers = 0`, one shard per core), and the same as nginx's `worker_processes 2` on the
#   2-core benchmark machine. Runs A–H used one worker; `TIDEGATE_WORKERS=1` repeats them.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
OUT=perf/out; mkdir -p "$OUT"
RATE=${RATE:-4000}
ROUNDS=${ROUNDS:-1}
TIDEGATE_WORKERS=${TIDEGATE_WORKERS:-$(nproc)}
PROBE_ROUNDS=${PROBE_ROUNDS:-5}
. perf/common.sh

# nginx from the distribution's package (no service started: policy-rc.d answers 101).
if ! command -v nginx >/dev/null; then
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1; fi
  apt-get update -qq && apt-get install -y -qq nginx-light
  [ $made_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
NGINX_PORT=$((MOCK_PORT + 1))
NGX=$PWD/$OUT/nginx; rm -rf "$NGX"; mkdir -p "$NGX"/{client_body,proxy,fastcgi,uwsgi,scgi}; chmod -R 777 "$NGX"
sed -e "s|@MOCK_PORT@|$MOCK_PORT|g; s|@NGINX_PORT@|$NGINX_PORT|g; s|@PREFIX@|$NGX|g" perf/nginx.conf.in > "$NGX/nginx.conf"
nginx -p "$NGX" -c "$NGX/nginx.conf" > "$OUT/nginx.log" 2>&1 &
pids+=($!)

write_config "$OUT/perf.toml" "$TIDEGATE_WORKERS" "${TIDEGATE_PIN:-true}"
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$OUT/perf.toml" > "$OUT/tidegate.log" 2>&1 &
TG_PID=$!; pids+=($TG_PID)
TG_ADDR=$(listening_addr "$OUT/tidegate.log")
BASE_DIR=${BASE_DIR:-}
if [ -n "$BASE_DIR" ]; then
  [ -x "$BASE_DIR/tidegate" ] || { echo "BASE_DIR=$BASE_DIR has no executable tidegate" >&2; exit 2; }
  # The same config (gateway_config); an older build that refused it would fail here.
  # BASE_PIN=true|false gives the base side its own pin_threads (default: Tidegate's).
  base_toml="$OUT/perf.toml"
  if [ -n "${BASE_PIN:-}" ]; then base_toml="$OUT/perf-base.toml"; write_config "$base_toml" "$TIDEGATE_WORKERS" "$BASE_PIN"; fi
  TIDEGATE_LOG=warn "$BASE_DIR/tidegate" serve --config "$base_toml" > "$OUT/base.log" 2>&1 &
  BASE_PID=$!; pids+=($BASE_PID)
  BASE_ADDR=$(listening_addr "$OUT/base.log")
fi
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$NGINX_PORT) 2>/dev/null && break; sleep 0.1; done

PATH_=/v1/chat/completions
declare -A URL=(
  [direct]="http://127.0.0.1:$MOCK_PORT$PATH_"
  [nginx]="http://127.0.0.1:$NGINX_PORT$PATH_"
  [tidegate]="http://$TG_ADDR$PATH_"
)
SIDES=(direct nginx tidegate)
if [ -n "$BASE_DIR" ]; then URL[base]="http://$BASE_ADDR$PATH_"; SIDES+=(base); fi

cpu_ticks() { awk '{print $14 + $15}' /proc/"${1:-$TG_PID}"/stat; }
to_ms() { awk -v v="$1" 'BEGIN{ if (v ~ /us$/) {sub(/us/,"",v); print v/1000} else if (v ~ /ms$/) {sub(/ms/,"",v); print v+0} else if (v ~ /s$/) {sub(/s/,"",v); print v*1000} else print v }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
minus() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a-b}'; }
# median of the arguments
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2 }'; }
# wrk_run NAME URL CONNS STREAM DUR -> prints "rps p50_ms p99_ms"
wrk_run() {
  local name=$1 url=$2 conns=$3 stream=$4 dur=$5 threads=2
  [ "$conns" = 1 ] && threads=1
  STREAM=$stream wrk -t$threads -c"$conns" -d"${dur}s" --latency -s perf/post.lua "$url" > "$OUT/$name.txt" 2>&1
  local rps p50 p99
  rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$name.txt")
  p50=$(awk '$1=="50%" {print $2}' "$OUT/$name.txt")
  p99=$(awk '$1=="99%" {print $2}' "$OUT/$name.txt")
  echo "$rps $(to_ms "$p50") $(to_ms "$p99")"
}

# Warm up every path.
for side in "${SIDES[@]}"; do
  STREAM=0 wrk -t1 -c8 -d2s -s perf/post.lua "${URL[$side]}" > /dev/null
done

# Added latency at a fixed offered rate (below every side's capacity), corrected for
# coordinated omission: the same oha load on each side. fixed_rows ROUNDS fills lat_rows:
# per round direct, nginx and Tidegate back to back; per side the median p50/p99 of the
# rounds (STREAMS: the modes measured, 0 non-stream, 1 stream).
oha_run() {
  local url=$1 stream=$2
  local body='{"model":"perf/gpt-4o-mini","stream":'$([ "$stream" = 1 ] && echo true || echo false)',"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
  "$OHA" -z "${DUR}s" -c 64 -q "$RATE" --latency-correction --no-tui --output-format json \
    -m POST -H "Authorization: Bearer perf-key" -T application/json -d "$body" "$url" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); p=d["latencyPercentiles"]; s=d["summary"]; print("%.0f %.3f %.3f %.3f" % (s["requestsPerSec"], p["p50"]*1000, p["p99"]*1000, s["successRate"]))'
}
lat_rows=()
declare -A F50=() F99=() FOK=()
fixed_rows() {
  local rounds=$1 stream mode r side
  for stream in ${STREAMS:-0 1}; do
    mode=$([ "$stream" = 1 ] && echo stream || echo non-stream)
    F50=(); F99=(); FOK=()
    for r in $(seq "$rounds"); do
      for side in "${SIDES[@]}"; do
        read -r _ p50 p99 ok < <(oha_run "${URL[$side]}" "$stream")
        F50[$side]+="$p50 "; F99[$side]+="$p99 "; FOK[$side]+="$ok "
        if [ "$rounds" -gt 1 ]; then echo "fixed $mode round $r $side: p50 $p50 p99 $p99 ms, success $ok" >&2; fi
      done
    done
    for side in "${SIDES[@]}"; do
      # shellcheck disable=SC2086
      F50[$side]=$(median ${F50[$side]}); F99[$side]=$(median ${F99[$side]}); FOK[$side]=$(median ${FOK[$side]})
    done
    local base_cols=""
    if [ -n "$BASE_DIR" ]; then base_cols=" $(minus "${F50[base]}" "${F50[direct]}") | $(minus "${F99[base]}" "${F99[direct]}") |"; fi
    lat_rows+=("| $mode | $RATE | ${F50[direct]} | ${F99[direct]} | $(minus "${F50[nginx]}" "${F50[direct]}") | $(minus "${F99[nginx]}" "${F99[direct]}") | $(minus "${F50[tidegate]}" "${F50[direct]}") | **$(minus "${F99[tidegate]}" "${F99[direct]}")** |$base_cols ${FOK[direct]} / ${FOK[nginx]} / ${FOK[tidegate]} |")
  done
}
lat_header() {
  if [ -n "$BASE_DIR" ]; then
    echo "| mode | offered rps | direct p50 | direct p99 | nginx added p50 | nginx added p99 | tidegate added p50 | tidegate added p99 | base added p50 | base added p99 | success direct / nginx / tidegate |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    return
  fi
  echo "| mode | offered rps | direct p50 | direct p99 | nginx added p50 | nginx added p99 | tidegate added p50 | tidegate added p99 | success direct / nginx / tidegate |"
  echo "|---|---|---|---|---|---|---|---|---|"
}
if [ "${ONLY:-}" = fixed ]; then
  FIXED_ROUNDS=${FIXED_ROUNDS:-1}
  fixed_rows "$FIXED_ROUNDS"
  {
    echo "Added latency at a fixed offered rate (oha -c 64 -q $RATE --latency-correction, ${DUR}s; ms; added = side − direct; median of $FIXED_ROUNDS interleaved round(s)); Tidegate workers=$TIDEGATE_WORKERS pin_threads=${TIDEGATE_PIN:-true}, nginx worker_processes 2; $(uptime | sed 's/.*load/load/')."
    echo
    lat_header
    printf '%s\n' "${lat_rows[@]}"
    echo
    echo "Command: \`${TIDEGATE_BIN:+TIDEGATE_BIN=$TIDEGATE_BIN }${BASE_DIR:+BASE_DIR=$BASE_DIR }${BASE_PIN:+BASE_PIN=$BASE_PIN }ONLY=fixed FIXED_ROUNDS=$FIXED_ROUNDS STREAMS=\"${STREAMS:-0 1}\" TIDEGATE_WORKERS=$TIDEGATE_WORKERS TIDEGATE_PIN=${TIDEGATE_PIN:-true} RATE=$RATE perf/run.sh $DUR\`."
  } > "$OUT/fixed.md"
  cat "$OUT/fixed.md"
  exit 0
fi

HZ=$(getconf CLK_TCK)
rows=(); base_rows=()
cpu_pct() { awk -v a="$1" -v b="$2" -v hz="$HZ" -v d="$DUR" 'BEGIN{printf "%.0f", (b-a)/hz/d*100}'; }
for stream in 0 1; do
  for conns in 64 256; do
    mode=$([ $stream = 1 ] && echo stream || echo non-stream)
    declare -A RPS=() P50=() P99=()
    cpu_all=(); cpu_base=()
    for round in $(seq "$ROUNDS"); do
      for side in "${SIDES[@]}"; do
        [ "$side" = tidegate ] && t0=$(cpu_ticks)
        [ "$side" = base ] && t0=$(cpu_ticks "$BASE_PID")
        read -r rps p50 p99 < <(wrk_run "$side-$mode-$conns-r$round" "${URL[$side]}" "$conns" "$stream" "$DUR")
        [ "$side" = tidegate ] && cpu_all+=("$(cpu_pct "$t0" "$(cpu_ticks)")")
        [ "$side" = base ] && cpu_base+=("$(cpu_pct "$t0" "$(cpu_ticks "$BASE_PID")")")
        RPS[$side]+="$rps "; P50[$side]+="$p50 "; P99[$side]+="$p99 "
      done
    done
    for side in "${SIDES[@]}"; do
      # shellcheck disable=SC2086
      RPS[$side]=$(median ${RPS[$side]}); P50[$side]=$(median ${P50[$side]}); P99[$side]=$(median ${P99[$side]})
    done
    cpu=$(median "${cpu_all[@]}")
    if [ -n "$BASE_DIR" ]; then
      base_rows+=("| $mode | $conns | ${RPS[tidegate]} | ${RPS[base]} | **$(ratio "${RPS[tidegate]}" "${RPS[base]}")** | ${P50[tidegate]} | ${P50[base]} | ${P99[tidegate]} | ${P99[base]} | ${cpu}% | $(median "${cpu_base[@]}")% |")
    fi
    rows+=("| $mode | $conns | ${RPS[direct]} | ${P99[direct]} | ${RPS[nginx]} | ${P99[nginx]} | ${RPS[tidegate]} | ${P50[tidegate]} | ${P99[tidegate]} | $(ratio "${RPS[nginx]}" "${RPS[direct]}") | $(ratio "${RPS[tidegate]}" "${RPS[direct]}") | **$(ratio "${RPS[tidegate]}" "${RPS[nginx]}")** | $(minus "${P99[nginx]}" "${P99[direct]}") | $(minus "${P99[tidegate]}" "${P99[direct]}") | ${cpu}% |")
  done
done

# The fixed-rate table in as many interleaved rounds as the load table (FIXED_ROUNDS to
# choose otherwise): its p99 is the noisiest figure of the run.
FIXED_ROUNDS=${FIXED_ROUNDS:-$ROUNDS}
fixed_rows "$FIXED_ROUNDS"

# Sequential overhead: one connection, one request at a time, the three sides back to back
# per round; per round the p50 difference to direct; the median over rounds.
probe_n=(); probe_g=()
for round in $(seq "$PROBE_ROUNDS"); do
  read -r _ d50 _ < <(wrk_run "probe-direct-r$round" "${URL[direct]}" 1 0 2)
  read -r _ n50 _ < <(wrk_run "probe-nginx-r$round" "${URL[nginx]}" 1 0 2)
  read -r _ g50 _ < <(wrk_run "probe-tidegate-r$round" "${URL[tidegate]}" 1 0 2)
  probe_n+=("$(awk -v a="$n50" -v b="$d50" 'BEGIN{printf "%.1f", (a-b)*1000}')")
  probe_g+=("$(awk -v a="$g50" -v b="$d50" 'BEGIN{printf "%.1f", (a-b)*1000}')")
done
RSS_KB=$(awk '/VmHWM/ {print $2}' /proc/$TG_PID/status)

{
  echo "# Tidegate load test results"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(uname -r)); load generator, mock, nginx and Tidegate share the machine."
  echo "Tidegate workers=$TIDEGATE_WORKERS pin_threads=${TIDEGATE_PIN:-true}; nginx $(nginx -v 2>&1 | sed 's|.*/||') worker_processes 2, upstream keepalive 128, proxy_buffering off (perf/nginx.conf.in); mock workers=1; wrk -t2, ${DUR}s per measurement, median of $ROUNDS interleaved round(s). Latencies in ms (wrk --latency)."
  echo
  echo "| mode | conns | direct rps | direct p99 | nginx rps | nginx p99 | tidegate rps | tidegate p50 | tidegate p99 | nginx/direct | tidegate/direct | tidegate/nginx | nginx added p99 | tidegate added p99 | tidegate CPU |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  if [ -n "$BASE_DIR" ]; then
    echo "Same-format A/B against an older build (BASE_DIR=$BASE_DIR): the fourth side of the rounds above, the same config and mock; median of $ROUNDS interleaved round(s):"
    echo
    echo "| mode | conns | tidegate rps | base rps | tidegate/base | tidegate p50 | base p50 | tidegate p99 | base p99 | tidegate CPU | base CPU |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${base_rows[@]}"
    echo
  fi
  echo "Added latency at a fixed offered rate (oha -c 64 -q $RATE --latency-correction, ${DUR}s; ms; added = side − direct; median of $FIXED_ROUNDS interleaved round(s)):"
  echo
  lat_header
  printf '%s\n' "${lat_rows[@]}"
  echo
  echo "Sequential overhead (wrk -t1 -c1 -d2s, non-stream, $PROBE_ROUNDS interleaved rounds; per round p50 minus direct's p50, µs):"
  echo "nginx $(median "${probe_n[@]}") µs (rounds: ${probe_n[*]}), tidegate $(median "${probe_g[@]}") µs (rounds: ${probe_g[*]})."
  echo
  echo "Tidegate peak RSS over the whole run (VmHWM): $((RSS_KB / 1024)) MiB ($RSS_KB KiB)."
  echo
  echo "Command: \`${TIDEGATE_BIN:+TIDEGATE_BIN=$TIDEGATE_BIN }${BASE_DIR:+BASE_DIR=$BASE_DIR }${BASE_PIN:+BASE_PIN=$BASE_PIN }ROUNDS=$ROUNDS perf/run.sh $DUR\` (TIDEGATE_WORKERS=$TIDEGATE_WORKERS TIDEGATE_PIN=${TIDEGATE_PIN:-true} RATE=$RATE PROBE_ROUNDS=$PROBE_ROUNDS); per measurement \`STREAM=0|1 wrk -t2 -c<conns> -d${DUR}s --latency -s perf/post.lua <url>/v1/chat/completions\`. Raw wrk output in perf/out/."
} > "$OUT/load.md"
cat "$OUT/load.md"
