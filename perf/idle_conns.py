#!/usr/bin/env python3
"""Memory cost of idle keep-alive client connections.

Starts Tidegate (release build) on the shipped default config with a loopback port, reads its
RSS, opens N client connections that each complete one keep-alive request (GET /healthz) and
then stay idle, reads the RSS again, and reports (after - before) / N.

    python3 perf/idle_conns.py [N] [BINARY]     (default N = 10000, target/release/tidegate)
"""
import os, re, resource, signal, socket, subprocess, sys, tempfile, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BIN = sys.argv[2] if len(sys.argv) > 2 else os.path.join(TARGET, "release", "tidegate")

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = N + 1024
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, soft), max(want, hard)))

cfg = open(os.path.join(ROOT, "config", "tidegate.toml")).read()
cfg = re.sub(r'(?m)^listen\s*=.*$', 'listen = "127.0.0.1:0"', cfg, count=1)
tmp = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
tmp.write(cfg); tmp.close()

proc = subprocess.Popen([BIN, "serve", "--config", tmp.name], stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True, env={**os.environ, "TIDEGATE_LOG": "warn"})
try:
    line = proc.stdout.readline()
    m = re.match(r"tidegate listening on (\S+):(\d+) \(shards=(\d+)", line)
    if not m:
        sys.exit(f"no ready line: {line!r}")
    host, port, shards = m.group(1), int(m.group(2)), int(m.group(3))

    def rss_kib():
        with open(f"/proc/{proc.pid}/status") as f:
            for l in f:
                if l.startswith("VmRSS:"):
                    return int(l.split()[1])
        return 0

    req = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    # Warm up: allocator arenas, first connections.
    warm = []
    for _ in range(64):
        s = socket.create_connection((host, port)); s.sendall(req); s.recv(4096); warm.append(s)
    for s in warm:
        s.close()
    time.sleep(0.5)
    before = rss_kib()
    conns = []
    t0 = time.time()
    for i in range(N):
        s = socket.create_connection((host, port))
        s.sendall(req)
        data = s.recv(4096)
        if not data.startswith(b"HTTP/1.1 200"):
            sys.exit(f"connection {i}: unexpected answer {data[:40]!r}")
        conns.append(s)
    opened = time.time() - t0
    time.sleep(1.0)
    after = rss_kib()
    per = (after - before) * 1024 / N
    print(f"shards={shards} connections={N} rss_before_kib={before} rss_after_kib={after} "
          f"per_connection_bytes={per:.0f} ({per/1024:.2f} KiB) open_time_s={opened:.1f}")
    for s in conns:
        s.close()
finally:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
    os.unlink(tmp.name)
