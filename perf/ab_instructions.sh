#!/usr/bin/env bash
# Instructions per proxied request of one or more Tidegate builds, counted by callgrind
# (load-independent; the same method as perf/instructions.sh, with perf/keepalive_posts.py
# as the client so no oha is needed): Tidegate (workers = 1, epoll driver unless DRIVER) under
# `valgrind --tool=callgrind` serving N1 and then N2 requests over 4 keep-alive
# connections; prints (I(N2) - I(N1)) / (N2 - N1) per build.
#
#   perf/ab_instructions.sh DIR [DIR...]           (each DIR holds tidegate + tidegate-mock)
#   N1=200 N2=1000 STREAM=1 perf/ab_instructions.sh DIR_BEFORE DIR_AFTER
#   DRIVER=io_uring perf/ab_instructions.sh DIR_BEFORE DIR_AFTER
#
# DRIVER (default epoll) is TIDEGATE_DRIVER for the counted gateway. Under epoll a read
# whose bytes are already there completes at its first poll (and under valgrind the slow
# gateway usually finds them there); under io_uring every read waits for its completion
# first, as in production — count both when a change is about waits.
#
# Callgrind output stays in perf/out/ (callgrind_annotate it). Traffic stays on 127.0.0.1;
# every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${N1:-200}; N2=${N2:-1000}; STREAM=${STREAM:-0}
OUT=perf/out; mkdir -p "$OUT"
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
. perf/stack.sh   # start_mock, gateway_config, listening_addr

for dir in "$@"; do
  tag=$(basename "$dir")
  start_mock "$dir" "$OUT/ab-mock.log"; mock=${pids[-1]}
  gateway_config "$OUT/ab-instr.toml" "$STARTED_PORT" 1 false
  count() {
    local n=$1 log="$OUT/ab-instr-$tag-$1.log" cg="$OUT/callgrind.out.$tag.s$STREAM.$1"
    rm -f "$cg"
    TIDEGATE_DRIVER=${DRIVER:-epoll} TIDEGATE_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$cg" \
      "$dir/tidegate" serve --config "$OUT/ab-instr.toml" > "$log" 2>&1 &
    local pid=$!; pids+=($pid)
    local addr
    addr=$(listening_addr "$log" 600)
    python3 perf/keepalive_posts.py "$addr" "$n" 4 "$STREAM" >&2
    kill -TERM "$pid"; wait "$pid" || true
    awk '/^summary:/ {print $2}' "$cg"
  }
  i1=$(count "$N1"); i2=$(count "$N2")
  # A gateway that ended without writing its summary (seen on a loaded box) leaves a count
  # empty; the difference would then be a figure of nothing.
  if [ -z "$i1" ] || [ -z "$i2" ]; then
    echo "$dir stream=$STREAM: a callgrind summary is missing (N=$N1: '${i1}', N=$N2: '${i2}'; see $OUT/ab-instr-$tag-*.log); no figure" >&2
    exit 1
  fi
  echo "$dir stream=$STREAM: N=$N1 -> $i1, N=$N2 -> $i2; per request: $(( (i2 - i1) / (N2 - N1) ))"
  kill "$mock" 2>/dev/null || true
done
