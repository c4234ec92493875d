#!/usr/bin/env bash
# Tidegate's io_uring loop turns at a fixed rate: where a request's time goes between the
# shard's recv of the client's request and its send to the upstream. bpftrace on the
# shard threads (two pinned shards, the shipped default) while oha sends chat completions
# (64 connections, coordinated omission corrected):
#   turn, user        exit of one io_uring_enter → the next enter (the loop's user-space work)
#   turn, in kernel   inside io_uring_enter (submitting, and waiting for completions)
#   recv → exit       the client request's recv (run as task work inside io_uring_enter)
#                     → that enter's return
#   exit → enter      the user-space turn that handles it (every task woken in the turn)
#   enter → send      the next enter → the upstream send's return (the turn's submissions
#                     are issued in order; the send includes the loopback transmit)
#   on / off CPU      of recv → upstream send: the shard thread running, or switched out
# (one sample per turn that read a client request: the last such recv of the turn)
# plus io_uring submissions by opcode and completions per shard.
#
#   perf/turn.sh [RATE] [DURATION_S]     (default 4000 5)
#   TIDEGATE_BIN=DIR   prebuilt tidegate + tidegate-mock;  STREAM=1  sends `"stream": true`
#
# Writes perf/out/turn.md. Needs root, bpftrace and tracefs (mounted here when absent). Run
# inside `flock /tmp/tidegate-perf.lock`. Traffic stays on 127.0.0.1; every process started
# here is ended by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-4000}
DUR=${2:-5}
STREAM=${STREAM:-0}
OUT=perf/out; mkdir -p "$OUT"
command -v bpftrace >/dev/null || { apt-get update -qq && apt-get install -y -qq bpftrace; }
[ -e /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
. perf/common.sh

gateway_config "$OUT/turn.toml" "$MOCK_PORT" 2 true
TIDEGATE_LOG=warn "$BIN/tidegate" serve --config "$OUT/turn.toml" > "$OUT/turn-tidegate.log" 2>&1 &
TG=$!; pids+=($TG)
addr=$(listening_addr "$OUT/turn-tidegate.log")
LPORT=${addr##*:}
shards=(); for t in /proc/$TG/task/*; do [[ $(cat "$t/comm") == tidegate-shard* ]] && shards+=("${t##*/}"); done
T1=${shards[0]}; T2=${shards[1]:-${shards[0]}}
body='{"model":"perf/gpt-4o-mini","stream":'$([ "$STREAM" = 1 ] && echo true || echo false)',"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}'
load() { "$OHA" -z "${1}s" -c 64 -q "$RATE" --latency-correction --no-tui -m POST -H "Authorization: Bearer perf-key" -T application/json -d "$body" "http://$addr/v1/chat/completions"; }

# struct sock_common: skc_num (the local port) at offset 14 (bpftrace 0.17 does not
# resolve the anonymous union's members by name)
cat > "$OUT/turn.bt" <<BT
BEGIN { printf("attached\\n"); }
interval:ms:$(( DUR * 1000 + 700 )) { exit(); }
tracepoint:syscalls:sys_enter_io_uring_enter /pid == $TG/ {
  \$x = @exit[tid]; if (\$x > 0) { @turn_user = lhist((nsecs - \$x) / 1000, 0, 1000, 2); }
  \$r = @rx[tid]; if (\$r > 0) { @exit_to_enter = lhist((nsecs - \$r) / 1000, 0, 1000, 2); @re[tid] = nsecs; delete(@rx[tid]); }
  @ent[tid] = nsecs; @enters = count();
}
tracepoint:syscalls:sys_exit_io_uring_enter /pid == $TG/ {
  \$e = @ent[tid]; if (\$e > 0) { @turn_kernel = lhist((nsecs - \$e) / 1000, 0, 1000, 2); }
  \$r = @rt[tid]; if (\$r > 0) { @recv_to_exit = lhist((nsecs - \$r) / 1000, 0, 1000, 2); @rx[tid] = nsecs; delete(@rt[tid]); }
  @exit[tid] = nsecs;
}
tracepoint:io_uring:io_uring_complete /pid == $TG/ { @completions[tid] = count(); }
tracepoint:io_uring:io_uring_submit_req /pid == $TG/ { @ops[str(args->op_str)] = count(); }
tracepoint:sched:sched_switch {
  if (args->prev_pid == $T1 || args->prev_pid == $T2) { @so[args->prev_pid] = nsecs; }
  if (args->next_pid == $T1 || args->next_pid == $T2) { \$o = @so[args->next_pid]; if (\$o > 0) { @off[args->next_pid] = @off[args->next_pid] + (nsecs - \$o); } }
}
tracepoint:sock:sock_recv_length /pid == $TG && args->ret > 0/ {
  if (*(uint16 *)((uint64)args->sk + 14) == $LPORT) { @rt[tid] = nsecs; @rts[tid] = nsecs; @roff[tid] = @off[tid] + 1; }
}
tracepoint:sock:sock_send_length /pid == $TG && args->ret > 0/ {
  if (*(uint16 *)((uint64)args->sk + 14) != $LPORT) {
    \$r = @re[tid]; if (\$r > 0) { @enter_to_send = lhist((nsecs - \$r) / 1000, 0, 1000, 2); delete(@re[tid]); }
    \$o = @roff[tid];
    if (\$o > 0) {
      \$off = @off[tid] + 1 - \$o;
      @recv_to_send_off = lhist(\$off / 1000, 0, 1000, 2);
      @recv_to_send_on = lhist((nsecs - @rts[tid] - \$off) / 1000, 0, 1000, 2);
      delete(@roff[tid]);
    }
  } else { @answers = count(); }
}
END { clear(@exit); clear(@ent); clear(@rt); clear(@rx); clear(@re); clear(@so); clear(@off); clear(@roff); clear(@rts); }
BT

load 2 > /dev/null # warm-up
bpftrace -q "$OUT/turn.bt" > "$OUT/turn.raw" 2>&1 &
bt=$!
for _ in $(seq 300); do grep -q '^attached' "$OUT/turn.raw" && break; sleep 0.1; done
sleep 0.5
load "$DUR" > "$OUT/turn-oha.txt"
for _ in $(seq 100); do kill -0 "$bt" 2>/dev/null || break; sleep 0.1; done
kill -9 "$bt" 2>/dev/null || true; wait "$bt" || true

python3 - "$OUT/turn.raw" "$RATE" "$DUR" "$STREAM" > "$OUT/turn.md" <<'PY'
import re, sys
path, rate, dur, stream = sys.argv[1:]
h, c, key = {}, {}, None
for line in open(path):
    m = re.match(r'@(\w+):\s*$', line)
    if m:
        key = m.group(1); h[key] = []; continue
    m = re.match(r'@(\w+)(?:\[(.*)\])?: (\d+)$', line)
    if m:
        c.setdefault(m.group(1), {})[m.group(2)] = int(m.group(3)); key = None; continue
    m = re.match(r'\[(\d+), [^)]*\)\s+(\d+)', line)
    if m and key:
        h[key].append((int(m.group(1)), int(m.group(2))))
def pct(v, q):
    tot = sum(n for _, n in v); seen = 0
    for lo, n in v:
        seen += n
        if seen >= q * tot:
            return lo
    return float('nan')
answers = sum(c.get("answers", {}).values()) or float('nan')
print(f"Tidegate's io_uring loop turns ({'stream' if stream == '1' else 'non-stream'}, oha -c 64 -q {rate} --latency-correction, {dur}s; two pinned shards; "
      f"{answers} answers). µs, 2 µs buckets (1000 = 1 ms or more).")
print()
print("| interval | samples | p10 / p50 / p90 / p99 |")
print("|---|---|---|")
for k, label in (("turn_user", "turn, user (enter return → next enter)"), ("turn_kernel", "turn, in io_uring_enter"),
                 ("recv_to_exit", "client recv → that enter's return"), ("exit_to_enter", "→ the user-space turn that handles it"),
                 ("enter_to_send", "→ next enter → upstream send returns"),
                 ("recv_to_send_on", "client recv → upstream send: on CPU"), ("recv_to_send_off", "client recv → upstream send: off CPU")):
    v = h.get(k, [])
    print(f"| {label} | {sum(n for _, n in v)} | " + " / ".join(str(pct(v, q)) for q in (0.1, 0.5, 0.9, 0.99)) + " |")
print()
comp = sum(c.get("completions", {}).values()); enters = sum(c.get("enters", {}).values())
print(f"Per answer: io_uring_enter {enters / answers:.2f}, completions {comp / answers:.2f} ({comp / max(enters, 1):.2f} per enter); submissions: "
      + ", ".join(f"{k} {v / answers:.2f}" for k, v in sorted(c.get("ops", {}).items())) + ".")
print()
print(f"Command: `STREAM={stream} perf/turn.sh {rate} {dur}`.")
PY
cat "$OUT/turn.md"
