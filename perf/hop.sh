#!/usr/bin/env bash
# What a proxy adds to each request, measured inside the proxy: the same open-loop oha load
# (64 connections, coordinated omission corrected) through nginx (perf/nginx.conf.in) and
# through Tidegate (2 shards, pinned: the shipped default), in interleaved rounds, while
# bpftrace times each request's two hops through the proxy from kernel events:
#   request hop: the client's request bytes arriving on the proxy's client socket
#                (tcp:tcp_probe, data) → the proxy's send to the upstream (sock_send_length);
#   answer hop:  the upstream's answer arriving on the proxy's upstream socket → the
#                proxy's send to the client;
# each split at the proxy's recv of those bytes (sock_recv_length): arrival → recv is the
# wait for the proxy's thread to run (wake-up, run queue, the rest of its loop turn),
# recv → send the proxy's own work (and how much of it its thread spent switched out:
# preempted, or asleep in a later wait). Also per request: client arrival → the answer's
# send on the same client socket ("in proxy", upstream time included), the proxy's send → the
# upstream answer's arrival on the same upstream socket ("upstream"), and the number of
# wake-ups of the proxy thread and of its waits in the kernel (io_uring_enter, epoll_wait)
# inside each hop. Per thread: the client and upstream connections it served.
#
# Matching: the arrival → recv and the "in proxy" / "upstream" intervals are exact (one
# socket carries one request at a time). A hop's recv → send is matched in order per thread
# (the n-th request a thread received is the n-th it sends upstream; likewise answers):
# exact while a thread handles its requests in the order it read them, which both proxies
# do within a loop turn; a reorder swaps two samples of the same turn. Seen once not to
# hold: nginx's stream requests at 500 rps showed ~1 ms between recv and upstream send,
# longer than oha's whole p50 (a send or recv this pairing does not expect); the exact
# intervals are not affected.
#
#   perf/hop.sh [RATE] [DURATION_S] [ROUNDS]   (default 4000 5 3)
#   TIDEGATE_BIN=DIR   prebuilt tidegate + tidegate-mock (build nothing)
#   BASE_DIR=DIR       adds side "base": DIR/tidegate with the same config
#   STREAM=1           sends `"stream": true`; STREAMS="0 1" measures both in every round
#   SIDES="nginx tidegate"  (and base with BASE_DIR; epoll: this build with the epoll
#                      driver); WORKERS=2 shards / worker_processes
#
# Writes perf/out/hop.md. Needs root, bpftrace and a mounted tracefs (mounted here when
# absent). The tracepoints cost every socket send/recv a little, on every side alike. Run it
# inside `flock /tmp/tidegate-perf.lock`. Traffic stays on 127.0.0.1; every process started
# here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-4000}
DUR=${2:-5}
ROUNDS=${3:-3}
STREAMS=${STREAMS:-${STREAM:-0}}
WORKERS=${WORKERS:-2}
BASE_DIR=${BASE_DIR:-}
SIDES=${SIDES:-nginx tidegate${BASE_DIR:+ base}}
OUT=perf/out; mkdir -p "$OUT"
command -v bpftrace >/dev/null || { apt-get update -qq && apt-get install -y -qq bpftrace; }
command -v nginx >/dev/null || { printf 'nginx is not installed (perf/run.sh installs it)\n' >&2; exit 1; }
[ -e /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
. perf/common.sh

declare -A URL=() PORT=() PIDS=() TIDS=()
tids() { local p t; for p in "$@"; do for t in /proc/"$p"/task/*; do echo "${t##*/}"; done; done | tr '\n' ' '; }
for side in $SIDES; do
  case $side in
    tidegate|base|epoll)
      # epoll: this build with monoio's epoll driver (TIDEGATE_DRIVER=epoll)
      bin=$BIN; [ "$side" = base ] && bin=$BASE_DIR
      gateway_config "$OUT/hop-$side.toml" "$MOCK_PORT" "$WORKERS" true
      TIDEGATE_LOG=warn TIDEGATE_DRIVER=$([ "$side" = epoll ] && echo epoll || echo auto) "$bin/tidegate" serve --config "$OUT/hop-$side.toml" > "$OUT/hop-$side.log" 2>&1 &
      pids+=($!); PIDS[$side]=$!
      addr=$(listening_addr "$OUT/hop-$side.log")
      URL[$side]="http://$addr/v1/chat/completions"; PORT[$side]=${addr##*:};;
    nginx)
      PORT[nginx]=$((MOCK_PORT + 1))
      NGX=$PWD/$OUT/hop-nginx; rm -rf "$NGX"; mkdir -p "$NGX"/{client_body,proxy,fastcgi,uwsgi,scgi}; chmod -R 777 "$NGX"
      sed -e "s|@MOCK_PORT@|$MOCK_PORT|g; s|@NGINX_PORT@|${PORT[nginx]}|g; s|@PREFIX@|$NGX|g" \
          -e "s|^worker_processes .*|worker_processes $WORKERS;|" perf/nginx.conf.in > "$NGX/nginx.conf"
      nginx -p "$NGX" -c "$NGX/nginx.conf" > "$OUT/hop-nginx.log" 2>&1 &
      ngx_master=$!; pids+=($ngx_master)
      for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/${PORT[nginx]}) 2>/dev/null && break; sleep 0.1; done
      PIDS[nginx]=$(pgrep -P "$ngx_master" | tr '\n' ' ')
      URL[nginx]="http://127.0.0.1:${PORT[nginx]}/v1/chat/completions";;
    *) echo "unknown side $side" >&2; exit 1;;
  esac
