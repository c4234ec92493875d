#!/usr/bin/env bash
# Where the added tail latency at a fixed rate comes from: how long each proxy's threads wait
# for a CPU. The same open-loop oha load (non-stream or stream chat completions, coordinated
# omission corrected) against tidegate-mock directly, through nginx (perf/nginx.conf.in) and
# through Tidegate pinned and unpinned (`pin_threads`), in interleaved rounds; during each
# load bpftrace records, for the threads of every side (Tidegate's shard threads, nginx's
# workers, the mock's threads), the run-queue delay: from a wake-up to running again, and
# from being preempted (switched out while runnable) to running again. Per side and round:
# oha's p50/p99, and the delays' p50/p99/p99.9 and counts per request, of the loaded side
# and of the mock behind it (for the direct side, the loaded side is the mock itself).
#
#   perf/runq.sh [RATE] [DURATION_S] [ROUNDS]   (default 4000 5 3)
#   TIDEGATE_BIN=DIR   prebuilt tidegate + tidegate-mock (build nothing)
#   WORKERS=2          Tidegate shards and nginx worker_processes (the same count)
#   STREAM=0           STREAM=1 sends `"stream": true`
#   SIDES="direct nginx pinned unpinned"  (also epoll, plain, defer: Tidegate pinned with
#                      the epoll driver, or io_uring with that TIDEGATE_URING_SETUP)
#
# The tracepoints cost every context switch a little, on every side alike. Writes
# perf/out/runq.md. Needs root and bpftrace; run it inside `flock /tmp/tidegate-perf.lock`.
# Traffic stays on 127.0.0.1; every process started here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-4000}
DUR=${2:-5}
ROUNDS=${3:-3}
STREAM=${STREAM:-0}
WORKERS=${WORKERS:-2}
SIDES=${SIDES:-direct nginx pinned unpinned}
OUT=perf/out; mkdir -p "$OUT"
command -v bpftrace >/dev/null || { apt-get update -qq && apt-get install -y -qq bpftrace; }
# Tracepoints need tracefs, which is not mounted on every boot.
[ -e /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
command -v nginx >/dev/null || { printf 'nginx is not installed (perf/run.sh installs it)\n' >&2; exit 1; }
. perf/common.sh

declare -A URL=() TIDS=()
# tids PID [COMM_PREFIX]: the thread ids of PID (those whose name starts with the prefix)
tids() { local t; for t in /proc/"$1"/task/*; do [[ $(cat "$t/comm") == ${2:-}* ]] && echo "${t##*/}"; done | tr '\n' ' '; }
TIDS[mock]=$(tids "${pids[0]}")
URL[direct]="http://127.0.0.1:$MOCK_PORT/v1/chat/completions"
for side in $SIDES; do
  case $side in
    direct) TIDS[direct]=${TIDS[mock]};; # its "side" is the mock
    pinned|unpinned|epoll|plain|defer)
      # pinned: the shipped default (pin_threads, io_uring with COOP_TASKRUN); the others
      # change one thing: unpinned threads, the epoll driver, or the ring's setup flags.
      env=(TIDEGATE_LOG=warn)
      case $side in
        epoll) env+=(TIDEGATE_DRIVER=epoll);;
        plain|defer) env+=(TIDEGATE_DRIVER=io_uring "TIDEGATE_URING_SETUP=$side");;
      esac
      gateway_config "$OUT/runq-$side.toml" "$MOCK_PORT" "$WORKERS" "$([ "$side" = unpinned ] && echo false || echo true)"
      env "${env[@]}" "$BIN/tidegate" serve --config "$OUT/runq-$side.toml" > "$OUT/runq-$side.log" 2>&1 &
      pids+=($!)
      URL[$side]="http://$(listening_addr "$OUT/runq-$side.log")/v1/chat/completions"
      TIDS[$side]=$(tids "$!" tidegate-shard);;
    nginx)
      NGINX_PORT=$((MOCK_PORT + 1))
      NGX=$PWD/$OUT/runq-nginx; rm -rf "$NGX"; mkdir -p "$NGX"/{client_body,proxy,fastcgi,uwsgi,scgi}; chmod -R 777 "$NGX"
      sed -e "s|@MOCK_PORT@|$MOCK_PORT|g; s|@NGINX_PORT@|$NGINX_PORT|g; s|@PREFIX@|$NGX|g" \
          -e "s|^worker_processes .*|worker_processes $WORKERS;|" perf/nginx.conf.in > "$NGX/nginx.conf"
      nginx -p "$NGX" -c "$NGX/nginx.conf" > "$OUT/runq-nginx.log" 2>&1 &
      ngx_master=$!; pids+=($ngx_master)
      for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$NGINX_PORT) 2>/dev/null && break; sleep 0.1; done
      TIDS[nginx]=$(pgrep -P "$ngx_master" | tr '\n' ' ')
      URL[nginx]="http://127.0.0.1:$NGINX_PORT/v1/chat/completions";;
    *) echo "unknown side $side" >&2; exit 1;;
  esac
