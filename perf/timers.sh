#!/usr/bin/env bash
# Timers and kernel entries per proxied request at a fixed rate: bpftrace uprobes on the
# monoio timer functions in the Tidegate binary (a `sleep` made, a wheel entry removed —
# one per timer that was registered —, the timer wheel processed after each wait) plus
# `io_uring_enter` calls (by min_complete) and io_uring submissions by opcode, while oha
# sends a fixed rate of chat completions; each count divided by the requests answered.
# Counts, not timings (the uprobes slow the gateway down, so the loop batches a little
# more than it would: the io_uring_enter figure is a lower bound; the timer counts are
# per request and do not depend on it).
#
#   perf/timers.sh [RATE] [DURATION_S]     (default 4000 5)
#   STREAM=1 TIDEGATE_BIN=DIR are the other knobs (one shard, not pinned).
#
# Needs bpftrace (installed from the distribution when absent) and root, and symbols in
# the binary (the release profile keeps them). Run inside `flock /tmp/tidegate-perf.lock`.
# Traffic stays on 127.0.0.1; every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-4000}
DUR=${2:-5}
STREAM=${STREAM:-0}
OUT=perf/out; mkdir -p "$OUT"
command -v bpftrace >/dev/null || { apt-get update -qq && apt-get install -y -qq bpftrace; }
# Tracepoints need tracefs, which is not mounted on every boot.
[ -e /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
. perf/common.sh

write_config "$OUT/timers.toml" 1 false
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$OUT/timers.toml" > "$OUT/timers-tidegate.log" 2>&1 &
TG_PID=$!; pids+=($TG_PID)
URL="http://$(listening_addr "$OUT/timers-tidegate.log")/v1/chat/completions"
body='{"model":"perf/gpt-4o-mini","stream":'$([ "$STREAM" = 1 ] && echo true || echo false)',"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
load() { "$OHA" -z "${1}s" -c 64 -q "$RATE" --no-tui -m POST -H "Authorization: Bearer perf-key" -T application/json -d "$body" "$URL"; }

T=$(readlink -f "$BIN/tidegate")
sym() { nm "$T" | awk -v re="$1" '!f && $3 ~ re {print $3; f = 1}'; }
probe() { # probe REGEX LABEL
  local s; s=$(sym "$1")
  [ -n "$s" ] || { echo "no symbol matching $1 in $T" >&2; exit 1; }
  echo "uprobe:$T:\"$s\" /pid == $TG_PID/ { @[\"$2\"] = count(); }"
}
{
  probe 'monoio4time6driver5sleep5sleep17h' "timer made (monoio sleep)"
  probe 'monoio4time6driver5wheel5Wheel6remove17h' "timer wheel entry removed"
  probe 'Handle.*7process17h' "timer wheel processed (once per wait)"
  echo "tracepoint:syscalls:sys_enter_io_uring_enter /pid == $TG_PID/ { @[\"io_uring_enter\"] = count(); }"
  echo "tracepoint:io_uring:io_uring_submit_req /pid == $TG_PID/ { @op[str(args->op_str)] = count(); }"
} > "$OUT/timers.bt"

load 2 > /dev/null   # warm-up
bpftrace -q "$OUT/timers.bt" > "$OUT/timers.raw" 2>&1 &
bt=$!
sleep 3 # attach
load "$DUR" > "$OUT/timers-oha.txt"
kill -INT "$bt"; wait "$bt" || true
n=$(awk '/^[[:space:]]*\[200\]/ {print $2}' "$OUT/timers-oha.txt")
{
  echo "Per request, $([ "$STREAM" = 1 ] && echo stream || echo non-stream), oha -c 64 -q $RATE for ${DUR}s, Tidegate workers=1 ($n requests):"
  echo
  echo "| per request | count |"
  echo "|---|---|"
  awk -v n="$n" -F': ' '/^@/ && $2 + 0 > 0 { k = $1; sub(/^@op\[/, "io_uring op ", k); sub(/^@\[/, "", k); sub(/\]$/, "", k); printf "| %s | %.3f |\n", k, $2 / n }' "$OUT/timers.raw" | sort
  echo
  echo "Command: \`STREAM=$STREAM perf/timers.sh $RATE $DUR\`."
} > "$OUT/timers.md"
cat "$OUT/timers.md"