done
for side in $SIDES; do
  # shellcheck disable=SC2086
  TIDS[$side]=$(tids ${PIDS[$side]})
done
# the mock's port as the kernel stores it in skc_dport (network order); struct sock_common
# holds skc_dport at offset 12 and skc_num (the local port) at 14 (anonymous unions
# bpftrace 0.17 does not resolve by name)
MPORT_N=$(( ((MOCK_PORT & 0xff) << 8) | (MOCK_PORT >> 8) ))

# filter VAR IDS...: a predicate "VAR == id || ..."
filter() { local v=$1 t out=""; shift; for t in "$@"; do out+="${out:+ || }$v == $t"; done; echo "${out:-0}"; }
program() { # program SIDE
  local lport=${PORT[$1]} pid_f tid_f
  # shellcheck disable=SC2086
  pid_f=$(filter pid ${PIDS[$1]}); tid_f=$(filter '$t' ${TIDS[$1]})
  cat <<BT
BEGIN { printf("attached\\n"); }
interval:ms:$(( DUR * 1000 + 700 )) { exit(); }
// the proxy threads' wake-ups and waits in the kernel
tracepoint:sched:sched_wakeup { \$t = args->pid; if ($tid_f) { @wakes[\$t] = @wakes[\$t] + 1; } }
// off-CPU time of the proxy threads (switched out, for any reason), summed per thread
tracepoint:sched:sched_switch {
  \$t = args->prev_pid; if ($tid_f) { @out[\$t] = nsecs; }
  \$t = args->next_pid; if ($tid_f) { \$o = @out[\$t]; if (\$o > 0) { @off[\$t] = @off[\$t] + (nsecs - \$o); } }
}
tracepoint:syscalls:sys_enter_io_uring_enter, tracepoint:syscalls:sys_enter_epoll_wait,
tracepoint:syscalls:sys_enter_epoll_pwait /$pid_f/ { @enters[tid] = @enters[tid] + 1; }
// data arriving: on a client socket (local port = the proxy's), or on an upstream socket
// the proxy sent on (remote port = the mock's)
tracepoint:tcp:tcp_probe /args->data_len > 0/ {
  \$sk = (uint64)args->skaddr;
  if (args->sport == $lport) {
    if (@carr[\$sk] == 0) { \$o = @owner[\$sk];
      @carr[\$sk] = nsecs; @cin[\$sk] = nsecs; @carr_w[\$sk] = @wakes[\$o]; @carr_e[\$sk] = @enters[\$o]; }
  } else if (args->dport == $MOCK_PORT && @up[\$sk] != 0) {
    if (@uarr[\$sk] == 0) { \$o = @owner[\$sk];
      @uarr[\$sk] = nsecs; @uarr_w[\$sk] = @wakes[\$o]; @uarr_e[\$sk] = @enters[\$o];
      \$s = @usent[\$sk]; if (\$s > 0) { @upstream = lhist((nsecs - \$s) / 1000, 0, 10000, 10); delete(@usent[\$sk]); } }
  }
}
tracepoint:sock:sock_recv_length /($pid_f) && args->ret <= 0/ {
  \$sk = (uint64)args->sk;
  if (*(uint16 *)(\$sk + 14) == $lport) { @crecv_empty[tid] = count(); }
  else if (*(uint16 *)(\$sk + 12) == $MPORT_N) { @urecv_empty[tid] = count(); }
}
tracepoint:sock:sock_recv_length /($pid_f) && args->ret > 0/ {
  \$sk = (uint64)args->sk;
  @owner[\$sk] = tid;
  if (*(uint16 *)(\$sk + 14) == $lport) {
    @client[\$sk] = tid; @crecvs[tid] = count();
    \$a = @carr[\$sk];
    if (\$a > 0) {
      @c_wait = lhist((nsecs - \$a) / 1000, 0, 2000, 2);
      \$i = @cqt[tid]; @cq[tid, \$i] = \$a; @cqw[tid, \$i] = @carr_w[\$sk]; @cqe[tid, \$i] = @carr_e[\$sk]; @cqr[tid, \$i] = nsecs; @cqo[tid, \$i] = @off[tid];
      @cqt[tid] = \$i + 1; delete(@carr[\$sk]);
    }
  } else if (*(uint16 *)(\$sk + 12) == $MPORT_N) {
    @urecvs[tid] = count();
    \$a = @uarr[\$sk];
    if (\$a > 0) {
      @u_wait = lhist((nsecs - \$a) / 1000, 0, 2000, 2);
      \$i = @aqt[tid]; @aq[tid, \$i] = \$a; @aqw[tid, \$i] = @uarr_w[\$sk]; @aqe[tid, \$i] = @uarr_e[\$sk]; @aqr[tid, \$i] = nsecs; @aqo[tid, \$i] = @off[tid];
      @aqt[tid] = \$i + 1; delete(@uarr[\$sk]);
    }
  }
}
tracepoint:sock:sock_send_length /($pid_f) && args->ret > 0/ {
  \$sk = (uint64)args->sk;
  @owner[\$sk] = tid;
  if (*(uint16 *)(\$sk + 12) == $MPORT_N) {
    @up[\$sk] = tid;
    if (@usent[\$sk] == 0) { @usent[\$sk] = nsecs; }
    \$i = @cqh[tid];
    if (\$i < @cqt[tid]) {
      @req_hop = lhist((nsecs - @cq[tid, \$i]) / 1000, 0, 2000, 2);
      @req_work = lhist((nsecs - @cqr[tid, \$i]) / 1000, 0, 2000, 2);
      @req_work_off = lhist((@off[tid] - @cqo[tid, \$i]) / 1000, 0, 2000, 2);
      @req_wakes = lhist(@wakes[tid] - @cqw[tid, \$i], 0, 20, 1);
      @req_enters = lhist(@enters[tid] - @cqe[tid, \$i], 0, 20, 1);
      delete(@cq[tid, \$i]); delete(@cqw[tid, \$i]); delete(@cqe[tid, \$i]); delete(@cqr[tid, \$i]); delete(@cqo[tid, \$i]);
      @cqh[tid] = \$i + 1;
    }
  } else if (*(uint16 *)(\$sk + 14) == $lport) {
    \$i = @aqh[tid];
    if (\$i < @aqt[tid]) {
      @ans_hop = lhist((nsecs - @aq[tid, \$i]) / 1000, 0, 2000, 2);
      @ans_work = lhist((nsecs - @aqr[tid, \$i]) / 1000, 0, 2000, 2);
      @ans_work_off = lhist((@off[tid] - @aqo[tid, \$i]) / 1000, 0, 2000, 2);
      @ans_wakes = lhist(@wakes[tid] - @aqw[tid, \$i], 0, 20, 1);
      @ans_enters = lhist(@enters[tid] - @aqe[tid, \$i], 0, 20, 1);
      delete(@aq[tid, \$i]); delete(@aqw[tid, \$i]); delete(@aqe[tid, \$i]); delete(@aqr[tid, \$i]); delete(@aqo[tid, \$i]);
      @aqh[tid] = \$i + 1;
    }
    \$a = @cin[\$sk];
    if (\$a > 0) {
      @in_proxy = lhist((nsecs - \$a) / 1000, 0, 10000, 10); @in_proxy_by[tid] = lhist((nsecs - \$a) / 1000, 0, 10000, 10);
      delete(@cin[\$sk]);
    }
    @sends[tid] = count();
  }
}
END {
  clear(@carr); clear(@carr_w); clear(@carr_e); clear(@uarr); clear(@uarr_w); clear(@uarr_e);
  clear(@out); clear(@off); clear(@cqo); clear(@aqo); clear(@cq); clear(@cqw); clear(@cqe); clear(@cqr); clear(@aq); clear(@aqw); clear(@aqe); clear(@aqr);
  clear(@cqh); clear(@cqt); clear(@aqh); clear(@aqt); clear(@usent); clear(@cin); clear(@owner);
}
BT
}

