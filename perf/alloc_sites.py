#!/usr/bin/env python3
"""alloc_sites.py OUTDIR BINARY N DEPTH: perf/alloc_sites.sh's counts per request, by the
caller's chain of inlined frames (allocator and `alloc::` frames left out)."""
import collections, re, subprocess, sys
out, binary, n, depth = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
base = next(int(p[0].split('-')[0], 16) for p in (l.split() for l in open(f"{out}/maps.txt"))
            if len(p) >= 6 and p[5] == binary and int(p[2], 16) == 0)
skip = re.compile(r'^(<mimalloc|__rustc|alloc::|<alloc::|core::ptr|<core::pin|<T as )')
agg = collections.Counter()
for m in re.finditer(r'@(r?)\[(\d+)\]: (\d+)', open(f"{out}/raw.txt").read()):
    r = subprocess.run(['addr2line', '-i', '-f', '-C', '-e', binary, hex(int(m.group(2)) - base - 1)],
                       capture_output=True, text=True).stdout.splitlines()
    frames = [f"{f[:90]} @{re.sub(r'.*/', '', loc)}" for f, loc in zip(r[::2], r[1::2]) if not skip.match(f)]
    agg[(m.group(1), "\n        ".join(frames[:depth]))] += int(m.group(3))
for (kind, where), c in sorted(agg.items(), key=lambda x: -x[1]):
    if c / n >= 0.05:
        print(f"{c / n:6.2f} {'realloc ' if kind else ''}{where}")
print(f"allocations per request: {sum(agg.values()) / n:.2f}")
