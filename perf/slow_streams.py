#!/usr/bin/env python3
"""Holds N slow streaming requests open through Tidegate at once and samples its memory.

Usage: slow_streams.py ADDR PID N SECONDS MODEL

Opens N client connections to ADDR (host:port), each sending one `"stream": true` chat
completion for MODEL (e.g. `drip-1000`: one word a second, ~150 words), and reads every
stream as it arrives. Once every stream has received its first body byte, samples the
gateway's VmRSS (/proc/PID/status) every 5 s for SECONDS, checks that every stream is still
alive, and prints one JSON line: idle RSS, RSS per sample, streams alive at each sample, and
the per-stream memory ((RSS at N streams - idle RSS) / N).
"""

import asyncio
import json
import sys
import time


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Stats:
    def __init__(self) -> None:
        self.first_byte = 0
        self.open = 0
        self.done = 0
        self.errors = 0
        self.bytes = 0


async def one(host: str, port: int, body: bytes, stats: Stats) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        stats.errors += 1
        return
    stats.open += 1
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"authorization: Bearer perf-key\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body)
    got_first = False
    try:
        while True:
            chunk = await reader.read(4096)
            if not chunk:
                break
            stats.bytes += len(chunk)
            if not got_first and b"\r\n\r\n" in chunk:
                got_first = True
                stats.first_byte += 1
            if chunk.endswith(b"0\r\n\r\n"):
                break
    except OSError:
        stats.errors += 1
    finally:
        stats.open -= 1
        stats.done += 1
        writer.close()


async def main() -> None:
    addr, pid, n, seconds, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(
        sys.argv[4]
    ), sys.argv[5]
    host, port = addr.rsplit(":", 1)
    words = " ".join(f"w{i}" for i in range(150))
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": words}],
        }
    ).encode()
    idle = rss_kib(pid)
    stats = Stats()
    tasks = []
    t0 = time.monotonic()
    for i in range(n):
        tasks.append(asyncio.create_task(one(host, int(port), body, stats)))
        if i % 250 == 249:
            await asyncio.sleep(0.05)
    while stats.first_byte + stats.errors < n:
        if time.monotonic() - t0 > 120:
            break
        await asyncio.sleep(0.5)
    ramp_s = time.monotonic() - t0
    samples = []
    start = time.monotonic()
    while True:
        samples.append(
            {
                "t_s": round(time.monotonic() - start, 1),
                "rss_kib": rss_kib(pid),
                "open_streams": stats.open,
            }
        )
        if time.monotonic() - start >= seconds:
            break
        await asyncio.sleep(5)
    at_n = samples[0]["rss_kib"]
    rss = [s["rss_kib"] for s in samples]
    print(
        json.dumps(
            {
                "streams": n,
                "first_bytes": stats.first_byte,
                "errors": stats.errors,
                "ramp_s": round(ramp_s, 1),
                "idle_rss_kib": idle,
                "rss_min_kib": min(rss),
                "rss_max_kib": max(rss),
                "rss_first_kib": rss[0],
                "rss_last_kib": rss[-1],
                "per_stream_bytes": round((at_n - idle) * 1024 / max(1, n)),
                "samples": samples,
            }
        )
    )
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


asyncio.run(main())