load() { # load URL SECONDS STREAM(0|1) -> oha json
  local body='{"model":"perf/gpt-4o-mini","stream":'$([ "$3" = 1 ] && echo true || echo false)',"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
  "$OHA" -z "${2}s" -c 64 -q "$RATE" --latency-correction --no-tui --output-format json \
    -m POST -H "Authorization: Bearer perf-key" -T application/json -d "$body" "$1"
}
for side in $SIDES; do load "${URL[$side]}" 2 0 > /dev/null; done # warm-up

for r in $(seq "$ROUNDS"); do
  for st in $STREAMS; do
    for side in $SIDES; do
      f=$OUT/hop-$side-s$st-$r
      program "$side" > "$OUT/hop-$side.bt"
      bpftrace -q "$OUT/hop-$side.bt" > "$f.raw" 2>&1 &
      bt=$!
      for _ in $(seq 300); do grep -q '^attached' "$f.raw" && break; sleep 0.1; done
      sleep 0.5
      load "${URL[$side]}" "$DUR" "$st" > "$f.json"
      for _ in $(seq 100); do kill -0 "$bt" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$bt" 2>/dev/null || true; wait "$bt" || true
      echo "round $r stream=$st $side done ($(uptime | sed 's/.*load/load/'))" >&2
    done
  done
