#!/usr/bin/env bash
# How long snapshot work holds a shard's request loop, under load that changes state on
# every request: CONNS connections of the in-process mock provider (never cooled, breaker
# threshold out of reach), requests alternating `fail-503` (each failure walks the
# connections in priority order, recording an error and a breaker count on each) and
# `echo` (a success clears the first one). The snapshot is written every INTERVAL_MS.
# Prints the gateway's snapshot metrics after DURATION of wrk: the longest collection step
# on any shard (`tidegate_snapshot_collect_max_seconds`, the only snapshot work on a shard),
# the writes and their sizes. Usage: perf/snapshot_block.sh [CONNS] [DURATION]
# PROFILE=dev measures the debug build (slower code, so an upper bound) without the long
# release build.
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${1:-2000}
DURATION=${2:-20s}
INTERVAL_MS=${INTERVAL_MS:-100}
OUT=$(mktemp -d)
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
PROFILE=${PROFILE:-release}
# SKIP_BUILD=1 measures the binary already built (built beforehand under `nice`, so the
# long release build does not run at normal priority inside the perf lock).
[ -n "${SKIP_BUILD:-}" ] || cargo build --profile "$PROFILE" --bin tidegate -q
DIR=$PROFILE; [ "$PROFILE" = dev ] && DIR=debug
BIN=${CARGO_TARGET_DIR:-target}/$DIR
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT

{
  cat <<TOML
[server]
listen = "127.0.0.1:0"
workers = 2
state_dir = "$OUT/state"
snapshot_interval_ms = $INTERVAL_MS

[[providers]]
id = "churn"
format = "mock"

[resilience.provider_breaker.local]
failure_threshold = 1000
degradation_threshold = 999
TOML
  for i in $(seq 1 "$CONNS"); do
    printf '[[connections]]\nid = "c%05d"\nprovider = "churn"\ndisable_cooling = true\npriority = %d\n' "$i" "$i"
  done
} > "$OUT/tidegate.toml"

"$BIN/tidegate" serve --config "$OUT/tidegate.toml" > "$OUT/out.log" 2> "$OUT/err.log" &
pids+=($!)
for _ in $(seq 1 200); do
  grep -q "listening on" "$OUT/out.log" 2>/dev/null && break
  sleep 0.05
done
ADDR=$(sed -n 's/^tidegate listening on \([^ ]*\) .*/\1/p' "$OUT/out.log")
[ -n "$ADDR" ] || { cat "$OUT/err.log"; exit 1; }
wrk -t 2 -c 32 -d "$DURATION" -s perf/snapshot_block.lua "http://$ADDR" | sed -n '1,12p'
curl -s "http://$ADDR/metrics" | grep -E "^tidegate_(snapshot|requests_total|upstream_attempts_total)"