done

# The bpftrace program: group 1 = the loaded side's threads, 2 = the mock's.
# filter TIDS...: a predicate on $t
filter() { local t out=""; for t in "$@"; do out+="${out:+ || }\$t == $t"; done; echo "${out:-0}"; }
program() { # program SIDE
  local side_f mock_f
  # shellcheck disable=SC2086
  side_f=$(filter ${TIDS[$1]:-}); mock_f=$(filter ${TIDS[mock]})
  cat <<BT
BEGIN { printf("attached\\n"); }
interval:ms:$(( DUR * 1000 + 700 )) { exit(); }
tracepoint:sched:sched_wakeup { \$t = args->pid; if ($side_f) { @wq[\$t] = nsecs; } else if ($mock_f) { @wq[\$t] = nsecs; } }
tracepoint:sched:sched_switch {
  \$t = args->prev_pid; \$g = 0;
  if ($side_f) { \$g = 1; } else if ($mock_f) { \$g = 2; }
  if (\$g > 0) {
    delete(@wq[\$t]);
    if ((args->prev_state & 0xff) == 0) { @pq[\$t] = nsecs; @preempted[\$g] = count(); }
  }
  \$t = args->next_pid; \$g = 0;
  if ($side_f) { \$g = 1; } else if ($mock_f) { \$g = 2; }
  if (\$g > 0) {
    \$w = @wq[\$t];
    if (\$w > 0) { @wake[\$g] = lhist((nsecs - \$w) / 1000, 0, 3000, 5); delete(@wq[\$t]); }
    \$p = @pq[\$t];
    if (\$p > 0) { @pre[\$g] = lhist((nsecs - \$p) / 1000, 0, 3000, 5); delete(@pq[\$t]); }
  }
}
END { clear(@wq); clear(@pq); }
BT
}

stream_json=$([ "$STREAM" = 1 ] && echo true || echo false)
body='{"model":"perf/gpt-4o-mini","stream":'$stream_json',"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
load() { # load URL SECONDS -> oha json
  "$OHA" -z "${2}s" -c 64 -q "$RATE" --latency-correction --no-tui --output-format json \
    -m POST -H "Authorization: Bearer perf-key" -T application/json -d "$body" "$1"
}
for side in $SIDES; do load "${URL[$side]}" 2 > /dev/null; done # warm-up

for r in $(seq "$ROUNDS"); do
  for side in $SIDES; do
    program "$side" > "$OUT/runq-$side.bt"
    bpftrace -q "$OUT/runq-$side.bt" > "$OUT/runq-$side-$r.raw" 2>&1 &
    bt=$!
    # attached once BEGIN has run (compiling takes seconds on a busy box; a SIGINT before
    # that left bpftrace hanging once)
    for _ in $(seq 300); do grep -q '^attached' "$OUT/runq-$side-$r.raw" && break; sleep 0.1; done
    sleep 0.5
    load "${URL[$side]}" "$DUR" > "$OUT/runq-$side-$r.json"
    # bpftrace ends itself (a SIGINT left it hanging twice); a stuck one is killed and its
    # round has no histogram
    for _ in $(seq 100); do kill -0 "$bt" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$bt" 2>/dev/null || true; wait "$bt" || true
    echo "round $r $side done" >&2
  done
done

python3 - "$OUT" "$ROUNDS" "$RATE" "$DUR" "$STREAM" "$WORKERS" $SIDES > "$OUT/runq.md" <<'PY'
import json, re, statistics, sys
out, rounds, rate, dur, stream, workers, *sides = sys.argv[1:]
rounds = int(rounds)