done

: > "$OUT/hop.md"
for st in $STREAMS; do
python3 - "$OUT" "$ROUNDS" "$RATE" "$DUR" "$st" "$WORKERS" $SIDES >> "$OUT/hop.md" <<'PY'
import json, re, statistics, sys
out, rounds, rate, dur, stream, workers, *sides = sys.argv[1:]
rounds = int(rounds)

def parse(path):
    """{name: [(lo, count)]} of bpftrace's lhist maps, and {name: {key: n}} of its counts."""
    h, c, key = {}, {}, None
    for line in open(path):
        m = re.match(r'@(\w+):\s*$', line) or re.match(r'@(\w+\[\d+\]):\s*$', line)
        if m:
            key = m.group(1); h[key] = []; continue
        m = re.match(r'@(\w+)\[(-?\d+)\]: (\d+)$', line)
        if m:
            c.setdefault(m.group(1), {})[int(m.group(2))] = int(m.group(3)); key = None; continue
        m = re.match(r'\[(\d+), (\d+)\)\s+(\d+)', line) or re.match(r'\[(\d+), \.\.\.\)\s+(\d+)', line)
        if m and key:
            h[key].append((int(m.group(1)), int(m.group(m.lastindex))))
    return h, c

def pct(h, q):
    total = sum(n for _, n in h)
    if not total:
        return float('nan')
    need, seen = q * total, 0
    for lo, n in h:
        seen += n
        if seen >= need:
            return lo
    return h[-1][0]

def mean(h):
    total = sum(n for _, n in h)
    return sum(lo * n for lo, n in h) / total if total else float('nan')

HOPS = [("req_hop", "request hop: client bytes in → upstream send"),
        ("c_wait", "  of it: client bytes in → proxy's recv"),
        ("req_work", "  of it: proxy's recv → upstream send"),
        ("req_work_off", "    of that: the proxy thread off CPU"),
        ("ans_hop", "answer hop: upstream bytes in → client send"),
        ("u_wait", "  of it: upstream bytes in → proxy's recv"),
        ("ans_work", "  of it: proxy's recv → client send"),
        ("ans_work_off", "    of that: the proxy thread off CPU"),
        ("in_proxy", "client bytes in → answer sent (upstream included)"),
        ("upstream", "upstream send → upstream bytes in")]
