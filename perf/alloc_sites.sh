#!/usr/bin/env bash
# Heap allocations per proxied request of one Tidegate build, by call site: a bpftrace uprobe
# on mimalloc's `mi_malloc_aligned` / `mi_realloc_aligned` records the return address on the
# stack at entry (the immediate caller: the release build has no frame pointers, so
# `ustack` skips it), and perf/alloc_sites.py resolves it with `addr2line -i` into its
# chain of inlined frames. Counts, not timings: load-independent, exact per call site
# (a timer made only when a read waits shows as a fraction).
#
#   perf/alloc_sites.sh DIR [N] [DEPTH]     (DIR holds tidegate + tidegate-mock; N = 2000)
#
# Non-stream chat completions (perf/keepalive_posts.py, 4 keep-alive connections) through
# Tidegate (workers = 1, epoll unless DRIVER) to the mock; 400 warm-up requests first.
# Run inside `flock /tmp/tidegate-perf.lock`. Every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=$1; N=${2:-2000}; DEPTH=${3:-8}
OUT=perf/out/alloc-$(basename "$DIR"); mkdir -p "$OUT"
command -v bpftrace >/dev/null || { apt-get update -qq && apt-get install -y -qq bpftrace; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
. perf/stack.sh
start_mock "$DIR" "$OUT/mock.log"
gateway_config "$OUT/gw.toml" "$STARTED_PORT" 1 false
TIDEGATE_DRIVER=${DRIVER:-epoll} TIDEGATE_LOG=warn "$DIR/tidegate" serve --config "$OUT/gw.toml" > "$OUT/gw.log" 2>&1 &
TG=$!; pids+=($TG)
addr=$(listening_addr "$OUT/gw.log")
python3 perf/keepalive_posts.py "$addr" 400 4 0
T=$(readlink -f "$DIR/tidegate")
cat > "$OUT/a.bt" <<BT
uprobe:$T:mi_malloc_aligned /pid == $TG/ { @[*(uint64*)(reg("sp"))] = count(); }
uprobe:$T:mi_realloc_aligned /pid == $TG/ { @r[*(uint64*)(reg("sp"))] = count(); }
BT
bpftrace -q "$OUT/a.bt" > "$OUT/raw.txt" 2>&1 &
bt=$!; sleep 4
python3 perf/keepalive_posts.py "$addr" "$N" 4 0
sleep 0.5; kill -INT $bt; wait $bt || true
cp /proc/$TG/maps "$OUT/maps.txt"
python3 perf/alloc_sites.py "$OUT" "$T" "$N" "$DEPTH" | tee "$OUT/sites.txt"