def hists(path):
    """{(map, group): [(lo, count)]} from bpftrace's lhist output."""
    res, key = {}, None
    for line in open(path):
        m = re.match(r'@(\w+)\[(\d+)\]:', line)
        if m:
            key = (m.group(1), int(m.group(2))); res[key] = []; continue
        m = re.match(r'\[(\d+), (\d+)\)\s+(\d+)', line) or re.match(r'\[(\d+), \.\.\.\)\s+(\d+)', line)
        if m and key:
            lo = int(m.group(1)); n = int(m.group(m.lastindex))
            res[key].append((lo, n))
            continue
        m = re.match(r'\((\.\.\.), (\d+)\)\s+(\d+)', line)
        if m and key:
            res[key].append((0, int(m.group(3))))
    return res

def counts(path):
    return {int(g): int(n) for g, n in re.findall(r'@preempted\[(\d+)\]: (\d+)', open(path).read())}

def pct(h, q):
    """The q-quantile of a histogram, in µs (the bucket's upper edge; 3000+ for the overflow)."""
    total = sum(n for _, n in h)
    if not total:
        return float('nan')
    need, seen = q * total, 0
    for lo, n in h:
        seen += n
        if seen >= need:
            return lo + 5
    return h[-1][0] + 5

rows = {}
for side in sides:
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/runq-{side}-{r}.json"))
        p = d["latencyPercentiles"]; n = sum(d["statusCodeDistribution"].values())
        h = hists(f"{out}/runq-{side}-{r}.raw"); c = counts(f"{out}/runq-{side}-{r}.raw")
        row = {"p50": p["p50"] * 1000, "p99": p["p99"] * 1000, "p999": p["p99.9"] * 1000}
        for g, who in ((1, "side"), (2, "mock")):
            w = h.get(("wake", g), []); pr = h.get(("pre", g), [])
            row[who + "_wakes"] = sum(x for _, x in w) / n
            row[who + "_w99"] = pct(w, 0.99); row[who + "_w999"] = pct(w, 0.999); row[who + "_w50"] = pct(w, 0.5)
            row[who + "_pre"] = c.get(g, 0) / n
            row[who + "_p99"] = pct(pr, 0.99); row[who + "_p50"] = pct(pr, 0.5)
            row[who + "_over100"] = (sum(x for lo, x in w if lo >= 100) + sum(x for lo, x in pr if lo >= 100)) / n * 1000
            row[who + "_over1000"] = (sum(x for lo, x in w if lo >= 1000) + sum(x for lo, x in pr if lo >= 1000)) / n * 1000
        rows.setdefault(side, []).append(row)
        print(f"round {r} {side}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), file=sys.stderr)

def med(side, k):
    vals = [x[k] for x in rows[side] if x[k] == x[k]]  # a round without its histogram is nan
    return statistics.median(vals) if vals else float('nan')
print(f"Run-queue delay at a fixed offered rate ({'stream' if stream == '1' else 'non-stream'}, oha -c 64 -q {rate} --latency-correction, {dur}s × {rounds} interleaved rounds, medians; "
      f"Tidegate workers={workers}, nginx worker_processes {workers}). Delays in µs (5 µs buckets); 'side' = the loaded proxy's threads (the mock's for direct).")
print()
print("| side | oha p50 ms | oha p99 ms | oha p99.9 ms | side wake-ups / req | side wake→run p50 / p99 / p99.9 µs | side preemptions / req | preempted→run p50 / p99 µs | side waits ≥ 100 µs / ≥ 1 ms per 1000 req | mock wake→run p99 / p99.9 µs | mock waits ≥ 100 µs / ≥ 1 ms per 1000 req |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for side in sides:
    f = lambda k, d=2: f"{med(side, k):.{d}f}"
    print(f"| {side} | {f('p50', 3)} | {f('p99', 3)} | {f('p999', 3)} | {f('side_wakes')} | {f('side_w50', 0)} / {f('side_w99', 0)} / {f('side_w999', 0)} | {f('side_pre')} | {f('side_p50', 0)} / {f('side_p99', 0)} | {f('side_over100', 1)} / {f('side_over1000', 1)} | {f('mock_w99', 0)} / {f('mock_w999', 0)} | {f('mock_over100', 1)} / {f('mock_over1000', 1)} |")
print()
print(f"Per round oha p99 ms: " + "; ".join(f"{s} " + " ".join(f"{x['p99']:.3f}" for x in rows[s]) for s in sides) + ".")
print()
print(f"Command: `STREAM={stream} WORKERS={workers} SIDES=\"{' '.join(sides)}\" perf/runq.sh {rate} {dur} {rounds}`.")
PY
cat "$OUT/runq.md"