QS = [0.5, 0.9, 0.99, 0.999]
res = {s: [] for s in sides}
for side in sides:
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/hop-{side}-s{stream}-{r}.json"))
        p = d["latencyPercentiles"]
        h, c = parse(f"{out}/hop-{side}-s{stream}-{r}.raw")
        # oha leaves a percentile out (null) when it has too few samples for it
        ms = lambda q: p[q] * 1000 if p.get(q) is not None else float('nan')
        row = {"oha": (ms("p50"), ms("p99"), ms("p99.9"))}
        for k, _ in HOPS:
            row[k] = [pct(h.get(k, []), q) for q in QS] + [sum(n for _, n in h.get(k, []))]
        for k in ("req_wakes", "req_enters", "ans_wakes", "ans_enters"):
            hh = h.get(k, [])
            tot = sum(n for _, n in hh)
            row[k] = (mean(hh), sum(n for lo, n in hh if lo >= 1) / tot if tot else float('nan'))
        sends = c.get("sends", {})
        row["threads"] = " / ".join(str(n) for _, n in sorted(sends.items(), key=lambda x: -x[1]))
        per = []
        for t, n in sorted(sends.items(), key=lambda x: -x[1]):
            conns = sum(1 for v in c.get("client", {}).values() if v == t)
            ups = sum(1 for v in c.get("up", {}).values() if v == t)
            hh = h.get(f"in_proxy_by[{t}]", [])
            g = lambda k: c.get(k, {}).get(t, 0) / n
            per.append(f"{conns} client / {ups} upstream conns, {n} answers, recvs per answer client {g('crecvs'):.2f} (+{g('crecv_empty'):.2f} empty) "
                       f"upstream {g('urecvs'):.2f} (+{g('urecv_empty'):.2f} empty), in proxy p50/p99 {pct(hh, 0.5)}/{pct(hh, 0.99)} µs")
        row["per"] = "; ".join(per)
        res[side].append(row)

def med(side, k, i):
    vals = [x[k][i] for x in res[side] if x[k][i] == x[k][i]]
    return statistics.median(vals) if vals else float('nan')

mode = 'stream' if stream == '1' else 'non-stream'
print(f"Per-request hops inside the proxy ({mode}, oha -c 64 -q {rate} --latency-correction, {dur}s × {rounds} interleaved rounds; "
      f"{workers} Tidegate shards pinned / nginx worker_processes {workers}). µs, median over rounds of each round's percentile; hops in 2 µs buckets (2000 = 2 ms or more), "
      f"\"in proxy\" and \"upstream\" in 10 µs buckets (10000 = 10 ms or more).")
print()
print("| interval | " + " | ".join(f"{s} p50 / p90 / p99 / p99.9" for s in sides) + " |")
print("|---|" + "---|" * len(sides))
for k, label in HOPS:
    print(f"| {label} | " + " | ".join(" / ".join(f"{med(s, k, i):.0f}" for i in range(4)) for s in sides) + " |")
print()
print("| per request | " + " | ".join(sides) + " |")
print("|---|" + "---|" * len(sides))
for k, label in (("req_wakes", "proxy-thread wake-ups in the request hop: mean / share ≥ 1"),
                 ("req_enters", "io_uring_enter / epoll_wait in the request hop: mean / share ≥ 1"),
                 ("ans_wakes", "proxy-thread wake-ups in the answer hop: mean / share ≥ 1"),
                 ("ans_enters", "io_uring_enter / epoll_wait in the answer hop: mean / share ≥ 1")):
    print(f"| {label} | " + " | ".join(f"{med(s, k, 0):.2f} / {med(s, k, 1):.2f}" for s in sides) + " |")
print(f"| oha p50 / p99 / p99.9 ms | " + " | ".join(" / ".join(f"{med(s, 'oha', i):.3f}" for i in range(3)) for s in sides) + " |")
print(f"| samples (request hops) | " + " | ".join(f"{med(s, 'req_hop', 4):.0f}" for s in sides) + " |")
print()
for s in sides:
    print(f"{s}: client sends per thread by round: " + "; ".join(x["threads"] for x in res[s]) + "; per round oha p99 ms: " + " ".join(f"{x['oha'][1]:.3f}" for x in res[s]) + ".")
print()
for s in sides:
    for r, x in enumerate(res[s], 1):
        print(f"- {s} round {r}, per thread: {x['per']}")
print()
print(f"Command: `STREAM={stream} WORKERS={workers} SIDES=\"{' '.join(sides)}\" perf/hop.sh {rate} {dur} {rounds}` (or a STREAMS run interleaving the modes).")
print()
PY
done
cat "$OUT/hop.md"
